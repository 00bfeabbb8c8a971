import type { OutgoingHttpHeaders } from 'node:http';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Container } from '../../container.js';
import { AppError, isAppError, envelope } from '../../errors.js';
import { FlowRecords } from '../../queue/flows.js';
import { JobEventLog } from '../../queue/job-events.js';
import type { KeyCaller } from '../../access/auth.js';
import { Idempotency, type StoredResponse, type TrackJob } from '../../calls/idempotency.js';
import { ProtocolService, type ProtocolOptions, type StreamTarget } from '../../calls/protocol.js';
import { JobFollower, StreamDrain, parseEventId, rootIdOf, type EventCursor, type ReconnectEvent, type SseEvent } from '../sse.js';
import { ENDPOINTS } from '../../calls/catalogue.js';
import { JobIdParams, RATE_LIMIT } from './openapi-components.js';
import { empty, errors, media, typed, type RouteSchema } from './route-schema.js';

const EVENT_STREAM_REF = { $ref: '#/components/schemas/EventStream' };

interface ProtocolServices {
  protocol: ProtocolService;
  follower: JobFollower;
  /** Started when the app closes: open streams end with their outcome, or resumably (`reconnect`). */
  drain: StreamDrain;
}

/**
 * How long open streams wait for their outcome once the process shuts down: four fifths of
 * SHUTDOWN_GRACE_MS, so they end (with the result, or a reconnect event) before the rest is cut.
 */
export function streamDrainMs(graceMs: number): number {
  return Math.floor(graceMs * 0.8);
}

const byContainer = new WeakMap<Container, ProtocolServices>();

/** The root protocol's services for a container (one set per app; the routes share them). */
export function protocolServices(container: Container): ProtocolServices {
  let s = byContainer.get(container);
  if (!s) {
    const api = container.api;
    if (!api) throw new Error('the root protocol needs a container with the API services');
    const { config, redis, queues, records, credits, accounts } = container;
    const protocol = new ProtocolService({
      config,
      calls: api.calls,
      queues,
      dispatcher: api.dispatcher,
      records,
      flows: new FlowRecords(redis, config.REDIS_PREFIX),
      credits,
      accounts,
      ...(container.webhooks ? { webhooks: container.webhooks } : {}),
      results: container.results,
    });
    const follower = new JobFollower({ dispatcher: api.dispatcher, events: new JobEventLog(redis, config.REDIS_PREFIX, queues.refs), protocol });
    s = { protocol, follower, drain: new StreamDrain() };
    byContainer.set(container, s);
  }
  return s;
}

export function wantsEventStream(req: FastifyRequest): boolean {
  const accept = req.headers.accept;
  return typeof accept === 'string' && accept.toLowerCase().includes('text/event-stream');
}

/** The position a reconnecting EventSource reports (Last-Event-ID), when it is one of ours. */
export function lastEventCursor(req: FastifyRequest): EventCursor | null {
  return wantsEventStream(req) ? parseEventId(req.headers['last-event-id']) : null;
}

function formatEvent(e: (Omit<SseEvent, 'id'> | ReconnectEvent) & { id?: string }): string {
  // JSON.stringify escapes newlines, so each payload is exactly one `data:` line.
  return `${e.id ? `id: ${e.id}\n` : ''}event: ${e.event}\ndata: ${JSON.stringify(e.data)}\n\n`;
}

/**
 * Answers with a Server-Sent Events stream of the target's events. A client that goes away only ends
 * its stream: the job runs on, and GET /jobs/{id} or GET /jobs/{id}/events has its outcome.
 */
export async function sendEventStream(app: FastifyInstance, req: FastifyRequest, reply: FastifyReply, target: StreamTarget, after?: string): Promise<void> {
  const { config } = app.container;
  const { follower, drain } = protocolServices(app.container);
  const rootId = rootIdOf(target);
  reply.hijack();
  const res = reply.raw;
  const headers: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(reply.getHeaders())) if (v !== undefined) headers[k] = v;
  res.writeHead(200, {
    ...headers,
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache, no-transform',
    // nginx buffers responses by default, which would hold events back until the stream ends.
    'x-accel-buffering': 'no',
    'x-request-id': req.id,
    'x-job-id': rootId,
  });
  const write = (chunk: string) => {
    if (!res.destroyed && !res.writableEnded) res.write(chunk);
  };
  // Reconnects are cheap (they replay the log, they never run the request again), so retry soon.
  write('retry: 1000\n\n');

  const abort = new AbortController();
  const onClose = () => abort.abort();
  res.on('close', onClose);
  const heartbeat = setInterval(() => write(': ping\n\n'), config.SSE_HEARTBEAT_MS);
  try {
    await follower.follow(target, { requestId: req.id, after, signal: abort.signal, recheckMs: config.SSE_HEARTBEAT_MS, drain }, (e) => write(formatEvent(e)));
  } catch (err) {
    req.log.error({ err }, 'event stream failed');
    // No id: a reconnect resumes from the last event that did arrive.
    const error = new AppError('internal_error', `The event stream failed; GET /jobs/${rootId} has the outcome`);
    write(formatEvent({ event: 'error', data: envelope(error, req.id) }));
  } finally {
    clearInterval(heartbeat);
    res.off('close', onClose);
    if (!res.writableEnded) res.end();
  }
}

/**
 * A reconnecting EventSource repeats its original request with Last-Event-ID. It follows the job it
 * was following instead of running anything again; 204 tells it the stream already ended.
 */
export async function resumeEventStream(app: FastifyInstance, req: FastifyRequest, reply: FastifyReply, caller: KeyCaller, at: EventCursor) {
  const target = await protocolServices(app.container).protocol.target(caller, at.jobId);
  if (at.cursor === 'end') return reply.status(204).send();
  return sendEventStream(app, req, reply, target, at.cursor);
}

/**
 * Starts a streaming request, under its Idempotency-Key when it has one: the key stores the job it
 * started (as the 202 an async call gets), so a retry follows that job instead of running again.
 * Admission errors are thrown before anything is streamed, and answer as ordinary JSON errors.
 */
export async function startEventStream(
  app: FastifyInstance,
  req: FastifyRequest,
  reply: FastifyReply,
  caller: KeyCaller,
  start: (track?: TrackJob) => Promise<StreamTarget>,
) {
  const idemKey = req.headers['idempotency-key'];
  if (typeof idemKey !== 'string') return sendEventStream(app, req, reply, await start());
  let started: StreamTarget | null = null;
  const queued = (jobId: string): StoredResponse => ({
    status: 202,
    headers: { 'x-job-id': jobId },
    body: { job_id: jobId, status: 'queued', status_url: `/jobs/${jobId}` },
  });
  const fingerprint = Idempotency.fingerprint(req.method, req.url, req.body);
  const out = await app.container.api!.idempotency.run(
    caller.keyId,
    idemKey,
    fingerprint,
    async (track) => {
      started = await start(track);
      return queued(rootIdOf(started));
    },
    // The first request died after queueing: follow its job (root first) like any replay, if it exists.
    async (jobIds) => {
      const exists = await protocolServices(app.container)
        .protocol.target(caller, jobIds[0]!)
        .then(
          () => true,
          (e: unknown) => (isAppError(e) && e.code === 'not_found' ? false : Promise.reject(e)),
        );
      return exists ? queued(jobIds[0]!) : null;
    },
  );
  if (started) return sendEventStream(app, req, reply, started);
  reply.header('idempotent-replayed', 'true');
  const jobId = (out.body as { job_id?: unknown } | null)?.job_id;
  if (out.status === 202 && typeof jobId === 'string') {
    return sendEventStream(app, req, reply, await protocolServices(app.container).protocol.target(caller, jobId));
  }
  return sendStored(req, reply, out);
}

function sendStored(req: FastifyRequest, reply: FastifyReply, res: StoredResponse) {
  let body = res.body;
  if (res.status >= 400) body = { error: { ...(body as { error: Record<string, unknown> }).error, request_id: req.id } };
  return reply.status(res.status).headers(res.headers).send(body);
}

/** POST /tools/{name} with Accept: text/event-stream. */
export async function streamToolCall(app: FastifyInstance, req: FastifyRequest, reply: FastifyReply, caller: KeyCaller, tool: string, opts: ProtocolOptions) {
  const at = lastEventCursor(req);
  if (at) return resumeEventStream(app, req, reply, caller, at);
  const { protocol } = protocolServices(app.container);
  return startEventStream(app, req, reply, caller, (track) => protocol.startTool(caller, tool, req.body, { ...opts, onJobId: track }));
}

export async function streamRoutes(app: FastifyInstance): Promise<void> {
  const { protocol, drain } = protocolServices(app.container);
  // Not awaited: the server stops listening meanwhile, and its close waits for these responses to end.
  app.addHook('preClose', async () => drain.start(streamDrainMs(app.container.config.SHUTDOWN_GRACE_MS)));

  /** Replays a job's stored events, then follows it live until its result or error (same key only). */
  const eventsSchema = {
    operationId: 'jobEvents',
    tags: ['Jobs'],
    summary: "A job's Server-Sent Events",
    description:
      `${ENDPOINTS['GET /jobs/{id}/events']}. Events: queued, progress (and step, as each step of a chain or parallel request ends), then ` +
      'result or error; every id is `<root job id>:<cursor>`. A stream that fails after it started ends with an error event (internal_error) without an id; ' +
      'one whose server shuts down first ends with a reconnect event without an id (resume with Last-Event-ID elsewhere).',
    params: JobIdParams,
    parameters: ['Last-Event-ID'],
    response: {
      '200': {
        ...media('text/event-stream', 'Server-Sent Events: the stored ones replayed, then live ones until the result or error.', EVENT_STREAM_REF),
        headers: ['X-Job-Id', ...RATE_LIMIT],
      },
      '204': empty('The stream had already ended (Last-Event-ID at its end).'),
      ...errors(['404', '410']),
    },
  } satisfies RouteSchema;
  typed(app).get('/jobs/:id/events', { schema: eventsSchema }, async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    const target = await protocol.target(caller, req.params.id);
    const last = parseEventId(req.headers['last-event-id']);
    const after = last && last.jobId === rootIdOf(target) ? last.cursor : undefined;
    if (after === 'end') return reply.status(204).send();
    return sendEventStream(app, req, reply, target, after);
  });
}
