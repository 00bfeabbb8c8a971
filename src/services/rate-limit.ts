import type { Redis } from '../queue/redis.js';
import { accountTag } from '../queue/keyspace.js';
import type { Config } from '../config.js';
import { AppError } from '../errors.js';
import type { Plan } from '../tools/types.js';

export const PLAN_RPM: Record<Exclude<Plan, 'enterprise'>, number> = { free: 10, starter: 30, pro: 60 };

/**
 * Sliding-window log per account: a sorted set of the admitted requests' times (Redis server time,
 * so every replica agrees). One script drops entries older than a minute, counts, and admits or
 * refuses atomically, so any number of API replicas together admit exactly `limit` requests in any
 * 60-second window: no 2x burst across a boundary as with fixed windows.
 *
 * A hit may weigh more than one request (an MCP batch of n messages): all n are admitted together
 * only if all n fit, so a batch cannot take a window past its limit.
 */
// KEYS: log   ARGV: limit, windowMs, member suffix, weight
const SLIDE = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local n = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
local admitted = 0
if count + n <= limit then
  for i = 1, n do
    redis.call('ZADD', KEYS[1], now, now .. ':' .. ARGV[3] .. ':' .. i)
  end
  count = count + n
  admitted = 1
end
redis.call('PEXPIRE', KEYS[1], window)
-- Until the window frees a request; refused, until it frees enough for this hit's weight.
local need = 1
if admitted == 0 then need = count + n - limit end
local reset = window
if need <= count then
  local e = redis.call('ZRANGE', KEYS[1], need - 1, need - 1, 'WITHSCORES')
  if e[2] then reset = tonumber(e[2]) + window - now end
end
return {admitted, limit - count, reset}
`;

export interface RateLimitState {
  limit: number;
  remaining: number;
  /** Whole seconds until the window frees a request. */
  resetSeconds: number;
}

type Scripted = Redis & { tgSlide(keys: 1, ...args: Array<string | number>): Promise<[number, number, number]> };

export class RateLimiter {
  private readonly redis: Scripted;
  private seq = 0;
  private readonly node = Math.random().toString(36).slice(2, 8);

  constructor(
    redis: Redis,
    private readonly config: Config,
  ) {
    const r: Redis = redis;
    if (!('tgSlide' in r)) r.defineCommand('tgSlide', { lua: SLIDE });
    this.redis = redis as Scripted;
  }

  limitFor(plan: Plan, rpm: number | null): number {
    if (plan === 'enterprise') return rpm ?? this.config.ENTERPRISE_DEFAULT_RPM;
    return PLAN_RPM[plan];
  }

  /** The subject's window, in its account's cluster slot (src/queue/keyspace.ts). */
  key(subject: string): string {
    return `${this.config.REDIS_PREFIX}:rl:${accountTag(subject)}:${subject}`;
  }

  /**
   * Counts `weight` requests (default one) against `subject` (an account id, or `payer:<address>`);
   * throws rate_limited (429 + Retry-After) when they do not all fit in the window.
   */
  async hit(subject: string, limit: number, weight = 1): Promise<RateLimitState> {
    const key = this.key(subject);
    weight = Math.max(1, Math.floor(weight));
    const [admitted, remaining, resetMs] = await this.redis.tgSlide(1, key, limit, this.config.RATE_LIMIT_WINDOW_MS, `${this.node}:${++this.seq}`, weight);
    const state = { limit, remaining: Math.max(0, remaining), resetSeconds: Math.max(admitted ? 0 : 1, Math.ceil(resetMs / 1000)) };
    if (!admitted) {
      const what = weight > 1 ? `reached for these ${weight} requests` : 'reached';
      throw new AppError('rate_limited', `Rate limit of ${limit} requests per minute ${what}; retry in ${state.resetSeconds} s`, { retry_after: state.resetSeconds, limit }, {
        headers: { 'retry-after': String(state.resetSeconds), ...rateLimitHeaders(state) },
      });
    }
    return state;
  }
}

export function rateLimitHeaders(s: RateLimitState): Record<string, string> {
  return {
    'x-ratelimit-limit': String(s.limit),
    'x-ratelimit-remaining': String(s.remaining),
    'x-ratelimit-reset': String(s.resetSeconds),
  };
}
