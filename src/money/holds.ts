import type { Redis } from '../queue/redis.js';
import { ACCOUNT_SHARDS, accountTag, shardTag } from '../queue/keyspace.js';
import { AppError } from '../errors.js';
import type { AccountsRepo } from '../access/accounts.js';
import { inFlightKey, type SlotClaim } from '../access/in-flight.js';
import { SLIDE_FN, type DeferredHit } from '../access/rate-limit.js';

/**
 * Credit reservation. Postgres holds the durable balance and the ledger; Redis holds, per account,
 * `avail` = credits minus the holds of admitted calls that have not settled yet. Admission takes a
 * hold with one Lua script, so N concurrent callers can never reserve more than the balance, and no
 * Postgres row lock sits on the hot path. Settlement (src/money/settlement.ts) debits Postgres in
 * batches and then drops the holds; a failed call gives its hold back. What a crash leaves behind
 * (a hold whose job was never queued, a hold whose charge committed but was not dropped, a stale
 * `avail`) is repaired by the reconciler (src/money/reconciler.ts), which uses the scripts at the end.
 *
 * Sub-keys get the same treatment for their calendar-month allowance: `subuse` counts settled plus
 * held cents for the month and the script refuses a hold that would pass `monthly_limit`.
 */

/**
 * A hold is one field of the account's `holds` hash: field = job id (the hold id), value =
 * `amount|subuseKey|takenAtMs` (subuseKey empty without a sub-key; takenAt is Redis server time, so
 * replicas' clocks do not matter). Values written before takenAt existed are `amount|subuseKey`:
 * every script reads both, and the reconciler stamps old ones with the time it first sees them.
 */
const PARSE = `
local function parse(v)
  local s1 = string.find(v, '|', 1, true)
  local amt = tonumber(string.sub(v, 1, s1 - 1))
  local rest = string.sub(v, s1 + 1)
  local s2 = string.find(rest, '|', 1, true)
  if s2 then return amt, string.sub(rest, 1, s2 - 1), tonumber(string.sub(rest, s2 + 1)) end
  return amt, rest, nil
end
local function nowMs()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`;

// Admission of a request's jobs, in one script: the request's rate-limit hit (when the caller passes
// it), a slot in flight per job under the owner's cap, and the holds of the paid ones against avail
// (and the sub-key's month). The hit counts whatever follows (as it would at the door); slots and
// holds are all or nothing. The slot keys are InFlightSlots' (src/access/in-flight.ts) and the window
// is RateLimiter's (src/access/rate-limit.ts), all in the account's cluster slot.
// KEYS: avail, holds, subuse (without a sub-key, an unused name in the account's slot), accounts, slots, owners,
//       rate-limit window (without a hit, an unused name in the account's slot)
// ARGV: limit(-1 = no sub-key), n, then n pairs of holdId, amount, then accountId, cap, now, m, m slot ids, owner,
//       then the hit: rpm (-1 = none), windowMs, member, weight
// Returns {status, value, admitted, remaining, resetMs} (the last three only with a hit): status 1, avail
// after (-1 without holds); 0, avail: short of credit; -1 avail not loaded; -2 sub-key month not loaded;
// -3, used: over the month; -4, count: at the cap of jobs in flight; -5: over the rate limit.
const RESERVE = `${PARSE}${SLIDE_FN}
local n = tonumber(ARGV[2])
local a = 3 + 2 * n
local cap, at, m = tonumber(ARGV[a + 1]), ARGV[a + 2], tonumber(ARGV[a + 3])
local r = a + 4 + m
local rl = {}
if tonumber(ARGV[r + 1]) >= 0 then
  rl = slide(KEYS[7], tonumber(ARGV[r + 1]), tonumber(ARGV[r + 2]), ARGV[r + 3], tonumber(ARGV[r + 4]))
  if rl[1] == 0 then return {-5, 0, rl[1], rl[2], rl[3]} end
end
local function out(status, value) return {status, value, rl[1], rl[2], rl[3]} end
local count = redis.call('ZCARD', KEYS[5])
if count + m > cap then return out(-4, count) end
local total = 0
for i = 1, n do total = total + tonumber(ARGV[2 + 2 * i]) end
local avail = -1
local limit = tonumber(ARGV[1])
local sub = ''
if n > 0 then
  avail = redis.call('GET', KEYS[1])
  if not avail then return out(-1, 0) end
  avail = tonumber(avail)
  if avail < total then return out(0, avail) end
  if limit >= 0 then
    local used = redis.call('GET', KEYS[3])
    if not used then return out(-2, 0) end
    if tonumber(used) + total > limit then return out(-3, tonumber(used)) end
    redis.call('INCRBY', KEYS[3], total)
    sub = KEYS[3]
  end
  redis.call('DECRBY', KEYS[1], total)
  local now = nowMs()
  for i = 1, n do
    redis.call('HSET', KEYS[2], ARGV[1 + 2 * i], ARGV[2 + 2 * i] .. '|' .. sub .. '|' .. now)
  end
  redis.call('SADD', KEYS[4], ARGV[a])
  avail = avail - total
end
for i = 1, m do redis.call('ZADD', KEYS[5], at, ARGV[a + 3 + i]) end
if m > 0 then redis.call('SADD', KEYS[6], ARGV[a + 4 + m]) end
return out(1, avail)
`;

// Gives holds back (failed calls, holds of jobs that never were queued). Idempotent: a hold already
// settled or released is skipped.
// KEYS: avail, holds   ARGV: holdIds...
const RELEASE = `${PARSE}
local back = 0
for i = 1, #ARGV do
  local v = redis.call('HGET', KEYS[2], ARGV[i])
  if v then
    redis.call('HDEL', KEYS[2], ARGV[i])
    local amt, sub = parse(v)
    if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], amt) end
    if sub ~= '' and redis.call('EXISTS', sub) == 1 then redis.call('DECRBY', sub, amt) end
    back = back + amt
  end
end
return back
`;

// Settled calls: their charges are in Postgres, whose balance already moved (avail excluded their
// holds since admission), so the holds go; and the finished jobs' slots in flight go with them (the
// account's slots share its money keys' cluster slot). Bumps the settle counter when holds went, so a
// reconciler pass that read Postgres before this does not rebuild avail from a mix of before and after.
// KEYS: holds, settles, slots   ARGV: nHolds, holdIds..., slot ids...
const SETTLED = `
local nh = tonumber(ARGV[1])
local n = 0
for i = 2, nh + 1 do n = n + redis.call('HDEL', KEYS[1], ARGV[i]) end
if nh > 0 then redis.call('INCR', KEYS[2]) end
for i = nh + 2, #ARGV do redis.call('ZREM', KEYS[3], ARGV[i]) end
return n
`;

// Top-ups: bump the epoch so a concurrent loader or reconciler does not install a stale balance, then add.
// KEYS: avail, epoch   ARGV: cents
const TOPUP = `
redis.call('INCR', KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], tonumber(ARGV[1])) end
return 1
`;

// avail missing (first use, Redis flushed or restarted): credits from Postgres minus the holds still
// in Redis (none after a restart without persistence; some if only avail was lost).
// KEYS: avail, epoch, holds, accounts   ARGV: credits, epochSeen, accountId
const LOAD = `${PARSE}
local e = redis.call('GET', KEYS[2]) or '0'
if e ~= ARGV[2] then return 0 end
local all = redis.call('HVALS', KEYS[3])
local held = 0
for i = 1, #all do held = held + parse(all[i]) end
redis.call('SET', KEYS[1], tonumber(ARGV[1]) - held, 'NX')
redis.call('SADD', KEYS[4], ARGV[3])
return 1
`;

// A sub-key's month: settled (Postgres) plus its live holds.
// KEYS: subuse, holds, accounts, subkeys   ARGV: used, ttlSeconds, accountId, keyId
const LOAD_SUBUSE = `${PARSE}
local all = redis.call('HVALS', KEYS[2])
local held = 0
for i = 1, #all do
  local amt, sub = parse(all[i])
  if sub == KEYS[1] then held = held + amt end
end
redis.call('SET', KEYS[1], tonumber(ARGV[1]) + held, 'NX', 'EX', tonumber(ARGV[2]))
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('SADD', KEYS[4], ARGV[4])
return 1
`;

// Reconciler, first step: one consistent read of an account's money keys. Old-format holds (no
// takenAt) are stamped with the current time, so they are released at the earliest one grace period
// after the first pass that saw them.
// KEYS: holds, epoch, settles, avail   ARGV: -
const SNAPSHOT = `${PARSE}
local now = nowMs()
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local v = all[i + 1]
  local amt, sub, at = parse(v)
  if not at then
    v = v .. '|' .. now
    redis.call('HSET', KEYS[1], all[i], v)
  end
  out[#out + 1] = all[i]
  out[#out + 1] = v
end
return {redis.call('GET', KEYS[2]) or '0', redis.call('GET', KEYS[3]) or '0', tostring(now), redis.call('GET', KEYS[4]) or false, out}
`;

// Reconciler, last step: with Postgres's credits, the holds whose charges Postgres already has, and
// each sub-key's settled month (all from one statement, so one snapshot), recompute
//   avail  = credits - sum(holds not yet charged)
//   subuse = settled this month + sum(that sub-key's holds not yet charged)
// and, when `write`, set them and drop the charged holds. Refused (-1) when a top-up (epoch) or a
// settlement (settles) moved since the snapshot: the Postgres read may then be on either side of it.
// Admissions and releases need no such guard: they change avail and the holds together, atomically.
// KEYS: avail, holds, epoch, settles, accounts
// ARGV: epochSeen, settlesSeen, credits, write(0|1), accountId, nCharged, chargedIds..., nSub, (subuseKey, settled)...
const REBUILD = `${PARSE}
if (redis.call('GET', KEYS[3]) or '0') ~= ARGV[1] or (redis.call('GET', KEYS[4]) or '0') ~= ARGV[2] then return {-1, 0, 0, 0, 0} end
local write = ARGV[4] == '1'
local i = 6
local nc = tonumber(ARGV[i])
local charged = {}
for j = 1, nc do charged[ARGV[i + j]] = true end
i = i + nc + 1
local all = redis.call('HGETALL', KEYS[2])
local sum, dropped = 0, 0
local subsum = {}
for k = 1, #all, 2 do
  if charged[all[k]] then
    dropped = dropped + 1
    if write then redis.call('HDEL', KEYS[2], all[k]) end
  else
    local amt, sub = parse(all[k + 1])
    sum = sum + amt
    if sub ~= '' then subsum[sub] = (subsum[sub] or 0) + amt end
  end
end
local expected = tonumber(ARGV[3]) - sum
local cur = redis.call('GET', KEYS[1])
local availOff = 0
if cur and tonumber(cur) ~= expected then
  availOff = 1
  if write then redis.call('SET', KEYS[1], expected) end
end
local subOff = 0
local ns = tonumber(ARGV[i])
for j = 1, ns do
  local key = ARGV[i + 2 * j - 1]
  local want = tonumber(ARGV[i + 2 * j]) + (subsum[key] or 0)
  local have = redis.call('GET', key)
  if have and tonumber(have) ~= want then
    subOff = subOff + 1
    if write then redis.call('SET', key, want, 'KEEPTTL') end
  end
end
if write and redis.call('EXISTS', KEYS[1]) == 0 and redis.call('HLEN', KEYS[2]) == 0 then redis.call('SREM', KEYS[5], ARGV[5]) end
return {1, cur and tonumber(cur) or -1, expected, availOff + subOff, dropped}
`;

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
  tgReserve(keys: 7, ...args: Array<string | number>): Promise<[number, number, number?, number?, number?]>;
  tgRelease(keys: 2, ...args: string[]): Promise<number>;
  tgSettled(keys: 3, ...args: Array<string | number>): Promise<number>;
  tgTopup(keys: 2, ...args: Array<string | number>): Promise<number>;
  tgLoad(keys: 4, ...args: Array<string | number>): Promise<number>;
  tgLoadSubuse(keys: 4, ...args: Array<string | number>): Promise<number>;
  tgHoldSnapshot(keys: 4, ...args: string[]): Promise<[string, string, string, string | null, string[]]>;
  tgHoldRebuild(keys: 5, ...args: Array<string | number>): Promise<[number, number, number, number, number]>;
};

/** One hold as stored: amount, the sub-key month it counts against ('' for none), when it was taken (Redis time, ms). */
export interface StoredHold {
  holdId: string;
  amount: number;
  subuseKey: string;
  takenAt: number;
}

/** What the reconciler reads first (SNAPSHOT). */
export interface HoldSnapshot {
  epoch: string;
  settles: string;
  /** Redis server time, ms. */
  now: number;
  avail: number | null;
  holds: StoredHold[];
}

/** What the reconciler read from Postgres, in one statement (one snapshot). */
export interface PostgresView {
  credits: number;
  /** Hold ids whose charge is in the ledger. */
  charged: string[];
  /** subuse key -> cents settled this month by that sub-key. */
  settledBySubuse: Map<string, number>;
}

export function parseHold(holdId: string, v: string): StoredHold {
  const [amount, subuseKey = '', takenAt] = v.split('|');
  return { holdId, amount: Number(amount), subuseKey, takenAt: takenAt ? Number(takenAt) : Number.NaN };
}

export class CreditReservations {
  private readonly redis: Scripted;

  constructor(
    redis: Redis,
    private readonly prefix: string,
    private readonly accounts: AccountsRepo,
  ) {
    this.redis = redis as Scripted;
    const r: Redis = redis;
    if (!('tgHoldRebuild' in r)) {
      r.defineCommand('tgReserve', { lua: RESERVE });
      r.defineCommand('tgRelease', { lua: RELEASE });
      r.defineCommand('tgSettled', { lua: SETTLED });
      r.defineCommand('tgTopup', { lua: TOPUP });
      r.defineCommand('tgLoad', { lua: LOAD });
      r.defineCommand('tgLoadSubuse', { lua: LOAD_SUBUSE });
      r.defineCommand('tgHoldSnapshot', { lua: SNAPSHOT });
      r.defineCommand('tgHoldRebuild', { lua: REBUILD });
    }
  }

  availKey(accountId: string) {
    return `${this.prefix}:credit:avail:${accountTag(accountId)}:${accountId}`;
  }
  holdsKey(accountId: string) {
    return `${this.prefix}:credit:holds:${accountTag(accountId)}:${accountId}`;
  }
  private epochKey(accountId: string) {
    return `${this.prefix}:credit:epoch:${accountTag(accountId)}:${accountId}`;
  }
  /** Bumped by every settlement of the account's holds (see SETTLED). */
  private settlesKey(accountId: string) {
    return `${this.prefix}:credit:settles:${accountTag(accountId)}:${accountId}`;
  }
  /**
   * Accounts with money state in Redis (an `avail` or holds), one set per shard in the shard's slot:
   * added atomically by every script that creates either, removed by the reconciler once both are
   * gone. The reconciler walks these sets (`registryKeys`).
   */
  accountsKey(accountId: string) {
    return this.registryKey(accountTag(accountId));
  }
  private registryKey(tag: string) {
    return `${this.prefix}:credit:accounts:${tag}`;
  }
  /** Every shard's registry, for the reconciler's walk. */
  registryKeys(): string[] {
    return Array.from({ length: ACCOUNT_SHARDS }, (_, n) => this.registryKey(shardTag(n)));
  }
  /** Sub-keys of an account with a `subuse` counter, for the reconciler. */
  subKeysKey(accountId: string) {
    return `${this.prefix}:credit:subkeys:${accountTag(accountId)}:${accountId}`;
  }
  /** A sub-key's use this month: in its account's slot, so a hold can count against both at once. */
  subuseKey(accountId: string, keyId: string, month = monthTag()) {
    return `${this.prefix}:credit:subuse:${accountTag(accountId)}:${keyId}:${month}`;
  }

  /**
   * The keys each script touches, in its KEYS order: the calls below use these, and
   * test/unit/scale/key-slots.test.ts checks that each list shares one cluster slot.
   */
  scriptKeys(accountId: string, keyId: string | null = null) {
    // Without a sub-key RESERVE still gets a name in the account's slot (a cluster refuses a script
    // whose keys span slots, and '' hashes to slot 0); it is never read or written.
    const subuse = keyId ? this.subuseKey(accountId, keyId) : `${this.prefix}:credit:subuse:${accountTag(accountId)}:none`;
    return {
      tgReserve: [this.availKey(accountId), this.holdsKey(accountId), subuse, this.accountsKey(accountId)],
      tgRelease: [this.availKey(accountId), this.holdsKey(accountId)],
      tgSettled: [this.holdsKey(accountId), this.settlesKey(accountId), inFlightKey(this.prefix, accountId)],
      tgTopup: [this.availKey(accountId), this.epochKey(accountId)],
      tgLoad: [this.availKey(accountId), this.epochKey(accountId), this.holdsKey(accountId), this.accountsKey(accountId)],
      tgLoadSubuse: [subuse, this.holdsKey(accountId), this.accountsKey(accountId), this.subKeysKey(accountId)],
      tgHoldSnapshot: [this.holdsKey(accountId), this.epochKey(accountId), this.settlesKey(accountId), this.availKey(accountId)],
      tgHoldRebuild: [this.availKey(accountId), this.holdsKey(accountId), this.epochKey(accountId), this.settlesKey(accountId), this.accountsKey(accountId)],
    };
  }

  /**
   * Admits a request's jobs: their slots in flight and the holds of the paid ones, all at once or
   * none, in one script. Throws concurrency_limited (after reaping dead slots once),
   * insufficient_credits or monthly_limit_exceeded. Returns the credits still available after the
   * holds (-1 when there were none).
   */
  async reserve(
    accountId: string,
    holds: Hold[],
    sub: SubKeyLimit | null,
    slots: SlotClaim = this.noSlots(accountId),
    /** The request's rate-limit hit, counted by the same script (its window is in the account's slot). */
    rate?: DeferredHit,
  ): Promise<number> {
    const total = holds.reduce((s, h) => s + h.amount, 0);
    const keys = [...this.scriptKeys(accountId, sub?.keyId ?? null).tgReserve, ...slots.keys];
    const args: Array<string | number> = [sub ? sub.monthlyLimitCents : -1, holds.length];
    for (const h of holds) args.push(h.holdId, h.amount);
    args.push(accountId, slots.cap, Date.now(), slots.jobIds.length, ...slots.jobIds, slots.owner);
    let reaped = false;
    for (let attempt = 0; attempt < 5; attempt++) {
      // Counted by the first attempt only: a retry (avail loaded, slots reaped) passes no hit.
      const hit = rate?.slide() ?? null;
      const window = hit?.key ?? this.noRateKey(accountId);
      const [status, value, ...reply] = await this.redis.tgReserve(7, ...keys, window, ...args, ...(hit ? hit.args : [-1, 0, '', 0]));
      if (hit) rate!.counted(reply as [number, number, number]);
      if (status === 1) return value;
      if (status === 0) {
        throw new AppError('insufficient_credits', `This call costs ${total} cents; ${Math.max(value, 0)} cents are available. Top up to continue.`, {
          required_cents: total,
          available_cents: Math.max(value, 0),
        });
      }
      if (status === -3) {
        throw new AppError(
          'monthly_limit_exceeded',
          `This sub-key has used ${value} of its ${sub!.monthlyLimitCents} cents this month; this call costs ${total}.`,
          {
            monthly_limit: sub!.monthlyLimitCents,
            used_this_month: value,
            required_cents: total,
          },
        );
      }
      if (status === -4) {
        if (reaped || !(await slots.reap())) throw slots.refuse(value);
        reaped = true;
      }
      if (status === -1) await this.loadAvail(accountId);
      if (status === -2) await this.loadSubuse(accountId, sub!.keyId);
    }
    throw new AppError('service_unavailable', 'Could not reserve credits, please retry', { retry_after: 1 }, { headers: { 'retry-after': '1' } });
  }

  /** RESERVE's window key when no hit is passed: a name in the account's slot, never read or written. */
  noRateKey(accountId: string): string {
    return `${this.prefix}:rl-none:${accountTag(accountId)}`;
  }

  /** Holds without slots (operators' and tests' use): no job ids, and two unused names in the account's slot. */
  private noSlots(accountId: string): SlotClaim {
    const unused = `${this.prefix}:credit:noslots:${accountTag(accountId)}`;
    return { keys: [unused, unused], owner: accountId, cap: 0, jobIds: [], reap: async () => false, refuse: () => new Error('unreachable: no slots asked') };
  }

  private async loadAvail(accountId: string): Promise<void> {
    const epoch = (await this.redis.get(this.epochKey(accountId))) ?? '0';
    const credits = await this.accounts.credits(accountId);
    await this.redis.tgLoad(4, ...this.scriptKeys(accountId).tgLoad, credits, epoch, accountId);
  }

  private async loadSubuse(accountId: string, keyId: string): Promise<void> {
    const used = await this.accounts.keyUsedThisMonth(keyId);
    await this.redis.tgLoadSubuse(4, ...this.scriptKeys(accountId, keyId).tgLoadSubuse, used, 40 * 24 * 3600, accountId, keyId);
  }

  /** Gives unsettled holds back to the account (and the sub-key's month). Safe to repeat. */
  async release(accountId: string, holdIds: string[]): Promise<number> {
    if (!holdIds.length) return 0;
    return this.redis.tgRelease(2, ...this.scriptKeys(accountId).tgRelease, ...holdIds);
  }

  /**
   * Drops holds whose charges are now in Postgres (the balance there already moved) and gives back the
   * slots in flight of jobs that are done (`slotId`: the job id, for a job whose slot its account holds).
   */
  settled(items: Array<{ accountId: string; holdId?: string | null; slotId?: string }>): Promise<unknown> {
    const byAccount = new Map<string, { holds: string[]; slots: string[] }>();
    for (const it of items) {
      let acc = byAccount.get(it.accountId);
      if (!acc) byAccount.set(it.accountId, (acc = { holds: [], slots: [] }));
      if (it.holdId) acc.holds.push(it.holdId);
      if (it.slotId) acc.slots.push(it.slotId);
    }
    // One script per account, each in its account's slot (a pipeline may not span slots in a cluster);
    // sent in the same turn, they share one write on the connection.
    return Promise.all(
      [...byAccount].map(([accountId, { holds, slots }]) => this.redis.tgSettled(3, ...this.scriptKeys(accountId).tgSettled, holds.length, ...holds, ...slots)),
    );
  }

  /** Call after a top-up committed in Postgres. */
  async toppedUp(accountId: string, cents: number): Promise<void> {
    await this.redis.tgTopup(2, ...this.scriptKeys(accountId).tgTopup, cents);
  }

  /** Credits that admission would still allow (balance minus holds). */
  async available(accountId: string): Promise<number> {
    const v = await this.redis.get(this.availKey(accountId));
    if (v !== null) return Number(v);
    return this.accounts.credits(accountId);
  }

  // The reconciler's side (src/money/reconciler.ts).

  /** Reads an account's money keys at once (and stamps holds written before takenAt existed). */
  async snapshot(accountId: string): Promise<HoldSnapshot> {
    const [epoch, settles, now, avail, flat] = await this.redis.tgHoldSnapshot(4, ...this.scriptKeys(accountId).tgHoldSnapshot);
    const holds: StoredHold[] = [];
    for (let i = 0; i < flat.length; i += 2) holds.push(parseHold(flat[i]!, flat[i + 1]!));
    return { epoch, settles, now: Number(now), avail: avail === null ? null : Number(avail), holds };
  }

  /** Sub-keys of the account that have (or had) a month counter in Redis. */
  subKeysOf(accountId: string): Promise<string[]> {
    return this.redis.smembers(this.subKeysKey(accountId));
  }

  /**
   * Compares (and with `write`, rebuilds) avail and the sub-keys' month counters against Postgres,
   * dropping holds whose charge Postgres already has. Returns null when a top-up or settlement moved
   * since `snap` (try again later), else how many values were off and how many holds were charged.
   */
  async rebuild(
    accountId: string,
    snap: HoldSnapshot,
    pg: PostgresView,
    write: boolean,
  ): Promise<{ off: number; charged: number; availBefore: number | null; availExpected: number } | null> {
    const subs: Array<string | number> = [];
    for (const [key, settled] of pg.settledBySubuse) subs.push(key, settled);
    const [status, before, expected, off, charged] = await this.redis.tgHoldRebuild(
      5,
      ...this.scriptKeys(accountId).tgHoldRebuild,
      snap.epoch,
      snap.settles,
      pg.credits,
      write ? 1 : 0,
      accountId,
      pg.charged.length,
      ...pg.charged,
      pg.settledBySubuse.size,
      ...subs,
    );
    if (status !== 1) return null;
    return { off, charged, availBefore: before === -1 ? null : before, availExpected: expected };
  }
}
