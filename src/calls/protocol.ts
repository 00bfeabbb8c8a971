import { z } from 'zod';
import { ownsJob } from '../access/keys.js';
import type { Config } from '../config.js';
import { AppError, type SerializedError } from '../errors.js';
import { assertNeedsMet, findTool, getTool, qInput } from '../tools/index.js';
import type { AnyTool } from '../tools/types.js';
import type { AccountsRepo } from '../access/accounts.js';
import type { CompletionDispatcher } from '../queue/dispatcher.js';
import type { JobRecords } from '../queue/job-records.js';
import { newJobId, type FlowStep, type JobQueues } from '../queue/queues.js';
import { PARALLEL_ROOT_JOB, type FlowMode, type FlowRecord, type FlowRecords } from '../queue/flows.js';
import type { Caller, KeyCaller } from '../access/auth.js';
import { authorizeTool, type CallAnswer, type CallService } from './admission.js';
import type { CreditReservations } from '../money/holds.js';
import { assertEdgeToken } from '../access/edge-token.js';
import type { CallJobData, CallResult } from '../queue/call-job.js';
import { invalidInput } from '../errors.js';
import type { Webhooks } from './webhooks.js';
import type { ResultsStore } from '../money/results.js';
import { storedAnswer } from '../queue/result-refs.js';

/**
 * The root protocol (POST /): `direct` and `stream` run one tool with `q` in the field it declares;
 * `chain` and `parallel` run several as one BullMQ flow. Admission covers the whole request before
 * anything runs: every tool exists, the plan and sub-key may use each, the first input is valid and
 * credit (and a sub-key's month) covers every step at once.
 */

export const MAX_STEPS = 10;

const SHAPES =
  'send {"chain": ["tool", ...], "q": "..."}, {"parallel": ["tool", ...], "q": "..."}, {"m": "tool", "q": "..."} or {"stream": true, "m": "tool", "q": "..."}';

const toolName = z.string().min(1).max(200);
const common = {
  q: z
    .string({ required_error: "q is required: the input that fills each tool's q field", invalid_type_error: 'q must be a string' })
    .describe('The input. It fills the field each tool declares as its q field (GET /tools/{name} shows `q_field`).'),
  stream: z.boolean().optional().describe('true: answer with Server-Sent Events (queued, progress, result or error) instead of one JSON body'),
  edge_token: z.string().optional().describe('Edge-network API token for cf_* tools, if the X-Edge-Token header cannot be sent'),
  callback_url: z
    .string()
    .optional()
    .describe(
      'https URL that gets the signed outcome when the job ends (like the Callback-Url header); for chain and parallel, when the whole request has ended',
    ),
};
const toolList = (mode: FlowMode) =>
  z
    .array(toolName)
    .min(1, `${mode} lists no tools: give 1 to ${MAX_STEPS} tool names`)
    .max(MAX_STEPS, `${mode} lists more than ${MAX_STEPS} tools: at most ${MAX_STEPS} per request`);

export const ChainRequestSchema = z
  .object({
    chain: toolList('chain').describe("Tools run one after another: the first gets q, each later one gets the previous step's output as its q"),
    ...common,
  })
  .strict();
export const ParallelRequestSchema = z
  .object({ parallel: toolList('parallel').describe('Tools run at the same time, each with the same q'), ...common })
  .strict();
export const DirectRequestSchema = z.object({ m: toolName.describe('The tool to run'), ...common }).strict();

/** The modes as the root document describes them, each with a working request body (tests run them). */
export const PROTOCOL_MODES = {
  chain: {
    description: `POST / with up to ${MAX_STEPS} tools run in order, each getting the previous output as its q; stops at the first failing step`,
    example: { chain: ['page_fetch', 'roast'], q: 'https://example.com/' },
  },
  parallel: {
    description: `POST / with up to ${MAX_STEPS} tools run at once on the same q; results keyed by tool, only successes charged`,
    example: { parallel: ['domain_check', 'page_fetch'], q: 'example.com' },
  },
  stream: {
    description: 'POST / like direct (or chain/parallel) with stream: true; Server-Sent Events queued, progress, result or error',
    example: { stream: true, m: 'compute', q: '2 * (3 + 4)' },
  },
  direct: {
    description: 'POST / running one tool with q in its q field; answers like POST /tools/{m}',
    example: { m: 'compute', q: '2 * (3 + 4)' },
  },
};

export type ProtocolRequest =
  | { mode: 'direct'; tool: AnyTool; q: string; stream: boolean; edgeToken?: string }
  | { mode: FlowMode; tools: AnyTool[]; q: string; stream: boolean; edgeToken?: string };
type FlowRequest = Extract<ProtocolRequest, { mode: FlowMode }>;

const MODE_KEYS = ['chain', 'parallel', 'm'] as const;

/** Reads a POST / body: exactly one mode, valid fields, known tools. */
export function parseProtocolRequest(body: unknown): ProtocolRequest {
  if (!body || typeof body !== 'object' || Array.isArray(body)) {
    throw new AppError('invalid_input', `POST / takes a JSON object: ${SHAPES}`, { issues: [{ path: [], message: 'expected an object' }] });
  }
  const present = MODE_KEYS.filter((k) => k in body);
  if (present.length === 0) {
    throw new AppError('invalid_input', `The body matches no mode: ${SHAPES}`, {
      issues: [{ path: [], message: 'expected one of chain, parallel or m' }],
    });
  }
  if (present.length > 1) {
    throw new AppError('invalid_input', `The body matches several modes (${present.join(' and ')}): send exactly one of chain, parallel or m`, {
      issues: present.map((k) => ({ path: [k], message: 'only one mode per request' })),
    });
  }
  const mode = present[0]!;
  if (mode === 'm') {
    const parsed = DirectRequestSchema.safeParse(body);
    if (!parsed.success) throw invalidInput(parsed.error, 'POST / body is invalid');
    const d = parsed.data;
    // Same 404 as POST /tools/{m}: direct mode answers exactly like it.
    return { mode: 'direct', tool: getTool(d.m), q: d.q, stream: d.stream ?? false, edgeToken: d.edge_token || undefined };
  }
  const parsed = (mode === 'chain' ? ChainRequestSchema : ParallelRequestSchema).safeParse(body);
  if (!parsed.success) throw invalidInput(parsed.error, 'POST / body is invalid');
  const d = parsed.data as { q: string; stream?: boolean; edge_token?: string } & { chain?: string[]; parallel?: string[] };
  const names = (mode === 'chain' ? d.chain : d.parallel)!;
  const tools = names.map((name, i) => {
    const tool = findTool(name);
    if (!tool) {
      throw new AppError('tool_not_found', `No tool named '${name}' (${mode} step ${i + 1} of ${names.length}). GET /tools lists them.`, {
        tool: name,
        index: i,
      });
    }
    return tool;
  });
  return { mode, tools, q: d.q, stream: d.stream ?? false, edgeToken: d.edge_token || undefined };
}

/** Keys of a parallel answer's `results`: the tool name; a tool listed again gets `name#2`, `name#3`... */
export function resultKeys(names: string[]): string[] {
  const seen = new Map<string, number>();
  return names.map((n) => {
    const k = (seen.get(n) ?? 0) + 1;
    seen.set(n, k);
    return k === 1 ? n : `${n}#${k}`;
  });
}

export interface ProtocolOptions {
  requestId: string;
  /** From the X-Edge-Token header; wins over `edge_token` in the body. */
  edgeToken?: string;
  respondAsync?: boolean;
  /** Vetted Callback-Url (header or callback_url): the outcome is POSTed there when the request ends (src/calls/webhooks.ts). */
  callbackUrl?: string;
  /** Called with every job id the request queues, the flow's root first, before any is queued (pay-per-call tracks them). */
  onJobId?: (jobId: string) => void | Promise<void>;
}

/** A whole HTTP answer, so a wrapper (idempotency) can store and replay it. Failures are thrown. */
export interface ProtocolAnswer {
  status: 200 | 202;
  headers: Record<string, string>;
  body: unknown;
}

/** What a stream follows: one job (its events may sit in a flow root's log), or a whole flow. */
export type StreamTarget = { kind: 'job'; jobId: string; logId: string } | { kind: 'flow'; flow: FlowRecord };

export type Final = { ok: true; body: unknown } | { ok: false; error: AppError };

type StepOutcome =
  | { state: 'completed'; value: CallResult }
  | { state: 'failed'; error: AppError }
  | { state: 'pending'; status: string }
  | { state: 'missing' };

export interface StepSummary {
  tool: string;
  result: unknown;
  cost_cents: number;
}

export function stepError(err: AppError) {
  return { code: err.code, message: err.message, ...err.details };
}

export class ProtocolService {
  constructor(
    private readonly deps: {
      config: Config;
      calls: CallService;
      queues: JobQueues;
      dispatcher: CompletionDispatcher;
      records: JobRecords;
      flows: FlowRecords;
      credits: CreditReservations;
      accounts: AccountsRepo;
      /** Watches chain and parallel requests with a Callback-Url until they end (src/calls/webhooks.ts). */
      webhooks?: Pick<Webhooks, 'watch'>;
      /**
       * Stored answers (job_results): a step of a request made with a key, once Redis no longer holds
       * its job (finished jobs stay JOB_REDIS_RETENTION_SECONDS).
       */
      results?: Pick<ResultsStore, 'get'>;
    },
  ) {}

  /**
   * Runs a non-streaming request and waits for it (202 with the root job id past the sync timeout).
   * A payer (x402) pays for the whole request or nothing, so for them any failed step fails the
   * request, and the error carries no step's result.
   */
  async answer(caller: Caller, req: ProtocolRequest, opts: ProtocolOptions): Promise<ProtocolAnswer> {
    if (req.mode === 'direct') return fromCallAnswer(await this.deps.calls.call(caller, req.tool.name, qInput(req.tool, req.q), this.callOpts(req, opts)));

    const { dispatcher, config } = this.deps;
    const seen = new Map<string, StepOutcome>();
    const unsubscribe: Array<() => void> = [];
    let finished = () => {};
    const done = new Promise<void>((resolve) => {
      finished = resolve;
    });
    let timer: NodeJS.Timeout | undefined;
    try {
      const flow = await this.launch(caller, req, opts, (f) => {
        // Subscribed before the flow is added, so no step's outcome can slip past.
        for (const s of f.steps) {
          unsubscribe.push(
            dispatcher.subscribe(s.jobId, (e) => {
              if (e.type === 'progress') return;
              seen.set(e.jobId, e.type === 'completed' ? { state: 'completed', value: e.value } : { state: 'failed', error: e.error });
              if (
                flowDone(
                  f,
                  f.steps.map((x) => seen.get(x.jobId)),
                )
              )
                finished();
            }),
          );
        }
      });
      if (opts.respondAsync) return accepted(flow.rootId);
      timer = setTimeout(finished, config.SYNC_TIMEOUT_MS);
      await done;
      if (
        !flowDone(
          flow,
          flow.steps.map((s) => seen.get(s.jobId)),
        )
      )
        return accepted(flow.rootId);
      const outcomes = await Promise.all(flow.steps.map((s) => seen.get(s.jobId) ?? this.readStep(s.jobId)));
      const final = await this.flowFinal(flow, outcomes);
      if (caller.kind === 'payer') {
        const refused = allOrNothing(flow, outcomes, final);
        if (refused) throw refused;
      }
      if (!final.ok) throw final.error;
      return { status: 200, headers: { 'x-job-id': flow.rootId }, body: final.body };
    } finally {
      clearTimeout(timer);
      for (const u of unsubscribe) u();
    }
  }

  /** Admits and queues a streaming request; the caller then follows the returned target. */
  async start(caller: KeyCaller, req: ProtocolRequest, opts: ProtocolOptions): Promise<StreamTarget> {
    if (req.mode === 'direct') return this.startTool(caller, req.tool.name, qInput(req.tool, req.q), this.callOpts(req, opts));
    return { kind: 'flow', flow: await this.launch(caller, req, opts) };
  }

  /** Admits and queues one tool call (POST /tools/{name} with Accept: text/event-stream). */
  async startTool(caller: KeyCaller, tool: string, body: unknown, opts: ProtocolOptions): Promise<StreamTarget> {
    const a = await this.deps.calls.call(caller, tool, body, { ...opts, respondAsync: true });
    return { kind: 'job', jobId: a.jobId, logId: a.jobId };
  }

  /** The stream target for a job id the caller owns (GET /jobs/{id}/events, reconnects). */
  async target(caller: KeyCaller, jobId: string): Promise<StreamTarget> {
    const notFound = new AppError('not_found', `No job ${jobId} for this key`);
    const flow = await this.deps.flows.get(jobId);
    if (flow) {
      if (!ownsJob(caller, flow.keyId)) throw notFound;
      return { kind: 'flow', flow };
    }
    const view = await this.deps.queues.view(jobId).catch(() => null);
    const owner = view ? view.data.keyId : ((await this.deps.records.raw(jobId))?.keyId ?? (await this.deps.results?.get(jobId))?.keyId ?? null);
    // Known nowhere with an owner: GET /jobs/{id} says what became of it (410 job_lost for a job the
    // queue lost, 404 for none of this key's), and a stream of it is refused the same way.
    if (owner === null && !view) await this.deps.calls.jobStatus(caller, jobId);
    if (!ownsJob(caller, owner)) throw notFound;
    return { kind: 'job', jobId, logId: view?.data.eventLog ?? jobId };
  }

  /** The outcome of a finished target (the body a sync call returns, or its error); null while it runs. */
  async final(target: StreamTarget): Promise<Final | null> {
    if (target.kind === 'flow') {
      const outcomes = await Promise.all(target.flow.steps.map((s) => this.readStep(s.jobId)));
      return flowDone(target.flow, outcomes) ? this.flowFinal(target.flow, outcomes) : null;
    }
    const o = await this.readStep(target.jobId);
    if (o.state === 'pending') return null;
    if (o.state === 'completed') return { ok: true, body: o.value };
    const err = o.state === 'failed' ? o.error : new AppError('not_found', `Job ${target.jobId} is no longer stored`);
    return { ok: false, error: new AppError(err.code, err.message, { ...err.details, job_id: target.jobId }) };
  }

  /**
   * The body GET /jobs/{root} answers once a chain or parallel request has ended (what its webhook
   * delivers); null while it runs; undefined when no such request is stored.
   */
  async flowOutcome(rootId: string): Promise<Record<string, unknown> | null | undefined> {
    const flow = await this.deps.flows.get(rootId);
    if (!flow) return undefined;
    const final = await this.final({ kind: 'flow', flow });
    if (!final) return null;
    if (final.ok) return { job_id: rootId, status: 'completed', ...(final.body as object) };
    const err = final.error;
    return { error: { code: err.code, message: err.message, ...err.details, job_id: rootId } };
  }

  /** GET /jobs/{id}: a chain or parallel root answers with the whole request's body; other jobs as before. */
  async jobStatus(caller: KeyCaller, jobId: string): Promise<{ status: number; body: unknown }> {
    const flow = await this.deps.flows.get(jobId);
    if (!flow) return this.deps.calls.jobStatus(caller, jobId);
    if (!ownsJob(caller, flow.keyId)) throw new AppError('not_found', `No job ${jobId} for this key`);
    const final = await this.final({ kind: 'flow', flow });
    if (final && !final.ok) throw final.error;
    if (final) return { status: 200, body: { job_id: jobId, status: 'completed', ...(final.body as object) } };
    const outcomes = await Promise.all(flow.steps.map((s) => this.readStep(s.jobId)));
    const steps = flow.steps.map((s, i) => ({ tool: s.tool, job_id: s.jobId, status: stepStatus(outcomes[i]!) }));
    const started = steps.some((s) => s.status !== 'queued');
    return { status: 200, body: { job_id: jobId, status: started ? 'running' : 'queued', mode: flow.mode, steps } };
  }

  private callOpts(req: ProtocolRequest, opts: ProtocolOptions) {
    return {
      requestId: opts.requestId,
      respondAsync: opts.respondAsync,
      edgeToken: opts.edgeToken ?? req.edgeToken,
      onJobId: opts.onJobId,
      ...(opts.callbackUrl ? { callbackUrl: opts.callbackUrl } : {}),
    };
  }

  /**
   * The inputs every step is queued with, validated: all of them for parallel, the first for a
   * chain (later ones come from the step before and are checked when they run). Needs no caller, so
   * a paid request is checked before any payment is asked for.
   */
  prepare(req: ProtocolRequest, edgeToken: string | undefined): Array<Record<string, unknown>> {
    const { calls } = this.deps;
    if (req.mode === 'direct') return [calls.prepare(req.tool, qInput(req.tool, req.q), edgeToken ?? req.edgeToken)];
    const { mode, tools, q } = req;
    edgeToken ??= req.edgeToken;
    // Every step's needs, not only the first's: a chain must not run its first steps and then find
    // a later one cannot run here.
    for (const tool of tools) assertNeedsMet(tool, this.deps.config);
    if (tools.some((t) => t.needsEdgeToken)) assertEdgeToken(edgeToken);
    return tools.map((tool, i) => {
      if (mode === 'parallel' || i === 0) return calls.prepare(tool, qInput(tool, q), edgeToken);
      if (tool.needsEdgeToken && !edgeToken) {
        throw new AppError(
          'invalid_input',
          `${tool.name} (chain step ${i + 1}) needs your Cloudflare API token: send it in the X-Edge-Token header (or as edge_token in the body)`,
          {
            issues: [{ path: ['X-Edge-Token'], message: 'required' }],
          },
        );
      }
      return {};
    });
  }

  /**
   * Admission and enqueue of a chain or parallel request as one flow. A chain nests its steps (the
   * last tool is the root, the first the deepest child; a failing step fails its parents, so later
   * steps never run). A parallel request hangs every tool under a no-op root that waits for all.
   */
  private async launch(caller: Caller, req: FlowRequest, opts: ProtocolOptions, beforeAdd?: (flow: FlowRecord) => void): Promise<FlowRecord> {
    const { calls, queues, flows } = this.deps;
    const { mode, tools } = req;
    const edgeToken = opts.edgeToken ?? req.edgeToken;
    const n = tools.length;
    for (const tool of tools) authorizeTool(caller, tool);
    const inputs = this.prepare(req, edgeToken);

    const rootId = mode === 'chain' ? newJobId(tools[n - 1]!.family) : newJobId('core');
    const ids = tools.map((t, i) => (mode === 'chain' && i === n - 1 ? rootId : newJobId(t.family)));
    const steps: FlowStep[] = tools.map((tool, i) => {
      const data: CallJobData = { ...calls.jobData(caller, tool, inputs[i]!, opts.requestId, edgeToken), eventLog: rootId };
      if (mode === 'chain' && i > 0) data.qFromPrevious = true;
      if (mode === 'chain' && i < n - 1) data.laterSteps = ids.slice(i + 1);
      return { jobId: ids[i]!, family: tool.family, data };
    });
    await calls.reserve(caller, steps, undefined, rootId);

    const keys = mode === 'parallel' ? resultKeys(tools.map((t) => t.name)) : tools.map((t) => t.name);
    const key = caller.kind === 'key' ? caller : null;
    // A payer's flow has no owner key, so no GET /jobs can read it: payers only get the synchronous answer.
    const flow: FlowRecord = {
      mode,
      rootId,
      keyId: key?.keyId ?? null,
      accountId: key?.accountId ?? null,
      sandbox: key?.sandbox ?? false,
      steps: steps.map((s, i) => ({ tool: tools[i]!.name, jobId: s.jobId, key: keys[i]! })),
    };
    try {
      if (opts.onJobId) for (const id of [rootId, ...ids.filter((id) => id !== rootId)]) await opts.onJobId(id);
      await flows.put(flow);
      // Before the flow is queued: a request whose callback cannot be watched is not run at all.
      if (opts.callbackUrl && key && this.deps.webhooks) await this.deps.webhooks.watch(rootId, key.accountId, opts.callbackUrl);
      beforeAdd?.(flow);
      await queues.addFlow(mode === 'chain' ? this.chainTree(steps) : this.parallelTree(rootId, steps, caller, opts.requestId));
    } catch {
      await calls.release(caller, ids);
      await flows.delete(rootId).catch(() => {});
      throw new AppError('service_unavailable', 'Could not queue the request; nothing was charged', {}, { retryable: true });
    }
    return flow;
  }

  private chainTree(steps: FlowStep[]) {
    const { queues } = this.deps;
    let node: ReturnType<JobQueues['flowNode']> | undefined;
    steps.forEach((step, i) => {
      const last = i === steps.length - 1;
      node = queues.flowNode(step, node ? [node] : undefined, last ? {} : { failParentOnFailure: true });
    });
    return node!;
  }

  private parallelTree(rootId: string, steps: FlowStep[], caller: Caller, requestId: string) {
    const { queues } = this.deps;
    const children = steps.map((s) => queues.flowNode(s, undefined, { ignoreDependencyOnFailure: true }));
    const key = caller.kind === 'key' ? caller : null;
    const data: CallJobData = {
      tool: PARALLEL_ROOT_JOB,
      input: {},
      accountId: key?.accountId ?? null,
      keyId: key?.keyId ?? null,
      subKeyId: key?.subKey?.keyId ?? null,
      agentName: key?.agentName ?? null,
      payer: caller.kind === 'payer' ? caller.payer : null,
      priceCents: 0,
      listPriceCents: 0,
      sandbox: key?.sandbox ?? false,
      requestId,
    };
    return queues.flowNode({ jobId: rootId, family: 'core', data }, children);
  }

  private async readStep(jobId: string): Promise<StepOutcome> {
    const view = await this.deps.queues.view(jobId).catch(() => null);
    if (view?.state === 'pending') return { state: 'pending', status: view.status };
    if (view?.state === 'failed') return { state: 'failed', error: view.error };
    if (view?.state === 'completed' && view.value) return { state: 'completed', value: view.value };
    // Jobs that carried an edge token are deleted when they finish; their outcome is kept apart.
    const rec = await this.deps.records.get(jobId);
    if (rec?.state === 'completed' && rec.value) return { state: 'completed', value: rec.value };
    if (rec?.state === 'failed' && rec.error) return { state: 'failed', error: AppError.fromJSON(rec.error) };
    // Redis no longer holds the job (finished jobs stay JOB_REDIS_RETENTION_SECONDS): a step made with a key has its outcome in job_results.
    const stored = await this.deps.results?.get(jobId);
    if (stored?.status === 'completed') return { state: 'completed', value: storedAnswer(stored) };
    if (stored) return { state: 'failed', error: AppError.fromJSON(stored.body as unknown as SerializedError) };
    return { state: 'missing' };
  }

  /** The answer of a finished flow, from each step's outcome. A failed chain also frees the holds of steps that never ran. */
  private async flowFinal(flow: FlowRecord, outcomes: StepOutcome[]): Promise<Final> {
    const sandbox = flow.sandbox ? { sandbox: true as const } : {};
    if (flow.mode === 'parallel') {
      const results: Record<string, { result: unknown; cost_cents: number } | { error: Record<string, unknown> }> = {};
      let cost = 0;
      let remaining: number | null = null;
      flow.steps.forEach((s, i) => {
        const o = outcomes[i]!;
        if (o.state === 'completed') {
          results[s.key] = { result: o.value.result, cost_cents: o.value.cost_cents };
          cost += o.value.cost_cents;
          // Steps settle concurrently: the lowest balance reported is the one after all of them.
          if (o.value.remaining_credits !== null) remaining = Math.min(remaining ?? Infinity, o.value.remaining_credits);
        } else {
          results[s.key] = { error: stepError(o.state === 'failed' ? o.error : lostOutcome(s.tool)) };
        }
      });
      return { ok: true, body: { results, cost_cents: cost, remaining_credits: remaining ?? (await this.balance(flow)), ...sandbox } };
    }

    const k = outcomes.findIndex((o) => o.state !== 'completed');
    const done = (k < 0 ? outcomes : outcomes.slice(0, k)) as Array<Extract<StepOutcome, { state: 'completed' }>>;
    const steps: StepSummary[] = done.map((o, i) => ({ tool: flow.steps[i]!.tool, result: o.value.result, cost_cents: o.value.cost_cents }));
    const cost = steps.reduce((s, x) => s + x.cost_cents, 0);
    const last = done[done.length - 1]?.value;
    const remaining = last && last.remaining_credits !== null ? last.remaining_credits : await this.balance(flow);
    if (k < 0) return { ok: true, body: { steps, result: last!.result, cost_cents: cost, remaining_credits: remaining, ...sandbox } };

    // The failing step's worker gave back its own hold and those after it; this covers a worker that died.
    if (flow.accountId)
      await this.deps.credits.release(
        flow.accountId,
        flow.steps.slice(k).map((s) => s.jobId),
      );
    const failed = flow.steps[k]!;
    const o = outcomes[k]!;
    const err = o.state === 'failed' ? o.error : lostOutcome(failed.tool);
    const n = flow.steps.length;
    const notes = [`Chain step ${k + 1} of ${n} (${failed.tool}) failed: ${err.message}`];
    if (k > 0) notes.push(`${plural(k, 'earlier step')} completed and ${k > 1 ? 'are' : 'is'} charged`);
    if (k < n - 1) notes.push(`${plural(n - k - 1, 'later step')} did not run and ${n - k - 1 > 1 ? 'are' : 'is'} not charged`);
    const error = new AppError(
      err.code,
      notes.join('; '),
      {
        job_id: flow.rootId,
        failed_step: { index: k, tool: failed.tool, job_id: failed.jobId, error: stepError(err) },
        steps,
        cost_cents: cost,
        remaining_credits: remaining,
        ...sandbox,
      },
      { headers: { 'x-job-id': flow.rootId } },
    );
    return { ok: false, error };
  }

  private async balance(flow: FlowRecord): Promise<number | null> {
    return flow.accountId ? this.deps.accounts.credits(flow.accountId) : null;
  }
}

/**
 * Whether a flow's answer is known: a chain's once its last step completed or any step failed (the
 * steps after it will never run), a parallel request's once every tool finished. The answer does not
 * wait for BullMQ to fail a chain's later steps or to run a parallel request's root.
 */
function flowDone(flow: FlowRecord, outcomes: Array<StepOutcome | undefined>): boolean {
  const finished = (o: StepOutcome | undefined) => !!o && o.state !== 'pending';
  if (flow.mode === 'parallel') return outcomes.every(finished);
  return outcomes.some((o) => o?.state === 'failed' || o?.state === 'missing') || outcomes[outcomes.length - 1]?.state === 'completed';
}

/**
 * For a payer: the error that fails a flow with any failed step, or null when every step succeeded.
 * An x402 `exact` payment settles whole or not at all, so a partial answer would be either
 * overcharged or free: the error names the failing step but carries no completed step's result.
 */
function allOrNothing(flow: FlowRecord, outcomes: StepOutcome[], final: Final): AppError | null {
  const n = flow.steps.length;
  const unpaid = 'the payment was not settled and nothing was charged';
  const headers = { 'x-job-id': flow.rootId };
  if (flow.mode === 'chain') {
    if (final.ok) return null;
    const failed = final.error.details.failed_step as { index: number; tool: string; error: { message: string } };
    return new AppError(
      final.error.code,
      `Chain step ${failed.index + 1} of ${n} (${failed.tool}) failed: ${failed.error.message}; ${unpaid}`,
      { job_id: flow.rootId, failed_step: failed },
      { headers },
    );
  }
  const failed = flow.steps.flatMap((s, index) => {
    const o = outcomes[index]!;
    return o.state === 'completed' ? [] : [{ index, tool: s.tool, key: s.key, job_id: s.jobId, err: o.state === 'failed' ? o.error : lostOutcome(s.tool) }];
  });
  const first = failed[0];
  if (!first) return null;
  const what =
    failed.length === 1
      ? `Parallel step ${first.index + 1} of ${n} (${first.tool}) failed: ${first.err.message}`
      : `${failed.length} of ${n} parallel steps failed, the first (${first.tool}): ${first.err.message}`;
  return new AppError(
    first.err.code,
    `${what}; ${unpaid}`,
    { job_id: flow.rootId, failed_steps: failed.map((f) => ({ index: f.index, tool: f.tool, key: f.key, job_id: f.job_id, error: stepError(f.err) })) },
    { headers },
  );
}

function lostOutcome(tool: string): AppError {
  return new AppError('internal_error', `The outcome of ${tool} is no longer available`);
}

function stepStatus(o: StepOutcome): string {
  if (o.state === 'pending') return o.status === 'active' ? 'running' : 'queued';
  return o.state === 'missing' ? 'unknown' : o.state;
}

function plural(n: number, word: string): string {
  return `${n} ${word}${n > 1 ? 's' : ''}`;
}

function accepted(jobId: string): ProtocolAnswer {
  const statusUrl = `/jobs/${jobId}`;
  return { status: 202, headers: { 'x-job-id': jobId, location: statusUrl }, body: { job_id: jobId, status: 'queued', status_url: statusUrl } };
}

function fromCallAnswer(a: CallAnswer): ProtocolAnswer {
  if (a.status === 202) return { status: 202, headers: { 'x-job-id': a.jobId, location: a.body.status_url }, body: a.body };
  return { status: 200, headers: { 'x-job-id': a.jobId }, body: a.body };
}
