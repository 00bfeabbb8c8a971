import { z } from 'zod';
import { ownsJob } from '../access/keys.js';
import type { Logger } from 'pino';
import { sql, type DatabasePool } from '../db/pool.js';
import { AppError } from '../errors.js';
import type { Redis } from '../queue/redis.js';
import type { JobQueues } from '../queue/queues.js';
import type { JobRecords } from '../queue/job-records.js';
import { FlowRecords, type FlowRecord } from '../queue/flows.js';
import type { CreditReservations } from '../money/holds.js';
import type { ResultsStore, StoredResult } from '../money/results.js';
import { slotOwner, type InFlightSlots } from '../access/in-flight.js';
import type { KeyCaller } from '../access/auth.js';
import { cancelKey, cancelChannel, cancelledError, type CallJobData } from '../queue/call-job.js';

/**
 * DELETE /jobs/{id}. Whether a job ends cancelled or charged is decided in Postgres, where settlement
 * decides it too: cancelling inserts the job's `job_results` row with status 'cancelled' (a conditional
 * insert keyed by the job id); settlement inserts the same row with its charge (settle_calls,
 * migrations/009_cancel.sql, never charges a job whose row says cancelled). Whichever row is written
 * first stands, so a job is never both charged and cancelled.
 *
 * Once the cancel stands, everyone is told: a Redis marker (read by a worker when it starts a job) and a
 * pub/sub message (read by every worker pool, which aborts the handler's `signal`, and by every
 * completion dispatcher, which answers waiting sync callers and SSE streams). A job still waiting is
 * removed from BullMQ here and its hold and in-flight slot given back; a running one is ended by its
 * worker, which gives them back.
 */

type StepAnswer = { tool: string; job_id: string; status: 'completed' | 'failed' | 'cancelled'; cost_cents: number };

const Inserted = z.object({ job_id: z.string() });

export class JobCanceller {
  constructor(
    private readonly deps: {
      prefix: string;
      pool: DatabasePool;
      redis: Redis;
      queues: JobQueues;
      records: JobRecords;
      flows: FlowRecords;
      credits: CreditReservations;
      slots: InFlightSlots;
      results: ResultsStore;
      log: Logger;
    },
  ) {}

  async cancel(caller: KeyCaller, jobId: string): Promise<{ status: number; body: Record<string, unknown> }> {
    const notFound = new AppError('not_found', `No job ${jobId} for this key`);
    const flow = await this.deps.flows.get(jobId);
    if (flow) {
      if (!ownsJob(caller, flow.keyId)) throw notFound;
      return this.cancelFlow(flow);
    }
    const view = await this.deps.queues.view(jobId).catch(() => null);
    if (view) {
      if (!ownsJob(caller, view.data.keyId)) throw notFound;
      if (view.state === 'pending') {
        const out = await this.cancelStep(jobId, view.data);
        if (out === 'cancelled') return { status: 200, body: { job_id: jobId, status: 'cancelled', cancelled: true } };
        throw finished(jobId, out);
      }
    }
    // Finished (or gone from Redis): its stored outcome says how.
    const stored = await this.deps.results.get(jobId);
    if (stored && ownsJob(caller, stored.keyId)) {
      if (stored.status === 'cancelled') return { status: 200, body: { job_id: jobId, status: 'cancelled', cancelled: true } };
      throw finished(jobId, stored);
    }
    if (view)
      throw finished(jobId, { status: view.state === 'completed' ? 'completed' : 'failed', costCents: view.state === 'completed' ? view.value.cost_cents : 0 });
    const rec = await this.deps.records.get(jobId).catch(() => null);
    if (rec && ownsJob(caller, rec.keyId)) {
      if (rec.error?.code === 'cancelled') return { status: 200, body: { job_id: jobId, status: 'cancelled', cancelled: true } };
      throw finished(jobId, { status: rec.state, costCents: rec.value?.cost_cents ?? 0 });
    }
    throw notFound;
  }

  /**
   * A chain or parallel request: every unfinished step is cancelled (a chain's later steps then never
   * run); steps that finished stay as they are, charged if they completed. 409 when all had finished.
   */
  private async cancelFlow(flow: FlowRecord): Promise<{ status: number; body: Record<string, unknown> }> {
    const steps: StepAnswer[] = [];
    const cancelled: Array<{ jobId: string; data: CallJobData }> = [];
    for (const s of flow.steps) {
      const job = await this.deps.queues.getJob(s.jobId);
      const state = job ? await job.getState() : 'unknown';
      if (job && state !== 'completed' && state !== 'failed') {
        const out = await this.claim(s.jobId, job.data, job.timestamp);
        if (out === 'cancelled') {
          cancelled.push({ jobId: s.jobId, data: job.data });
          steps.push({ tool: s.tool, job_id: s.jobId, status: 'cancelled', cost_cents: 0 });
          continue;
        }
        steps.push({ tool: s.tool, job_id: s.jobId, status: out.status === 'completed' ? 'completed' : 'failed', cost_cents: out.costCents });
        continue;
      }
      const stored = await this.deps.results.get(s.jobId);
      const status = stored?.status ?? (state === 'completed' ? 'completed' : 'failed');
      const cost = stored ? stored.costCents : state === 'completed' ? (job?.returnvalue?.cost_cents ?? 0) : 0;
      steps.push({ tool: s.tool, job_id: s.jobId, status, cost_cents: status === 'completed' ? cost : 0 });
    }
    if (!cancelled.length) {
      throw new AppError('job_finished', `Job ${flow.rootId} already finished; nothing was cancelled`, { job_id: flow.rootId, mode: flow.mode, steps });
    }
    await this.mark(cancelled.map((c) => c.jobId));
    // The whole tree goes at once when no step is running (a parallel request's root too); otherwise
    // each waiting step on its own, and a running one is ended by its worker (a chain's later steps fail with it).
    const root = await this.deps.queues.getJob(flow.rootId);
    const treeGone = root
      ? await root.remove().then(
          () => true,
          () => false,
        )
      : true;
    for (const c of cancelled) {
      if (!treeGone) await this.removeWaiting(c.jobId);
      if (!(await this.deps.queues.getJob(c.jobId))) await this.gone(c.jobId, c.data);
    }
    await this.publish(cancelled.map((c) => c.jobId));
    const charged = steps.filter((s) => s.status === 'completed').reduce((n, s) => n + s.cost_cents, 0);
    return { status: 200, body: { job_id: flow.rootId, status: 'cancelled', cancelled: true, mode: flow.mode, steps, cost_cents: charged } };
  }

  /** One job: 'cancelled' when the cancel stands, else the outcome it already had. */
  private async cancelStep(jobId: string, data: CallJobData): Promise<'cancelled' | Pick<StoredResult, 'status' | 'costCents'>> {
    const job = await this.deps.queues.getJob(jobId);
    const out = await this.claim(jobId, data, job?.timestamp ?? Date.now());
    if (out !== 'cancelled') return out;
    await this.mark([jobId]);
    if (await this.removeWaiting(jobId)) await this.gone(jobId, data);
    await this.publish([jobId]);
    return 'cancelled';
  }

  /** The atomic decision: the cancelled row, unless the job already has an outcome (or a charge). */
  private async claim(jobId: string, data: CallJobData, createdMs: number): Promise<'cancelled' | Pick<StoredResult, 'status' | 'costCents'>> {
    if (!data.accountId) throw new AppError('not_found', `No job ${jobId} for this key`);
    const body = JSON.stringify(cancelledError().toJSON());
    const row = await this.deps.pool.maybeOne(sql.type(Inserted)`
      INSERT INTO job_results (job_id, account_id, key_id, tool, status, cost_cents, body, created_at)
      SELECT ${jobId}, ${data.accountId}, ${data.keyId}, ${data.tool}, 'cancelled', 0, ${body}::jsonb,
        'epoch'::timestamptz + ${createdMs}::bigint * interval '1 millisecond'
      WHERE NOT EXISTS (SELECT 1 FROM ledger WHERE entry_key = ${jobId})
      ON CONFLICT (job_id) DO NOTHING
      RETURNING job_id`);
    if (row) return 'cancelled';
    const stored = await this.deps.results.get(jobId);
    if (stored?.status === 'cancelled') return 'cancelled';
    return stored ?? { status: 'completed', costCents: data.priceCents };
  }

  /** Marks the jobs cancelled for a worker about to start one (before anything else is told). */
  private async mark(jobIds: string[]): Promise<void> {
    const { redis, prefix } = this.deps;
    // One command per marker: each job's marker has its own slot in a cluster (no pipeline spans them).
    await Promise.all(jobIds.map((id) => redis.set(cancelKey(prefix, id), '1', 'EX', 24 * 3600)));
  }

  /**
   * Tells workers (abort the signal) and dispatchers (answer waiting callers and streams). Last, so a
   * stream that reads the job on hearing it finds it removed and its cancelled record written.
   */
  private async publish(jobIds: string[]): Promise<void> {
    for (const id of jobIds) await this.deps.redis.publish(cancelChannel(this.deps.prefix), id);
  }

  /** Takes a job that is not running out of BullMQ. False when it runs (locked) or is already gone. */
  private async removeWaiting(jobId: string): Promise<boolean> {
    const job = await this.deps.queues.getJob(jobId);
    if (!job) return false;
    // A chain step waiting for its children is left to fail with the running one (failParentOnFailure):
    // removing a parent under a running child would leave that child without its parent.
    const state = await job.getState();
    if (state !== 'waiting' && state !== 'delayed' && state !== 'prioritized') return false;
    return job.remove({ removeChildren: false }).then(
      () => true,
      () => false,
    );
  }

  /** A cancelled job that will never run: its outcome for readers of Redis, its hold and slot back. */
  private async gone(jobId: string, data: CallJobData): Promise<void> {
    await this.deps.records.put(jobId, { state: 'failed', error: cancelledError().toJSON(), keyId: data.keyId, accountId: data.accountId });
    const owner = slotOwner(data);
    if (owner) await this.deps.slots.release(owner, [jobId]);
    if (data.accountId && data.priceCents > 0) await this.deps.credits.release(data.accountId, [jobId]);
  }
}

function finished(jobId: string, out: Pick<StoredResult, 'status' | 'costCents'>): AppError {
  const charged = out.status === 'completed' ? out.costCents : 0;
  return new AppError(
    'job_finished',
    `Job ${jobId} already ${out.status === 'completed' ? 'completed' : 'failed'}; nothing was cancelled (GET /jobs/${jobId} has its outcome)`,
    {
      job_id: jobId,
      status: out.status === 'completed' ? 'completed' : 'failed',
      cost_cents: charged,
    },
  );
}

/** One canceller per container (the routes share it). */
const byContainer = new WeakMap<object, JobCanceller>();
export function cancellerFor(c: {
  config: { REDIS_PREFIX: string };
  pool: DatabasePool;
  redis: Redis;
  queues: JobQueues;
  records: JobRecords;
  credits: CreditReservations;
  slots: InFlightSlots;
  results: ResultsStore;
  log: Logger;
}): JobCanceller {
  let j = byContainer.get(c);
  if (!j) {
    const prefix = c.config.REDIS_PREFIX;
    j = new JobCanceller({
      prefix,
      pool: c.pool,
      redis: c.redis,
      queues: c.queues,
      records: c.records,
      flows: new FlowRecords(c.redis, prefix),
      credits: c.credits,
      slots: c.slots,
      results: c.results,
      log: c.log,
    });
    byContainer.set(c, j);
  }
  return j;
}
