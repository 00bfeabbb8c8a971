import { DelayedError, Queue, UnrecoverableError, Worker, type Job } from 'bullmq';
import { AppError } from '../errors.js';
import type { Logger } from 'pino';
import { concurrencyFor, type Config, type Family } from '../config.js';
import { JobFailure, type JobRun, type ToolRunner } from './runner.js';
import { JOB_CANCELLED, cancelChannel, cancelKey, type CallJobData, type CallResult } from '../queue/call-job.js';
import { encodeFailure, failedReturn, isCallersFailure, returnedFailure, type FailedReturn } from '../queue/failure.js';
import { queueName } from '../queue/queues.js';
import { connectRedis, type Redis } from '../queue/redis.js';
import { queuePrefix } from '../queue/keyspace.js';
import type { JobRecords } from '../queue/job-records.js';
import type { ToolProgress } from '../tools/types.js';
import type { AppendedEvent, JobEventLog } from '../queue/job-events.js';
import { PARALLEL_ROOT_JOB } from '../queue/flows.js';
import { slotOwner, type InFlightSlots } from '../access/in-flight.js';
import { WorkerHeartbeat } from '../queue/heartbeat.js';
import { findTool } from '../tools/index.js';
import type { Metrics } from '../ops/metrics.js';
import { isResultRef, refFor, sealedRef, type JobReturn, type ResultRefs } from '../queue/result-refs.js';
import { jobSeal } from '../queue/job-seal.js';
import { annotate, callAttributes, jobContext, recordSpan, SpanKind, traced } from '../tracing.js';

/** What a job returns to BullMQ: its answer (or a reference to it), or a caller's failure. */
type Ending = JobReturn | FailedReturn;

/**
 * A job's part of its caller's trace (src/tracing.ts), continued from the context BullMQ stored with
 * it when it was queued, on whichever machine this is: its wait in the queue (first attempt), then its
 * run, parent of the sandbox, upstream HTTP and settlement spans. A job queued untraced just runs.
 */
function traceRun<T>(job: Job<CallJobData, unknown>, run: () => Promise<T>): Promise<T> {
  const parent = jobContext(job.opts.telemetry?.metadata);
  if (!parent) return run();
  const attributes = callAttributes({
    tool: job.data.tool,
    family: findTool(job.data.tool)?.family ?? 'unknown',
    jobId: job.id!,
    accountId: job.data.accountId,
  });
  if (job.attemptsMade === 0 && job.processedOn) recordSpan('queue wait', job.timestamp, job.processedOn, attributes, parent);
  return traced('tool run', run, { ...attributes, 'tollgate.attempt': job.attemptsMade + 1 }, { kind: SpanKind.CONSUMER, parent });
}

/** Reason given to a finished job's signal; one shared object, so no DOMException per job. */
const JOB_FINISHED = new Error('job finished');

/** A job over its owner's fair share waits this long at first, doubling per wait up to the maximum. */
const FAIR_WAIT_MS = 25;
const FAIR_WAIT_MAX_MS = 2_000;

/**
 * Fair share of one family's workers in this process. BullMQ's open-source edition has no per-group
 * concurrency, so the processor decides: an owner (account or payer) already running its share
 * (`share` jobs) gets a further job only while no other owner has a job running here, and never more
 * than `concurrency - share`, so a share's worth of workers is always free for a newcomer: the worker
 * keeps taking jobs, sends back the ones over their owner's limit, and reaches the newcomer's job at
 * once. A job sent back goes to the delayed set (not counted as an attempt; 25 ms at first, doubling
 * to 2 s) and the worker takes the next job in the queue, whoever's it is. Once another owner runs
 * here, a busy owner's excess drains down to its share as its jobs finish. Counted per process: each
 * replica gives an owner its share of its own workers, so the share of the whole pool is the same.
 *
 * Strict caps would leave workers idle while one busy account waits; this keeps the pool working for
 * a lone account and still gives every other account a worker as soon as its job reaches the front.
 */
class FairShare {
  private readonly running = new Map<string, number>();
  /** How often each job was sent back, for its next wait. */
  private readonly waits = new Map<string, number>();

  constructor(
    readonly share: number,
    private readonly concurrency: number,
  ) {}

  tryStart(owner: string, jobId: string): boolean {
    const n = this.running.get(owner) ?? 0;
    const othersRunning = this.running.size > (n > 0 ? 1 : 0);
    if (n >= this.share && (n >= this.concurrency - this.share || othersRunning)) return false;
    this.running.set(owner, n + 1);
    this.waits.delete(jobId);
    return true;
  }

  end(owner: string): void {
    const n = (this.running.get(owner) ?? 1) - 1;
    if (n > 0) this.running.set(owner, n);
    else this.running.delete(owner);
  }

  /** How long a job over its owner's share waits before it is offered again (with jitter). */
  waitFor(jobId: string): number {
    const k = this.waits.get(jobId) ?? 0;
    if (this.waits.size > 100_000) this.waits.clear();
    this.waits.set(jobId, k + 1);
    const base = Math.min(FAIR_WAIT_MAX_MS, FAIR_WAIT_MS * 2 ** k);
    return Math.round(base * (0.75 + Math.random() / 2));
  }
}

/**
 * One BullMQ worker per tool family, each sized by its CONCURRENCY_<FAMILY> setting. The processor only
 * adapts a BullMQ job to the ToolRunner, so HTTP and the queue run the same service code.
 */
/**
 * A job that failed for good keeps its error, not the caller's input (retries, which need it, are
 * over). Best effort: the job leaves Redis after JOB_REDIS_RETENTION_SECONDS anyway.
 */
export async function dropJobInput(job: Job<CallJobData, unknown>, log?: Pick<Logger, 'warn'>): Promise<void> {
  if (job.data.inputDropped) return;
  await job
    .updateData({ ...job.data, input: {}, sealedInput: undefined, inputDropped: true })
    .catch((err: Error) => log?.warn({ err: err.message, job: job.id }, "dropping a failed job's input failed"));
}

export class WorkerPool {
  private readonly workers: Worker[] = [];
  private readonly redis: Redis;
  /** Live-worker heartbeats per family in Redis, read by GET /health. */
  private heartbeat: WorkerHeartbeat | null = null;
  /** Jobs running here, so a cancel (pub/sub, src/calls/cancel.ts) can abort the handler's signal. */
  private readonly running = new Map<string, AbortController>();
  private sub: Redis | null = null;
  /** Removes finished jobs past JOB_REDIS_RETENTION_SECONDS from queues that have gone quiet (see `clean`). */
  private cleaner: NodeJS.Timeout | null = null;
  private cleaning: Promise<void> | null = null;
  private readonly cleanQueues = new Map<Family, Queue>();

  constructor(
    private readonly deps: {
      config: Config;
      log: Logger;
      runner: ToolRunner;
      records: JobRecords;
      onProgress?: (jobId: string, p: ToolProgress) => Promise<void>;
      /** Keeps progress and flow-step outcomes for SSE replay (GET /jobs/{id}/events). */
      events?: JobEventLog;
      /** Jobs in flight per account: a job's slot is given back when it finishes or fails for good. */
      slots: InFlightSlots;
      /** Tool calls, run times and queue waits (src/ops/metrics.ts). */
      metrics?: Metrics;
      /** Resolves a chain step's reference to the previous step's stored answer (src/queue/result-refs.ts). */
      refs?: ResultRefs;
    },
    private readonly families: readonly Family[],
  ) {
    this.redis = connectRedis(deps.config.REDIS_URL);
    // Reconnects on its own; the BullMQ workers report the outage.
    this.redis.on('error', (err: Error) => deps.log.debug({ err: err.message }, 'worker pool redis connection error'));
  }

  async start(): Promise<void> {
    const { config, log } = this.deps;
    // Subscribed before any worker takes a job; a job started after a cancel went by sees its marker.
    this.sub = connectRedis(config.REDIS_URL);
    this.sub.on('error', (err: Error) => log.debug({ err: err.message }, 'cancel subscription connection error'));
    this.sub.on('message', (_channel: string, jobId: string) => this.running.get(jobId)?.abort(JOB_CANCELLED));
    await this.sub.subscribe(cancelChannel(config.REDIS_PREFIX));
    for (const family of this.families) {
      const concurrency = concurrencyFor(config, family);
      const fair = new FairShare(Math.max(1, Math.floor(concurrency * config.FAIR_SHARE)), concurrency);
      const worker = new Worker<CallJobData, Ending>(queueName(family), (job, token) => this.fairly(fair, job, token), {
        connection: connectRedis(config.REDIS_URL),
        prefix: queuePrefix(config.REDIS_PREFIX),
        concurrency,
        lockDuration: config.WORKER_LOCK_MS,
        stalledInterval: Math.max(500, Math.floor(config.WORKER_LOCK_MS / 2)),
        maxStalledCount: 1,
      });
      worker.on('error', (err) => log.error({ err: err.message, family }, 'worker error'));
      this.workers.push(worker);
      await worker.waitUntilReady();
    }
    this.heartbeat = new WorkerHeartbeat(this.redis, config.REDIS_PREFIX, this.families);
    await this.heartbeat.start();
    const every = Math.min(60_000, Math.max(1_000, (config.JOB_REDIS_RETENTION_SECONDS * 1000) / 2));
    this.cleaner = setInterval(() => {
      this.cleaning ??= this.clean().finally(() => (this.cleaning = null));
    }, every);
    this.cleaner.unref();
    log.info({ families: this.families }, 'workers started');
  }

  /** Runs the job if its owner is within its fair share of this family's workers, else offers it later. */
  private async fairly(fair: FairShare, job: Job<CallJobData, Ending>, token: string | undefined): Promise<Ending> {
    const owner = job.name === PARALLEL_ROOT_JOB ? null : slotOwner(job.data);
    if (!owner) return this.process(job);
    if (!fair.tryStart(owner, job.id!)) {
      await job.moveToDelayed(Date.now() + fair.waitFor(job.id!), token);
      throw new DelayedError();
    }
    try {
      return await traceRun(job, () => this.process(job));
    } finally {
      fair.end(owner);
    }
  }

  private async process(job: Job<CallJobData, Ending>): Promise<Ending> {
    // A parallel request's root only gathers its children, which have all finished by now; the API
    // reads their outcomes (src/calls/protocol.ts). Nothing runs and nothing is charged.
    if (job.name === PARALLEL_ROOT_JOB) return { result: null, cost_cents: 0, remaining_credits: null };
    const logId = job.data.eventLog ?? job.id!;
    // Best effort: a lost replay entry must not fail (and so re-run) a call that worked.
    const logEvent = async (e: AppendedEvent) =>
      this.deps.events?.append(logId, e).catch((err: Error) => this.deps.log.warn({ err: err.message, job: job.id }, 'event log write failed'));
    const abort = new AbortController();
    const ephemeral = job.data.edgeToken !== undefined;
    const record = { keyId: job.data.keyId, accountId: job.data.accountId };
    const m = this.deps.metrics;
    const labels = { tool: job.data.tool, family: findTool(job.data.tool)?.family ?? 'unknown' };
    const started = performance.now();
    // A chain step after one that failed by its caller's doing (which completed) never runs.
    if (job.data.qFromPrevious) {
      const before = await this.previousFailure(job);
      if (before) return this.notRun(job, before);
    }
    this.running.set(job.id!, abort);
    if (m && job.attemptsMade === 0 && job.processedOn)
      m.queueWaitSeconds.observe({ family: labels.family }, Math.max(0, job.processedOn - job.timestamp) / 1000);
    // A call's outcome is counted once: when it succeeds or fails for good (not a failure to be retried).
    const finished = (outcome: string) => {
      annotate({ 'tollgate.outcome': outcome });
      m?.toolRunSeconds.observe(labels, (performance.now() - started) / 1000);
      m?.toolCalls.inc({ ...labels, outcome });
    };
    try {
      // Cancelled while it waited (the pub/sub message came before this job ran here): it must not run.
      if ((await this.redis.exists(cancelKey(this.deps.config.REDIS_PREFIX, job.id!)).catch(() => 0)) === 1) abort.abort(JOB_CANCELLED);
      const run: JobRun = {
        id: job.id!,
        attemptsMade: job.attemptsMade,
        // A retry, or a redelivery after a stall (not fair-share waits, which count no attempt).
        redelivered: job.attemptsMade > 0 || job.stalledCounter > 0,
        createdAt: job.timestamp,
        maxAttempts: job.opts.attempts ?? 1,
        signal: abort.signal,
        progress: async (p) => {
          // Logged before the BullMQ progress event: a stream woken by that event then finds the entry.
          await logEvent({ type: 'progress', job: job.id!, data: p });
          await job.updateProgress(p as unknown as object);
          await this.deps.onProgress?.(job.id!, p);
        },
        previousOutput: async () => {
          const values = await job.getChildrenValues<Ending>();
          const [key, first] = Object.entries(values)[0] ?? [];
          if (!isResultRef(first)) return (first as CallResult | undefined)?.result;
          // The previous step's answer was large: job_results (or its record) holds it. Keys read `<prefix>:<queue>:<id>`.
          if (!this.deps.refs) throw new Error("a chain step needs refs to read the previous step's stored answer");
          return (await this.deps.refs.resolve(key!.slice(key!.lastIndexOf(':') + 1), first)).result;
        },
      };
      const full = await this.deps.runner.run(job.data, run);
      annotate({ 'tollgate.cost_cents': full.cost_cents });
      finished('ok');
      // The call is settled and answered now: a failure below must not fail (and re-run) it.
      const value = await this.compact(job, run, full);
      if (ephemeral && !(isResultRef(value) && value.stored === 'job_record')) {
        await this.deps.records
          .put(job.id!, { state: 'completed', value, ...record })
          .catch((err: Error) => this.deps.log.warn({ err: err.message, job: job.id }, 'job record write failed'));
      }
      if (job.data.eventLog) await logEvent({ type: 'step', job: job.id!, outcome: 'completed', value });
      if (!run.slotReleased) await this.releaseSlots(job.data, [job.id!]);
      return value;
    } catch (e) {
      if (!(e instanceof JobFailure)) throw e;
      if (e.final) {
        finished(e.error.code);
        // Later chain steps never run once this one failed: their slots go back with its own.
        await this.releaseSlots(job.data, [job.id!, ...(job.data.laterSteps ?? [])]);
        if (ephemeral) await this.deps.records.put(job.id!, { state: 'failed', error: e.error.toJSON(), ...record });
        if (job.data.eventLog) await logEvent({ type: 'step', job: job.id!, outcome: 'failed', error: e.error.toJSON() });
        // A failed job keeps its error, not the caller's input (retries, which need it, are over).
        if (!ephemeral) await dropJobInput(job, this.deps.log);
        // The caller's failure completes the job; only faults fail it (src/queue/failure.ts).
        if (isCallersFailure(e.error)) return failedReturn(e.error);
        throw new UnrecoverableError(encodeFailure(e.error));
      }
      throw new Error(encodeFailure(e.error));
    } finally {
      this.running.delete(job.id!);
      abort.abort(JOB_FINISHED);
    }
  }

  /** The failure the previous chain step completed with (a caller's failure), or null. */
  private async previousFailure(job: Job<CallJobData, Ending>): Promise<AppError | null> {
    const values = await job.getChildrenValues<Ending>();
    const first = Object.values(values)[0];
    return returnedFailure(first);
  }

  /**
   * Ends a chain step whose previous step failed by its caller's doing, without running it, as a
   * failed step of its parent would have been failed by BullMQ (the holds and slots of the steps
   * after the failed one went back with it): recorded as failed, not charged, completed in BullMQ.
   */
  private async notRun(job: Job<CallJobData, Ending>, before: AppError): Promise<FailedReturn> {
    const err = new AppError(before.code, `Not run: the chain step before it failed (${before.message})`, {}, { retryable: false });
    const data = job.data;
    await this.deps.runner.endUnrun(data, { id: job.id!, createdAt: job.timestamp }, err);
    await this.releaseSlots(data, [job.id!, ...(data.laterSteps ?? [])]);
    if (data.edgeToken !== undefined) {
      await this.deps.records
        .put(job.id!, { state: 'failed', error: err.toJSON(), keyId: data.keyId, accountId: data.accountId })
        .catch((e: Error) => this.deps.log.warn({ err: e.message, job: job.id }, 'job record write failed'));
    } else await dropJobInput(job, this.deps.log);
    return failedReturn(err);
  }

  /**
   * What the job returns to BullMQ, which keeps it in the job's hash and copies it into the queue's
   * event stream: the answer itself when its result is at most JOB_RESULT_INLINE_BYTES, else a
   * reference (src/queue/result-refs.ts) to job_results (a call made with a key, stored whole there)
   * or, for a call paid per call, to its job record kept for JOB_REDIS_RETENTION_SECONDS. A sensitive
   * tool's answer is never there in clear: it goes sealed, unless job_results holds it whole (sealed).
   */
  private async compact(job: Job<CallJobData, Ending>, run: JobRun, value: CallResult): Promise<JobReturn> {
    const { config } = this.deps;
    const bytes = run.resultBytes;
    if (findTool(job.data.tool)?.sensitive) {
      const large = bytes !== undefined && bytes > config.JOB_RESULT_INLINE_BYTES && !!this.deps.refs;
      if (large && run.storedWhole && job.data.accountId !== null && job.data.payer === null) return refFor('job_results', value, bytes);
      return sealedRef(jobSeal(config), job.id!, value, bytes ?? 0);
    }
    if (bytes === undefined || bytes <= config.JOB_RESULT_INLINE_BYTES || !this.deps.refs) return value;
    const data = job.data;
    if (data.accountId !== null && data.payer === null) return run.storedWhole ? refFor('job_results', value, bytes) : value;
    try {
      await this.deps.records.put(job.id!, { state: 'completed', value, keyId: data.keyId, accountId: data.accountId }, config.JOB_REDIS_RETENTION_SECONDS);
      return refFor('job_record', value, bytes);
    } catch (err) {
      this.deps.log.warn({ err: (err as Error).message, job: job.id }, 'job record write failed; the answer stays in the job');
      return value;
    }
  }

  /**
   * BullMQ removes finished jobs older than their `removeOnComplete`/`removeOnFail` age only when a later
   * job of the same queue finishes; a queue that went quiet after a burst would keep the burst. So every
   * half retention (1 s to 1 min) each family's finished jobs past JOB_REDIS_RETENTION_SECONDS go, 1,000
   * per set and pass (replicas doing the same delete nothing twice). Best effort.
   */
  private async clean(): Promise<void> {
    const { config, log } = this.deps;
    for (const family of this.families) {
      let q = this.cleanQueues.get(family);
      if (!q) {
        // skipMetasUpdate: the queue's settings (its event stream's length) are the API's to write.
        q = new Queue(queueName(family), { connection: this.redis, prefix: queuePrefix(config.REDIS_PREFIX), skipMetasUpdate: true });
        q.on('error', () => {});
        this.cleanQueues.set(family, q);
      }
      try {
        await q.clean(config.JOB_REDIS_RETENTION_SECONDS * 1000, 1_000, 'completed');
        await q.clean(config.JOB_REDIS_RETENTION_SECONDS * 1000, 1_000, 'failed');
      } catch (err) {
        log.debug({ err: (err as Error).message, family }, 'removing finished jobs failed');
      }
    }
  }

  private async releaseSlots(data: CallJobData, jobIds: string[]): Promise<void> {
    const owner = slotOwner(data);
    // Best effort: a slot left behind is reaped once its job has finished (InFlightSlots.reap).
    if (owner) await this.deps.slots.release(owner, jobIds).catch((err: Error) => this.deps.log.warn({ err: err.message }, 'in-flight release failed'));
  }

  async close(): Promise<void> {
    if (this.cleaner) clearInterval(this.cleaner);
    await this.cleaning?.catch(() => {});
    await Promise.all([...this.cleanQueues.values()].map((q) => q.close().catch(() => {})));
    await this.heartbeat?.stop();
    await Promise.all(this.workers.map((w) => w.close()));
    this.sub?.disconnect();
    this.redis.disconnect();
  }
}
