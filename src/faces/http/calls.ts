import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { AppError, isAppError } from '../../errors.js';
import { JobListQuery } from '../../money/results.js';
import { awaitJobBody as awaitJob } from '../../calls/await-job.js';
import type { KeyCaller } from '../../access/auth.js';
import { Idempotency, type StoredResponse, type TrackJob } from '../../calls/idempotency.js';
import { payPerCallFor, sendPaidToolCall } from './paid-calls.js';
import { answerResponse, edgeTokenHeader, wantsAsync } from './answers.js';
import { protocolServices, streamToolCall, wantsEventStream } from './stream.js';
import { cancellerFor } from '../../calls/cancel.js';
import { getTool } from '../../tools/index.js';
import { acceptCallback, type AcceptedCallback } from './webhooks.js';
import { PLANS } from '../../tools/types.js';
import { KEY_TYPES } from '../../access/key-format.js';
import { ENDPOINTS } from '../../calls/catalogue.js';
import { CallResultSchema, ErrorSchema, JobIdParams, JobStatusSchema, OpenSchema, RATE_LIMIT, ToolNameParams } from './openapi-components.js';
import { empty, errors, input, named, ok, typed, type ErrorStatus, type HeaderName, type RouteSchema } from './route-schema.js';

/** A job's answer (a chain or parallel root: the whole request's) for `caller`, waiting while it runs. */
export function awaitJobBody(req: FastifyRequest, caller: KeyCaller, jobId: string): Promise<Record<string, unknown> | null> {
  const { container } = req.server;
  const { protocol } = protocolServices(container);
  return awaitJob(container.api!.dispatcher, (id) => protocol.jobStatus(caller, id), jobId, container.config.SYNC_TIMEOUT_MS);
}

/** Answers a retry whose first request died after queueing `jobIds` (root first): from the job, as the first would have. */
export async function answerFromJob(req: FastifyRequest, caller: KeyCaller, jobIds: string[]): Promise<StoredResponse | null> {
  const jobId = jobIds[0]!;
  const job = await awaitJobBody(req, caller, jobId);
  if (!job) return null;
  const { job_id: _id, status, ...rest } = job;
  if (status !== 'completed') {
    const statusUrl = `/jobs/${jobId}`;
    return { status: 202, headers: { 'x-job-id': jobId, location: statusUrl }, body: { job_id: jobId, status, status_url: statusUrl } };
  }
  return { status: 200, headers: { 'x-job-id': jobId }, body: rest };
}

/**
 * Runs `exec` under the request's Idempotency-Key when it has one: a retry with the same key and body
 * answers with the first response and runs nothing. `exec` passes `track` on as its calls' onJobId,
 * so a retry after this process died answers from the job (`recover`, by default as POST /tools would).
 */
export async function sendIdempotent(
  req: FastifyRequest,
  reply: FastifyReply,
  caller: KeyCaller,
  exec: (track?: TrackJob) => Promise<StoredResponse>,
  recover: (jobIds: string[]) => Promise<StoredResponse | null> = (ids) => answerFromJob(req, caller, ids),
) {
  const idemKey = req.headers['idempotency-key'];
  let res: StoredResponse;
  if (typeof idemKey === 'string') {
    const { idempotency } = req.server.container.api!;
    const fingerprint = Idempotency.fingerprint(req.method, req.url, req.body);
    // A large answer is kept as a reference to its job and read back through `recover` (src/calls/idempotency.ts).
    const out = await idempotency.run(caller.keyId, idemKey, fingerprint, exec, recover);
    if (out.replayed) reply.header('idempotent-replayed', 'true');
    res = out;
    if (out.replayed && out.status >= 400) {
      // A stored failure goes back through the one error handler: fresh request id, and the
      // envelope this path uses (OpenAI's on the chat endpoint).
      const { code, message, ...details } = (out.body as { error: { code: string; message: string } & Record<string, unknown> }).error;
      const err = AppError.fromJSON({ code, message, details });
      throw new AppError(err.code, err.message, err.details, { headers: { ...out.headers, ...err.headers } });
    }
  } else {
    res = await exec();
  }
  reply.headers(res.headers);
  return reply.status(res.status).send(res.body);
}

/** What a call can be answered with besides its result (401, 429, 500 and 503 come with every keyed route). */
export const CALL_ERRORS: ErrorStatus[] = ['400', '402', '403', '404', '409', '410', '413', '415', '422', '502', '504'];

/** Headers of a call's 200: its job, a replay, the key's rate limit and, paid per call, the settlement. */
export function callHeaders(x402: boolean): HeaderName[] {
  return ['X-Job-Id', 'Idempotent-Replayed', ...RATE_LIMIT, ...(x402 ? (['PAYMENT-RESPONSE', 'X-Payment-Response'] as const) : [])];
}

const JobListSchema = named(
  'JobList',
  z.object({
    jobs: z.array(
      z.object({
        job_id: z.string(),
        tool: z.string(),
        status: z.enum(['completed', 'failed', 'cancelled']),
        cost_cents: z.number().int().describe('What the call was charged (0 unless completed).'),
        created_at: z.string().datetime(),
        finished_at: z.string().datetime(),
      }),
    ),
    next_cursor: z.string().nullable().describe('Pass as `cursor` for the next (older) page; null on the last page.'),
  }),
);

const JobStepSchema = z.object({
  tool: z.string(),
  job_id: z.string(),
  status: z.enum(['completed', 'failed', 'cancelled']),
  cost_cents: z.number().int().describe('What the step was charged (0 unless completed).'),
});

const CancelledJobSchema = named(
  'CancelledJob',
  z
    .object({
      job_id: z.string(),
      status: z.literal('cancelled'),
      cancelled: z.literal(true),
      mode: z.enum(['chain', 'parallel']).optional().describe('A chain or parallel root only.'),
      steps: z.array(JobStepSchema).optional().describe('A chain or parallel root only: every step, as it ended.'),
      cost_cents: z.number().int().optional().describe('A chain or parallel root only: what its completed steps were charged.'),
    })
    .describe('A cancelled call, or a chain or parallel request with every unfinished step cancelled.'),
);

const BalanceSchema = named(
  'Balance',
  z.object({
    credits: z.number().int().describe("The account's credits, in cents."),
    plan: z.enum(PLANS),
    used_this_month: z.number().int().describe("Cents charged this calendar month (UTC): the account's, or a sub-key's own."),
    key_type: z.enum(KEY_TYPES).describe("The calling key's type."),
    monthly_limit: z.number().int().optional().describe('A sub-key only: its cap, in cents per calendar month.'),
    sandbox: z.literal(true).optional().describe('Present, true, for a sandbox (cv_test_) key.'),
  }),
);

/** What POST /tools/compute answers to its first example, as the reference shows it. */
export const COMPUTE_SAMPLE = {
  result: { expression: '2 * (3 + 4)', result: '14', value: 14, type: 'number' },
  cost_cents: 2,
  remaining_credits: 998,
};

export async function callRoutes(app: FastifyInstance): Promise<void> {
  const { calls } = app.container.api!;
  const x402 = app.container.config.X402_ENABLED;

  const callSchema = {
    operationId: 'callTool',
    tags: ['Tools'],
    summary: 'Run a tool by name',
    description: `${ENDPOINTS['POST /tools/{name}']}. The per-tool paths (/tools/<tool>) carry each tool's input schema, examples and result.`,
    security: 'key-or-x402',
    parameters: ['Idempotency-Key', 'Prefer', 'Callback-Url', 'X-Edge-Token', 'Last-Event-ID'],
    params: ToolNameParams,
    body: OpenSchema,
    bodyExamples: { compute: { summary: 'POST /tools/compute', value: getTool('compute').examples[0] } },
    response: {
      '200': ok(CallResultSchema, 'The call ran and was charged (or, with Accept: text/event-stream, its events).', {
        headers: callHeaders(x402),
        eventStream: true,
        // compute's answer to the body example, as a synchronous call with a key gets it (test/integration/openapi.test.ts runs it).
        examples: { compute: { summary: 'POST /tools/compute, no Prefer header', value: COMPUTE_SAMPLE } },
      }),
      '202': { $ref: '#/components/responses/Accepted' },
      '204': empty('A resumed event stream (Accept: text/event-stream with Last-Event-ID) that had already ended.'),
      ...errors(CALL_ERRORS),
    },
  } satisfies RouteSchema;
  typed(app).post('/tools/:name', { schema: callSchema }, async (req, reply) => {
    const paid = payPerCallFor(req);
    // paid-calls.ts reads the tool name from the route's one path parameter.
    if (paid) return sendPaidToolCall(req as FastifyRequest<{ Params: { name: string } }>, reply, paid);
    // The rate-limit hit of a plain call is counted by admission's script, with its slot and hold (one
    // round trip fewer). A stream, a replayable (Idempotency-Key) or a Callback-Url request counts it at
    // the door as every other route does: before any work is done for it.
    const { caller, rate } = await app.authenticateDeferred(req, reply);
    const stream = wantsEventStream(req);
    if (stream || req.headers['idempotency-key'] !== undefined || req.headers['callback-url'] !== undefined) await rate.now();
    // Accept: text/event-stream answers with Server-Sent Events (src/faces/http/stream.ts).
    if (stream) return streamToolCall(app, req, reply, caller, req.params.name, { requestId: req.id, edgeToken: edgeTokenHeader(req) });
    let callback: AcceptedCallback | undefined;
    try {
      // Accepted before anything is reserved or queued: a refused Callback-Url (a free call, a bad URL,
      // too many deliveries outstanding) costs nothing.
      callback = await acceptCallback(req, caller, () => [getTool(req.params.name)]);
      return await sendIdempotent(req, reply, caller, async (track) =>
        answerResponse(
          await calls.call(caller, req.params.name, req.body, {
            requestId: req.id,
            respondAsync: wantsAsync(req),
            edgeToken: edgeTokenHeader(req),
            onJobId: callback ? callback.track(track) : track,
            callbackUrl: callback?.url,
            rateLimit: rate,
          }),
          getTool(req.params.name),
        ),
      );
    } catch (e) {
      // Refused before admission (unknown tool, plan, bad input): the request counts all the same, and
      // over the limit it is answered 429, as it would have been at the door.
      if (rate.pending)
        await rate.now().catch((err: unknown) => {
          if (isAppError(err) && err.code === 'rate_limited') throw err;
        });
      throw e;
    } finally {
      await callback?.done();
    }
  });

  // The calling key's recent calls, newest first (job_results; kept JOB_RESULT_DAYS).
  const listSchema = {
    operationId: 'listJobs',
    tags: ['Jobs'],
    summary: "The key's recent calls, newest first",
    description: `${ENDPOINTS['GET /jobs']}. Calls of the keys this key replaced (rotation) are included; kept JOB_RESULT_DAYS.`,
    querystring: JobListQuery,
    response: { '200': ok(JobListSchema, "The key's calls, newest first.", { headers: RATE_LIMIT }), ...errors(['400']) },
  } satisfies RouteSchema;
  app.get('/jobs', { schema: listSchema }, async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    const query = input<typeof JobListQuery>(req, 'querystring', 'GET /jobs query is invalid');
    return app.container.results.list(caller.ownKeyIds, query);
  });

  const statusSchema = {
    operationId: 'getJob',
    tags: ['Jobs'],
    summary: 'Status and result of a call, chain or parallel request',
    description:
      `${ENDPOINTS['GET /jobs/{id}']}. While it runs: 200 with status queued or running (a chain or parallel root also gives mode and steps). ` +
      'Completed: 200 with the body the synchronous call would have had. Failed or cancelled: the error it ended with, at its own status, ' +
      'with job_id. Lost (accepted, then lost by the queue before it ran): 410 job_lost, never 404. A job sent with a Callback-Url also carries `webhook` (in `error` when it failed). A job of another key: 404.',
    params: JobIdParams,
    response: {
      '200': ok(JobStatusSchema, 'Queued or running, or completed with its body.', { headers: RATE_LIMIT }),
      // A failed or cancelled job answers with its own error: any a running call can end with.
      ...errors(['400', '403', '404', '409', '410', '422', '502', '504']),
    },
  } satisfies RouteSchema;
  typed(app).get('/jobs/:id', { schema: statusSchema }, async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    // A chain or parallel root answers with the whole request's body; other jobs as calls.jobStatus.
    const { webhooks } = app.container;
    let answer: { status: number; body: unknown };
    try {
      answer = await protocolServices(app.container).protocol.jobStatus(caller, req.params.id);
    } catch (e) {
      // A failed job's error carries its webhook deliveries too (never a not_found: that would tell of other keys' jobs).
      const hook = e instanceof AppError && e.code !== 'not_found' ? await webhooks?.view(req.params.id).catch(() => null) : null;
      if (hook) {
        const err = e as AppError;
        throw new AppError(err.code, err.message, { ...err.details, webhook: hook }, { headers: err.headers });
      }
      throw e;
    }
    const { status, body } = answer;
    // A job queued with a Callback-Url: where it goes and every delivery attempt (src/calls/webhooks.ts).
    const hook = body && typeof body === 'object' ? await webhooks?.view(req.params.id).catch(() => null) : null;
    return reply.status(status).send(hook ? { ...(body as object), webhook: hook } : body);
  });

  // Cancels a job the calling key made (src/calls/cancel.ts): 200 cancelled, 409 job_finished, 404.
  const cancelSchema = {
    operationId: 'cancelJob',
    tags: ['Jobs'],
    summary: 'Cancel a queued or running call, chain or parallel request',
    description:
      `${ENDPOINTS['DELETE /jobs/{id}']}. A chain or parallel request: every unfinished step is cancelled; steps that finished stay as they are, ` +
      'charged if they completed. A job sent with a Callback-Url gets its delivery. Cancelling a cancelled job answers 200 again. A job of another key: 404.',
    params: JobIdParams,
    response: {
      '200': ok(CancelledJobSchema, 'Cancelled.', { headers: RATE_LIMIT }),
      ...errors(['404']),
      '409': ok(
        ErrorSchema,
        'job_finished: the job had already completed (charged; details: job_id, status, cost_cents) or failed, so nothing was cancelled; ' +
          'a chain or parallel request whose steps had all finished gives job_id, mode and steps. (`cancelled` is what GET /jobs/{id} and a waiting caller get for a cancelled job.)',
      ),
    },
  } satisfies RouteSchema;
  typed(app).delete('/jobs/:id', { schema: cancelSchema }, async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    // A job sent with a Callback-Url is delivered when cancelled too: its data is read first (cancelling may remove it),
    // and the delivery queued here, since a cancelled job never reaches settlement.
    const hooked = await app.container.queues.getJob(req.params.id).then(
      (j) => j?.data,
      () => undefined,
    );
    const { status, body } = await cancellerFor(app.container).cancel(caller, req.params.id);
    if (hooked?.callbackUrl && hooked.accountId && (body as { status?: unknown }).status === 'cancelled') {
      await app.container.webhooks
        ?.ended([{ jobId: req.params.id, accountId: hooked.accountId, callbackUrl: hooked.callbackUrl }])
        .catch((err: Error) => req.log.warn({ err: err.message, job: req.params.id }, 'queueing the webhook of a cancelled job failed'));
    }
    return reply.status(status).send(body);
  });

  const balanceSchema = {
    operationId: 'balance',
    tags: ['Account'],
    summary: 'Credits, plan and this month\u2019s use',
    description: `${ENDPOINTS['GET /balance']}. A sub-key sees its own use this month and its monthly_limit.`,
    response: { '200': ok(BalanceSchema, 'Credits, plan and use.', { headers: RATE_LIMIT }), ...errors() },
  } satisfies RouteSchema;
  app.get('/balance', { schema: balanceSchema }, async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    const view = await app.container.accounts.balanceView(caller.accountId, caller.subKey?.keyId ?? null);
    return {
      ...view,
      ...(caller.subKey ? { monthly_limit: caller.subKey.monthlyLimitCents, key_type: 'sub' } : { key_type: caller.keyType }),
      ...(caller.sandbox ? { sandbox: true } : {}),
    };
  });
}
