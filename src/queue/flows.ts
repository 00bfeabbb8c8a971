import type { Redis } from './redis.js';

/**
 * Job name of a parallel request's root. A BullMQ flow needs a parent; this one only waits for its
 * children (they fail it nothing: `ignoreDependencyOnFailure`) and is never charged. The worker pool
 * completes it without running a tool.
 */
export const PARALLEL_ROOT_JOB = '__parallel';

export type FlowMode = 'chain' | 'parallel';

export interface FlowStepRecord {
  tool: string;
  jobId: string;
  /** Key of this step in a parallel answer's `results` (the tool name, `name#2` for a repeat). */
  key: string;
}

/**
 * What a chain or parallel request ran, kept for a day under its root job id, so GET /jobs/{id} and
 * GET /jobs/{id}/events can rebuild the whole answer (not just the root job's own result).
 */
export interface FlowRecord {
  mode: FlowMode;
  rootId: string;
  /** Null for a request paid per call (x402): it has no key or account, and GET /jobs cannot read it. */
  keyId: string | null;
  accountId: string | null;
  sandbox: boolean;
  steps: FlowStepRecord[];
}

export class FlowRecords {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
  ) {}

  private key(rootId: string): string {
    return `${this.prefix}:flow:${rootId}`;
  }

  async put(rec: FlowRecord): Promise<void> {
    await this.redis.set(this.key(rec.rootId), JSON.stringify(rec), 'EX', 24 * 3600);
  }

  async get(rootId: string): Promise<FlowRecord | null> {
    const v = await this.redis.get(this.key(rootId));
    return v ? (JSON.parse(v) as FlowRecord) : null;
  }

  async delete(rootId: string): Promise<void> {
    await this.redis.del(this.key(rootId));
  }
}
