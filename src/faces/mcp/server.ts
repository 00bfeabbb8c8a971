import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import {
  CallToolRequestSchema,
  ErrorCode,
  ListToolsRequestSchema,
  McpError,
  type CallToolResult,
  type ProgressToken,
  type Tool,
} from '@modelcontextprotocol/sdk/types.js';
import { AppError, ERROR_STATUS, isAppError } from '../../errors.js';
import { ClientGone, Idempotency, stillRunning, type TrackJob } from '../../calls/idempotency.js';
import { awaitJobBody } from '../../calls/await-job.js';
import type { CompletionDispatcher } from '../../queue/dispatcher.js';
import { TOOLS, dollars, findTool } from '../../tools/index.js';
import { isIdempotent, type AnyTool } from '../../tools/types.js';
import type { KeyCaller } from '../../access/auth.js';
import type { ToolNarrowing } from '../../access/tool-sets.js';
import { authorizeTool, takeEdgeToken, type CallService } from '../../calls/admission.js';
import { API_VERSION, inputJsonSchema, outputJsonSchema } from '../../calls/catalogue.js';
import { JobWatch } from '../../calls/job-watch.js';
import type { CallResult } from '../../queue/call-job.js';

const INSTRUCTIONS =
  "Tools of the Tollgate service. Each successful tools/call is charged at the tool's price (shown in its " +
  'description) from your account\u2019s credits; failed calls cost nothing. Failures come back as results with ' +
  'isError set and the error code first, e.g. "insufficient_credits: ...". Cloudflare tools (cf_*) need your ' +
  'Cloudflare API token in the edge_token argument (or the X-Edge-Token header); it is never stored.';

const EDGE_TOKEN_PROPERTY = {
  type: 'string',
  description:
    'Your Cloudflare API token, created with least privilege for the zones to automate. Required unless the MCP ' +
    'connection sends an X-Edge-Token header. Used for this call only and never stored.',
};

/**
 * The tools this key may call: its plan's tier and below, narrowed to a sub-key's allowed_tools and
 * to the key's default tool set (authorizeTool's rules).
 */
export function visibleTools(caller: KeyCaller): AnyTool[] {
  return TOOLS.filter((tool) => {
    try {
      authorizeTool(caller, tool);
      return true;
    } catch {
      return false;
    }
  });
}

const WORDS: Record<string, string> = { cf: 'Cloudflare', dns: 'DNS', ssl: 'SSL', ip: 'IP', llm: 'LLM' };

/** "cf_list_dns" -> "Cloudflare list DNS": a display name for hosts that show one. */
export function toolTitle(name: string): string {
  const words = name.split('_').map((w) => WORDS[w] ?? w);
  const first = words[0] ?? name;
  return [first.charAt(0).toUpperCase() + first.slice(1), ...words.slice(1)].join(' ');
}

// --- tools/list: what this request offers, in pages, each tool with its schemas and hints ---

/** Tools per tools/list page. */
export const MCP_PAGE_SIZE = 50;

/**
 * What this request offers: what the key may call (visibleTools), narrowed by the request's query
 * (?tools=, ?families=, ?set=; src/access/tool-sets.ts), by name: the order pages follow.
 */
export function offeredTools(caller: KeyCaller, narrowing: ToolNarrowing | null | undefined): AnyTool[] {
  const tools = visibleTools(caller).filter((t) => !narrowing || narrowing.tools.has(t.name));
  return tools.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

/** A cursor names the last tool of the page before: opaque to clients, stable across requests. */
function encodeCursor(lastName: string): string {
  return Buffer.from(JSON.stringify({ after: lastName })).toString('base64url');
}

function decodeCursor(cursor: string): string {
  const invalid = () => new McpError(ErrorCode.InvalidParams, 'Invalid cursor: pass the nextCursor of the previous tools/list answer as it was given');
  if (cursor.length > 200 || !/^[A-Za-z0-9_-]+$/.test(cursor)) throw invalid();
  let after: unknown;
  try {
    after = (JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as { after?: unknown } | null)?.after;
  } catch {
    throw invalid();
  }
  if (typeof after !== 'string' || !/^[a-z0-9_]{1,64}$/.test(after)) throw invalid();
  return after;
}

/** One tools/list page: up to MCP_PAGE_SIZE tools after the cursor's, and a nextCursor while more remain. */
export function listPage(tools: readonly AnyTool[], cursor: string | undefined): { tools: Tool[]; nextCursor?: string } {
  const after = cursor === undefined ? null : decodeCursor(cursor);
  const rest = after === null ? tools : tools.filter((t) => t.name > after);
  const page = rest.slice(0, MCP_PAGE_SIZE);
  const more = rest.length > page.length;
  return { tools: page.map(mcpTool), ...(more ? { nextCursor: encodeCursor(page[page.length - 1]!.name) } : {}) };
}

/**
 * A tools/call of a tool this request does not offer because its query narrowed the list: the
 * JSON-RPC error an unknown tool gets, since for this connection it is one. Nothing runs or is charged.
 */
function refuseOutsideNarrowing(name: string, narrowing: ToolNarrowing | null | undefined): void {
  if (!narrowing || narrowing.tools.has(name)) return;
  throw new McpError(
    ErrorCode.InvalidParams,
    `Tool ${name} is not offered on this connection: its URL narrows the tools to ${narrowing.asked}. tools/list shows those it offers.`,
  );
}

/**
 * The JSON Schema of a tools/call's structuredContent. MCP clients (the SDK's Client among them) check
 * every structuredContent against it, failures' too, so it names each shape a call can answer:
 *
 * 1. success: the call's answer as POST /tools/{name} gives it, `result` being the tool's own output
 *    schema (MCP wants an object at the root, which the tool's result alone need not be); `sandbox`
 *    too for sandbox keys;
 * 2. a stored answer over RESULT_MAX_BYTES replayed under an Idempotency-Key: `truncated`, and the
 *    start of its JSON text as `result`;
 * 3. a failure (isError): `{error: {code, message, ...details}}`;
 * 4. x402's PaymentRequired, which a paid call without a payment answers (src/faces/mcp/paid.ts).
 *
 * Kept terse (no descriptions): the whole list goes to hosts, and POST /tools/{name} documents the
 * fields. The other shapes are told apart by a field only they have (`truncated`, `error`,
 * `x402Version`), so a success of the wrong shape matches none.
 */
export function mcpOutputSchema(tool: AnyTool): Tool['outputSchema'] {
  const result = outputJsonSchema(tool);
  if (!result) return undefined;
  return {
    type: 'object',
    anyOf: [
      {
        required: ['result', 'cost_cents', 'remaining_credits'],
        properties: { result, cost_cents: INTEGER, remaining_credits: { type: ['integer', 'null'] } },
      },
      TRUNCATED_SHAPE,
      FAILURE_SHAPE,
      PAYMENT_REQUIRED_SHAPE,
    ],
  };
}

const INTEGER = { type: 'integer' };
// The other shapes by the fields only they have: enough to tell them apart, small enough to send 80 times.
const TRUNCATED_SHAPE = { required: ['truncated'] };
const FAILURE_SHAPE = { required: ['error'], properties: { error: { type: 'object' } } };
const PAYMENT_REQUIRED_SHAPE = { required: ['x402Version', 'accepts'] };

const toolEntries = new WeakMap<AnyTool, Tool>();

/** A registry tool as MCP describes it; derived from the tool file, like every other listing. */
export function mcpTool(tool: AnyTool): Tool {
  let entry = toolEntries.get(tool);
  if (entry) return entry;
  const schema = inputJsonSchema(tool) as Tool['inputSchema'];
  const inputSchema: Tool['inputSchema'] = tool.needsEdgeToken
    ? { ...schema, properties: { ...(schema.properties ?? {}), edge_token: EDGE_TOKEN_PROPERTY } }
    : schema;
  const title = toolTitle(tool.name);
  const outputSchema = mcpOutputSchema(tool);
  entry = {
    name: tool.name,
    title,
    description: `${tool.description} Price: $${dollars(tool.priceCents)} per successful call (${tool.tier} plan).`,
    inputSchema,
    ...(outputSchema ? { outputSchema } : {}),
    annotations: {
      title,
      readOnlyHint: !tool.sideEffects,
      destructiveHint: !!tool.sideEffects,
      // What the same call again does (src/tools/types.ts `idempotent`); charging is apart from it.
      idempotentHint: isIdempotent(tool),
      // Everything but the pure computations reaches outside the service (the web, a model, Cloudflare).
      openWorldHint: tool.family !== 'core',
    },
    _meta: { 'tollgate/price_cents': tool.priceCents, 'tollgate/tier': tool.tier },
  };
  toolEntries.set(tool, entry);
  return entry;
}

export interface McpRequestContext {
  caller: KeyCaller;
  requestId: string;
  /** The HTTP request's X-Edge-Token, used when the arguments carry no edge_token. */
  edgeToken?: string;
  /** The request's logger (pino's error/debug signature). */
  log: { error(obj: object, msg: string): void; debug(obj: object, msg: string): void };
  /** The HTTP request's Idempotency-Key, applied to its tools/call. */
  idempotencyKey?: string;
  /** The request URL's narrowing (?tools=, ?families=, ?set=): tools/list and tools/call keep to it. */
  narrowing?: ToolNarrowing | null;
}

export interface McpDeps {
  calls: CallService;
  dispatcher: CompletionDispatcher;
  idempotency: Idempotency;
  /** How long a retry answered from a dead request's job waits for it. */
  syncTimeoutMs: number;
}

/**
 * One MCP server for one HTTP request (the SDK's stateless pattern): it knows who is calling, so
 * tools/list shows only what the key may call and tools/call runs with the key's rights.
 *
 * The low-level Server rather than McpServer: tool schemas here are JSON Schemas derived from the
 * registry per caller, which McpServer's zod-based registerTool cannot take as they are.
 */
export function createMcpServer(deps: McpDeps, ctx: McpRequestContext): Server {
  const server = new Server(
    { name: 'tollgate', title: 'Tollgate', version: API_VERSION },
    { capabilities: { tools: { listChanged: false } }, instructions: INSTRUCTIONS },
  );

  server.setRequestHandler(ListToolsRequestSchema, async (request) => listPage(offeredTools(ctx.caller, ctx.narrowing), request.params?.cursor));

  server.setRequestHandler(CallToolRequestSchema, async (request, extra): Promise<CallToolResult> => {
    const { name } = request.params;
    if (!findTool(name)) {
      throw new McpError(ErrorCode.InvalidParams, `Unknown tool: ${name}. tools/list shows the tools this key may call.`);
    }
    refuseOutsideNarrowing(name, ctx.narrowing);
    // The edge token leaves the arguments here, before anything can queue, store or log them.
    const { input, edgeToken } = takeEdgeToken(request.params.arguments ?? {});
    const run = (track?: TrackJob) => runTool(name, input, edgeToken, request.params._meta?.progressToken, extra, track);
    if (!ctx.idempotencyKey) return run();
    // Idempotency-Key as on REST calls: a retried tools/call with the same key and arguments gets the
    // first result and runs (and charges) nothing. Failures that charged nothing are stored with
    // their status, so 429/5xx ones free the key for a real retry.
    try {
      const out = await deps.idempotency.run(
        ctx.caller.keyId,
        ctx.idempotencyKey,
        Idempotency.fingerprint('MCP', `tools/call ${name}`, input),
        async (track) => stored(await run(track)),
        // The first request died, or its client left, after queueing: answer from its job.
        async (jobIds) => {
          const jobId = jobIds[0]!;
          let job: Record<string, unknown> | null;
          try {
            job = await awaitJobBody(deps.dispatcher, (id) => deps.calls.jobStatus(ctx.caller, id), jobId, deps.syncTimeoutMs);
          } catch (e) {
            if (!isAppError(e)) throw e;
            return stored(failure(e));
          }
          if (!job) return null;
          const { job_id: _id, status, ...value } = job;
          if (status !== 'completed') throw stillRunning(jobId);
          return stored(success(value as unknown as CallResult));
        },
      );
      return out.body as CallToolResult;
    } catch (e) {
      if (e instanceof ClientGone) throw new McpError(ErrorCode.InternalError, 'The client went away before the tool finished');
      if (isAppError(e)) return failure(e);
      if (e instanceof McpError) throw e;
      // The SDK would send the error's own message to the client; internals stay in the log.
      ctx.log.error({ err: e, tool: name }, 'MCP tools/call failed');
      throw new McpError(ErrorCode.InternalError, `Something went wrong on our side; request id ${ctx.requestId} helps us find it`);
    }
  });

  async function runTool(
    name: string,
    input: unknown,
    edgeToken: string | undefined,
    progressToken: ProgressToken | undefined,
    extra: { signal: AbortSignal; sendNotification: SendNotification },
    /** Records the job under the request's Idempotency-Key before it is queued. */
    track?: TrackJob,
  ): Promise<CallToolResult> {
    const watch = new JobWatch(deps.dispatcher, progressToken !== undefined);
    // The client went away (the transport closed): stop waiting. The job still finishes and is
    // charged if it succeeds, as a REST call whose client hangs up would be.
    const onAbort = () => watch.stop();
    extra.signal.addEventListener('abort', onAbort, { once: true });
    try {
      // respondAsync: MCP clients have no other way to fetch a result later, so the answer waits for
      // the job (with progress notifications when asked for) instead of turning into a 202.
      await deps.calls.call(ctx.caller, name, input, {
        requestId: ctx.requestId,
        respondAsync: true,
        edgeToken: edgeToken ?? ctx.edgeToken,
        onJobId: async (id) => {
          watch.attach(id);
          await track?.(id);
        },
      });
      if (progressToken !== undefined) forwardProgress(watch, progressToken, extra.sendNotification);
      const done = await watch.finished;
      if (done.state === 'completed') return success(done.value);
      if (done.state === 'failed') return failure(new AppError(done.error.code, done.error.message, { ...done.error.details, job_id: done.jobId }));
      // Under an Idempotency-Key the claim outlives the client: its retry gets this job's result.
      if (track) throw new ClientGone();
      return failure(new AppError('timeout', 'The request was cancelled before the tool finished'));
    } catch (e) {
      watch.stop();
      if (e instanceof ClientGone) throw e;
      if (isAppError(e)) return failure(e);
      ctx.log.error({ err: e, tool: name }, 'MCP tools/call failed');
      throw new McpError(ErrorCode.InternalError, `Something went wrong on our side; request id ${ctx.requestId} helps us find it`);
    } finally {
      extra.signal.removeEventListener('abort', onAbort);
    }
  }

  server.onerror = (err) => ctx.log.debug({ err: err.message }, 'MCP transport error');
  return server;
}

type SendNotification = (n: {
  method: 'notifications/progress';
  params: { progressToken: ProgressToken; progress: number; message?: string };
}) => Promise<void>;

/** Job progress (tokens generated, bytes fetched...) as MCP progress notifications. */
function forwardProgress(watch: JobWatch, progressToken: ProgressToken, send: SendNotification): void {
  let last = 0;
  watch.listen((e) => {
    if (e.type !== 'progress' || !e.data || typeof e.data !== 'object') return;
    const p = e.data as { stage?: unknown; done?: unknown; total?: unknown; unit?: unknown; message?: unknown };
    // MCP requires progress to increase with every notification.
    last = typeof p.done === 'number' && p.done > last ? p.done : last + 1;
    const unit = typeof p.unit === 'string' ? ` ${p.unit}` : '';
    const of = typeof p.total === 'number' ? `/${p.total}` : '';
    const message = typeof p.message === 'string' ? p.message : `${String(p.stage ?? 'working')}: ${last}${of}${unit}`;
    send({
      method: 'notifications/progress',
      params: { progressToken, progress: last, ...(typeof p.total === 'number' ? { total: p.total } : {}), message },
    }).catch(() => {}); // the client may have gone; the result still settles the call
  });
}

/** A tools/call result as an Idempotency-Key stores it, with the HTTP status its error code has. */
function stored(result: CallToolResult) {
  const code = (result.structuredContent as { error?: { code?: string } } | undefined)?.error?.code;
  return { status: result.isError ? ((ERROR_STATUS as Record<string, number>)[code ?? ''] ?? 500) : 200, headers: {}, body: result };
}

export function success(body: CallResult): CallToolResult {
  const structured = body as unknown as Record<string, unknown>;
  // The text mirrors structuredContent, as MCP asks of tools that return structured content.
  return { content: [{ type: 'text', text: JSON.stringify(body) }], structuredContent: structured };
}

/** Business failures are tool results the model can read and act on, not protocol errors. */
export function failure(err: AppError): CallToolResult {
  return {
    isError: true,
    content: [{ type: 'text', text: `${err.code}: ${err.message}` }],
    structuredContent: { error: { code: err.code, message: err.message, ...err.details } },
  };
}
