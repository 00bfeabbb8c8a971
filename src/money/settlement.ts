/**
 * money/: credits and where they go. Holds taken at admission, settlement (this file: a job's charge
 * and its answer written together, exactly once), stored results, partners' shares and the
 * reconciler that repairs holds after a crash. Every cent that moves, moves here.
 */
import { z } from 'zod';
import type pg from 'pg';
import type { Logger } from 'pino';
import type { CreditReservations } from './holds.js';
import type { Metrics } from '../ops/metrics.js';
import type { StoredOutcome } from '../queue/call-job.js';
import { pgSafeJson } from '../db/pg-text.js';
import { traced } from '../tracing.js';

/**
 * One finished call made with a key: its charge (if any) and its answer, written together. Keyed by the
 * job id, so settling the same job twice charges once and keeps the first answer.
 */
export interface Settlement {
  jobId: string;
  accountId: string;
  keyId: string | null;
  tool: string;
  /** completed: charged `amount` (ledger) and answered `result`; failed: answered the error `result`. */
  status: 'completed' | 'failed';
  /** Cents debited from the account (0: free tool, sandbox key, or a failure: no ledger row). */
  amount: number;
  /** `cost_cents` of the answer. */
  costCents: number;
  /** completed: the tool's result; failed: the error ({code, message, details?}). */
  result: unknown;
  /** `result` as JSON, when the caller has it already (the runner measures every answer): not serialised again. */
  resultJson?: string;
  sandbox: boolean;
  agentName: string | null;
  usage: Record<string, number> | null;
  /** When the job was queued (ms since the epoch); null: now. */
  createdAt: number | null;
  /** Reservation to drop once the charge is durable (null for calls without a hold). */
  holdId: string | null;
  /** The call's vetted Callback-Url: its delivery's outbox row is written with this outcome (src/calls/webhooks.ts). */
  callbackUrl?: string;
  /** The job whose slot in flight (its account's) is given back once it is settled completed. */
  slotId?: string;
}

export interface Settled {
  /** The account's balance after the batch that held this settlement. */
  remaining: number | null;
  /**
   * Set when this job already had an outcome (so nothing was written now, nor charged): the stored
   * one, which is what the caller must be told. A completed settlement replaces a stored failure and
   * so never sees one here.
   */
  prior: StoredOutcome | null;
  /** False when the job already had an outcome (`prior` is that outcome, when it was readable). */
  stored: boolean;
  /** The entry's `slotId` was given back with the batch's holds (else its worker gives it back). */
  slotReleased?: boolean;
}

interface Pending {
  entry: Settlement;
  resolve: (s: Settled) => void;
  reject: (e: unknown) => void;
}

const SettledRows = z.array(
  z.object({
    job_id: z.string(),
    credits: z.coerce.number().int().nullable(),
    stored: z.boolean(),
    prior_status: z.enum(['completed', 'failed', 'cancelled']).nullable(),
    prior_body: z.record(z.unknown()).nullable(),
    prior_truncated: z.boolean().nullable(),
  }),
);

/** The first `maxBytes` bytes of `text` (UTF-8), never ending inside a character. */
function utf8Prefix(text: string, maxBytes: number): string {
  const cut = Buffer.from(text, 'utf8').subarray(0, maxBytes).toString('utf8');
  return cut.endsWith('\uFFFD') && !text.startsWith(cut) ? cut.slice(0, -1) : cut;
}

/**
 * Settles finished calls in Postgres in batches: every few milliseconds one statement
 * (`settle_calls`, migrations/005_job_results.sql) inserts the batch's ledger rows (ON CONFLICT on the
 * job id does nothing), moves each account's balance by the sum of the rows actually inserted, and
 * stores every call's answer in `job_results` with the balance it reports. A charge and its answer are
 * thus one fact: a hot account pays one commit per batch, not per call, a job delivered twice is
 * charged once and answered with its first answer, and a charged call can be answered after Redis lost
 * it. Callers wait for the commit before their job completes, so a crash before it leaves the job to
 * be redelivered and settled then.
 */
export class Settler {
  private queue: Pending[] = [];
  private timer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> | null = null;
  /**
   * For jobs that ended outside a settlement statement (a stored outcome answered again by a
   * redelivered job): writes their webhook's outbox row, once per job (src/calls/webhooks.ts).
   */
  onEnded: ((entries: Array<Pick<Settlement, 'jobId' | 'accountId' | 'callbackUrl'>>) => Promise<void>) | null = null;
  /**
   * The webhook outbox (src/calls/webhooks.ts): an entry with a callback has its delivery's row written
   * by the statement that settles it, under this deployment's `scope`, so the delivery commits or rolls
   * back with the outcome it reports; `wake` tells this process's relay once it is committed. Entries
   * without a callback run the plain statement and pay nothing for it.
   */
  outbox: { scope: string; wake: () => void } | null = null;
  /**
   * Told of every committed charge, before its caller is answered (src/calls/alerts.ts checks the spend
   * thresholds of the accounts and keys charged). Its failure costs an alert's timing, never a charge.
   */
  onCharged: ((entries: Array<Pick<Settlement, 'accountId' | 'keyId'>>) => Promise<void>) | null = null;

  constructor(
    /**
     * A plain pg pool, not slonik: this one statement is the hot path of every paid call, and slonik's
     * per-query machinery (interceptors, query contexts) more than doubled its cost when measured
     * (1.27 ms against 0.55 ms). The statement is fixed and its result is still validated with zod.
     */
    private readonly pool: pg.Pool,
    private readonly credits: CreditReservations,
    private readonly log: Logger,
    private readonly batchMs: number,
    private readonly batchMax: number,
    /** Answers larger than this (JSON bytes) are stored truncated (RESULT_MAX_BYTES). */
    private readonly resultMaxBytes: number = 1_000_000,
    /** Batches, their sizes and times, and cents charged (src/ops/metrics.ts). */
    private readonly metrics: Pick<Metrics, 'settlementBatches' | 'settlementBatchSize' | 'settlementSeconds' | 'centsCharged'> | null = null,
  ) {}

  /** Resolves once the settlement is committed (or found already there). */
  settle(entry: Settlement): Promise<Settled> {
    const settled = () =>
      new Promise<Settled>((resolve, reject) => {
        this.queue.push({ entry, resolve, reject });
        this.schedule();
      });
    return traced('settlement', settled, { 'tollgate.outcome': entry.status, 'tollgate.cost_cents': entry.costCents });
  }

  /**
   * Group commit: when no write is running, the next one starts at once (after `batchMs`, 0 by
   * default, and the current tick, so settlements arriving together go together); while one runs, new
   * ones wait and all go in the next statement. Idle latency stays one round trip and a hot account's
   * throughput is bounded by statements, not by rows.
   */
  private schedule() {
    if (this.flushing || this.timer) return;
    if (this.queue.length >= this.batchMax || this.batchMs === 0) {
      this.timer = setImmediate(() => void this.flush()) as unknown as NodeJS.Timeout;
    } else {
      this.timer = setTimeout(() => void this.flush(), this.batchMs);
    }
  }

  private async flush(): Promise<void> {
    this.timer = null;
    const batch = this.take();
    if (!batch.length) return;
    this.flushing = this.write(batch);
    await this.flushing;
    this.flushing = null;
    if (this.queue.length) this.schedule();
  }

  /** The next batch: at most `batchMax`, one entry per job id (a second one waits for the next batch). */
  private take(): Pending[] {
    if (this.queue.length <= 1) return this.queue.splice(0);
    const seen = new Set<string>();
    const batch: Pending[] = [];
    const later: Pending[] = [];
    for (const p of this.queue) {
      if (batch.length < this.batchMax && !seen.has(p.entry.jobId)) {
        seen.add(p.entry.jobId);
        batch.push(p);
      } else later.push(p);
    }
    this.queue = later;
    return batch;
  }

  private async write(batch: Pending[]): Promise<void> {
    let settled: Settled[];
    const m = this.metrics;
    const started = m ? process.hrtime.bigint() : 0n;
    try {
      settled = await this.commit(batch.map((p) => p.entry));
      if (m) {
        m.settlementSeconds.observe(Number(process.hrtime.bigint() - started) / 1e9);
        m.settlementBatches.inc();
        m.settlementBatchSize.observe(batch.length);
        // Charged now: completed, written by this statement (not a redelivery's second settlement).
        batch.forEach((p, i) => {
          const e = p.entry;
          if (e.status === 'completed' && e.amount > 0 && settled[i]!.stored) m.centsCharged.inc({ tool: e.tool }, e.amount);
        });
      }
    } catch (e) {
      // A value Postgres refuses (class 22, data exception) fails only its own entry: retry one by one.
      const code = (e as { code?: string }).code;
      if (batch.length > 1 && code?.startsWith('22')) {
        this.log.warn({ err: (e as Error).message, batch: batch.length }, 'settlement batch refused a value; settling one by one');
        for (const p of batch) await this.write([p]);
        return;
      }
      this.log.error({ err: e, batch: batch.length }, 'settlement batch failed; jobs will be retried');
      for (const p of batch) p.reject(e);
      return;
    }
    if (this.outbox && batch.some((p) => p.entry.callbackUrl)) this.outbox.wake();
    // A redelivery's second settlement counts too: the check reads committed state, so it is only ever late, never double.
    const charged = this.onCharged ? batch.filter((p) => p.entry.status === 'completed' && p.entry.amount > 0).map((p) => p.entry) : [];
    await Promise.all([
      this.dropHoldsAndFreeSlots(batch, settled),
      charged.length
        ? this.onCharged!(charged).catch((err: Error) => this.log.warn({ err: err.message, entries: charged.length }, 'checking spend alerts failed'))
        : undefined,
    ]);
    batch.forEach((p, i) => p.resolve(settled[i]!));
  }

  /**
   * The charges are durable now and `avail` already excludes them: the batch's holds are dropped, and
   * the slots in flight of the jobs that completed given back, one script per account for the whole
   * batch (instead of a command per job from each worker). Waited for, so a caller answered can start
   * its next call at once, but for at most a second: with Redis slow or gone the answers go anyway. A
   * hold left behind is only read if the same job later failed for good, which a settled job does not
   * (and the reconciler drops it); a slot not given back here is given back by the job's worker.
   * Not a job found cancelled: it was not charged, so its hold is given back (the runner), not dropped.
   */
  private async dropHoldsAndFreeSlots(batch: Pending[], settled: Settled[]): Promise<void> {
    const items: Array<{ accountId: string; holdId: string | null; slotId?: string }> = [];
    const freed: Settled[] = [];
    batch.forEach((p, i) => {
      const e = p.entry;
      const s = settled[i]!;
      if (e.status !== 'completed' || s.prior?.status === 'cancelled') return;
      const completed = s.stored || s.prior?.status === 'completed';
      const slotId = completed ? e.slotId : undefined;
      if (!e.holdId && !slotId) return;
      items.push({ accountId: e.accountId, holdId: e.holdId, slotId });
      if (slotId) freed.push(s);
    });
    if (!items.length) return;
    let timer: NodeJS.Timeout | undefined;
    const ok = await Promise.race([
      this.credits.settled(items).then(
        () => true,
        (err) => (this.log.warn({ err, holds: items.length }, 'dropping settled holds failed'), false),
      ),
      new Promise<false>((r) => (timer = setTimeout(() => r(false), 1_000))),
    ]);
    clearTimeout(timer);
    if (ok) for (const s of freed) s.slotReleased = true;
  }

  /** The batch as the statement's JSON argument; each result is serialised once, here. */
  private batchJson(entries: Settlement[]): string {
    const parts = entries.map((s) => {
      let result = s.resultJson ?? JSON.stringify(s.result) ?? 'null';
      let truncated = false;
      if (result.length > this.resultMaxBytes || (result.length * 3 > this.resultMaxBytes && Buffer.byteLength(result) > this.resultMaxBytes)) {
        // Over RESULT_MAX_BYTES: the start of its JSON text, as a string.
        result = JSON.stringify(utf8Prefix(result, this.resultMaxBytes));
        truncated = true;
      }
      const head = JSON.stringify({
        job_id: s.jobId,
        account_id: s.accountId,
        key_id: s.keyId,
        tool: s.tool,
        amount: s.amount,
        agent_name: s.agentName,
        usage: s.usage,
        status: s.status,
        cost: s.costCents,
        sandbox: s.sandbox,
        truncated,
        created_ms: s.createdAt,
      });
      return `${head.slice(0, -1)},"result":${result}}`;
    });
    // `\u0000` and lone surrogates are valid JSON but not jsonb: one in one caller's result would fail everyone's batch.
    return pgSafeJson(`[${parts.join(',')}]`);
  }

  private async commit(entries: Settlement[]): Promise<Settled[]> {
    const json = this.batchJson(entries);
    const hooks = this.outbox ? entries.filter((s) => s.callbackUrl).map((s) => ({ job_id: s.jobId, account_id: s.accountId, url: s.callbackUrl })) : [];
    // With callbacks: the outbox rows are a second CTE of the same statement (so the same
    // transaction); ON CONFLICT keeps a job settled twice at one row and one webhook-id.
    const query = hooks.length
      ? {
          name: 'settle_calls_hooked',
          text: `WITH s AS (SELECT job_id, credits, stored, prior_status, prior_body, prior_truncated FROM settle_calls($1::jsonb)),
            h AS (INSERT INTO webhook_jobs (job_id, account_id, url, scope)
              SELECT x.job_id, x.account_id, x.url, $3 FROM jsonb_to_recordset($2::jsonb) AS x(job_id text, account_id uuid, url text)
              ON CONFLICT (job_id) DO NOTHING)
            SELECT * FROM s`,
          values: [json, JSON.stringify(hooks), this.outbox!.scope],
        }
      : {
          name: 'settle_calls',
          text: 'SELECT job_id, credits, stored, prior_status, prior_body, prior_truncated FROM settle_calls($1::jsonb)',
          values: [json],
        };
    // Deadlocks between two workers' batches touching the same accounts in another order are
    // possible; Postgres aborts one statement, which is safe to run again as a whole.
    for (let attempt = 1; ; attempt++) {
      try {
        const { rows: raw } = await this.pool.query(query);
        const byJob = new Map(SettledRows.parse(raw).map((r) => [r.job_id, r]));
        return entries.map((s) => {
          const r = byJob.get(s.jobId);
          if (!r) throw new Error(`settle_calls returned no row for ${s.jobId}`);
          return {
            remaining: r.credits,
            stored: r.stored,
            prior: r.prior_status && r.prior_body ? { status: r.prior_status, body: r.prior_body, truncated: r.prior_truncated ?? false } : null,
          };
        });
      } catch (e) {
        const code = (e as { code?: string }).code;
        // 40001: a job of the batch was cancelled while it settled (settle_calls, migrations/009_cancel.sql);
        // run again, the charge is then skipped.
        if ((code === '40P01' || code === '40001') && attempt < 5) continue;
        throw e;
      }
    }
  }

  /** Waits for queued settlements to be written (graceful shutdown). */
  async drain(): Promise<void> {
    while (this.queue.length || this.flushing) {
      if (this.flushing) await this.flushing;
      else await this.flush();
    }
  }
}
