import type { FastifyReply, FastifyRequest } from 'fastify';
import { AppError, envelope } from '../../errors.js';
import { getTool } from '../../tools/index.js';
import { inputJsonSchema } from '../../calls/catalogue.js';
import { takeEdgeToken } from '../../calls/admission.js';
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

export function paidIdempotency(req: FastifyRequest): PaidRun['idempotency'] {
  const key = req.headers['idempotency-key'];
  return typeof key === 'string' ? { key, fingerprint: Idempotency.fingerprint(req.method, req.url, req.body) } : undefined;
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
  const { calls } = req.server.container.api!;
  const tool = getTool(req.params.name);
  refuseSideEffects([tool]);
  if (tool.priceCents === 0) throw freeNeedsKey(tool.name);
  // Bad input is refused before any money is asked for.
  const taken = takeEdgeToken(req.body);
  calls.prepare(tool, taken.input, edgeTokenHeader(req) ?? taken.edgeToken);
  const out = await payPerCall.run(
    {
      payment: paymentHeaders(req),
      call: {
        tool: tool.name,
        priceCents: tool.priceCents,
        resource: `${baseUrl(req.server, req)}/tools/${tool.name}`,
        description: `${tool.name}: ${tool.description}`,
        // x402 discovery: how to call the resource and what it returns.
        outputSchema: { input: { type: 'http', method: 'POST', bodyType: 'json', bodyFields: inputJsonSchema(tool) }, output: { description: tool.output } },
      },
      idempotency: paidIdempotency(req),
    },
    // Always synchronous: the result must be settled and returned on this response (no GET /jobs
    // without a key), so Prefer: respond-async does not apply.
    async (caller, track) =>
      answerResponse(await calls.call(caller, tool.name, req.body, { requestId: req.id, edgeToken: edgeTokenHeader(req), onJobId: track })),
  );
  return sendPaid(req, reply, out);
}
