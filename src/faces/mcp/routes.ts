import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';
import type { Config } from '../../config.js';
import { AppError, isAppError } from '../../errors.js';
import type { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { createMcpServer } from './server.js';
import { McpQuery, readNarrowing } from './narrowing.js';
import { ToolSetsRepo } from '../../access/tool-sets.js';
import { rateLimitHeaders } from '../../access/rate-limit.js';
import { isJsonTooDeep, jsonBodyParser } from '../http/plugins/json-body.js';
import { isUnsupportedCharacter } from '../http/plugins/input-guard.js';
import { edgeTokenHeader } from '../http/answers.js';
import { mcpResource, resourceMetadataUrl } from '../http/oauth.js';
import { OAUTH_SCOPE } from '../../access/oauth.js';
import { ErrorSchema, RATE_LIMIT } from '../http/openapi-components.js';
import { empty, errors, named, ok, type ResponseDoc, type RouteSchema } from '../http/route-schema.js';

/** /mcp checks origins itself: the global CORS handling (src/faces/http/openapi.ts) skips its routes. */
const NO_GLOBAL_CORS = { config: { cors: false } } as const;

const JsonRpcId = z.union([z.string(), z.number().int()]);

const JsonRpcMessageSchema = named(
  'JsonRpcMessage',
  z
    .object({
      jsonrpc: z.literal('2.0'),
      id: JsonRpcId.nullable().optional().describe('Requests and their answers; a notification has none.'),
      method: z.string().optional().describe('Requests and notifications: initialize, tools/list, tools/call, ping...'),
      params: z.record(z.unknown()).optional(),
      result: z.record(z.unknown()).optional().describe('An answer that succeeded.'),
      error: z.object({ code: z.number().int(), message: z.string(), data: z.unknown().optional() }).optional().describe('An answer that failed.'),
    })
    .passthrough()
    .describe('A JSON-RPC 2.0 request, notification or answer.'),
);

export const JsonRpcSchema = named(
  'JsonRpc',
  z.union([JsonRpcMessageSchema, z.array(JsonRpcMessageSchema)]).describe('A JSON-RPC 2.0 message or batch (MCP Streamable HTTP, stateless).'),
);

export const JsonRpcErrorSchema = named(
  'JsonRpcError',
  z
    .object({
      jsonrpc: z.literal('2.0'),
      id: z.null(),
      error: z.object({
        code: z.number().int().describe('-32700 parse error, -32600 invalid request, -32603 internal error, -32000 the transport refused the request.'),
        message: z.string(),
        data: z.unknown().optional(),
      }),
    })
    .describe('A JSON-RPC error answering the whole HTTP request.'),
);

/** An answer that is either the service's error envelope (before the MCP transport) or a JSON-RPC error (from it). */
export const eitherError = (description: string): ResponseDoc => ({
  description,
  content: { 'application/json': { schema: { oneOf: [{ $ref: '#/components/schemas/Error' }, { $ref: '#/components/schemas/JsonRpcError' }] } } },
});

/** Marks a body that was not JSON, so the answer can be JSON-RPC's parse error after authentication. */
const NOT_JSON = Symbol('not json');
/** Marks a body nested past MAX_JSON_DEPTH: refused as an Invalid Request after authentication. */
const TOO_DEEP = Symbol('too deep');
/** Marks a body with U+0000 or an unpaired surrogate in a string (src/db/pg-text.ts): an Invalid Request. */
const UNSUPPORTED = Symbol('unsupported character');

export function invalidRequest(reply: FastifyReply, message: string) {
  return reply.status(400).send({ jsonrpc: '2.0', id: null, error: { code: -32600, message: `Invalid Request: ${message}` } });
}

const LOOPBACK = new Set(['localhost', '127.0.0.1', '[::1]']);

/** An IP literal cannot be re-pointed by DNS, so a Host naming one cannot come from a rebinding attack. */
function isIpLiteral(hostname: string): boolean {
  return /^\d{1,3}(\.\d{1,3}){3}$/.test(hostname) || hostname.startsWith('[');
}

/**
 * DNS-rebinding protection for a service that may listen on a loopback or private address. A browser
 * tricked by rebinding sends `Origin` and `Host` that both name the attacker's domain, so "Origin
 * matches Host" proves nothing; an origin is accepted only when it is one the service knows as its
 * own: listed in MCP_ALLOWED_ORIGINS, PUBLIC_BASE_URL's origin, or the same host reached through a
 * name DNS cannot re-point (loopback or an IP literal). Requests without Origin are not from a
 * browser page (browsers always send it on POST), so they are not subject to the check.
 */
export function originChecker(config: Config): (origin: string | undefined, host: string | undefined) => boolean {
  const allowed = new Set(
    config.MCP_ALLOWED_ORIGINS.map((o) => {
      try {
        return new URL(o).origin;
      } catch {
        throw new Error(`MCP_ALLOWED_ORIGINS: "${o}" is not an origin like https://app.example.com`);
      }
    }),
  );
  const publicOrigin = config.PUBLIC_BASE_URL ? new URL(config.PUBLIC_BASE_URL).origin : null;
  return (origin, host) => {
    if (origin === undefined) return true;
    let url: URL;
    try {
      url = new URL(origin);
    } catch {
      return false; // includes the opaque origin "null"
    }
    if (allowed.has(url.origin) || url.origin === publicOrigin) return true;
    const sameHost = !!host && url.host === host.toLowerCase();
    return sameHost && (LOOPBACK.has(url.hostname) || isIpLiteral(url.hostname));
  };
}

function header(req: FastifyRequest, name: string): string | undefined {
  const v = req.headers[name];
  return typeof v === 'string' ? v : undefined;
}

/** Streamable HTTP (stateless) MCP endpoint: a fresh server and transport per POST. */
export async function mcpRoutes(app: FastifyInstance): Promise<void> {
  const { calls, dispatcher, idempotency, limiter } = app.container.api!;
  const toolSets = new ToolSetsRepo(app.container.pool);
  const { config } = app.container;
  const originAllowed = originChecker(config);

  installJsonRpcParser(app, config);

  // onRequest runs before the body is read: a foreign page or a caller without a key gets nothing more.
  app.addHook('onRequest', async (req, reply) => {
    guardOrigin(originAllowed, req, reply);
    if (req.method === 'POST') await authenticate(app, req, reply);
  });

  app.options(
    '/mcp',
    {
      ...NO_GLOBAL_CORS,
      schema: {
        operationId: 'mcpPreflight',
        tags: ['MCP'],
        summary: 'CORS preflight of /mcp',
        security: 'none',
        response: { '204': empty('Preflight answer.'), ...errors(['403'], { keyed: false }) },
        hide: 'CORS preflight of /mcp, answered by its own origin check instead of the global one',
      } satisfies RouteSchema,
    },
    async (_req, reply) =>
      reply
        .status(204)
        .header('access-control-allow-methods', 'POST')
        .header('access-control-allow-headers', 'authorization, content-type, accept, mcp-protocol-version, mcp-session-id, last-event-id, x-edge-token')
        .header('access-control-max-age', '600')
        .send(),
  );

  app.post(
    '/mcp',
    {
      ...NO_GLOBAL_CORS,
      schema: {
        operationId: 'mcp',
        tags: ['MCP'],
        summary: 'Model Context Protocol (Streamable HTTP, stateless)',
        description:
          'tools/list shows what your key may call; tools/call runs and charges like POST /tools/{name}. A fresh server per request: no session, no Mcp-Session-Id. ' +
          '?tools=, ?families= and ?set= narrow what this URL lists and may call (each given narrows; an unknown name: 400 invalid_input); ' +
          'tools/list pages by name, 50 tools a page (nextCursor). ' +
          'Send Accept: application/json, text/event-stream; Mcp-Protocol-Version is optional (an unsupported one: 400). A batch may hold at most MCP_MAX_BATCH messages, no more than ' +
          "the key's requests per minute (each counts against the rate limit) and at most one tools/call. A browser Origin must be the service's own or listed in " +
          'MCP_ALLOWED_ORIGINS (else 403, before the key is checked). An API key or an OAuth access token issued for /mcp (cv_oat_); a 401 carries WWW-Authenticate: Bearer resource_metadata="<base>/.well-known/oauth-protected-resource", where MCP clients start the OAuth flow.',
        parameters: ['Idempotency-Key', 'X-Edge-Token'],
        querystring: McpQuery,
        body: JsonRpcSchema,
        bodyExamples: {
          list: { summary: 'The tools this key may call', value: { jsonrpc: '2.0', id: 1, method: 'tools/list' } },
          call: {
            summary: 'Run compute',
            value: { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'compute', arguments: { expression: '6 * 7' } } },
          },
        },
        response: {
          '200': {
            description: 'The JSON-RPC answer (or batch of answers); Server-Sent Events when a tools/call asks for progress (params._meta.progressToken).',
            headers: RATE_LIMIT,
            content: {
              'application/json': { schema: JsonRpcSchema },
              'text/event-stream': {
                schema: { type: 'string', description: 'Server-Sent Events, each `data:` a JsonRpcMessage: progress notifications, then the answer.' },
              },
            },
          },
          '202': empty('Only notifications or answers were sent: accepted, nothing to answer.', RATE_LIMIT),
          '400': eitherError(
            'invalid_input (Error): the query names an unknown tool, family or tool set. ' +
              'Parse error (-32700: not JSON, not JSON-RPC), invalid request (-32600: nested too deep, U+0000 or an unpaired surrogate in a string, a batch too large, two tools/calls in one request) or an unsupported Mcp-Protocol-Version (-32000).',
          ),
          ...errors(['403', '413']),
          '406': ok(JsonRpcErrorSchema, 'Accept must list both application/json and text/event-stream.'),
          '415': eitherError(
            'The body must be application/json: a media type the service does not read (Error), or one it reads that is not JSON (JsonRpcError).',
          ),
          '500': eitherError('Something went wrong on our side: before the MCP transport (Error) or in it (JsonRpcError -32603).'),
        },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      // The URL's narrowing first: a bad one is refused in the service's envelope, before the transport.
      const narrowing = await readNarrowing(req, req.caller!, toolSets);
      const refused = refuseMarkedBody(reply, req.body, config);
      if (refused) return refused;
      if (Array.isArray(req.body)) {
        const caller = req.caller!;
        const n = req.body.length;
        const limit = limiter.limitFor(caller.plan, caller.rpm);
        const why = batchRefusal(req.body, config, limit);
        if (why) return invalidRequest(reply, why);
        // Every message counts against the rate limit; authentication counted the first.
        if (n > 1) reply.headers(rateLimitHeaders(await limiter.hit(caller.accountId, limit, n - 1)));
      }
      const idempotencyKey = req.headers['idempotency-key'];
      const server = createMcpServer(
        { calls, dispatcher, idempotency, syncTimeoutMs: app.container.config.SYNC_TIMEOUT_MS },
        {
          caller: req.caller!,
          narrowing,
          requestId: req.id,
          edgeToken: edgeTokenHeader(req),
          log: req.log,
          ...(typeof idempotencyKey === 'string' ? { idempotencyKey } : {}),
        },
      );
      await serveMcp(req, reply, server);
    },
  );

  // Stateless: there is no server-to-client stream to GET and no session to DELETE.
  const notAllowed = async () => {
    throw new AppError('method_not_allowed', 'This MCP endpoint is stateless: POST JSON-RPC messages to /mcp', {}, { headers: { allow: 'POST' } });
  };
  const statelessSchema = (method: 'GET' | 'DELETE'): RouteSchema => ({
    operationId: method === 'GET' ? 'mcpStream' : 'mcpEndSession',
    tags: ['MCP'],
    summary: 'Not offered: the endpoint is stateless (405, Allow: POST)',
    description:
      method === 'GET'
        ? 'Streamable HTTP offers a GET stream of server messages; this stateless endpoint has none. No key needed to be told so.'
        : 'Streamable HTTP ends a session with DELETE; this stateless endpoint has no sessions. No key needed to be told so.',
    security: 'none',
    response: {
      '403': errors(['403'], { keyed: false })['403']!,
      '405': ok(ErrorSchema, 'method_not_allowed: POST JSON-RPC messages to /mcp (Allow: POST).'),
      '500': errors([], { keyed: false })['500']!,
    },
  });
  app.get('/mcp', { ...NO_GLOBAL_CORS, schema: statelessSchema('GET') }, notAllowed);
  app.delete('/mcp', { ...NO_GLOBAL_CORS, schema: statelessSchema('DELETE') }, notAllowed);
}

/**
 * An API key, or an OAuth access token issued for this /mcp (RFC 8707). A 401 carries
 * WWW-Authenticate with the protected resource metadata's URL (RFC 9728 §5.1), which is how an MCP
 * client finds the authorization server; `error="invalid_token"` when a credential was sent.
 */
async function authenticate(app: FastifyInstance, req: FastifyRequest, reply: FastifyReply): Promise<void> {
  try {
    await app.authenticate(req, reply, { audience: mcpResource(app, req) });
  } catch (e) {
    if (isAppError(e) && e.status === 401) {
      const challenge = [`Bearer resource_metadata="${resourceMetadataUrl(app, req)}"`, `scope="${OAUTH_SCOPE}"`];
      if (req.headers.authorization) challenge.push('error="invalid_token"');
      throw new AppError(e.code, e.message, e.details, { headers: { ...e.headers, 'www-authenticate': challenge.join(', ') } });
    }
    throw e;
  }
}

// --- Shared by every MCP endpoint (/mcp with a key, /mcp/x402 paid per call: src/faces/mcp/paid.ts) ---

/**
 * Parse errors must wait until after authentication and must come back as JSON-RPC errors, so the
 * body is parsed in the endpoint's plugin scope by the app's one JSON parser (depth cap,
 * prototype-poisoning protection), its failures kept as markers for refuseMarkedBody to answer.
 */
export function installJsonRpcParser(app: FastifyInstance, config: Config): void {
  const parseJson = jsonBodyParser(app, config.MAX_JSON_DEPTH);
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (req, body, done) => {
    parseJson(req, body as string, (err, value) =>
      done(null, err ? (isJsonTooDeep(err) ? TOO_DEEP : isUnsupportedCharacter(err) ? UNSUPPORTED : NOT_JSON) : value),
    );
  });
}

/** The JSON-RPC error for a body installJsonRpcParser could not take, or undefined for a good one. */
export function refuseMarkedBody(reply: FastifyReply, body: unknown, config: Config): FastifyReply | undefined {
  if (body === NOT_JSON) {
    return reply.status(400).send({ jsonrpc: '2.0', id: null, error: { code: -32700, message: 'Parse error: the body is not valid JSON' } });
  }
  if (body === TOO_DEEP) return invalidRequest(reply, `JSON body nests deeper than ${config.MAX_JSON_DEPTH} levels`);
  if (body === UNSUPPORTED) return invalidRequest(reply, 'a string or key contains U+0000 or an unpaired UTF-16 surrogate, which this service does not accept');
  return undefined;
}

/**
 * Why a batch is refused whole, before any message is handled (answers to a batch can be far larger
 * than it), or undefined. `perMinute`: the key's rate, when there is a key.
 */
export function batchRefusal(batch: unknown[], config: Config, perMinute?: number): string | undefined {
  const n = batch.length;
  if (n > config.MCP_MAX_BATCH) return `a batch may hold at most ${config.MCP_MAX_BATCH} messages; this one has ${n}`;
  if (perMinute !== undefined && n > perMinute) return `a batch of ${n} messages is more than this key's ${perMinute} requests per minute`;
  // A tools/call's admission and result belong to its one HTTP request (idempotency, payment, progress).
  if (batch.filter(isToolCall).length > 1) return 'send at most one tools/call per HTTP request';
  return undefined;
}

/** DNS-rebinding protection (originChecker) for an MCP endpoint's onRequest, and CORS for an allowed origin. */
export function guardOrigin(originAllowed: ReturnType<typeof originChecker>, req: FastifyRequest, reply: FastifyReply): void {
  const origin = header(req, 'origin');
  if (!originAllowed(origin, header(req, 'host'))) {
    throw new AppError(
      'forbidden',
      `Origin ${origin} may not call ${req.url.split('?')[0]} (DNS-rebinding protection); the operator can list it in MCP_ALLOWED_ORIGINS`,
    );
  }
  if (origin !== undefined) {
    // An allowed browser origin needs CORS to read the answer.
    reply.header('access-control-allow-origin', origin).header('vary', 'Origin');
    reply.header('access-control-expose-headers', 'mcp-session-id, mcp-protocol-version, x-request-id, www-authenticate');
  }
}

/** Answers the request with a fresh MCP server over a stateless Streamable HTTP transport. */
export async function serveMcp(req: FastifyRequest, reply: FastifyReply, server: Server): Promise<void> {
  const transport = new StreamableHTTPServerTransport({
    sessionIdGenerator: undefined,
    // Plain JSON answers unless a tools/call asks for progress, which needs the SSE form to arrive.
    enableJsonResponse: !asksForProgress(req.body),
  });
  // The SDK writes the response itself; carry over what Fastify would have added (request id,
  // rate-limit and CORS headers) since its onSend hooks will not run.
  reply.hijack();
  for (const [k, v] of Object.entries(reply.getHeaders())) if (v !== undefined) reply.raw.setHeader(k, v);
  reply.raw.setHeader('x-request-id', req.id);
  reply.raw.on('close', () => {
    void transport.close();
    void server.close();
  });
  try {
    await server.connect(transport);
    await transport.handleRequest(req.raw, reply.raw, req.body);
  } catch (err) {
    req.log.error({ err }, 'MCP request failed');
    if (!reply.raw.headersSent) {
      reply.raw.writeHead(500, { 'content-type': 'application/json' });
      reply.raw.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32603, message: 'Internal error' } }));
    } else reply.raw.end();
  }
}

function isToolCall(m: unknown): boolean {
  return (m as { method?: unknown } | null)?.method === 'tools/call';
}

function asksForProgress(body: unknown): boolean {
  const messages = Array.isArray(body) ? body : [body];
  return messages.some((m) => {
    const msg = m as { params?: { _meta?: { progressToken?: unknown } } } | null;
    return isToolCall(m) && msg?.params?._meta?.progressToken !== undefined;
  });
}
