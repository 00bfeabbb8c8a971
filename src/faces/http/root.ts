import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { AppError } from '../../errors.js';
import type { PayPerCall } from '../../calls/pay-per-call.js';
import { parseProtocolRequest, type ProtocolRequest, type ProtocolService } from '../../calls/protocol.js';
import { sendIdempotent } from './calls.js';
import { edgeTokenHeader, wantsAsync } from './answers.js';
import { baseUrl } from './meta.js';
import { freeNeedsKey, paidIdempotency, payPerCallFor, paymentHeaders, refuseSideEffects, sendPaid } from './paid-calls.js';
import { lastEventCursor, protocolServices, resumeEventStream, startEventStream } from './stream.js';
import { acceptCallback } from './webhooks.js';

/** POST /: the root protocol (direct, chain, parallel, stream). Shapes in src/calls/protocol.ts. */
export async function rootRoutes(app: FastifyInstance): Promise<void> {
  const { protocol } = protocolServices(app.container);
  // Chain and parallel requests with a callback are watched here until they end: this process can
  // assemble their body (src/calls/webhooks.ts, WEBHOOK_WATCH_QUEUE).
  app.container.webhooks?.startWatcher((rootId) => protocol.flowOutcome(rootId));

  app.post('/', async (req, reply) => {
    const paid = payPerCallFor(req);
    if (paid) return sendPaidRoot(req, reply, protocol, paid);
    const caller = await app.authenticate(req, reply);
    const at = lastEventCursor(req);
    if (at) return resumeEventStream(app, req, reply, caller, at);
    const request = parseProtocolRequest(req.body);
    // Callback-Url header or callback_url: accepted (charged request, allowed URL, a place among the
    // account's outstanding deliveries) before anything runs.
    const tools = () => (request.mode === 'direct' ? [request.tool] : request.tools);
    const callback = await acceptCallback(req, caller, tools, (req.body as { callback_url?: unknown }).callback_url);
    const opts = { requestId: req.id, edgeToken: edgeTokenHeader(req), respondAsync: wantsAsync(req), ...(callback ? { callbackUrl: callback.url } : {}) };
    const onJobId = (track?: (jobId: string) => Promise<void>) => (callback ? callback.track(track) : track);
    try {
      if (request.stream) return await startEventStream(app, req, reply, caller, (track) => protocol.start(caller, request, { ...opts, onJobId: onJobId(track) }));
      return await sendIdempotent(req, reply, caller, (track) => protocol.answer(caller, request, { ...opts, onJobId: onJobId(track) }));
    } finally {
      await callback?.done();
    }
  });
}

const STREAM_NEEDS_KEY =
  'is not available with pay-per-call: a payment is settled before its result is returned, so the result comes as one response. ' +
  'Send the request without stream (and without Last-Event-ID), or use an API key: Authorization: Bearer <key>.';

/**
 * POST / without a key: 402 with the price of the whole request (every step), or run it for the
 * payment (PAYMENT-SIGNATURE or X-Payment). All or nothing: a step that fails fails the request and nothing is charged.
 */
async function sendPaidRoot(req: FastifyRequest, reply: FastifyReply, protocol: ProtocolService, payPerCall: PayPerCall) {
  if (lastEventCursor(req)) throw new AppError('unauthorized', `Resuming an event stream (Last-Event-ID) ${STREAM_NEEDS_KEY}`);
  const request = parseProtocolRequest(req.body);
  if (request.stream) throw new AppError('unauthorized', `stream: true ${STREAM_NEEDS_KEY}`);
  const tools = request.mode === 'direct' ? [request.tool] : request.tools;
  refuseSideEffects(tools);
  const names = tools.map((t) => t.name);
  // Paying buys each step's price, never a wider door: every step must be one a payer could buy
  // alone. A free tool needs a key on its own, so it needs one inside a chain or parallel request
  // too (its plan tier and rate limit belong to an account); refused before any price is quoted.
  const free = [...new Set(tools.filter((t) => t.priceCents === 0).map((t) => t.name))];
  if (free.length) {
    if (request.mode === 'direct') throw freeNeedsKey(request.tool.name);
    const err = freeNeedsKey(`${free.join(', ')} (in this ${request.mode} request)`);
    throw new AppError(err.code, err.message, { free_tools: free });
  }
  const priceCents = tools.reduce((sum, t) => sum + t.priceCents, 0);
  const edgeToken = edgeTokenHeader(req);
  // Bad input is refused before any money is asked for.
  protocol.prepare(request, edgeToken);
  const out = await payPerCall.run(
    {
      payment: paymentHeaders(req),
      call: {
        tool: request.mode === 'direct' ? request.tool.name : `${request.mode}:${names.join(',')}`,
        priceCents,
        resource: `${baseUrl(req.server, req)}/`,
        description: describe(request),
        outputSchema: { input: { type: 'http', method: 'POST', bodyType: 'json' } },
      },
      idempotency: paidIdempotency(req),
      // Each step counts against the payer's rate limit, as it would alone.
      calls: tools.length,
    },
    // Always synchronous, like POST /tools/{name}: the result must be settled and returned on this response.
    (caller, track) => protocol.answer(caller, request, { requestId: req.id, edgeToken, onJobId: track }),
  );
  return sendPaid(req, reply, out);
}

function describe(request: ProtocolRequest): string {
  if (request.mode === 'direct') return `${request.tool.name}: ${request.tool.description}`;
  const names = request.tools.map((t) => t.name);
  return request.mode === 'chain'
    ? `Chain of ${names.length} tools run in order (${names.join(' -> ')}), priced as their total`
    : `${names.length} tools run in parallel (${names.join(', ')}), priced as their total`;
}
