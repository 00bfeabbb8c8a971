/**
 * queue/: Redis and BullMQ. The family queues and flows (this file), completion dispatch, job events
 * and records, result references, the key space and memory policy, heartbeats. It moves jobs and
 * their answers; it decides nothing about who pays or may call.
 */
import { randomUUID } from 'node:crypto';
import { FlowProducer, Job, Queue, type JobsOptions, type FlowJob, type Telemetry } from 'bullmq';
import { FAMILIES, type Config, type Family } from '../config.js';
import type { CallJobData, CallResult } from './call-job.js';
import { decodeFailure, returnedFailure } from './failure.js';
import type { JobReturn, ResultRefs } from './result-refs.js';
import type { AppError } from '../errors.js';
import type { Redis } from './redis.js';
import { queuePrefix } from './keyspace.js';
import { bullmqTelemetry } from '../tracing.js';

export const queueName = (family: Family) => `tools-${family}`;

/** Job ids carry their family so GET /jobs/{id} knows which queue to ask. */
export function newJobId(family: Family): string {
  return `${family}-${randomUUID()}`;
}

export function familyOfJob(jobId: string): Family | null {
  const f = jobId.split('-')[0] as Family;
  return (FAMILIES as readonly string[]).includes(f) ? f : null;
}

export type JobView =
  | { state: 'completed'; data: CallJobData; value: CallResult }
  | { state: 'failed'; data: CallJobData; error: AppError }
  | { state: 'pending'; data: CallJobData; status: string; progress: unknown };

/** A step of a chain or parallel request, as handed to `addFlow`. */
export interface FlowStep {
  jobId: string;
  family: Family;
  data: CallJobData;
}

export class JobQueues {
  private readonly queues = new Map<Family, Queue>();
  private flows: FlowProducer | null = null;
  /** Resolves a finished job's reference to its stored answer (set by the container once the results store exists). */
  refs: ResultRefs | null = null;

  constructor(
    private readonly connection: Redis,
    private readonly config: Config,
  ) {}

  queue(family: Family): Queue {
    let q = this.queues.get(family);
    if (!q) {
      // The event stream keeps QUEUE_EVENTS_MAX_LEN entries (BullMQ trims it approximately on every
      // event, reading the length from the queue's meta hash, which opening the Queue writes). Its
      // `completed` events carry return values, which are at most JOB_RESULT_INLINE_BYTES of result
      // (larger answers are references: src/queue/result-refs.ts), so the stream's size is bounded.
      q = new Queue(queueName(family), {
        connection: this.connection,
        prefix: queuePrefix(this.config.REDIS_PREFIX),
        streams: { events: { maxLen: this.config.QUEUE_EVENTS_MAX_LEN } },
        // While tracing is on, BullMQ's own `add` span is the enqueue, and it stores the trace context with the job.
        telemetry: bullmqTelemetry<Telemetry>(),
      });
      this.queues.set(family, q);
    }
    return q;
  }

  jobOptions(data: CallJobData): JobsOptions {
    // Jobs that carry a (sealed) edge token are deleted as soon as they finish; their outcome is kept
    // by the worker in a separate record without the token (see JobRecords).
    const ephemeral = data.edgeToken !== undefined;
    // Other finished jobs stay JOB_REDIS_RETENTION_SECONDS (BullMQ removes them as later jobs of the
    // queue finish), so Redis holds the last few minutes of calls, not a day's. A call made with a key
    // is answered from job_results after that (GET /jobs/{id}, chain and parallel steps, streams); a
    // call paid per call only ever had its synchronous answer.
    const keep = { age: this.config.JOB_REDIS_RETENTION_SECONDS, count: 50_000 };
    return {
      attempts: this.config.JOB_ATTEMPTS,
      backoff: { type: 'exponential', delay: 250 },
      removeOnComplete: ephemeral ? true : keep,
      removeOnFail: ephemeral ? true : keep,
    };
  }

  async add(family: Family, jobId: string, data: CallJobData): Promise<void> {
    await this.queue(family).add(data.tool, data, { ...this.jobOptions(data), jobId });
  }

  /**
   * Adds a flow: `root` runs after all of its children. A chain is nested (each step the only child of
   * the next); a parallel request is one root with every tool as a direct child.
   */
  async addFlow(tree: FlowJob): Promise<void> {
    await this.flowProducer().add(tree);
  }

  /** Opened at start-up with the queues: one first opened during an outage would add its flow after it. */
  flowProducer(): FlowProducer {
    this.flows ??= new FlowProducer({ connection: this.connection, prefix: queuePrefix(this.config.REDIS_PREFIX), telemetry: bullmqTelemetry<Telemetry>() });
    return this.flows;
  }

  flowNode(step: FlowStep, children?: FlowJob[], extra: JobsOptions = {}): FlowJob {
    return {
      name: step.data.tool,
      queueName: queueName(step.family),
      data: step.data,
      prefix: queuePrefix(this.config.REDIS_PREFIX),
      opts: { ...this.jobOptions(step.data), jobId: step.jobId, ...extra },
      ...(children ? { children } : {}),
    };
  }

  /** The BullMQ job; its `returnvalue` may be a reference (src/queue/result-refs.ts): `view` resolves it. */
  async getJob(jobId: string): Promise<Job<CallJobData, JobReturn> | null> {
    const family = familyOfJob(jobId);
    if (!family) return null;
    return ((await Job.fromId(this.queue(family), jobId)) as Job<CallJobData, JobReturn> | undefined) ?? null;
  }

  /** Which of these job ids still stand for work to do: the job exists and has not finished. */
  async liveJobs(jobIds: string[]): Promise<Set<string>> {
    const pipe = this.connection.pipeline();
    const asked: string[] = [];
    for (const id of jobIds) {
      const family = familyOfJob(id);
      if (!family) continue;
      asked.push(id);
      pipe.hmget(`${queuePrefix(this.config.REDIS_PREFIX)}:${queueName(family)}:${id}`, 'timestamp', 'finishedOn');
    }
    const replies = (await pipe.exec()) ?? [];
    const live = new Set<string>();
    replies.forEach(([err, v], i) => {
      const [created, finished] = (v ?? []) as Array<string | null>;
      // A failed read counts as live: never free a slot on doubt.
      if (err || (created !== null && finished === null)) live.add(asked[i]!);
    });
    return live;
  }

  async view(jobId: string, reread = true): Promise<JobView | null> {
    const job = await this.getJob(jobId);
    if (!job) return null;
    if (job.finishedOn && job.returnvalue !== null && job.returnvalue !== undefined && !job.failedReason) return this.finished(job, 'completed');
    const status = await job.getState();
    // A job that finished between the read above and getState has its outcome only in a fresh read
    // (and none at all if it was removed on completion: then null, and JobRecords has it).
    if (status === 'completed' || status === 'failed') return job.finishedOn || !reread ? this.finished(job, status) : this.view(jobId, false);
    return { state: 'pending', data: job.data, status, progress: job.progress };
  }

  private async finished(job: Job<CallJobData, JobReturn>, status: 'completed' | 'failed'): Promise<JobView> {
    // A caller's failure completes its job (src/queue/failure.ts): it is a failed call all the same.
    const failure = status === 'completed' ? returnedFailure(job.returnvalue) : null;
    if (failure) return { state: 'failed', data: job.data, error: failure };
    if (status === 'completed') return { state: 'completed', data: job.data, value: await this.resolve(job.id!, job.returnvalue) };
    return { state: 'failed', data: job.data, error: decodeFailure(job.failedReason) };
  }

  private async resolve(jobId: string, value: JobReturn): Promise<CallResult> {
    return this.refs ? this.refs.resolve(jobId, value) : (value as CallResult);
  }

  async close(): Promise<void> {
    await Promise.all([...this.queues.values()].map((q) => q.close()));
    await this.flows?.close();
  }
}
