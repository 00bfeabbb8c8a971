import type { Redis } from './redis.js';
import { AppError } from '../errors.js';
import type { ToolStore } from '../tools/types.js';

/** Largest value one key may hold (JSON bytes); a tool keeps summaries, not documents. */
export const STORE_MAX_BYTES = 256 * 1024;
const MAX_TTL_SECONDS = 30 * 86400;
const KEY = /^[A-Za-z0-9_.:-]{1,128}$/;

/**
 * ctx.store for one call: keys live under the account (sandbox keys in a namespace of their own) and
 * the tool, so one account's state is never another's and two tools never collide. JSON values with a
 * TTL; nothing in Postgres (state, not money).
 */
export function accountStore(redis: Redis, prefix: string, scope: { accountId: string; sandbox: boolean; tool: string }): ToolStore {
  const base = `${prefix}:store:${scope.sandbox ? 'test:' : ''}${scope.accountId}:${scope.tool}:`;
  const keyOf = (key: string) => {
    if (!KEY.test(key)) throw new AppError('invalid_input', `store key "${key.slice(0, 40)}" must be 1-128 letters, digits or _.:-`);
    return base + key;
  };
  return {
    async get<T>(key: string): Promise<T | null> {
      const raw = await redis.get(keyOf(key));
      return raw === null ? null : (JSON.parse(raw) as T);
    },
    async set(key: string, value: unknown, ttlSeconds: number): Promise<void> {
      const json = JSON.stringify(value);
      if (Buffer.byteLength(json) > STORE_MAX_BYTES) throw new AppError('invalid_input', `stored state is larger than ${STORE_MAX_BYTES} bytes`);
      const ttl = Math.min(Math.max(1, Math.floor(ttlSeconds)), MAX_TTL_SECONDS);
      await redis.set(keyOf(key), json, 'EX', ttl);
    },
    async delete(key: string): Promise<void> {
      await redis.del(keyOf(key));
    },
  };
}
