import type { Redis } from '../queue/redis.js';
import { ACCOUNT_SHARDS, accountTag, shardTag } from '../queue/keyspace.js';
import type { Config } from '../config.js';
import { AppError } from '../errors.js';
import type { Plan } from '../tools/types.js';

/** Jobs in flight (queued or running) each account may have, by plan; enterprise is set per account. */
export const PLAN_MAX_IN_FLIGHT: Record<Exclude<Plan, 'enterprise'>, number> = { free: 2, starter: 5, pro: 20 };

/** The slots in flight an admission takes with its holds (InFlightSlots.claim; money/holds.ts RESERVE takes them). */
export interface SlotClaim {
  /** The owner's slots and its shard's owner registry, in the account's cluster slot. */
  keys: string[];
  owner: string;
  cap: number;
  jobIds: string[];
  /** At the cap: drops dead slots; true when some went (admission is then tried once more). */
  reap: () => Promise<boolean>;
  /** The 429 for an owner at its cap with `count` jobs in flight. */
  refuse: (count: number) => Error;
}

/** Whose slots a job holds: its account, or for a call paid per call, its payer's address. */
export function slotOwner(data: { accountId: string | null; payer: string | null }): string | null {
  return data.accountId ?? (data.payer ? `payer:${data.payer.toLowerCase()}` : null);
}

// KEYS: slots, owners   ARGV: cap, now, n, ids..., owner
// Takes n slots at once or none (a chain or parallel request counts each step), and lists the owner
// for the reconciler.
const TAKE = `
local count = redis.call('ZCARD', KEYS[1])
local n = tonumber(ARGV[3])
if count + n > tonumber(ARGV[1]) then return {0, count} end
for i = 1, n do redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3 + i]) end
redis.call('SADD', KEYS[2], ARGV[4 + n])
return {1, count + n}
`;

// KEYS: slots, owners   ARGV: owner. Unlists an owner without slots (atomic against TAKE).
const UNLIST = `
if redis.call('ZCARD', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[1]) return 1 end
return 0
`;

/** An owner's slots (a sorted set), in its account's cluster slot (src/queue/keyspace.ts). */
export function inFlightKey(prefix: string, owner: string): string {
  return `${prefix}:inflight:${accountTag(owner)}:${owner}`;
}

/** 429 concurrency_limited for an owner with `count` of its `cap` jobs in flight asking for `n` more. */
function concurrencyLimited(count: number, cap: number, n: number): AppError {
  return new AppError(
    'concurrency_limited',
    `This account already has ${count} of its ${cap} jobs in flight` +
      (n > 1 ? ` and this request needs ${n} more` : '') +
      '; retry when one finishes (GET /jobs/{id} shows them).',
    { max_in_flight: cap, in_flight: count, retry_after: 1 },
    { headers: { 'retry-after': '1' } },
  );
}

type Scripted = Redis & {
  tgTakeSlots(keys: 2, ...args: Array<string | number>): Promise<[number, number]>;
  tgUnlistOwner(keys: 2, ...args: string[]): Promise<number>;
};

/** Tells which of the given job ids still stand for work to do (queued, waiting or running). */
export type LiveJobs = (jobIds: string[]) => Promise<Set<string>>;

/**
 * The per-account cap on jobs in flight, counted in Redis so it holds across any number of API
 * replicas. One sorted set per owner: member = job id, score = when the slot was taken.
 *
 * Slots are taken at admission (every step of a chain or parallel request) and given back when the
 * job finishes or fails for good (the worker), when a job fails outside the worker's hands (stalled
 * too often: the completion dispatcher), or when it could not be queued. A process that dies between
 * admission and enqueue leaves slots with no job behind: when an owner is refused at its cap, slots
 * older than a grace period whose job is gone or finished are dropped and admission is tried again.
 */
export class InFlightSlots {
  private readonly redis: Scripted;
  /** Owners recently reaped, so a caller hammering at its cap costs one job lookup per period. */
  private readonly reapedAt = new Map<string, number>();

  constructor(
    redis: Redis,
    private readonly config: Config,
    private readonly liveJobs: LiveJobs,
    private readonly graceMs = 10_000,
  ) {
    const r: Redis = redis;
    if (!('tgUnlistOwner' in r)) {
      r.defineCommand('tgTakeSlots', { lua: TAKE });
      r.defineCommand('tgUnlistOwner', { lua: UNLIST });
    }
    this.redis = redis as Scripted;
  }

  capFor(plan: Plan, custom: number | null): number {
    if (custom !== null) return custom;
    return plan === 'enterprise' ? this.config.ENTERPRISE_DEFAULT_MAX_IN_FLIGHT : PLAN_MAX_IN_FLIGHT[plan];
  }

  private key(owner: string): string {
    return inFlightKey(this.config.REDIS_PREFIX, owner);
  }

  /** Owners that have (or recently had) slots, one set per shard: the reconciler walks them. */
  private ownersKey(tag: string): string {
    return `${this.config.REDIS_PREFIX}:inflight-owners:${tag}`;
  }

  /** The keys each script touches, in its KEYS order (checked by test/unit/scale/key-slots.test.ts). */
  scriptKeys(owner: string) {
    const keys = [this.key(owner), this.ownersKey(accountTag(owner))];
    return { tgTakeSlots: keys, tgUnlistOwner: keys };
  }

  /** Takes one slot per job id, all or none; past the cap, 429 concurrency_limited. */
  async take(owner: string, cap: number, jobIds: string[]): Promise<void> {
    if (!jobIds.length) return;
    const args = [cap, Date.now(), jobIds.length, ...jobIds, owner];
    let [ok, count] = await this.redis.tgTakeSlots(2, ...this.scriptKeys(owner).tgTakeSlots, ...args);
    if (!ok && (await this.reap(owner))) [ok, count] = await this.redis.tgTakeSlots(2, ...this.scriptKeys(owner).tgTakeSlots, ...args);
    if (!ok) throw concurrencyLimited(count, cap, jobIds.length);
  }

  /**
   * The same slots, for an admission that takes them in one script with its credit holds
   * (CreditReservations.reserve): an account's slots share its money keys' cluster slot.
   */
  claim(owner: string, cap: number, jobIds: string[]): SlotClaim {
    return {
      keys: this.scriptKeys(owner).tgTakeSlots,
      owner,
      cap,
      jobIds,
      reap: async () => (await this.reap(owner)) > 0,
      refuse: (count) => concurrencyLimited(count, cap, jobIds.length),
    };
  }

  /** Gives slots back. Safe to repeat: a slot already given back is skipped. */
  async release(owner: string, jobIds: string[]): Promise<void> {
    if (jobIds.length) await this.redis.zrem(this.key(owner), ...jobIds);
  }

  async count(owner: string): Promise<number> {
    return this.redis.zcard(this.key(owner));
  }

  /**
   * Drops slots older than the grace period whose job no longer stands for work. Returns how many.
   * At most once per half grace period per owner, unless `force` (the reconciler).
   */
  async reap(owner: string, force = false): Promise<number> {
    const now = Date.now();
    const last = this.reapedAt.get(owner);
    if (!force && last !== undefined && now - last < this.graceMs / 2) return 0;
    if (this.reapedAt.size > 10_000) this.reapedAt.clear();
    this.reapedAt.set(owner, now);
    const old = await this.redis.zrangebyscore(this.key(owner), '-inf', now - this.graceMs);
    if (!old.length) return 0;
    const live = await this.liveJobs(old);
    const dead = old.filter((id) => !live.has(id));
    if (dead.length) await this.redis.zrem(this.key(owner), ...dead);
    return dead.length;
  }

  /**
   * The reconciler's pass (src/money/reconciler.ts): reaps every listed owner's dead slots, whether or
   * not it is at its cap, and unlists owners left without slots. Returns the slots dropped.
   */
  async reconcile(onOwner: () => Promise<void> = async () => {}): Promise<number> {
    let dropped = 0;
    for (let n = 0; n < ACCOUNT_SHARDS; n++) {
      const owners = this.ownersKey(shardTag(n));
      let cursor = '0';
      do {
        const [next, page] = await this.redis.sscan(owners, cursor, 'COUNT', 200);
        cursor = next;
        for (const owner of page) {
          dropped += await this.reap(owner, true);
          await this.redis.tgUnlistOwner(2, ...this.scriptKeys(owner).tgUnlistOwner, owner);
          await onOwner();
        }
      } while (cursor !== '0');
    }
    return dropped;
  }
}
