import type { SerializedError } from '../errors.js';
import type { CallResult } from '../services/runner.js';
import type { Redis } from './redis.js';

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

export interface StoredEvent {
  /** Redis stream entry id ("<ms>-<seq>"): ordered, so it doubles as the SSE event id. */
  id: string;
  event: LoggedEvent;
}

/** Cap per log: a long model answer reports a progress event per token; older entries go first. */
const MAX_ENTRIES = 5_000;
const TTL_SECONDS = 24 * 3600;

/**
 * One Redis stream per job, or per flow (every step of a chain or parallel request writes to its
 * root's log), capped and kept for a day like the job itself.
 */
export class JobEventLog {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
  ) {}

  private key(logId: string): string {
    return `${this.prefix}:events:${logId}`;
  }

  async append(logId: string, event: LoggedEvent): Promise<string> {
    const key = this.key(logId);
    const res = await this.redis
      .multi()
      .xadd(key, 'MAXLEN', '~', String(MAX_ENTRIES), '*', 'e', JSON.stringify(event))
      .expire(key, TTL_SECONDS)
      .exec();
    const [err, id] = res?.[0] ?? [new Error('event log write was discarded'), null];
    if (err) throw err;
    return id as string;
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
    return out;
  }
}

/** A Redis stream entry id as the log hands them out. */
export function isStreamId(s: string): boolean {
  return /^\d{1,20}-\d{1,20}$/.test(s);
}
