import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from './redis.js';
import { AppError } from '../errors.js';
import type { ToolStore } from '../tools/types.js';

/** Largest value one key may hold (JSON bytes); a tool keeps summaries, not documents. */
export const STORE_MAX_BYTES = 256 * 1024;
const MAX_TTL_SECONDS = 30 * 86400;
const KEY = /^[A-Za-z0-9_.:-]{1,128}$/;
/** A waiting call tries the lock again after this long at first, doubling up to the maximum. */
const LOCK_POLL_MS = 10;
const LOCK_POLL_MAX_MS = 200;

// KEYS: lock   ARGV: token. Frees the lock only if this call still holds it (not one that expired and was taken since).
const UNLOCK = `
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`;

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
    async exclusive(key, opts, fn) {
      const lock = `${keyOf(key)}:lock`;
      const token = randomBytes(12).toString('base64url');
      const until = Date.now() + opts.waitMs;
      for (let wait = LOCK_POLL_MS; ; wait = Math.min(wait * 2, LOCK_POLL_MAX_MS)) {
        if ((await redis.set(lock, token, 'PX', opts.holdMs, 'NX')) === 'OK') break;
        if (Date.now() + wait > until || opts.signal?.aborted) return null;
        await sleep(wait, undefined, opts.signal ? { signal: opts.signal } : undefined).catch(() => {});
      }
      try {
        return { value: await fn() };
      } finally {
        await redis.eval(UNLOCK, 1, lock, token).catch(() => {});
      }
    },
  };
}
