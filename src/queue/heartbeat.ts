import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { FAMILIES, type Family } from '../config.js';
import type { Redis } from './redis.js';
import { queuePrefix } from './keyspace.js';

export const HEARTBEAT_MS = 5_000;
export const HEARTBEAT_TTL_MS = 15_000;
/** A family that had a worker within this long is expected to have one (see `workerCounts`). */
const EXPECTED_FOR_MS = 24 * 3600_000;

// One sorted set per family: member = worker process, score = its last beat (Redis time, so hosts'
// clocks do not matter). Entries older than the TTL are dropped and the set expires with its last
// beat. `seen` remembers which families this deployment runs (last beat per family).
// KEYS: seen, family sets...   ARGV: member, ttlMs, families...
const BEAT = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
for i = 2, #KEYS do
  redis.call('ZADD', KEYS[i], now, ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - ttl)
  redis.call('PEXPIRE', KEYS[i], ttl)
  redis.call('ZADD', KEYS[1], now, ARGV[1 + i])
end
redis.call('PEXPIRE', KEYS[1], 86400000)
return now
`;

// KEYS: seen, family sets (in FAMILIES order)   ARGV: ttlMs. Returns live workers per family.
const COUNT = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 2, #KEYS do out[#out + 1] = redis.call('ZCOUNT', KEYS[i], now - tonumber(ARGV[1]), '+inf') end
return out
`;

type Scripted = Redis & {
  tgWorkerBeat(keys: number, ...args: Array<string | number>): Promise<number>;
  tgWorkerCount(keys: number, ...args: Array<string | number>): Promise<number[]>;
};

function define(redis: Redis): Scripted {
  const r: Redis = redis;
  if (!('tgWorkerCount' in r)) {
    r.defineCommand('tgWorkerBeat', { lua: BEAT });
    r.defineCommand('tgWorkerCount', { lua: COUNT });
  }
  return r as Scripted;
}

// Under the queues' hash tag (src/queue/keyspace.ts): the scripts above touch all of them at once.
export const familyKey = (prefix: string, f: Family) => `${queuePrefix(prefix)}:workers:${f}`;
export const seenKey = (prefix: string) => `${queuePrefix(prefix)}:workers:seen`;

/** Heartbeats of one worker process for its families, every HEARTBEAT_MS with a TTL of HEARTBEAT_TTL_MS. */
export class WorkerHeartbeat {
  private timer: NodeJS.Timeout | null = null;
  private readonly member = `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  private readonly redis: Scripted;

  constructor(
    redis: Redis,
    private readonly prefix: string,
    private readonly families: readonly Family[],
  ) {
    this.redis = define(redis);
  }

  private beat(first = false): Promise<unknown> {
    // Skipped while disconnected: a beat must not wait offline and land late. The first one waits for
    // the connection, so a worker counts as soon as it has started.
    if (!first && this.redis.status !== 'ready') return Promise.resolve();
    const keys = [seenKey(this.prefix), ...this.families.map((f) => familyKey(this.prefix, f))];
    return this.redis.tgWorkerBeat(keys.length, ...keys, this.member, HEARTBEAT_TTL_MS, ...this.families);
  }

  async start(): Promise<void> {
    await this.beat(true);
    this.timer = setInterval(() => void this.beat().catch(() => {}), HEARTBEAT_MS);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    if (this.redis.status !== 'ready') return;
    const pipe = this.redis.pipeline();
    for (const f of this.families) pipe.zrem(familyKey(this.prefix, f), this.member);
    await pipe.exec().catch(() => {});
  }
}

/**
 * Live workers per family, and which families this deployment runs: those that had a worker within
 * the last day (none yet on a deployment where no worker has run: nothing is missing, nothing runs).
 */
export async function workerCounts(redis: Redis, prefix: string): Promise<{ counts: Record<Family, number>; expected: Family[] }> {
  const r = define(redis);
  const keys = [seenKey(prefix), ...FAMILIES.map((f) => familyKey(prefix, f))];
  const [live, seen] = await Promise.all([
    r.tgWorkerCount(keys.length, ...keys, HEARTBEAT_TTL_MS),
    r.zrangebyscore(seenKey(prefix), Date.now() - EXPECTED_FOR_MS, '+inf'),
  ]);
  const counts = Object.fromEntries(FAMILIES.map((f, i) => [f, Number(live[i] ?? 0)])) as Record<Family, number>;
  const expected = FAMILIES.filter((f) => seen.includes(f));
  return { counts, expected };
}
