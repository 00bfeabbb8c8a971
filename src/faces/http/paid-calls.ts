import type { FastifyReply, FastifyRequest } from 'fastify';
import { AppError, envelope } from '../../errors.js';
import { getTool } from '../../tools/index.js';
import { inputJsonSchema } from '../../calls/catalogue.js';
import { takeEdgeToken, type CallService } from '../../calls/admission.js';
import { Idempotency, type StoredResponse } from '../../calls/idempotency.js';
import type { PayPerCall, PaidRun } from '../../calls/pay-per-call.js';
import { isPaymentError, paymentErrorBody, type PaymentHeaders } from '../../pay/x402/index.js';
import type { AnyTool } from '../../tools/types.js';
import { answerResponse, edgeTokenHeader } from './answers.js';
import { baseUrl } from './meta.js';

/**
 * x402 pay-per-call for routes that run tools. A request without an Authorization header, while
 * X402_ENABLED, is paid per call; with a header it is a key call as always (a payment beside a
 * key is ignored).
 */
export function payPerCallFor(req: FastifyRequest): PayPerCall | undefined {
  return req.headers.authorization ? undefined : req.server.container.api?.payPerCall;
}

/** The request's payment headers: PAYMENT-SIGNATURE (x402 v2) and X-Payment (v1). */
export function paymentHeaders(req: FastifyRequest): PaymentHeaders {
  return { signature: req.headers['payment-signature'], xPayment: req.headers['x-payment'] };
}

/**
 * Tools that change something outside the service (a DNS record, a purge) are not sold per call: a
 * payment can fail to settle after the change is made, and an all-or-nothing request would then
 * have had the change for free. Refused before any payment is asked for, so nobody signs one.
 */
export function refuseSideEffects(tools: readonly Pick<AnyTool, 'name' | 'sideEffects'>[]): void {
  const writes = tools.filter((t) => t.sideEffects).map((t) => t.name);
  if (!writes.length) return;
  throw new AppError(
    'unauthorized',
    `${writes.join(', ')} ${writes.length === 1 ? 'changes' : 'change'} things outside this service and ${writes.length === 1 ? 'is' : 'are'} not sold per call: ` +
      'send an API key (Authorization: Bearer <key>). Pay-per-call is for tools without side effects.',
    { side_effect_tools: [...new Set(writes)] },
  );
}

/**
 * The request's fingerprint, and its Idempotency-Key when it has one. A payment carrying an x402
 * payment identifier is bound to the fingerprint (and then governs: the Idempotency-Key is not used).
 */
export function paidIdempotency(req: FastifyRequest): PaidRun['idempotency'] {
  const key = req.headers['idempotency-key'];
  return { ...(typeof key === 'string' ? { key } : {}), fingerprint: Idempotency.fingerprint(req.method, req.url, req.body) };
}

/** Whether a tool is sold per call: paid (free tools need a key) and without side effects (see above). */
export function soldPerCall(tool: Pick<AnyTool, 'priceCents' | 'sideEffects'>): boolean {
  return tool.priceCents > 0 && !tool.sideEffects;
}

/**
 * Free tools cannot be paid per call, so without a key they are 401 like every other endpoint that
 * cannot be paid: running them anonymously would bypass plan tiers and every rate limit.
 */
export function freeNeedsKey(what: string): AppError {
  return new AppError(
    'unauthorized',
    `${what} is free but needs an API key: send Authorization: Bearer <key>. Pay-per-call (X-Payment) is for paid tools only.`,
  );
}

export function sendPaid(req: FastifyRequest, reply: FastifyReply, out: StoredResponse & { replayed: boolean }) {
  let body = out.body;
  if (out.replayed) {
    reply.header('idempotent-replayed', 'true');
    if (out.status >= 400) {
      // Stored errors are in the envelope form; answer in the form a live one would have had.
      const { code, message, request_id: _first, ...details } = (out.body as { error: Record<string, unknown> }).error;
      const err = AppError.fromJSON({ code: String(code), message: String(message), details });
      body = isPaymentError(err) ? paymentErrorBody(err, req.id) : envelope(err, req.id);
    }
  }
  reply.headers(out.headers);
  return reply.status(out.status).send(body);
}

/** POST /tools/{name} without a key: 402 with the price, or run it for the payment in X-Payment. */
export async function sendPaidToolCall(req: FastifyRequest<{ Params: { name: string } }>, reply: FastifyReply, payPerCall: PayPerCall) {
  const tool = getTool(req.params.name);
  const out = await runPaidToolCall(req.server.container.api!.calls, payPerCall, {
    tool,
    input: req.body,
    edgeToken: edgeTokenHeader(req),
    requestId: req.id,
    resource: `${baseUrl(req.server, req)}/tools/${tool.name}`,
    payment: paymentHeaders(req),
    idempotency: paidIdempotency(req),
  });
  return sendPaid(req, reply, out);
}

export interface PaidToolCall {
  tool: AnyTool;
  /** The arguments as received (an edge_token among them is taken out before anything else). */
  input: unknown;
  /** The transport's edge token (X-Edge-Token), used when the arguments carry none. */
  edgeToken: string | undefined;
  requestId: string;
  /** What the payment is for: the route's URL over HTTP, mcp://tool/{name} over MCP. */
  resource: string;
  payment: PaymentHeaders;
  idempotency: PaidRun['idempotency'];
}

/**
 * One tool call paid per call, whatever the transport (POST /tools/{name}, MCP tools/call on
 * /mcp/x402): the same refusals before any price is quoted, the same money rules (PayPerCall).
 */
export async function runPaidToolCall(calls: CallService, payPerCall: PayPerCall, c: PaidToolCall): Promise<StoredResponse & { replayed: boolean }> {
  const { tool } = c;
  refuseSideEffects([tool]);
  if (tool.priceCents === 0) throw freeNeedsKey(tool.name);
  // Bad input is refused before any money is asked for.
  const taken = takeEdgeToken(c.input);
  const edgeToken = c.edgeToken ?? taken.edgeToken;
  calls.prepare(tool, taken.input, edgeToken);
  return payPerCall.run(
    {
      payment: c.payment,
      call: {
        tool: tool.name,
        priceCents: tool.priceCents,
        resource: c.resource,
        description: `${tool.name}: ${tool.description}`,
        // x402 discovery: how to call the resource and what it returns.
        outputSchema: { input: { type: 'http', method: 'POST', bodyType: 'json', bodyFields: inputJsonSchema(tool) }, output: { description: tool.output } },
      },
      idempotency: c.idempotency,
    },
    // Always synchronous: the result must be settled and returned on this response (no GET /jobs
    // without a key), so Prefer: respond-async does not apply.
    async (caller, track) => answerResponse(await calls.call(caller, tool.name, c.input, { requestId: c.requestId, edgeToken: c.edgeToken, onJobId: track })),
  );
}
