import type { SerializedError } from '../errors.js';
import type { CallResult } from './call-job.js';
import type { Redis } from './redis.js';
import { isResultRef, type JobReturn, type ResultRefs } from './result-refs.js';

/**
 * What a worker records about a job while it runs, so a Server-Sent Events client that connects late
 * or reconnects (GET /jobs/{id}/events, Last-Event-ID) sees the same events as one that watched live.
 * Progress data is what the tool reported; it never holds job input or the edge token.
 */
export type LoggedEvent =
  | { type: 'progress'; job: string; data: unknown }
  /** A flow step finished (chain and parallel requests only). */
  | { type: 'step'; job: string; outcome: 'completed'; value: CallResult }
  | { type: 'step'; job: string; outcome: 'failed'; error: SerializedError };

/** An event as appended: a completed step's value may be a reference (src/queue/result-refs.ts), resolved on read. */
export type AppendedEvent = Exclude<LoggedEvent, { outcome: 'completed' }> | { type: 'step'; job: string; outcome: 'completed'; value: JobReturn };

export interface StoredEvent {
  /** Redis stream entry id ("<ms>-<seq>"): ordered, so it doubles as the SSE event id. */
  id: string;
  event: LoggedEvent;
}

/** Cap per log: a long model answer reports a progress event per token; older entries go first. */
const MAX_ENTRIES = 5_000;
/**
 * A log expires this long after its last event unless told otherwise: at least as long as finished jobs
 * stay in Redis (JOB_REDIS_RETENTION_SECONDS), and never under ten minutes, so a flow whose step runs
 * long keeps its earlier events. Past it, GET /jobs/{id}/events replays no progress, only the outcome
 * (read from job_results).
 */
export function eventLogTtl(retentionSeconds: number): number {
  return Math.max(retentionSeconds, 600);
}

// KEYS: log   ARGV: max entries, ttl seconds, entry. One script rather than MULTI: ioredis builds a
// pipeline object per MULTI by copying every script defined on the connection (BullMQ's and ours, some
// 80), which cost more than the write itself, once per progress event and per chain step.
const APPEND = `
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'e', ARGV[3])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return id
`;

type Scripted = Redis & { tgEventAppend(keys: 1, key: string, max: number, ttl: number, entry: string): Promise<string> };

/**
 * One Redis stream per job, or per flow (every step of a chain or parallel request writes to its
 * root's log), capped, and kept a while after its last event (eventLogTtl), like the job itself.
 */
export class JobEventLog {
  private readonly redis: Scripted;

  constructor(
    redis: Redis,
    private readonly prefix: string,
    /** Resolves completed steps' references when the log is read (a reader without it gets them as written). */
    private readonly refs: ResultRefs | null = null,
    /** Seconds a log is kept after its last event (eventLogTtl). */
    private readonly ttlSeconds = eventLogTtl(300),
  ) {
    if (!('tgEventAppend' in redis)) redis.defineCommand('tgEventAppend', { lua: APPEND });
    this.redis = redis as Scripted;
  }

  /** The log's key (one key: its script stays in one cluster slot). */
  key(logId: string): string {
    return `${this.prefix}:events:${logId}`;
  }

  append(logId: string, event: AppendedEvent): Promise<string> {
    return this.redis.tgEventAppend(1, this.key(logId), MAX_ENTRIES, this.ttlSeconds, JSON.stringify(event));
  }

  /** Entries after `after` (exclusive; from the start when absent), oldest first. */
  async read(logId: string, after?: string, count = 1_000): Promise<StoredEvent[]> {
    const rows = await this.redis.xrange(this.key(logId), after ? `(${after}` : '-', '+', 'COUNT', count);
    const out: StoredEvent[] = [];
    for (const [id, fields] of rows) {
      const i = fields.indexOf('e');
      if (i < 0 || fields[i + 1] === undefined) continue;
      out.push({ id, event: JSON.parse(fields[i + 1]!) as LoggedEvent });
    }
    for (const e of out) {
      const ev = e.event;
      if (ev.type === 'step' && ev.outcome === 'completed' && isResultRef(ev.value) && this.refs) {
        try {
          e.event = { ...ev, value: await this.refs.resolve(ev.job, ev.value) };
        } catch (err) {
          e.event = { type: 'step', job: ev.job, outcome: 'failed', error: { code: 'not_found', message: (err as Error).message } };
        }
      }
    }
    return out;
  }
}

/** A Redis stream entry id as the log hands them out. */
export function isStreamId(s: string): boolean {
  return /^\d{1,20}-\d{1,20}$/.test(s);
}
