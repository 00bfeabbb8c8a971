import type { Redis } from './redis.js';
import type { AppError } from '../errors.js';
import type { CallResult } from '../services/runner.js';

export interface JobRecord {
  state: 'completed' | 'failed';
  keyId: string | null;
  accountId: string | null;
  value?: CallResult;
  error?: ReturnType<AppError['toJSON']>;
}

/**
 * Outcomes of jobs that are deleted from BullMQ as soon as they finish (those that carried a sealed
 * edge token), so GET /jobs/{id} can still answer for a day. Holds no input and no token.
 */
export class JobRecords {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
  ) {}

  private key(jobId: string) {
    return `${this.prefix}:jobrec:${jobId}`;
  }

  async put(jobId: string, rec: JobRecord): Promise<void> {
    await this.redis.set(this.key(jobId), JSON.stringify(rec), 'EX', 24 * 3600);
  }

  async get(jobId: string): Promise<JobRecord | null> {
    const v = await this.redis.get(this.key(jobId));
    return v ? (JSON.parse(v) as JobRecord) : null;
  }
}
