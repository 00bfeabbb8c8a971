import type { FastifyInstance } from 'fastify';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { CallToolRequestSchema, ErrorCode, ListToolsRequestSchema, McpError, type CallToolResult, type Tool } from '@modelcontextprotocol/sdk/types.js';
import { AppError, isAppError } from '../../errors.js';
import type { Config } from '../../config.js';
import { Idempotency, type StoredResponse } from '../../calls/idempotency.js';
import type { CallService } from '../../calls/admission.js';
import { takeEdgeToken } from '../../calls/admission.js';
import { API_VERSION } from '../../calls/catalogue.js';
import type { PayPerCall } from '../../calls/pay-per-call.js';
import type { CallResult } from '../../queue/call-job.js';
import { TOOLS, findTool } from '../../tools/index.js';
import type { AnyTool } from '../../tools/types.js';
import { MCP_PAYMENT_META_KEY, centsToUsd, isPaymentError, networkProfile, paymentIdentifierDeclaration, paymentRequiredV2 } from '../../pay/x402/index.js';
import { edgeTokenHeader } from '../http/answers.js';
import { runPaidToolCall, soldPerCall } from '../http/paid-calls.js';
import { empty, errors, ok, type RouteSchema } from '../http/route-schema.js';
import { ErrorSchema } from '../http/openapi-components.js';
import {
  JsonRpcErrorSchema,
  JsonRpcSchema,
  batchRefusal,
  eitherError,
  guardOrigin,
  installJsonRpcParser,
  invalidRequest,
  originChecker,
  refuseMarkedBody,
  serveMcp,
} from './routes.js';
import { failure, mcpTool, success } from './server.js';

/**
 * x402 pay-per-call over MCP (x402 specs/transports-v2/mcp.md) on its own endpoint, POST /mcp/x402:
 * /mcp needs credentials (a 401 there starts an MCP host's OAuth), so callers without any come here.
 * Stateless Streamable HTTP like /mcp, with its origin check, JSON guards and batch rules.
 *
 *   tools/list  the tools HTTP sells per call (paid, no side effects), each with its x402 price
 *   tools/call  without `_meta["x402/payment"]`: an isError result whose structuredContent is the
 *               PaymentRequired (content[0].text the same as JSON); with one: PayPerCall verifies it,
 *               runs the tool, settles exactly as POST /tools/{name} does, and returns the result with
 *               `_meta["x402/payment-response"]` (the SettlementResponse).
 */

/** The `_meta` key of the settlement on a paid result. */
export const MCP_PAYMENT_RESPONSE_META_KEY = 'x402/payment-response';

const PATH = '/mcp/x402';

const INSTRUCTIONS =
  'Tools of the Tollgate service, paid per call with x402 (no account, no key): a tools/call without payment returns ' +
  'isError with the x402 PaymentRequired in structuredContent; sign it and repeat the call with the PaymentPayload in ' +
  '_meta["x402/payment"]. Only successful calls are settled. Add a payment-identifier id to retry a call safely.';

/** Who is asking: nobody, known only by the payment each call carries. */
interface PaidMcpContext {
  requestId: string;
  edgeToken?: string;
  idempotencyKey?: string;
  log: { error(obj: object, msg: string): void; debug(obj: object, msg: string): void };
}

interface PaidMcpDeps {
  config: Config;
  calls: CallService;
  payPerCall: PayPerCall;
}

/** The resource a tool's payment is for, as x402's MCP transport names it. */
export function mcpResource(tool: Pick<AnyTool, 'name'>): string {
  return `mcp://tool/${tool.name}`;
}

/** A sold tool as tools/list shows it here: the MCP entry, priced in USDC and in x402's own terms. */
function paidTool(config: Config, tool: AnyTool): Tool {
  const entry = mcpTool(tool);
  const offer = paymentRequiredV2(config, { priceCents: tool.priceCents, resource: mcpResource(tool), description: tool.description }, '');
  return {
    ...entry,
    description: `${tool.description} Price: ${centsToUsd(tool.priceCents)} USDC per successful call, paid with x402 on ${networkProfile(config).caip2}.`,
    _meta: { ...entry._meta, 'x402/accepts': offer.accepts, 'x402/extensions': paymentIdentifierDeclaration() },
  };
}

export function createPaidMcpServer(deps: PaidMcpDeps, ctx: PaidMcpContext): Server {
  const server = new Server(
    { name: 'tollgate', title: 'Tollgate (x402)', version: API_VERSION },
    { capabilities: { tools: { listChanged: false } }, instructions: INSTRUCTIONS },
  );

  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS.filter(soldPerCall).map((t) => paidTool(deps.config, t)) }));

  server.setRequestHandler(CallToolRequestSchema, async (request): Promise<CallToolResult> => {
    const { name } = request.params;
    const tool = findTool(name);
    if (!tool) throw new McpError(ErrorCode.InvalidParams, `Unknown tool: ${name}. tools/list shows the tools sold per call.`);
    const args = request.params.arguments ?? {};
    try {
      const out = await runPaidToolCall(deps.calls, deps.payPerCall, {
        tool,
        input: args,
        edgeToken: ctx.edgeToken,
        requestId: ctx.requestId,
        resource: mcpResource(tool),
        payment: { mcpMeta: request.params._meta?.[MCP_PAYMENT_META_KEY] },
        idempotency: {
          ...(ctx.idempotencyKey !== undefined ? { key: ctx.idempotencyKey } : {}),
          // The edge token is never part of what is hashed or stored.
          fingerprint: Idempotency.fingerprint('MCP', `tools/call ${tool.name}`, takeEdgeToken(args).input),
        },
      });
      return paidResult(out);
    } catch (e) {
      if (isAppError(e)) return paidFailure(e);
      // The SDK would send the error's own message to the client; internals stay in the log.
      ctx.log.error({ err: e, tool: name }, 'MCP x402 tools/call failed');
      throw new McpError(ErrorCode.InternalError, `Something went wrong on our side; request id ${ctx.requestId} helps us find it`);
    }
  });

  server.onerror = (err) => ctx.log.debug({ err: err.message }, 'MCP transport error');
  return server;
}

/** A settled call (or its replay under a payment identifier or Idempotency-Key) as a tool result. */
function paidResult(out: StoredResponse & { replayed: boolean }): CallToolResult {
  const replayed = out.replayed ? { 'tollgate/replayed': true } : {};
  if (out.status >= 400) {
    // A stored failure (the first attempt's answer), in the form a live one has.
    const { code, message, request_id: _first, ...details } = (out.body as { error: Record<string, unknown> }).error;
    const result = paidFailure(AppError.fromJSON({ code: String(code), message: String(message), details }));
    return { ...result, _meta: { ...result._meta, ...replayed } };
  }
  const settlement = out.headers['PAYMENT-RESPONSE'];
  return {
    ...success(out.body as CallResult),
    _meta: { ...(settlement ? { [MCP_PAYMENT_RESPONSE_META_KEY]: fromBase64Json(settlement) } : {}), ...replayed },
  };
}

/**
 * Payment refusals (none, invalid, already used, settlement failed) are the PaymentRequired, in
 * structuredContent and as content[0].text, as the transport specification asks; the code and reason
 * ride in `_meta["tollgate/error"]`. Every other failure is a tool error result like on /mcp.
 */
function paidFailure(err: AppError): CallToolResult {
  if (!isPaymentError(err) || !err.headers['PAYMENT-REQUIRED']) return failure(err);
  const required = fromBase64Json(err.headers['PAYMENT-REQUIRED']) as Record<string, unknown>;
  const { x402Version: _v, accepts: _a, ...details } = err.details;
  return {
    isError: true,
    structuredContent: required,
    content: [{ type: 'text', text: JSON.stringify(required) }],
    _meta: { 'tollgate/error': { code: err.code, ...details } },
  };
}

function fromBase64Json(value: string): unknown {
  return JSON.parse(Buffer.from(value, 'base64').toString('utf8'));
}

/** POST /mcp/x402: the paid MCP endpoint. With x402 off it answers 404; a request carrying credentials is refused. */
export async function paidMcpRoutes(app: FastifyInstance): Promise<void> {
  const { config } = app.container;
  const originAllowed = originChecker(config);
  installJsonRpcParser(app, config);

  app.addHook('onRequest', async (req, reply) => {
    guardOrigin(originAllowed, req, reply);
    if (req.method !== 'POST') return;
    if (!app.container.api?.payPerCall) {
      throw new AppError('not_found', `Pay-per-call is off on this service (X402_ENABLED), so ${PATH} serves nothing; use /mcp with an API key`);
    }
    // A key (or token) here would be ignored and the call paid anyway: say where it belongs instead.
    if (req.headers.authorization !== undefined) {
      throw new AppError(
        'invalid_input',
        `${PATH} is paid per call with x402 and takes no credentials: send your API key or token to /mcp, or drop the Authorization header to pay per call here`,
      );
    }
  });

  app.options(
    PATH,
    {
      config: { cors: false },
      schema: {
        operationId: 'mcpX402Preflight',
        tags: ['MCP'],
        summary: `CORS preflight of ${PATH}`,
        security: 'none',
        response: { '204': empty('Preflight answer.'), ...errors(['403'], { keyed: false }) },
        hide: `CORS preflight of ${PATH}, answered by its own origin check instead of the global one`,
      } satisfies RouteSchema,
    },
    async (_req, reply) =>
      reply
        .status(204)
        .header('access-control-allow-methods', 'POST')
        .header('access-control-allow-headers', 'content-type, accept, mcp-protocol-version, idempotency-key, x-edge-token')
        .header('access-control-max-age', '600')
        .send(),
  );

  app.post(
    PATH,
    {
      config: { cors: false },
      schema: {
        operationId: 'mcpX402',
        tags: ['MCP'],
        summary: 'Model Context Protocol paid per call with x402 (Streamable HTTP, stateless, no key)',
        description:
          'tools/list shows the tools sold per call (paid, without side effects) with their x402 price in _meta["x402/accepts"]. tools/call without ' +
          '_meta["x402/payment"] answers an isError result whose structuredContent is the x402 PaymentRequired (version 2, the payment-identifier ' +
          'extension declared); with a payment it verifies it, runs the tool, settles as POST /tools/{name} does and returns the result with ' +
          '_meta["x402/payment-response"]. A payment-identifier id makes a retry of the same payment answer the first result without settling ' +
          'again. Same transport rules as /mcp (origin check, at most MCP_MAX_BATCH messages and one tools/call per request). An Authorization ' +
          'header is refused (400): keys go to /mcp.',
        security: 'none',
        parameters: ['Idempotency-Key', 'X-Edge-Token'],
        body: JsonRpcSchema,
        bodyExamples: {
          list: { summary: 'The tools sold per call', value: { jsonrpc: '2.0', id: 1, method: 'tools/list' } },
          ask: {
            summary: 'Ask the price of compute (no payment yet)',
            value: { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'compute', arguments: { expression: '6 * 7' } } },
          },
        },
        response: {
          '200': {
            description: 'The JSON-RPC answer (or batch of answers); Server-Sent Events when a tools/call asks for progress.',
            content: {
              'application/json': { schema: JsonRpcSchema },
              'text/event-stream': { schema: { type: 'string', description: 'Server-Sent Events, each `data:` a JsonRpcMessage.' } },
            },
          },
          '202': empty('Only notifications or answers were sent: accepted, nothing to answer.'),
          '400': eitherError(
            'An Authorization header (Error: invalid_input), or a JSON-RPC parse error, invalid request (nested too deep, bad characters, ' +
              'a batch too large, two tools/calls in one request) or unsupported Mcp-Protocol-Version (JsonRpcError).',
          ),
          ...errors(['403', '404', '413'], { keyed: false }),
          '406': ok(JsonRpcErrorSchema, 'Accept must list both application/json and text/event-stream.'),
          '415': eitherError('The body must be application/json.'),
          '500': eitherError('Something went wrong on our side: before the MCP transport (Error) or in it (JsonRpcError -32603).'),
        },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const refused = refuseMarkedBody(reply, req.body, config);
      if (refused) return refused;
      if (Array.isArray(req.body)) {
        const why = batchRefusal(req.body, config);
        if (why) return invalidRequest(reply, why);
      }
      const { calls, payPerCall } = app.container.api!;
      const idempotencyKey = req.headers['idempotency-key'];
      const server = createPaidMcpServer(
        { config, calls, payPerCall: payPerCall! },
        {
          requestId: req.id,
          edgeToken: edgeTokenHeader(req),
          log: req.log,
          ...(typeof idempotencyKey === 'string' ? { idempotencyKey } : {}),
        },
      );
      await serveMcp(req, reply, server);
    },
  );

  // Stateless, as /mcp: no server-to-client stream to GET, no session to DELETE.
  const notAllowed = async () => {
    throw new AppError('method_not_allowed', `This MCP endpoint is stateless: POST JSON-RPC messages to ${PATH}`, {}, { headers: { allow: 'POST' } });
  };
  const statelessSchema = (method: 'GET' | 'DELETE'): RouteSchema => ({
    operationId: method === 'GET' ? 'mcpX402Stream' : 'mcpX402EndSession',
    tags: ['MCP'],
    summary: 'Not offered: the endpoint is stateless (405, Allow: POST)',
    security: 'none',
    response: {
      '403': errors(['403'], { keyed: false })['403']!,
      '405': ok(ErrorSchema, `method_not_allowed: POST JSON-RPC messages to ${PATH} (Allow: POST).`),
      '500': errors([], { keyed: false })['500']!,
    },
  });
  app.get(PATH, { config: { cors: false }, schema: statelessSchema('GET') }, notAllowed);
  app.delete(PATH, { config: { cors: false }, schema: statelessSchema('DELETE') }, notAllowed);
}
