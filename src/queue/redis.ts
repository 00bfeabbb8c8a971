import { Redis, type RedisOptions } from 'ioredis';

/** A Redis connection as BullMQ wants it (no per-command retry limit for blocking clients). */
export function connectRedis(url: string, opts: RedisOptions = {}): Redis {
  return new Redis(url, { maxRetriesPerRequest: null, enableReadyCheck: true, lazyConnect: false, ...opts });
}

export type { Redis };

/** Deletes every key under `${prefix}:` (test and benchmark runs clean up after themselves). */
export async function deleteByPrefix(redis: Redis, prefix: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length) await redis.unlink(...keys);
  } while (cursor !== '0');
}
