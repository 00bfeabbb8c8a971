import { createHash } from 'node:crypto';
import type pg from 'pg';
import { z } from 'zod';
import type { Logger } from 'pino';
import { sql, type DatabasePool } from '../db/pool.js';
import type { Redis } from '../queue/redis.js';
import { PeriodicPass, RedisLeader } from '../queue/leader.js';
import { familyOfJob, queueName } from '../queue/queues.js';
import { queuePrefix } from '../queue/keyspace.js';
import { lostChannel } from '../queue/call-job.js';
import type { JobRecords } from '../queue/job-records.js';
import type { CreditReservations } from '../money/holds.js';
import type { InFlightSlots } from '../access/in-flight.js';

/**
 * Job intents (migrations/018_job_intents.sql): the durable record that a key's job was accepted,
 * written at admission before the caller learns the job id, and what decides that a job Redis lost
 * is `lost` (410 job_lost) rather than unknown (404). A lost job is not queued again: a re-run cannot
 * know whether the tool's outside effects (Cloudflare writes, fetches, webhooks) already happened,
 * the caller holding the Idempotency-Key is the one to decide, and keeping every input in Postgres to
 * re-run it would cost every call. Calls paid per call (x402) have no intent: no key can read their
 * jobs, and their payment is settled only with their synchronous answer.
 */

/** One intent as admission writes it. */
export interface Intent {
  jobId: string;
  accountId: string;
  keyId: string | null;
  tool: string;
  /** SHA-256 of the keyed request's fingerprint, else of the tool's input (see `inputDigest`). */
  digest: Buffer;
  /** SHA-256 of the Idempotency-Key and its scope (`idempotencyDigest`), when the request had one. */
  idem: Buffer | null;
  /** The request's root job, for steps of a chain or parallel request. */
  rootId: string | null;
}

/** The deployment an intent belongs to (job_intents.deployment): from its REDIS_PREFIX. */
export function deploymentOf(redisPrefix: string): number {
  return createHash('sha256').update(redisPrefix).digest().readInt32BE(0);
}

/** The digest of a job's input when its request had no Idempotency-Key. */
export function inputDigest(tool: string, input: unknown): Buffer {
  return createHash('sha256')
    .update(`${tool}\n${JSON.stringify(input ?? null)}`)
    .digest();
}

/** What an intent row holds about a key (the scope is the key id the Redis claim is scoped to). */
export function idempotencyDigest(scope: string, idemKey: string): Buffer {
  return createHash('sha256').update(`${scope}\n${idemKey}`).digest();
}

interface Pending {
  rows: Intent[];
  resolve: () => void;
  reject: (e: unknown) => void;
}

/**
 * Writes intents with group commit, as settlement does: while one INSERT runs, the admissions that
 * arrive wait and all go in the next one (one multi-row statement from unnest'ed arrays), so a busy
 * API pays one commit per batch, not per call, and an idle one a single round trip. The row is narrow
 * and never updated when things go right.
 */
export class IntentWriter {
  private queue: Pending[] = [];
  private flushing = false;

  constructor(
    /** A plain pg pool: this statement is on every keyed call's path, like settle_calls. */
    private readonly pool: pg.Pool,
    /** `deploymentOf(REDIS_PREFIX)`. */
    private readonly deployment: number,
    private readonly batchMax = 500,
  ) {}

  /** Resolves once the intents are committed. */
  record(rows: Intent[]): Promise<void> {
    if (!rows.length) return Promise.resolve();
    return new Promise((resolve, reject) => {
      this.queue.push({ rows, resolve, reject });
      if (!this.flushing) {
        this.flushing = true;
        setImmediate(() => void this.flush());
      }
    });
  }

  private async flush(): Promise<void> {
    while (this.queue.length) {
      const batch: Pending[] = [];
      let n = 0;
      while (this.queue.length && (n === 0 || n + this.queue[0]!.rows.length <= this.batchMax)) {
        const p = this.queue.shift()!;
        batch.push(p);
        n += p.rows.length;
      }
      try {
        await this.write(batch.flatMap((p) => p.rows));
        for (const p of batch) p.resolve();
      } catch (e) {
        for (const p of batch) p.reject(e);
      }
    }
    this.flushing = false;
  }

  private async write(rows: Intent[]): Promise<void> {
    await this.pool.query({
      name: 'job_intents_insert',
      text: `INSERT INTO job_intents (deployment, id, account_id, key_id, tool, digest, idem, root_id)
        SELECT $1::integer, * FROM unnest($2::text[], $3::uuid[], $4::uuid[], $5::text[], $6::bytea[], $7::bytea[], $8::text[])
        ON CONFLICT (id) DO NOTHING`,
      values: [
        this.deployment,
        rows.map((r) => r.jobId),
        rows.map((r) => r.accountId),
        rows.map((r) => r.keyId),
        rows.map((r) => r.tool),
        rows.map((r) => r.digest),
        rows.map((r) => r.idem),
        rows.map((r) => r.rootId),
      ],
    });
  }
}

const IntentRow = z.object({ key_id: z.string().nullable(), state: z.enum(['accepted', 'lost']) });
const IdemRow = z.object({ id: z.string(), root_id: z.string().nullable(), state: z.enum(['accepted', 'lost']), digest: z.instanceof(Buffer) });

/** What the intents say about an Idempotency-Key whose Redis claim is gone. */
export interface DurableClaim {
  /** The jobs of the latest request made with the key, its root first. */
  jobIds: string[];
  /** Its fingerprint (hex), to refuse a retry with another body. */
  fingerprint: string;
  /** Every job of it was lost: the key is free. */
  lost: boolean;
}

/** Reads of intents: GET /jobs/{id} once neither Redis nor job_results knows the job, and keyed retries. */
export class IntentStore {
  constructor(private readonly pool: DatabasePool) {}

  /**
   * The job's intent (its key and state); for a parallel request's root, which has none of its own,
   * `lost` when a step of it was lost.
   */
  async find(jobId: string): Promise<{ keyId: string | null; state: 'accepted' | 'lost' } | null> {
    const row = await this.pool.maybeOne(sql.type(IntentRow)`
      (SELECT key_id, state FROM job_intents WHERE id = ${jobId})
      UNION ALL
      (SELECT key_id, state FROM job_intents WHERE root_id = ${jobId} AND state = 'lost' LIMIT 1)
      LIMIT 1`);
    return row ? { keyId: row.key_id, state: row.state } : null;
  }

  /**
   * The latest request made with this Idempotency-Key in the last day (the Redis claim's lifetime), from
   * its intents; null when there is none.
   */
  async byIdempotencyKey(idem: Buffer): Promise<DurableClaim | null> {
    const rows = await this.pool.any(sql.type(IdemRow)`
      SELECT id, root_id, state, digest FROM job_intents
      WHERE idem = ${sql.binary(idem)} AND created_at > now() - interval '1 day'
      ORDER BY created_at DESC, id LIMIT 50`);
    const first = rows[0];
    if (!first) return null;
    const request = first.root_id ?? first.id;
    const mine = rows.filter((r) => (r.root_id ?? r.id) === request);
    const others = mine.filter((r) => r.id !== request).map((r) => r.id);
    return {
      jobIds: [request, ...others],
      fingerprint: first.digest.toString('hex'),
      lost: mine.some((r) => r.state === 'lost'),
    };
  }
}

const Candidate = z.object({ id: z.string(), account_id: z.string(), created_us: z.string() });
const Marked = z.object({ id: z.string(), account_id: z.string() });
const Window = z.object({ through_us: z.string(), upto_us: z.string() });

export interface IntentReport {
  /** False when another process held the lock. */
  ran: boolean;
  /** Intents past the grace period without an outcome, looked at. */
  checked: number;
  /** Of those, still queued or running in Redis (the watermark stays before the oldest). */
  pending: number;
  /** Marked lost now. */
  lost: number;
}

/** Rows read per statement of a pass. */
const PAGE = 500;
/** Rows deleted per statement while pruning. */
const PRUNE_BATCH = 5_000;
const PRUNE_EVERY_MS = 10 * 60_000;
/** How long a Redis Idempotency-Key claim lives (src/calls/idempotency.ts): claims younger may have been lost with Redis. */
const CLAIM_TTL_MS = 24 * 3600_000;

/**
 * Finds jobs Redis lost and marks them lost, one pass at a time across processes (a Redis lock). A pass
 * looks at intents from the watermark (every intent before it is resolved) up to INTENT_GRACE_MS ago
 * that have no job_results row, and asks Redis about each: a job still queued or running is left
 * alone (a long backlog is not a loss) and keeps the watermark before it; a job that ended in Redis
 * without a stored outcome is left to its end (the dispatcher stores a foreign failure); a job that
 * is neither in BullMQ nor in the job records is marked lost with a compare-and-set ('accepted' ->
 * 'lost', only while no job_results row exists), so two passes racing mark it once. Its hold and slot
 * are given back (Redis usually lost them with the job; the money reconciler rebuilds `avail` from
 * Postgres), and its id is published so a caller waiting on it is answered 410 job_lost at once.
 *
 * Passes run every RECONCILE_SECONDS and at once when Redis comes back without its data: a marker key
 * this service writes is gone (then again one grace period later, for jobs accepted just before).
 */
export class IntentReconciler {
  private readonly leader: RedisLeader;
  private readonly passes: PeriodicPass<IntentReport>;
  private markerTimer: NodeJS.Timeout | null = null;
  private later: NodeJS.Timeout | null = null;
  private lastPrune = 0;
  /** When this Redis started holding the service's data (the marker's value), once read. */
  private since: number | null = null;

  constructor(
    private readonly deps: {
      pool: DatabasePool;
      redis: Redis;
      prefix: string;
      log: Logger;
      records: JobRecords;
      credits: CreditReservations;
      slots: InFlightSlots;
      graceMs: number;
      intervalSeconds: number;
      /** JOB_RESULT_DAYS: intents are kept as long as job_results rows. */
      days: number;
      markerEveryMs?: number;
      lockMs?: number;
    },
  ) {
    this.leader = new RedisLeader(deps.redis, `${deps.prefix}:intents:lock`, deps.lockMs ?? 60_000);
    this.passes = new PeriodicPass(
      deps.intervalSeconds,
      () => this.pass(),
      (err) => this.failed(err),
    );
  }

  private get markerKey() {
    return `${this.deps.prefix}:intents:since`;
  }

  /**
   * Whether Idempotency-Key claims may have been lost with Redis's data in their lifetime (a day): then
   * a fresh claim asks the intents whether the key was used. Unknown (not read yet) counts as yes.
   */
  mayHaveLostClaims(): boolean {
    return this.since === null || Date.now() - this.since < CLAIM_TTL_MS;
  }

  start(): void {
    if (this.markerTimer) return;
    this.passes.start();
    const watch = () => {
      this.markerTimer = setTimeout(() => void this.checkMarker().finally(() => this.markerTimer && watch()), this.deps.markerEveryMs ?? 2_000);
      this.markerTimer.unref();
    };
    void this.checkMarker();
    watch();
  }

  async stop(): Promise<void> {
    for (const t of [this.markerTimer, this.later]) if (t) clearTimeout(t);
    this.markerTimer = this.later = null;
    await this.passes.stop();
  }

  /** Reads the marker; when it is missing, Redis lost its data (or is new): writes it and runs passes. */
  async checkMarker(): Promise<void> {
    try {
      const v = await this.deps.redis.get(this.markerKey);
      if (v) {
        this.since = Number(v);
        return;
      }
      const now = Date.now();
      await this.deps.redis.set(this.markerKey, String(now), 'NX');
      this.since = Number((await this.deps.redis.get(this.markerKey)) ?? now);
      this.deps.log.info('redis holds no intent marker (new or restarted without its data): looking for lost jobs');
      await this.runLogged();
      if (this.later) clearTimeout(this.later);
      this.later = setTimeout(() => void this.runLogged(), this.deps.graceMs + 500);
      this.later.unref();
    } catch {
      // Redis is down: the next check sees it back.
    }
  }

  private failed(err: Error): void {
    this.deps.log.warn({ err: err.message }, 'intent reconciler pass failed');
  }

  private runLogged(): Promise<unknown> {
    return this.runOnce().catch((err: Error) => this.failed(err));
  }

  /** One pass if no other process is running one. */
  runOnce(): Promise<IntentReport> {
    return this.passes.runOnce();
  }

  private async pass(): Promise<IntentReport> {
    const report: IntentReport = { ran: false, checked: 0, pending: 0, lost: 0 };
    return (await this.leader.run((keep) => this.look(report, keep), 'intent reconciler lock lost')) ?? report;
  }

  private async look(report: IntentReport, keepLock: () => Promise<void>): Promise<IntentReport> {
    const { pool, prefix, graceMs, log } = this.deps;
    report.ran = true;
    const deployment = deploymentOf(prefix);
    // A deployment's first pass starts a day back: before anything its processes could have accepted.
    await pool.query(sql.unsafe`
      INSERT INTO job_intents_watermark (deployment, through) VALUES (${deployment}, now() - interval '1 day')
      ON CONFLICT (deployment) DO NOTHING`);
    // The window, in Postgres time: from the watermark to one grace period ago.
    const win = await pool.one(sql.type(Window)`
      SELECT ((extract(epoch FROM through) * 1000000)::bigint)::text AS through_us,
        ((extract(epoch FROM now() - make_interval(secs => ${graceMs / 1000})) * 1000000)::bigint)::text AS upto_us
      FROM job_intents_watermark WHERE deployment = ${deployment}`);
    let oldestPending: string | null = null;
    let after: { us: string; id: string } | null = null;
    for (;;) {
      const page: ReadonlyArray<z.infer<typeof Candidate>> = await pool.any(sql.type(Candidate)`
        SELECT i.id, i.account_id, ((extract(epoch FROM i.created_at) * 1000000)::bigint)::text AS created_us
        FROM job_intents i
        WHERE i.deployment = ${deployment} AND i.created_at >= ${usTime(win.through_us)} AND i.created_at < ${usTime(win.upto_us)}
          ${after ? sql.fragment`AND (i.created_at, i.id) > (${usTime(after.us)}, ${after.id})` : sql.fragment``}
          AND i.state = 'accepted'
          AND NOT EXISTS (SELECT 1 FROM job_results r WHERE r.job_id = i.id)
        ORDER BY i.created_at, i.id
        LIMIT ${PAGE}`);
      if (!page.length) break;
      report.checked += page.length;
      const { pending, gone } = await this.whereAre(page.map((r) => r.id));
      report.pending += pending.size;
      const firstPending = page.find((r) => pending.has(r.id));
      if (firstPending && oldestPending === null) oldestPending = firstPending.created_us;
      if (gone.length) report.lost += await this.markLost(gone);
      const last = page[page.length - 1]!;
      after = { us: last.created_us, id: last.id };
      if (page.length < PAGE) break;
      await keepLock();
    }
    // Everything before the oldest job still in the queue (else before the window's end) is resolved.
    const through = oldestPending ?? win.upto_us;
    await pool.query(sql.unsafe`UPDATE job_intents_watermark SET through = GREATEST(through, ${usTime(through)}) WHERE deployment = ${deployment}`);
    if (report.lost) log.warn(report, 'intent reconciler marked lost jobs');
    await this.pruneNow();
    return report;
  }

  /** Which of these jobs Redis still has queued or running, and which it has not at all (no BullMQ job, no job record). */
  private async whereAre(ids: string[]): Promise<{ pending: Set<string>; gone: string[] }> {
    const { redis, prefix, records } = this.deps;
    const bull = queuePrefix(prefix);
    const states = await Promise.all(
      ids.map(async (id) => {
        const family = familyOfJob(id);
        const [created, finished] = family ? await redis.hmget(`${bull}:${queueName(family)}:${id}`, 'timestamp', 'finishedOn') : [null, null];
        if (created !== null) return finished === null ? 'pending' : 'ended';
        return (await records.raw(id)) ? 'ended' : 'gone';
      }),
    );
    return { pending: new Set(ids.filter((_, i) => states[i] === 'pending')), gone: ids.filter((_, i) => states[i] === 'gone') };
  }

  /** Marks these intents lost (each once, and never one whose outcome got stored), then gives back what they held and tells waiters. */
  private async markLost(ids: string[]): Promise<number> {
    const { pool, redis, prefix, credits, slots, log } = this.deps;
    const marked = await pool.any(sql.type(Marked)`
      UPDATE job_intents i SET state = 'lost'
      WHERE i.id = ANY(${sql.array(ids, 'text')}) AND i.state = 'accepted'
        AND NOT EXISTS (SELECT 1 FROM job_results r WHERE r.job_id = i.id)
      RETURNING i.id, i.account_id`);
    const byAccount = new Map<string, string[]>();
    for (const m of marked) byAccount.set(m.account_id, [...(byAccount.get(m.account_id) ?? []), m.id]);
    for (const [accountId, jobIds] of byAccount) {
      // Usually already gone with Redis's data; both are safe to repeat.
      await credits.release(accountId, jobIds).catch((err: Error) => log.warn({ err: err.message, accountId }, 'releasing lost holds failed'));
      await slots.release(accountId, jobIds).catch((err: Error) => log.warn({ err: err.message, accountId }, 'releasing lost slots failed'));
    }
    const channel = lostChannel(prefix);
    await Promise.all(marked.map((m) => redis.publish(channel, m.id).catch(() => 0)));
    return marked.length;
  }

  /** Deletes intents older than JOB_RESULT_DAYS, at most every PRUNE_EVERY_MS (idempotent, like job_results' pruning). */
  private async pruneNow(): Promise<void> {
    if (Date.now() - this.lastPrune < PRUNE_EVERY_MS) return;
    this.lastPrune = Date.now();
    for (let i = 0; i < 200; i++) {
      const res = await this.deps.pool.query(sql.unsafe`
        DELETE FROM job_intents d USING (
          SELECT id FROM job_intents
          WHERE deployment = ${deploymentOf(this.deps.prefix)} AND created_at < now() - make_interval(days => ${this.deps.days})
          LIMIT ${PRUNE_BATCH}
        ) old
        WHERE d.id = old.id`);
      if (res.rowCount < PRUNE_BATCH) break;
    }
  }
}

/** A microsecond epoch (text) as a timestamptz fragment. */
function usTime(us: string) {
  return sql.fragment`('epoch'::timestamptz + ${us}::bigint * interval '1 microsecond')`;
}
