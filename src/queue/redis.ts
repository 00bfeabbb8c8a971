import { Redis, type RedisOptions } from 'ioredis';

/** A Redis connection as BullMQ wants it (no per-command retry limit for blocking clients). */
export function connectRedis(url: string, opts: RedisOptions = {}): Redis {
  return new Redis(url, { maxRetriesPerRequest: null, enableReadyCheck: true, lazyConnect: false, ...opts });
}

export type { Redis };
