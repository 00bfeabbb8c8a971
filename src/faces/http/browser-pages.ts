import type { FastifyRequest } from 'fastify';
import { AppError } from '../../errors.js';
import type { Redis } from '../../queue/redis.js';

/**
 * What the routes that serve people (sign-up, subscribe, the OAuth pages) share: escaping for
 * server-rendered HTML, and a throttle per client address for the requests anyone may send.
 */

export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}

// Fixed window per client address in Redis (INCR, expiry set on the first hit): simple and shared by
// every replica. KEYS: counter  ARGV: window seconds. Returns {count, ttl seconds}.
const HIT = `
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1])) end
local ttl = redis.call('TTL', KEYS[1])
if ttl < 0 then redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1])); ttl = tonumber(ARGV[1]) end
return {n, ttl}
`;

/** Counts one request of `what` from the client's address; past `limit` in the window, the 429 (with Retry-After). */
export async function throttlePerAddress(
  redis: Redis,
  prefix: string,
  req: FastifyRequest,
  o: { what: string; limit: number; windowSeconds: number; says: string },
): Promise<void> {
  const [count, ttl] = (await redis.eval(HIT, 1, `${prefix}:${o.what}:${req.ip ?? 'unknown'}`, o.windowSeconds)) as [number, number];
  if (count > o.limit) {
    throw new AppError('rate_limited', `${o.says}; retry in ${ttl} s`, { retry_after: ttl, limit: o.limit }, { headers: { 'retry-after': String(ttl) } });
  }
}
