import type { Redis } from './redis.js';
import type { AppError } from '../errors.js';
import type { CallResult } from './call-job.js';
import { isResultRef, type JobReturn, type ResultRefs } from './result-refs.js';

export interface JobRecord {
  state: 'completed' | 'failed';
  keyId: string | null;
  accountId: string | null;
  value?: CallResult;
  error?: ReturnType<AppError['toJSON']>;
}

/** A record as written: its value may be a reference to job_results (src/queue/result-refs.ts). */
type StoredRecord = Omit<JobRecord, 'value'> & { value?: JobReturn };

/**
 * Outcomes of jobs that are deleted from BullMQ as soon as they finish (those that carried a sealed
 * edge token), so GET /jobs/{id} can still answer for a day, and the large answers of calls paid per
 * call (x402), which no Postgres row holds, for as long as finished jobs stay in Redis. Holds no input
 * and no token.
 */
export class JobRecords {
  /** Resolves a record's reference to job_results (set by the container once the results store exists). */
  refs: ResultRefs | null = null;

  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
  ) {}

  private key(jobId: string) {
    return `${this.prefix}:jobrec:${jobId}`;
  }

  async put(jobId: string, rec: StoredRecord, ttlSeconds = 24 * 3600): Promise<void> {
    await this.redis.set(this.key(jobId), JSON.stringify(rec), 'EX', ttlSeconds);
  }

  /** The record as written (a completed value may be a reference). */
  async raw(jobId: string): Promise<StoredRecord | null> {
    const v = await this.redis.get(this.key(jobId));
    return v ? (JSON.parse(v) as StoredRecord) : null;
  }

  /** The record, its value resolved to the answer it stands for. */
  async get(jobId: string): Promise<JobRecord | null> {
    const rec = await this.raw(jobId);
    if (!rec) return null;
    if (isResultRef(rec.value)) {
      if (!this.refs) throw new Error('JobRecords: a stored reference needs refs to be resolved');
      return { ...rec, value: await this.refs.resolve(jobId, rec.value) };
    }
    return rec as JobRecord;
  }
}
