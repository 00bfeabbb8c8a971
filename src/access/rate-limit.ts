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
// slide(log key, limit, windowMs, member suffix, weight) -> {admitted, remaining, resetMs}. Also part
// of the admission script (src/money/holds.ts), which counts a tool call's request in the same step.
export const SLIDE_FN = `
local function slide(key, limit, window, member, n)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local count = redis.call('ZCARD', key)
  local admitted = 0
  if count + n <= limit then
    for i = 1, n do
      redis.call('ZADD', key, now, now .. ':' .. member .. ':' .. i)
    end
    count = count + n
    admitted = 1
  end
  redis.call('PEXPIRE', key, window)
  -- Until the window frees a request; refused, until it frees enough for this hit's weight.
  local need = 1
  if admitted == 0 then need = count + n - limit end
  local reset = window
  if need <= count then
    local e = redis.call('ZRANGE', key, need - 1, need - 1, 'WITHSCORES')
    if e[2] then reset = tonumber(e[2]) + window - now end
  end
  return {admitted, limit - count, reset}
end
`;

// KEYS: log   ARGV: limit, windowMs, member suffix, weight
const SLIDE = `${SLIDE_FN}
return slide(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]))
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
    const slide = this.slideArgs(subject, limit, weight);
    return this.outcome(limit, weight, await this.redis.tgSlide(1, slide.key, ...slide.args));
  }

  /**
   * One request's hit, to be counted later: by admission's own script (src/money/holds.ts), which then
   * takes the rate limit, the slot in flight and the credit hold in one step, or by `now()` when the
   * request ends before it reaches admission (bad input, a replay, a stream). Counted once either way.
   */
  deferred(subject: string, limit: number, onState: (s: RateLimitState) => void): DeferredHit {
    let done = false;
    const hit: DeferredHit = {
      get pending() {
        return !done;
      },
      slide: () => (done ? null : this.slideArgs(subject, limit, 1)),
      counted: (reply) => {
        done = true;
        const state = this.outcome(limit, 1, reply);
        onState(state);
        return state;
      },
      now: async () => {
        if (done) return;
        done = true;
        onState(await this.hit(subject, limit));
      },
    };
    return hit;
  }

  private slideArgs(subject: string, limit: number, weight: number) {
    const n = Math.max(1, Math.floor(weight));
    return { key: this.key(subject), args: [limit, this.config.RATE_LIMIT_WINDOW_MS, `${this.node}:${++this.seq}`, n] as [number, number, string, number] };
  }

  /** The script's answer as headers' state, or the 429 when refused. */
  private outcome(limit: number, weight: number, [admitted, remaining, resetMs]: [number, number, number]): RateLimitState {
    const state = { limit, remaining: Math.max(0, remaining), resetSeconds: Math.max(admitted ? 0 : 1, Math.ceil(resetMs / 1000)) };
    if (!admitted) {
      const what = weight > 1 ? `reached for these ${weight} requests` : 'reached';
      throw new AppError(
        'rate_limited',
        `Rate limit of ${limit} requests per minute ${what}; retry in ${state.resetSeconds} s`,
        { retry_after: state.resetSeconds, limit },
        {
          headers: { 'retry-after': String(state.resetSeconds), ...rateLimitHeaders(state) },
        },
      );
    }
    return state;
  }
}

/** A request's rate-limit hit not counted yet (RateLimiter.deferred). */
export interface DeferredHit {
  readonly pending: boolean;
  /** The window's key and the slide's arguments (limit, windowMs, member, weight), or null once counted. */
  slide(): { key: string; args: [number, number, string, number] } | null;
  /** Takes the slide's answer from a script that ran it; throws rate_limited when refused. */
  counted(reply: [number, number, number]): RateLimitState;
  /** Counts it now on its own (no-op once counted); throws rate_limited when refused. */
  now(): Promise<void>;
}

export function rateLimitHeaders(s: RateLimitState): Record<string, string> {
  return {
    'x-ratelimit-limit': String(s.limit),
    'x-ratelimit-remaining': String(s.remaining),
    'x-ratelimit-reset': String(s.resetSeconds),
  };
}
