import type { Logger } from 'pino';
import { isCluster, type Redis } from './redis.js';

/**
 * The Redis that holds the queues must never evict a key: BullMQ's state (a job's hash, the lists and
 * sets that say where it is) is spread over several keys, and an evicted one leaves jobs that never
 * run or never finish. So `maxmemory-policy` must be `noeviction` (Redis then refuses writes when
 * full, which the API answers 503), and `maxmemory` should be set so a full Redis says so instead of
 * the host running out of memory. README, "Operating".
 *
 * Read at start-up; CONFIG may be disabled or renamed (managed Redis): then nothing is said. On a
 * cluster every primary is asked, and each setting that is wrong anywhere is reported once.
 */
export interface MemoryPolicy {
  policy: string | null;
  maxmemory: number | null;
}

async function readOne(node: Pick<Redis, 'config'>): Promise<MemoryPolicy> {
  const read = async (name: string): Promise<string | null> => {
    try {
      const v = (await (node.config as (op: 'GET', name: string) => Promise<unknown>)('GET', name)) as string[] | Record<string, string>;
      if (Array.isArray(v)) return v.length >= 2 ? String(v[1]) : null;
      return v && typeof v === 'object' && name in v ? String(v[name]) : null;
    } catch {
      // CONFIG disabled or renamed: unknown.
      return null;
    }
  };
  const [policy, max] = await Promise.all([read('maxmemory-policy'), read('maxmemory')]);
  return { policy, maxmemory: max === null || !/^\d+$/.test(max) ? null : Number(max) };
}

/** The settings of every primary (one entry for a single server). */
export async function readMemoryPolicy(redis: Redis): Promise<MemoryPolicy[]> {
  if (isCluster(redis)) return Promise.all(redis.nodes('master').map((n) => readOne(n)));
  return [await readOne(redis)];
}

/**
 * Logs one warning line when the eviction policy is not `noeviction`, and one when `maxmemory` is 0
 * (unlimited). Returns the warnings (tests read them). Never throws.
 */
export async function checkMemoryPolicy(redis: Redis, log: Pick<Logger, 'warn'>): Promise<string[]> {
  let found: MemoryPolicy[];
  try {
    found = await readMemoryPolicy(redis);
  } catch {
    return [];
  }
  const warnings: string[] = [];
  const policies = [...new Set(found.map((f) => f.policy).filter((p): p is string => p !== null && p !== 'noeviction'))];
  if (policies.length) {
    warnings.push(
      `Redis maxmemory-policy is ${policies.join(', ')}: the queues need noeviction (an evicted key loses or wedges jobs); set it with CONFIG SET maxmemory-policy noeviction or in redis.conf`,
    );
  }
  if (found.some((f) => f.maxmemory === 0)) {
    warnings.push(
      'Redis maxmemory is 0 (unlimited): set a limit (with maxmemory-policy noeviction) so a full Redis refuses writes instead of the host running out of memory',
    );
  }
  for (const w of warnings) log.warn(w);
  return warnings;
}
