import type { Redis } from 'ioredis';
import { AppError } from '../errors.js';
import type { AccountsRepo } from '../db/accounts-repo.js';

/**
 * Credit reservation. Postgres holds the durable balance and the ledger; Redis holds, per account,
 * `avail` = credits minus the holds of admitted calls that have not settled yet. Admission takes a
 * hold with one Lua script, so N concurrent callers can never reserve more than the balance, and no
 * Postgres row lock sits on the hot path. Settlement (src/services/settler.ts) debits Postgres in
 * batches and then drops the holds; a failed call gives its hold back.
 *
 * Sub-keys get the same treatment for their calendar-month allowance: `subuse` counts settled plus
 * held cents for the month and the script refuses a hold that would pass `monthly_limit`.
 */

// KEYS: avail, holds, subuse|''   ARGV: limit(-1 = none), n, then n pairs of holdId, amount
const RESERVE = `
local avail = redis.call('GET', KEYS[1])
if not avail then return {-1, 0} end
local total = 0
local n = tonumber(ARGV[2])
for i = 1, n do total = total + tonumber(ARGV[2 + 2 * i]) end
if tonumber(avail) < total then return {0, tonumber(avail)} end
local limit = tonumber(ARGV[1])
if limit >= 0 then
  local used = redis.call('GET', KEYS[3])
  if not used then return {-2, 0} end
  if tonumber(used) + total > limit then return {-3, tonumber(used)} end
  redis.call('INCRBY', KEYS[3], total)
end
redis.call('DECRBY', KEYS[1], total)
for i = 1, n do
  redis.call('HSET', KEYS[2], ARGV[1 + 2 * i], ARGV[2 + 2 * i] .. '|' .. KEYS[3])
end
return {1, tonumber(avail) - total}
`;

// Gives holds back (failed calls). Idempotent: a hold already settled or released is skipped.
// KEYS: avail, holds   ARGV: holdIds...
const RELEASE = `
local back = 0
for i = 1, #ARGV do
  local v = redis.call('HGET', KEYS[2], ARGV[i])
  if v then
    redis.call('HDEL', KEYS[2], ARGV[i])
    local sep = string.find(v, '|', 1, true)
    local amt = tonumber(string.sub(v, 1, sep - 1))
    local sub = string.sub(v, sep + 1)
    if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], amt) end
    if sub ~= '' and redis.call('EXISTS', sub) == 1 then redis.call('DECRBY', sub, amt) end
    back = back + amt
  end
end
return back
`;

// Top-ups: bump the epoch so a concurrent loader does not install a stale balance, then add.
// KEYS: avail, epoch   ARGV: cents
const TOPUP = `
redis.call('INCR', KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], tonumber(ARGV[1])) end
return 1
`;

// KEYS: avail, epoch   ARGV: credits, epochSeen
const LOAD = `
local e = redis.call('GET', KEYS[2]) or '0'
if e ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return 1
`;

// KEYS: subuse   ARGV: used, ttlSeconds
const LOAD_SUBUSE = `redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', tonumber(ARGV[2])) return 1`;

export interface Hold {
  holdId: string;
  amount: number;
}

export interface SubKeyLimit {
  keyId: string;
  monthlyLimitCents: number;
}

function monthTag(d = new Date()): string {
  return d.toISOString().slice(0, 7);
}

type Scripted = Redis & {
  tgReserve(keys: 3, ...args: Array<string | number>): Promise<[number, number]>;
  tgRelease(keys: 2, ...args: string[]): Promise<number>;
  tgTopup(keys: 2, ...args: Array<string | number>): Promise<number>;
  tgLoad(keys: 2, ...args: Array<string | number>): Promise<number>;
  tgLoadSubuse(keys: 1, ...args: Array<string | number>): Promise<number>;
};

export class CreditReservations {
  private readonly redis: Scripted;

  constructor(
    redis: Redis,
    private readonly prefix: string,
    private readonly accounts: AccountsRepo,
  ) {
    this.redis = redis as Scripted;
    const r: Redis = redis;
    if (!('tgReserve' in r)) {
      r.defineCommand('tgReserve', { lua: RESERVE });
      r.defineCommand('tgRelease', { lua: RELEASE });
      r.defineCommand('tgTopup', { lua: TOPUP });
      r.defineCommand('tgLoad', { lua: LOAD });
      r.defineCommand('tgLoadSubuse', { lua: LOAD_SUBUSE });
    }
  }

  private availKey(accountId: string) {
    return `${this.prefix}:credit:avail:${accountId}`;
  }
  private holdsKey(accountId: string) {
    return `${this.prefix}:credit:holds:${accountId}`;
  }
  private epochKey(accountId: string) {
    return `${this.prefix}:credit:epoch:${accountId}`;
  }
  subuseKey(keyId: string, month = monthTag()) {
    return `${this.prefix}:credit:subuse:${keyId}:${month}`;
  }

  /**
   * Reserves every hold at once or none. Throws insufficient_credits / monthly_limit_exceeded.
   * Returns the credits still available after the holds.
   */
  async reserve(accountId: string, holds: Hold[], sub: SubKeyLimit | null): Promise<number> {
    const total = holds.reduce((s, h) => s + h.amount, 0);
    const subKey = sub ? this.subuseKey(sub.keyId) : '';
    const args: Array<string | number> = [sub ? sub.monthlyLimitCents : -1, holds.length];
    for (const h of holds) args.push(h.holdId, h.amount);
    for (let attempt = 0; attempt < 5; attempt++) {
      const [status, value] = await this.redis.tgReserve(3, this.availKey(accountId), this.holdsKey(accountId), subKey, ...args);
      if (status === 1) return value;
      if (status === 0) {
        throw new AppError('insufficient_credits', `This call costs ${total} cents; ${Math.max(value, 0)} cents are available. Top up to continue.`, {
          required_cents: total,
          available_cents: Math.max(value, 0),
        });
      }
      if (status === -3) {
        throw new AppError('monthly_limit_exceeded', `This sub-key has used ${value} of its ${sub!.monthlyLimitCents} cents this month; this call costs ${total}.`, {
          monthly_limit: sub!.monthlyLimitCents,
          used_this_month: value,
          required_cents: total,
        });
      }
      if (status === -1) await this.loadAvail(accountId);
      if (status === -2) await this.loadSubuse(sub!.keyId);
    }
    throw new AppError('service_unavailable', 'Could not reserve credits, please retry');
  }

  private async loadAvail(accountId: string): Promise<void> {
    const epoch = (await this.redis.get(this.epochKey(accountId))) ?? '0';
    const credits = await this.accounts.credits(accountId);
    await this.redis.tgLoad(2, this.availKey(accountId), this.epochKey(accountId), credits, epoch);
  }

  private async loadSubuse(keyId: string): Promise<void> {
    const used = await this.accounts.keyUsedThisMonth(keyId);
    await this.redis.tgLoadSubuse(1, this.subuseKey(keyId), used, 40 * 24 * 3600);
  }

  /** Gives unsettled holds back to the account (and the sub-key's month). Safe to repeat. */
  async release(accountId: string, holdIds: string[]): Promise<number> {
    if (!holdIds.length) return 0;
    return this.redis.tgRelease(2, this.availKey(accountId), this.holdsKey(accountId), ...holdIds);
  }

  /** Drops holds whose charges are now in Postgres (the balance there already moved). */
  settled(items: Array<{ accountId: string; holdId: string }>): Promise<unknown> {
    const pipe = this.redis.pipeline();
    for (const it of items) pipe.hdel(this.holdsKey(it.accountId), it.holdId);
    return pipe.exec();
  }

  /** Call after a top-up committed in Postgres. */
  async toppedUp(accountId: string, cents: number): Promise<void> {
    await this.redis.tgTopup(2, this.availKey(accountId), this.epochKey(accountId), cents);
  }

  /** Credits that admission would still allow (balance minus holds). */
  async available(accountId: string): Promise<number> {
    const v = await this.redis.get(this.availKey(accountId));
    if (v !== null) return Number(v);
    return this.accounts.credits(accountId);
  }
}
