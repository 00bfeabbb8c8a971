import { QueueEvents } from 'bullmq';
import type { Logger } from 'pino';
import { FAMILIES, type Config, type Family } from '../config.js';
import { AppError, isAppError } from '../errors.js';
import { cancelChannel, cancelledError, jobLostError, lostChannel, type CallResult } from './call-job.js';
import { decodeFailure, isOwnFailure, returnedFailure } from './failure.js';
import { familyOfJob, queueName } from './queues.js';
import { connectRedis, type Redis } from './redis.js';
import { queuePrefix } from './keyspace.js';
import { isResultRef, type ResultRefs } from './result-refs.js';

export type JobEvent =
  | { type: 'progress'; jobId: string; data: unknown }
  | { type: 'completed'; jobId: string; value: CallResult }
  | { type: 'failed'; jobId: string; error: AppError };

export type Outcome = { state: 'completed'; value: CallResult } | { state: 'failed'; error: AppError } | { state: 'pending' };

type Listener = (e: JobEvent) => void;

/**
 * One QueueEvents subscription per family queue for the whole process, fanning completion, failure
 * and progress events out to whoever waits on a job id. Waiting costs a map entry, not a Redis
 * connection or a listener per job.
 */
export class CompletionDispatcher {
  private readonly events = new Map<Family, QueueEvents>();
  private readonly listeners = new Map<string, Set<Listener>>();
  /** Cancelled (src/calls/cancel.ts) and lost (src/calls/intents.ts) job ids: such a job has no BullMQ outcome, so its waiters hear it here. */
  private sub: Redis | null = null;
  /** Never used itself: each QueueEvents opens its own blocking duplicate of it (single server or cluster). */
  private eventsBase: Redis | null = null;

  constructor(
    private readonly config: Config,
    private readonly log: Logger,
    /** Called when a job fails outside the worker's own handling (e.g. stalled too often). */
    private readonly onForeignFailure: (jobId: string) => Promise<void> = async () => {},
    /**
     * Resolves a completed job's reference to its stored answer (src/queue/result-refs.ts): the event
     * stream carries large answers as references, read back only for a job someone here waits on.
     */
    private readonly refs: ResultRefs | null = null,
  ) {}

  async start(): Promise<void> {
    this.sub = connectRedis(this.config.REDIS_URL);
    this.sub.on('error', (err: Error) => this.log.debug({ err: err.message }, 'cancel subscription connection error'));
    // A cancel, or a loss, is decided (in Postgres) before it is published, so this is the job's outcome.
    const lost = lostChannel(this.config.REDIS_PREFIX);
    this.sub.on('message', (channel: string, jobId: string) =>
      this.emit({ type: 'failed', jobId, error: channel === lost ? jobLostError(jobId) : cancelledError() }),
    );
    await this.sub.subscribe(cancelChannel(this.config.REDIS_PREFIX), lost);
    const base = (this.eventsBase = connectRedis(this.config.REDIS_URL, { lazyConnect: true }));
    await Promise.all(
      FAMILIES.map(async (family) => {
        const qe = new QueueEvents(queueName(family), {
          connection: base,
          prefix: queuePrefix(this.config.REDIS_PREFIX),
        });
        qe.on('completed', ({ jobId, returnvalue }) => {
          const failure = returnedFailure(returnvalue);
          if (failure) return this.emit({ type: 'failed', jobId, error: failure });
          if (!isResultRef(returnvalue)) return this.emit({ type: 'completed', jobId, value: returnvalue as unknown as CallResult });
          // Nobody here waits on it: nothing to read.
          if (!this.listeners.has(jobId) || !this.refs) return;
          this.refs.resolve(jobId, returnvalue).then(
            (value) => this.emit({ type: 'completed', jobId, value }),
            (err: unknown) => {
              this.log.warn({ err: (err as Error).message, jobId }, 'reading a stored answer failed');
              this.emit({
                type: 'failed',
                jobId,
                error: isAppError(err)
                  ? err
                  : new AppError(
                      'service_unavailable',
                      'The call finished but its answer could not be read now; GET /jobs/{id} has it',
                      {},
                      { retryable: true },
                    ),
              });
            },
          );
        });
        qe.on('failed', ({ jobId, failedReason }) => {
          this.emit({ type: 'failed', jobId, error: decodeFailure(failedReason) });
          if (!isOwnFailure(failedReason)) {
            this.onForeignFailure(jobId).catch((err) => this.log.error({ err, jobId }, 'releasing a failed job failed'));
          }
        });
        qe.on('progress', ({ jobId, data }) => this.emit({ type: 'progress', jobId, data }));
        qe.on('error', (err) => this.log.warn({ err: err.message, family }, 'queue events connection error'));
        this.events.set(family, qe);
        await qe.waitUntilReady();
      }),
    );
  }

  private emit(e: JobEvent) {
    const set = this.listeners.get(e.jobId);
    if (set) for (const l of [...set]) l(e);
  }

  /** Listens to one job's events until the returned function is called. */
  subscribe(jobId: string, listener: Listener): () => void {
    let set = this.listeners.get(jobId);
    if (!set) {
      set = new Set();
      this.listeners.set(jobId, set);
    }
    set.add(listener);
    return () => {
      const s = this.listeners.get(jobId);
      if (!s) return;
      s.delete(listener);
      if (!s.size) this.listeners.delete(jobId);
    };
  }

  /**
   * Resolves when the job completes or fails for good, or with `pending` after `timeoutMs`.
   * Subscribe before adding the job so its completion cannot slip past.
   */
  waitFor(jobId: string, timeoutMs: number): { outcome: Promise<Outcome>; cancel: () => void } {
    let unsubscribe = () => {};
    let timer: NodeJS.Timeout | undefined;
    const outcome = new Promise<Outcome>((resolve) => {
      unsubscribe = this.subscribe(jobId, (e) => {
        if (e.type === 'progress') return;
        clearTimeout(timer);
        unsubscribe();
        resolve(e.type === 'completed' ? { state: 'completed', value: e.value } : { state: 'failed', error: e.error });
      });
      timer = setTimeout(() => {
        unsubscribe();
        resolve({ state: 'pending' });
      }, timeoutMs);
    });
    return {
      outcome,
      cancel: () => {
        clearTimeout(timer);
        unsubscribe();
      },
    };
  }

  familyReady(jobId: string): boolean {
    const f = familyOfJob(jobId);
    return !!f && this.events.has(f);
  }

  async close(): Promise<void> {
    this.sub?.disconnect();
    await Promise.all([...this.events.values()].map((qe) => qe.close()));
    this.events.clear();
    this.eventsBase?.disconnect();
  }
}
