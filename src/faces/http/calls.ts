import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { AppError, isAppError } from '../../errors.js';
import { JobListQuery } from '../../money/results.js';
import { parseOrThrow } from '../../errors.js';
import { awaitJobBody as awaitJob } from '../../calls/await-job.js';
import type { CallAnswer } from '../../calls/admission.js';
import type { KeyCaller } from '../../access/auth.js';
import { Idempotency, type StoredResponse, type TrackJob } from '../../calls/idempotency.js';
import { payPerCallFor, sendPaidToolCall } from './paid-calls.js';
import { answerResponse, edgeTokenHeader, wantsAsync } from './answers.js';
import { protocolServices, streamToolCall, wantsEventStream } from './stream.js';
import { cancellerFor } from '../../calls/cancel.js';
import { getTool } from '../../tools/index.js';
import { acceptCallback, type AcceptedCallback } from './webhooks.js';

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

export async function callRoutes(app: FastifyInstance): Promise<void> {
  const { calls } = app.container.api!;

  app.post<{ Params: { name: string } }>('/tools/:name', async (req, reply) => {
    const paid = payPerCallFor(req);
    if (paid) return sendPaidToolCall(req, reply, paid);
    // The rate-limit hit of a plain call is counted by admission's script, with its slot and hold (one
    // round trip fewer). A stream, a replayable (Idempotency-Key) or a Callback-Url request counts it at
    // the door as every other route does: before any work is done for it.
    const { caller, rate } = await app.authenticateDeferred(req, reply);
    const stream = wantsEventStream(req);
    if (stream || req.headers['idempotency-key'] !== undefined || req.headers['callback-url'] !== undefined) await rate.now();
    // Accept: text/event-stream answers with Server-Sent Events (src/faces/http/stream.ts).
    if (stream) return streamToolCall(app, req, reply, caller, { requestId: req.id, edgeToken: edgeTokenHeader(req) });
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
        ),
      );
    } catch (e) {
      // Refused before admission (unknown tool, plan, bad input): the request counts all the same, and
      // over the limit it is answered 429, as it would have been at the door.
      if (rate.pending) await rate.now().catch((err: unknown) => {
        if (isAppError(err) && err.code === 'rate_limited') throw err;
      });
      throw e;
    } finally {
      await callback?.done();
    }
  });

  // The calling key's recent calls, newest first (job_results; kept JOB_RESULT_DAYS).
  app.get('/jobs', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    const query = parseOrThrow(JobListQuery, req.query ?? {}, 'GET /jobs query is invalid');
    return app.container.results.list(caller.ownKeyIds, query);
  });

  app.get<{ Params: { id: string } }>('/jobs/:id', async (req, reply) => {
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
  app.delete<{ Params: { id: string } }>('/jobs/:id', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    // A job sent with a Callback-Url is delivered when cancelled too: its data is read first (cancelling may remove it),
    // and the delivery queued here, since a cancelled job never reaches settlement.
    const hooked = await app.container.queues.getJob(req.params.id).then((j) => j?.data, () => undefined);
    const { status, body } = await cancellerFor(app.container).cancel(caller, req.params.id);
    if (hooked?.callbackUrl && hooked.accountId && (body as { status?: unknown }).status === 'cancelled') {
      await app.container.webhooks
        ?.ended([{ jobId: req.params.id, accountId: hooked.accountId, callbackUrl: hooked.callbackUrl }])
        .catch((err: Error) => req.log.warn({ err: err.message, job: req.params.id }, 'queueing the webhook of a cancelled job failed'));
    }
    return reply.status(status).send(body);
  });

  app.get('/balance', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    const view = await app.container.accounts.balanceView(caller.accountId, caller.subKey?.keyId ?? null);
    return {
      ...view,
      ...(caller.subKey ? { monthly_limit: caller.subKey.monthlyLimitCents, key_type: 'sub' } : { key_type: caller.keyType }),
      ...(caller.sandbox ? { sandbox: true } : {}),
    };
  });
}
