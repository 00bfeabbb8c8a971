import { UnrecoverableError, Worker, type Job } from 'bullmq';
import type { Logger } from 'pino';
import { concurrencyFor, type Config, type Family } from '../config.js';
import { JobFailure, type CallJobData, type CallResult, type ToolRunner } from '../services/runner.js';
import { encodeFailure } from './failure.js';
import { queueName } from './queues.js';
import { connectRedis } from './redis.js';
import type { JobRecords } from './job-records.js';
import type { ToolProgress } from '../tools/types.js';

/**
 * One BullMQ worker per tool family, each sized by its CONCURRENCY_<FAMILY> setting. The processor only
 * adapts a BullMQ job to the ToolRunner, so HTTP and the queue run the same service code.
 */
export class WorkerPool {
  private readonly workers: Worker[] = [];

  constructor(
    private readonly deps: { config: Config; log: Logger; runner: ToolRunner; records: JobRecords; onProgress?: (jobId: string, p: ToolProgress) => Promise<void> },
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
      return value;
    } catch (e) {
      if (!(e instanceof JobFailure)) throw e;
      if (e.final) {
        if (ephemeral) await this.deps.records.put(job.id!, { state: 'failed', error: e.error.toJSON(), ...record });
        throw new UnrecoverableError(encodeFailure(e.error));
      }
      throw new Error(encodeFailure(e.error));
    } finally {
      abort.abort();
    }
  }

  async close(): Promise<void> {
    await Promise.all(this.workers.map((w) => w.close()));
  }
}
