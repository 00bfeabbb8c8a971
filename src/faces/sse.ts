import { AppError, envelope } from '../errors.js';
import type { CompletionDispatcher } from '../queue/dispatcher.js';
import { isStreamId, type JobEventLog, type StoredEvent } from '../queue/job-events.js';
import { stepError, type ProtocolService, type StreamTarget } from '../calls/protocol.js';

/**
 * The events of one call or one chain/parallel request, as a Server-Sent Events stream shows them:
 * `queued`, then `progress` (and `step` for each finished flow step) in the order the workers logged
 * them, then `result` or `error`. HTTP-free: src/faces/http/stream.ts writes them out.
 *
 * Every event id is `<root job id>:<cursor>` (cursor `0` for queued, the log entry id for progress,
 * `end` for the last event), so a client that reconnects with Last-Event-ID resumes where it stopped.
 */
export interface SseEvent {
  id: string;
  event: 'queued' | 'progress' | 'step' | 'result' | 'error';
  data: unknown;
}

/**
 * The last event of a stream this process stops following before its outcome (it is shutting down).
 * It has no id, so an EventSource keeps the id of the last event it got and sends it as Last-Event-ID
 * when it reconnects: another replica resumes the stream from there (the call itself runs on).
 */
export interface ReconnectEvent {
  event: 'reconnect';
  data: { job_id: string; reason: 'shutting_down'; last_event_id: string | null; message: string };
}

/**
 * Started once when the process begins shutting down: every stream it follows waits for its outcome
 * until `deadline` (ms since the epoch), then ends with a `reconnect` event.
 */
export class StreamDrain {
  private readonly started = new AbortController();
  deadline = Number.POSITIVE_INFINITY;

  get signal(): AbortSignal {
    return this.started.signal;
  }

  start(waitMs: number): void {
    if (this.started.signal.aborted) return;
    this.deadline = Date.now() + waitMs;
    this.started.abort();
  }
}

export interface EventCursor {
  jobId: string;
  /** `0` (after queued), a log entry id, or `end` (everything was sent). */
  cursor: string;
}

/** Reads `Last-Event-ID`; null when it is not one of ours. */
export function parseEventId(raw: unknown): EventCursor | null {
  if (typeof raw !== 'string') return null;
  const m = /^([A-Za-z0-9-]{1,100}):(0|end|\d{1,20}-\d{1,20})$/.exec(raw.trim());
  return m ? { jobId: m[1]!, cursor: m[2]! } : null;
}

export function rootIdOf(target: StreamTarget): string {
  return target.kind === 'flow' ? target.flow.rootId : target.jobId;
}

export interface FollowOptions {
  requestId: string;
  /** Resume after this cursor (from Last-Event-ID); `queued` is sent only when absent. */
  after?: string;
  signal: AbortSignal;
  /** Looks for the outcome this often even without an event, in case a completion event was lost. */
  recheckMs: number;
  /** The process's shutdown: past its deadline the stream ends with a `reconnect` event instead. */
  drain?: StreamDrain;
}

export class JobFollower {
  constructor(
    private readonly deps: {
      dispatcher: CompletionDispatcher;
      events: JobEventLog;
      protocol: ProtocolService;
    },
  ) {}

  /**
   * Emits the target's events until its result or error, or until `signal` aborts (the client left:
   * the job itself carries on). Live events only wake the loop; what is sent always comes from the
   * log and the stored outcome, so a live stream and a replay send the same events with the same ids.
   * When the process shuts down (`opts.drain`), the stream still ends with its result or error if that
   * comes by the drain's deadline, else with a `reconnect` event naming the last event it sent.
   */
  async follow(target: StreamTarget, opts: FollowOptions, send: (e: SseEvent | ReconnectEvent) => void): Promise<void> {
    const { dispatcher, protocol } = this.deps;
    const rootId = rootIdOf(target);
    let lastId: string | null = opts.after === undefined ? null : `${rootId}:${opts.after}`;
    const emit = (e: SseEvent) => {
      lastId = e.id;
      send(e);
    };
    const watched = target.kind === 'flow' ? [...new Set([rootId, ...target.flow.steps.map((s) => s.jobId)])] : [target.jobId];
    let dirty = true;
    // The first pass checks for an outcome: the job may have finished before we subscribed.
    let maybeFinished = true;
    let wake: (() => void) | null = null;
    const unsubscribe = watched.map((id) =>
      dispatcher.subscribe(id, (e) => {
        dirty = true;
        if (e.type !== 'progress') maybeFinished = true;
        wake?.();
      }),
    );
    const onAbort = () => wake?.();
    opts.signal.addEventListener('abort', onAbort);
    const recheck = setInterval(() => {
      dirty = true;
      maybeFinished = true;
      wake?.();
    }, opts.recheckMs);
    // Shutting down: one last look for the outcome at the deadline, then the reconnect event.
    let expired = false;
    let expiry: NodeJS.Timeout | undefined;
    const onDrain = () => {
      expiry = setTimeout(
        () => {
          expired = dirty = maybeFinished = true;
          wake?.();
        },
        Math.max(0, opts.drain!.deadline - Date.now()),
      );
    };
    if (opts.drain?.signal.aborted) onDrain();
    else opts.drain?.signal.addEventListener('abort', onDrain, { once: true });
    try {
      if (opts.after === undefined) emit({ id: `${rootId}:0`, event: 'queued', data: this.queuedData(target) });
      let cursor = opts.after && isStreamId(opts.after) ? opts.after : undefined;
      while (!opts.signal.aborted) {
        if (!dirty) {
          await new Promise<void>((resolve) => {
            wake = resolve;
          });
          wake = null;
          continue;
        }
        dirty = false;
        const check = maybeFinished;
        maybeFinished = false;
        // Outcome first, log second: once a job is finished, everything its workers logged is in the log.
        const final = check ? await protocol.final(target) : null;
        cursor = await this.drain(target, cursor, emit, opts.signal);
        if (final && !opts.signal.aborted) {
          emit(
            final.ok
              ? { id: `${rootId}:end`, event: 'result', data: final.body }
              : { id: `${rootId}:end`, event: 'error', data: envelope(final.error, opts.requestId) },
          );
          return;
        }
        if (expired && !opts.signal.aborted) {
          send(reconnectEvent(rootId, lastId));
          return;
        }
      }
    } finally {
      clearInterval(recheck);
      clearTimeout(expiry);
      opts.drain?.signal.removeEventListener('abort', onDrain);
      for (const u of unsubscribe) u();
      opts.signal.removeEventListener('abort', onAbort);
    }
  }

  private queuedData(target: StreamTarget) {
    if (target.kind === 'job') return { job_id: target.jobId };
    const { flow } = target;
    return { job_id: flow.rootId, mode: flow.mode, steps: flow.steps.map((s, index) => ({ index, tool: s.tool, job_id: s.jobId })) };
  }

  /** Sends every logged event after `cursor`; returns the new cursor. */
  private async drain(target: StreamTarget, cursor: string | undefined, emit: (e: SseEvent) => void, signal: AbortSignal) {
    const rootId = rootIdOf(target);
    const logId = target.kind === 'flow' ? rootId : target.logId;
    for (;;) {
      const page = await this.deps.events.read(logId, cursor);
      for (const entry of page) {
        if (signal.aborted) return cursor;
        cursor = entry.id;
        const e = this.toSse(target, entry);
        if (e) emit({ id: `${rootId}:${entry.id}`, ...e });
      }
      if (page.length < 1_000) return cursor;
    }
  }

  private toSse(target: StreamTarget, { event }: StoredEvent): Omit<SseEvent, 'id'> | null {
    if (target.kind === 'job') {
      // A single job's stream shows its own progress; its result is the `result` event.
      return event.type === 'progress' && event.job === target.jobId ? { event: 'progress', data: event.data } : null;
    }
    const index = target.flow.steps.findIndex((s) => s.jobId === event.job);
    if (index < 0) return null;
    const step = { index, tool: target.flow.steps[index]!.tool, job_id: event.job };
    if (event.type === 'progress') return { event: 'progress', data: { ...(event.data as object), step } };
    if (event.outcome === 'completed') {
      return { event: 'step', data: { ...step, status: 'completed', result: event.value.result, cost_cents: event.value.cost_cents } };
    }
    return { event: 'step', data: { ...step, status: 'failed', error: stepError(AppError.fromJSON(event.error)) } };
  }
}

function reconnectEvent(rootId: string, lastId: string | null): ReconnectEvent {
  const resume = lastId ? `with Last-Event-ID: ${lastId}` : 'without Last-Event-ID';
  return {
    event: 'reconnect',
    data: {
      job_id: rootId,
      reason: 'shutting_down',
      last_event_id: lastId,
      message: `This server is shutting down; the call runs on. Reconnect ${resume} (GET /jobs/${rootId}/events, or the same request) to follow it on another server.`,
    },
  };
}
