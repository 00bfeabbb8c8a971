import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import type { PayPerCall } from '../../calls/pay-per-call.js';
import { ENDPOINTS } from '../../calls/catalogue.js';
import {
  ChainRequestSchema,
  DirectRequestSchema,
  MAX_STEPS,
  ParallelRequestSchema,
  PROTOCOL_MODES,
  parseProtocolRequest,
  type ProtocolRequest,
  type ProtocolService,
} from '../../calls/protocol.js';
import { CALL_ERRORS, callHeaders, sendIdempotent } from './calls.js';
import { CallResultSchema, ErrorCodeSchema } from './openapi-components.js';
import { empty, errors, named, ok, type RouteSchema } from './route-schema.js';
import { edgeTokenHeader, wantsAsync } from './answers.js';
import { baseUrl } from './meta.js';
import { freeNeedsKey, paidIdempotency, payPerCallFor, paymentHeaders, refuseSideEffects, sendPaid } from './paid-calls.js';
import { lastEventCursor, protocolServices, resumeEventStream, startEventStream } from './stream.js';
import { acceptCallback } from './webhooks.js';

/** The body of POST /: one mode per request (parseProtocolRequest reads it, with its own messages for a body that names none or several). */
const ProtocolRequestSchema = named(
  'ProtocolRequest',
  z
    .union([ChainRequestSchema, ParallelRequestSchema, DirectRequestSchema])
    .describe(`The root protocol: one of chain, parallel or direct (m); stream: true for Server-Sent Events. Up to ${MAX_STEPS} tools.`),
);

// Functions, not shared instances: a schema used twice would be written as a $ref into the first place it appears.
const costCents = () => z.number().int().describe('What the completed steps were charged.');
const remainingCredits = () => z.number().int().nullable().describe('null for a request paid per call (x402).');
const sandbox = () => z.literal(true).optional().describe('Present, true, for sandbox (cv_test_) keys.');
const StepErrorSchema = z.object({ code: ErrorCodeSchema, message: z.string() }).passthrough().describe("The step's error, with its details.");

const ChainResultSchema = named(
  'ChainResult',
  z
    .object({
      steps: z.array(z.object({ tool: z.string(), result: z.unknown(), cost_cents: z.number().int() })).describe('Every step, in order.'),
      result: z.unknown().describe("The last step's output."),
      cost_cents: costCents(),
      remaining_credits: remainingCredits(),
      sandbox: sandbox(),
    })
    .describe('A chain whose every step completed. A failing step fails the request: its error names failed_step, with the steps before it (charged).'),
);

const ParallelResultSchema = named(
  'ParallelResult',
  z
    .object({
      results: z
        .record(z.union([z.object({ result: z.unknown(), cost_cents: z.number().int() }), z.object({ error: StepErrorSchema })]))
        .describe('By tool name (a tool listed again: name#2, name#3...): its result and charge, or its error.'),
      cost_cents: costCents(),
      remaining_credits: remainingCredits(),
      sandbox: sandbox(),
    })
    .describe(
      'A parallel request: every tool, succeeded or failed; only successes are charged. Paid per call (x402), any failure fails the whole request and nothing is charged.',
    ),
);

const ProtocolResultSchema = named(
  'ProtocolResult',
  z
    .union([CallResultSchema, ChainResultSchema, ParallelResultSchema])
    .describe('A direct request answers as POST /tools/{m}; chain and parallel requests as below.'),
);

/** POST /: the root protocol (direct, chain, parallel, stream). Shapes in src/calls/protocol.ts. */
export async function rootRoutes(app: FastifyInstance): Promise<void> {
  const { protocol } = protocolServices(app.container);
  // Chain and parallel requests with a callback are watched here until they end: this process can
  // assemble their body (src/calls/webhooks.ts, WEBHOOK_WATCH_QUEUE).
  app.container.webhooks?.startWatcher((rootId) => protocol.flowOutcome(rootId));

  const schema = {
    operationId: 'rootProtocol',
    tags: ['Protocol'],
    summary: 'Root protocol: chain, parallel, direct or stream',
    description: `${ENDPOINTS['POST /']}. ${Object.values(PROTOCOL_MODES)
      .map((m) => m.description)
      .join('. ')}. Without a key (x402): the price of every step at once, all or nothing; free tools and streams need a key.`,
    security: 'key-or-x402',
    parameters: ['Idempotency-Key', 'Prefer', 'Callback-Url', 'X-Edge-Token', 'Last-Event-ID'],
    body: ProtocolRequestSchema,
    bodyExamples: Object.fromEntries(Object.entries(PROTOCOL_MODES).map(([k, m]) => [k, { summary: m.description, value: m.example }])),
    response: {
      '200': ok(
        ProtocolResultSchema,
        'The request ran: a call result (direct), steps and result (chain), or results by tool (parallel); with stream: true, its events.',
        {
          headers: callHeaders(app.container.config.X402_ENABLED),
          eventStream: true,
        },
      ),
      '202': { $ref: '#/components/responses/Accepted' },
      '204': empty('A resumed event stream (Last-Event-ID) that had already ended.'),
      ...errors(CALL_ERRORS),
    },
  } satisfies RouteSchema;

  app.post('/', { schema }, async (req, reply) => {
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
      if (request.stream)
        return await startEventStream(app, req, reply, caller, (track) => protocol.start(caller, request, { ...opts, onJobId: onJobId(track) }));
      // A request with a sensitive step is kept under an Idempotency-Key by reference to its root job.
      const byReference = tools().some((t) => t.sensitive);
      return await sendIdempotent(req, reply, caller, async (track) => ({
        ...(await protocol.answer(caller, request, { ...opts, onJobId: onJobId(track) })),
        ...(byReference ? { byReference } : {}),
      }));
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
