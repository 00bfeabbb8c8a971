import { z } from 'zod';
import type { Logger } from 'pino';
import { sql, type DatabasePool } from '../db/pool.js';
import { AppError } from '../errors.js';
import type { Redis } from '../queue/redis.js';
import { storedAnswer } from '../queue/result-refs.js';
import type { StoredOutcome } from '../queue/call-job.js';
import type { JobSeal } from '../queue/job-seal.js';

/**
 * Reads of `job_results` (migrations/005_job_results.sql), the Postgres copy of every keyed call's
 * answer that settlement writes with its charge (src/money/settlement.ts): GET /jobs/{id} when Redis
 * no longer knows the job, GET /jobs, a redelivered job's stored outcome, and pruning by age. A
 * sensitive tool's answer is stored sealed (src/queue/job-seal.ts) and opened by `get`, for its reader.
 */

export interface StoredResult extends StoredOutcome {
  jobId: string;
  keyId: string | null;
  accountId: string;
  tool: string;
  costCents: number;
}

export interface JobListItem {
  job_id: string;
  tool: string;
  status: 'completed' | 'failed' | 'cancelled';
  cost_cents: number;
  created_at: string;
  finished_at: string;
}

export interface JobList {
  jobs: JobListItem[];
  /** Pass as `cursor` for the next (older) page; null on the last page. */
  next_cursor: string | null;
}

export const LIST_DEFAULT = 50;
export const LIST_MAX = 200;

/** GET /jobs query string. */
export const JobListQuery = z.object({
  limit: z.coerce
    .number({ invalid_type_error: 'limit must be a number' })
    .int('limit must be a whole number')
    .min(1, 'limit must be at least 1')
    .max(LIST_MAX, `limit must be at most ${LIST_MAX}`)
    .default(LIST_DEFAULT)
    .describe('Calls per page.'),
  cursor: z.string().min(1).max(200).optional().describe("The previous page's next_cursor."),
  since: z
    .string()
    .datetime({ offset: true, message: 'since must be an ISO 8601 time, e.g. 2025-01-31T00:00:00Z' })
    .optional()
    .describe('Only calls made at or after this time.'),
  tool: z.string().min(1).max(200).optional().describe('Only calls of this tool.'),
  status: z.enum(['completed', 'failed', 'cancelled']).optional().describe('Only calls that ended so.'),
});
export type JobListQuery = z.infer<typeof JobListQuery>;

const ResultRow = z.object({
  job_id: z.string(),
  key_id: z.string().nullable(),
  account_id: z.string(),
  tool: z.string(),
  status: z.enum(['completed', 'failed', 'cancelled']),
  cost_cents: z.number().int(),
  body: z.record(z.unknown()),
  truncated: z.boolean(),
});

const ListRow = z.object({
  job_id: z.string(),
  tool: z.string(),
  status: z.enum(['completed', 'failed', 'cancelled']),
  cost_cents: z.number().int(),
  created_at: z.string(),
  finished_at: z.string(),
  created_us: z.string(),
});

/** Opaque keyset cursor: the last item's created_at (microseconds) and job id. */
function encodeCursor(createdUs: string, jobId: string): string {
  return Buffer.from(JSON.stringify([createdUs, jobId])).toString('base64url');
}

function decodeCursor(cursor: string): { us: string; jobId: string } {
  try {
    const v = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as unknown;
    if (Array.isArray(v) && v.length === 2 && typeof v[0] === 'string' && /^-?\d{1,19}$/.test(v[0]) && typeof v[1] === 'string' && v[1].length <= 200) {
      return { us: v[0], jobId: v[1] };
    }
  } catch {
    // fall through
  }
  throw new AppError('invalid_input', 'cursor is not one this service gave out: pass next_cursor from the previous page unchanged', {
    issues: [{ path: ['cursor'], message: 'invalid cursor' }],
  });
}

/** Rows deleted per statement while pruning, so no statement holds many locks or runs long. */
const PRUNE_BATCH = 5_000;
/** How often processes running workers try to prune (one of them does, under a Redis lock). */
export const PRUNE_EVERY_MS = 10 * 60_000;

export class ResultsStore {
  private timer: NodeJS.Timeout | null = null;
  private first: NodeJS.Timeout | null = null;
  private pruning: Promise<unknown> | null = null;

  constructor(
    private readonly pool: DatabasePool,
    private readonly opts: {
      days: number;
      redis?: Redis;
      prefix?: string;
      log?: Logger;
      /** Opens sensitive tools' sealed answers; without it they are returned as stored. */
      seal?: JobSeal;
    },
  ) {}

  /** One job's stored outcome, whoever made it (callers check the key). */
  async get(jobId: string): Promise<StoredResult | null> {
    const row = await this.pool.maybeOne(sql.type(ResultRow)`
      SELECT job_id, key_id, account_id, tool, status, cost_cents, body, truncated FROM job_results WHERE job_id = ${jobId}`);
    if (!row) return null;
    const stored: StoredResult = {
      jobId: row.job_id,
      keyId: row.key_id,
      accountId: row.account_id,
      tool: row.tool,
      status: row.status,
      costCents: row.cost_cents,
      body: row.body,
      truncated: row.truncated,
    };
    return this.opts.seal ? this.opts.seal.openOutcome(jobId, stored) : stored;
  }

  /** The body GET /jobs/{id} answers for a stored completed job (a failed one is thrown by the caller). */
  static answer(jobId: string, r: StoredOutcome): Record<string, unknown> {
    return { job_id: jobId, status: 'completed', ...storedAnswer(r) };
  }

  /** A key's calls (with those of the keys it replaced), newest first. */
  async list(keyIds: readonly string[], q: JobListQuery): Promise<JobList> {
    const after = q.cursor ? decodeCursor(q.cursor) : null;
    const limit = q.limit;
    const rows = await this.pool.any(sql.type(ListRow)`
      SELECT job_id, tool, status, cost_cents, created_at, finished_at,
        ((extract(epoch FROM created_at) * 1000000)::bigint)::text AS created_us
      FROM job_results
      WHERE ${keyIds.length === 1 ? sql.fragment`key_id = ${keyIds[0]!}` : sql.fragment`key_id = ANY(${sql.array([...keyIds], 'uuid')})`}
        ${after ? sql.fragment`AND (created_at, job_id) < ('epoch'::timestamptz + ${after.us}::bigint * interval '1 microsecond', ${after.jobId})` : sql.fragment``}
        ${q.since ? sql.fragment`AND created_at >= ${q.since}::timestamptz` : sql.fragment``}
        ${q.tool ? sql.fragment`AND tool = ${q.tool}` : sql.fragment``}
        ${q.status ? sql.fragment`AND status = ${q.status}` : sql.fragment``}
      ORDER BY created_at DESC, job_id DESC
      LIMIT ${limit + 1}`);
    const page = rows.slice(0, limit);
    const last = page[page.length - 1];
    return {
      jobs: page.map(({ created_us: _us, ...item }) => item),
      next_cursor: rows.length > limit && last ? encodeCursor(last.created_us, last.job_id) : null,
    };
  }

  /**
   * Deletes rows older than JOB_RESULT_DAYS, PRUNE_BATCH at a time (idempotent: running it twice, or
   * on two replicas at once, deletes nothing twice). Returns the rows deleted.
   */
  async prune(maxBatches = 200): Promise<number> {
    let total = 0;
    for (let i = 0; i < maxBatches; i++) {
      const res = await this.pool.query(sql.unsafe`
        DELETE FROM job_results r USING (
          SELECT job_id FROM job_results
          WHERE finished_at < now() - make_interval(days => ${this.opts.days})
          LIMIT ${PRUNE_BATCH}
        ) old
        WHERE r.job_id = old.job_id`);
      total += res.rowCount;
      if (res.rowCount < PRUNE_BATCH) break;
    }
    return total;
  }

  /**
   * Prunes every PRUNE_EVERY_MS from processes running workers. A Redis lock (SET NX PX, held for the
   * interval) lets one replica prune per interval; the DELETE is idempotent anyway.
   */
  startPruning(everyMs = PRUNE_EVERY_MS): void {
    const { redis, prefix, log } = this.opts;
    const tick = async () => {
      if (this.pruning) return;
      try {
        if (redis && (await redis.set(`${prefix ?? 'tollgate'}:results:prune`, '1', 'PX', everyMs, 'NX')) !== 'OK') return;
        this.pruning = this.prune();
        const n = await this.pruning;
        if (n) log?.info({ deleted: n, days: this.opts.days }, 'pruned job results');
      } catch (err) {
        log?.warn({ err: (err as Error).message }, 'pruning job results failed');
      } finally {
        this.pruning = null;
      }
    };
    // First run soon after start, with jitter, then every interval.
    this.first = setTimeout(() => void tick(), 5_000 + Math.floor(Math.random() * 25_000));
    this.first.unref();
    this.timer = setInterval(() => void tick(), everyMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    if (this.first) clearTimeout(this.first);
    if (this.timer) clearInterval(this.timer);
    this.first = this.timer = null;
    await this.pruning?.catch(() => {});
  }
}
