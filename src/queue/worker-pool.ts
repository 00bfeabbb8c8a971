import { UnrecoverableError, Worker, type Job } from 'bullmq';
import type { Logger } from 'pino';
import { concurrencyFor, type Config, type Family } from '../config.js';
import { JobFailure, type CallJobData, type CallResult, type ToolRunner } from '../services/runner.js';
import { encodeFailure } from './failure.js';
import { queueName } from './queues.js';
import { connectRedis } from './redis.js';
import type { JobRecords } from './job-records.js';
import type { ToolProgress } from '../tools/types.js';
import type { JobEventLog, LoggedEvent } from './job-events.js';
import { PARALLEL_ROOT_JOB } from './flows.js';

/**
 * One BullMQ worker per tool family, each sized by its CONCURRENCY_<FAMILY> setting. The processor only
 * adapts a BullMQ job to the ToolRunner, so HTTP and the queue run the same service code.
 */
/** Reason given to a finished job's signal; one shared object, so no DOMException per job. */
const JOB_FINISHED = new Error('job finished');

export class WorkerPool {
  private readonly workers: Worker[] = [];

  constructor(
    private readonly deps: {
      config: Config;
      log: Logger;
      runner: ToolRunner;
      records: JobRecords;
      onProgress?: (jobId: string, p: ToolProgress) => Promise<void>;
      /** Keeps progress and flow-step outcomes for SSE replay (GET /jobs/{id}/events). */
      events?: JobEventLog;
    },
    private readonly families: readonly Family[],
  ) {}

  async start(): Promise<void> {
    const { config, log } = this.deps;
    for (const family of this.families) {
      const worker = new Worker<CallJobData, CallResult>(queueName(family), (job) => this.process(job), {
        connection: connectRedis(config.REDIS_URL),
        prefix: config.REDIS_PREFIX,
        concurrency: concurrencyFor(config, family),
        lockDuration: config.WORKER_LOCK_MS,
        stalledInterval: Math.max(500, Math.floor(config.WORKER_LOCK_MS / 2)),
        maxStalledCount: 1,
      });
      worker.on('error', (err) => log.error({ err: err.message, family }, 'worker error'));
      this.workers.push(worker);
      await worker.waitUntilReady();
    }
    log.info({ families: this.families }, 'workers started');
  }

  private async process(job: Job<CallJobData, CallResult>): Promise<CallResult> {
    // A parallel request's root only gathers its children, which have all finished by now; the API
    // reads their outcomes (src/services/protocol.ts). Nothing runs and nothing is charged.
    if (job.name === PARALLEL_ROOT_JOB) return { result: null, cost_cents: 0, remaining_credits: null };
    const logId = job.data.eventLog ?? job.id!;
    // Best effort: a lost replay entry must not fail (and so re-run) a call that worked.
    const logEvent = async (e: LoggedEvent) =>
      this.deps.events?.append(logId, e).catch((err: Error) => this.deps.log.warn({ err: err.message, job: job.id }, 'event log write failed'));
    const abort = new AbortController();
    const ephemeral = job.data.edgeToken !== undefined;
    const record = { keyId: job.data.keyId, accountId: job.data.accountId };
    try {
      const value = await this.deps.runner.run(job.data, {
        id: job.id!,
        attemptsMade: job.attemptsMade,
        maxAttempts: job.opts.attempts ?? 1,
        signal: abort.signal,
        progress: async (p) => {
          // Logged before the BullMQ progress event: a stream woken by that event then finds the entry.
          await logEvent({ type: 'progress', job: job.id!, data: p });
          await job.updateProgress(p as unknown as object);
          await this.deps.onProgress?.(job.id!, p);
        },
        previousOutput: async () => {
          const values = await job.getChildrenValues<CallResult>();
          const first = Object.values(values)[0];
          return first?.result;
        },
      });
      if (ephemeral) await this.deps.records.put(job.id!, { state: 'completed', value, ...record });
      if (job.data.eventLog) await logEvent({ type: 'step', job: job.id!, outcome: 'completed', value });
      return value;
    } catch (e) {
      if (!(e instanceof JobFailure)) throw e;
      if (e.final) {
        if (ephemeral) await this.deps.records.put(job.id!, { state: 'failed', error: e.error.toJSON(), ...record });
        if (job.data.eventLog) await logEvent({ type: 'step', job: job.id!, outcome: 'failed', error: e.error.toJSON() });
        throw new UnrecoverableError(encodeFailure(e.error));
      }
      throw new Error(encodeFailure(e.error));
    } finally {
      abort.abort(JOB_FINISHED);
    }
  }

  async close(): Promise<void> {
    await Promise.all(this.workers.map((w) => w.close()));
  }
}
