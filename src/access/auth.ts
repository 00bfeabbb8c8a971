/**
 * access/: who may call and how much. Keys and their format, authentication (this file), accounts,
 * plans' limits, rate and concurrency limits, sub-keys, passports' access rules and the sealing of
 * callers' edge tokens. It answers "may this caller do this now"; it moves no money.
 */
import type { Redis } from '../queue/redis.js';
import type { Logger } from 'pino';
import { AppError } from '../errors.js';
import type { AccountsRepo, KeyRecord } from './accounts.js';
import type { Plan } from '../tools/types.js';
import { parseKey, type KeyType } from './key-format.js';
import { keyToolSet, type KeyToolSet } from './tool-sets.js';
import { traced } from '../tracing.js';

/** Who is calling. Built once per request by authentication. */
export interface KeyCaller {
  kind: 'key';
  keyId: string;
  accountId: string;
  keyType: KeyType;
  plan: Plan;
  /** Custom requests per minute (enterprise), else null for the plan's default. */
  rpm: number | null;
  /** Custom cap on jobs in flight, else null for the plan's default. */
  maxInFlight: number | null;
  sandbox: boolean;
  agentName: string | null;
  subKey: { keyId: string; monthlyLimitCents: number; allowedTools: string[] } | null;
  /**
   * A rotated key before its expires_at: it calls tools and reads its own jobs, and manages nothing
   * (the key that replaced it does), so a leaked key that was rotated cannot take the account over.
   */
  inGrace: boolean;
  /** This key and every key it replaced by rotation: the jobs this key may read and cancel are theirs. */
  ownKeyIds: readonly string[];
  /** The key's default tool set (src/access/tool-sets.ts): it calls nothing outside it. Absent or null: none. */
  toolSet?: KeyToolSet | null;
  /**
   * An OAuth grant calling with an access token: the one resource (RFC 8707) the token is for, so it
   * is refused everywhere else. Null for API keys.
   */
  audience: string | null;
}

/** An agent paying this one call with an x402 payment; it has no account. */
export interface PayerCaller {
  kind: 'payer';
  payer: string;
}

export type Caller = KeyCaller | PayerCaller;

export function callerFromRecord(r: KeyRecord): KeyCaller {
  return {
    kind: 'key',
    keyId: r.key_id,
    accountId: r.account_id,
    keyType: r.type,
    plan: r.plan,
    rpm: r.rpm,
    maxInFlight: r.max_in_flight,
    sandbox: r.type === 'test',
    agentName: r.type === 'agent' ? (r.name ?? 'agent') : null,
    // A grant is a delegated key with a sub-key's limits: every money rule of sub-keys applies to it.
    subKey:
      r.type === 'sub' || r.type === 'grant' ? { keyId: r.key_id, monthlyLimitCents: r.monthly_limit_cents ?? 0, allowedTools: r.allowed_tools ?? [] } : null,
    inGrace: r.expires_at !== null,
    ownKeyIds: r.predecessors.length ? [r.key_id, ...r.predecessors] : [r.key_id],
    toolSet: keyToolSet(r.tool_set),
    audience: r.resource,
  };
}

/**
 * Counts requests that fail authentication per client address, in Redis so the count holds across
 * replicas: a fixed window (one INCR, and an expiry set by the first failure) is enough for a throttle
 * whose only job is to make key guessing and keyless floods cheap to refuse.
 */
// KEYS: counter   ARGV: windowMs
const FAIL = `
local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {n, ttl}
`;
// KEYS: counter   ARGV: limit
const BLOCKED = `
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n < tonumber(ARGV[1]) then return 0 end
return redis.call('PTTL', KEYS[1])
`;

type ThrottleRedis = Redis & {
  tgAuthFail(keys: 1, key: string, windowMs: number): Promise<[number, number]>;
  tgAuthBlocked(keys: 1, key: string, limit: number): Promise<number>;
};

export class AuthFailureThrottle {
  private readonly redis: ThrottleRedis;

  constructor(
    redis: Redis,
    private readonly prefix: string,
    readonly limit: number,
    private readonly windowMs: number,
    private readonly log?: { warn(obj: object, msg: string): void },
  ) {
    const r: Redis = redis;
    if (!('tgAuthFail' in r)) r.defineCommand('tgAuthFail', { lua: FAIL });
    if (!('tgAuthBlocked' in r)) r.defineCommand('tgAuthBlocked', { lua: BLOCKED });
    this.redis = redis as ThrottleRedis;
  }

  private key(address: string): string {
    return `${this.prefix}:authfail:${address}`;
  }

  /**
   * Counts one failed authentication from `address`; returns the 429 to answer instead of the 401
   * once the address is past its limit. A Redis failure never turns a 401 into a 5xx: it counts nothing.
   */
  async fail(address: string): Promise<AppError | null> {
    try {
      const [n, ttl] = await this.redis.tgAuthFail(1, this.key(address), this.windowMs);
      return n > this.limit ? this.refusal(ttl) : null;
    } catch (err) {
      this.log?.warn({ err }, 'failed-authentication throttle unavailable');
      return null;
    }
  }

  /** The 429 to answer before any key lookup when `address` is already past its limit, else null. */
  async blocked(address: string): Promise<AppError | null> {
    try {
      const ttl = await this.redis.tgAuthBlocked(1, this.key(address), this.limit);
      return ttl > 0 ? this.refusal(ttl) : null;
    } catch (err) {
      this.log?.warn({ err }, 'failed-authentication throttle unavailable');
      return null;
    }
  }

  private refusal(ttlMs: number): AppError {
    const retryAfter = Math.max(1, Math.ceil(ttlMs / 1000));
    return new AppError(
      'rate_limited',
      `Too many requests without a valid API key from this address (more than ${this.limit} per minute); retry in ${retryAfter} s`,
      { retry_after: retryAfter, limit: this.limit },
      { headers: { 'retry-after': String(retryAfter) } },
    );
  }
}

export interface FrontDoorOptions {
  /** How long a key that does not exist (or was revoked) is known as such without asking Postgres; 0 = never. */
  negativeTtlMs: number;
  /** Per-address throttle of failed authentications; applied when `authenticate` is given an address. */
  throttle?: AuthFailureThrottle;
  /** Records `last_used_at` of keys that authenticate (at most once a minute per key). */
  lastUsed?: LastUsedRecorder;
}

/**
 * Keeps `api_keys.last_used_at` roughly current without a Postgres write per request: a Redis
 * `SET NX EX 60` per key lets one request a minute, across all replicas, do the write; and each
 * replica asks Redis at most once a minute per key, so a request costs no round trip for it. Fire
 * and forget: a failure is logged, never felt by the request.
 */
export class LastUsedRecorder {
  /** keyId -> when this replica may ask Redis again (ms). Bounded: cleared when full. */
  private readonly asked = new Map<string, number>();

  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    private readonly accounts: Pick<AccountsRepo, 'touchKey'>,
    private readonly log: { warn(obj: object, msg: string): void },
    private readonly everySeconds = 60,
  ) {}

  record(keyId: string): void {
    const now = Date.now();
    if ((this.asked.get(keyId) ?? 0) > now) return;
    if (this.asked.size >= MAX_RECENT) this.asked.clear();
    this.asked.set(keyId, now + this.everySeconds * 1000);
    void this.redis
      .set(`${this.prefix}:keyused:${keyId}`, '1', 'EX', this.everySeconds, 'NX')
      .then((won) => (won === 'OK' ? this.accounts.touchKey(keyId) : undefined))
      .catch((err: unknown) => this.log.warn({ err, keyId }, 'recording last use of a key failed'));
  }
}

/** Whether a rotated key's grace period, or the OAuth access token it was found by, is over (at `now`, ms since the epoch). */
export function keyExpired(record: Pick<KeyRecord, 'expires_at'> & Partial<Pick<KeyRecord, 'token_expires_at'>>, now: number): boolean {
  const at = (t: string | null | undefined) => t != null && Date.parse(t) <= now;
  return at(record.expires_at) || at(record.token_expires_at);
}

/** Bounds of the in-memory key state, so a flood of random keys cannot grow the process without end. */
const MAX_CACHED = 10_000;
const MAX_UNKNOWN = 50_000;
const MAX_RECENT = 50_000;
/** A key that authenticated within this long skips the address throttle check (no Redis round trip). */
const RECENT_MS = 10 * 60_000;
/**
 * Keys from addresses past their failure limit are looked up together: at most one query per this
 * many milliseconds per replica, whatever the flood, so a valid key from such an address still works.
 */
const BATCH_SPACING_MS = 20;
/** Keys waiting for the next batched lookup; more from throttled addresses are refused at once. */
const MAX_BATCH = 1_000;

function keyNotFound(): AppError {
  return new AppError('key_not_found', 'API key does not exist or was revoked');
}

/** Inserts into a Map used as a FIFO of bounded size: the oldest entries go first. */
function putBounded<V>(map: Map<string, V>, key: string, value: V, max: number): void {
  map.delete(key);
  while (map.size >= max) map.delete(map.keys().next().value!);
  map.set(key, value);
}

/**
 * Resolves `Authorization: Bearer <key>` to a caller. Lookups are cached in memory for
 * KEY_CACHE_SECONDS; revocations and plan changes are also broadcast on a Redis channel so every
 * replica drops its cache at once.
 *
 * In front of the lookup: keys that do not exist are remembered as such for KEY_NEGATIVE_CACHE_SECONDS
 * (no Postgres query for a repeated wrong key), concurrent lookups of one key share one query, and an
 * address past AUTH_FAIL_PER_MINUTE failed authentications is answered 429 for every key that fails;
 * its keys cost no query of their own (one batched query serves every throttled key of a moment), so a
 * valid key from that address still works. Keys are random, so an unknown key never turns valid while
 * remembered; a revoked one never comes back.
 */
export class KeyAuthenticator {
  private readonly cache = new Map<string, { at: number; record: KeyRecord }>();
  /** Hash -> when it stops being known as unknown. */
  private readonly unknown = new Map<string, number>();
  /** Hash -> last successful authentication, for the throttle's fast path. */
  private readonly recent = new Map<string, number>();
  private readonly inflight = new Map<string, Promise<KeyRecord | null>>();
  /** Bumped by every key change, so a lookup that started before one is not cached after it. */
  private generation = 0;
  private negativeTtlMs = 0;
  private throttle: AuthFailureThrottle | undefined;
  private lastUsed: LastUsedRecorder | undefined;
  /** Keys from throttled addresses waiting for the next batched lookup, with their waiters. */
  private queued = new Map<string, Array<{ resolve(r: KeyRecord | null): void; reject(e: unknown): void }>>();
  private batchTimer: NodeJS.Timeout | null = null;
  private batchRunning = false;
  private lastBatchAt = 0;
  /** Batched lookups run so far (Postgres queries on behalf of throttled addresses). */
  batchedLookups = 0;
  readonly channel: string;

  constructor(
    private readonly accounts: AccountsRepo,
    private readonly ttlMs: number,
    prefix: string,
    opts: Partial<FrontDoorOptions> = {},
  ) {
    this.channel = `${prefix}:keys:changed`;
    this.configure(opts);
  }

  configure(opts: Partial<FrontDoorOptions>): void {
    if (opts.negativeTtlMs !== undefined) this.negativeTtlMs = opts.negativeTtlMs;
    if (opts.throttle !== undefined) this.throttle = opts.throttle;
    if (opts.lastUsed !== undefined) this.lastUsed = opts.lastUsed;
  }

  /** Subscribes to key changes; `sub` must be a connection dedicated to subscriptions. */
  async listen(sub: Redis, log: Logger): Promise<void> {
    await sub.subscribe(this.channel);
    sub.on('message', (channel) => {
      if (channel === this.channel) this.clear();
    });
    sub.on('error', (err) => log.warn({ err: err.message }, 'key change subscription error'));
  }

  /** Tells every replica that keys or accounts changed. */
  static async broadcast(redis: Redis, prefix: string): Promise<void> {
    await redis.publish(`${prefix}:keys:changed`, '1');
  }

  /**
   * `address` is the client's address; with it (and a throttle configured) failures count against
   * that address, and once it is past its limit every failure is a 429 and its unknown keys go to the
   * batched lookup. A key that authenticated recently skips the check, so valid keys never wait on it.
   */
  authenticate(header: string | undefined, address?: string, opts: { audience?: string } = {}): Promise<KeyCaller> {
    return traced('authenticate', () => this.authenticateKey(header, address, opts));
  }

  private async authenticateKey(header: string | undefined, address?: string, opts: { audience?: string } = {}): Promise<KeyCaller> {
    const throttle = address !== undefined ? this.throttle : undefined;
    const fail = async (err: AppError): Promise<never> => {
      const refusal = throttle ? await throttle.fail(address!) : null;
      throw refusal ?? err;
    };
    if (!header) return fail(new AppError('unauthorized', 'Send your API key as Authorization: Bearer <key>'));
    const m = /^Bearer\s+(\S+)\s*$/i.exec(header);
    if (!m) return fail(new AppError('invalid_api_key', 'Authorization header must be "Bearer <key>"'));
    let hash: string;
    try {
      ({ hash } = parseKey(m[1]!));
    } catch (e) {
      return fail(e as AppError);
    }
    const now = Date.now();
    let record: KeyRecord | null;
    const hit = this.cache.get(hash);
    if (hit && now - hit.at <= this.ttlMs) {
      record = hit.record;
    } else {
      const until = this.unknown.get(hash);
      if (until !== undefined) {
        if (until > now) return fail(keyNotFound());
        this.unknown.delete(hash);
      }
      const seen = this.recent.get(hash);
      const blocked = throttle && !(seen !== undefined && now - seen <= RECENT_MS) ? await throttle.blocked(address!) : null;
      if (blocked) {
        // Past its limit, an address's keys cost no query of their own: they wait (milliseconds) for
        // the next batched lookup, so a flood of random keys adds one query per batch, not per request.
        if (this.queued.size >= MAX_BATCH && !this.queued.has(hash)) throw blocked;
        record = await this.lookupBatched(hash);
      } else {
        record = await this.lookup(hash);
      }
    }
    if (!record) {
      this.recent.delete(hash);
      return fail(keyNotFound());
    }
    // Checked on every request, cached record or not: a rotated key stops at its expires_at on
    // every replica, whatever KEY_CACHE_SECONDS or a missed broadcast would allow.
    if (keyExpired(record, Date.now())) {
      this.cache.delete(hash);
      this.recent.delete(hash);
      if (this.negativeTtlMs > 0) putBounded(this.unknown, hash, Date.now() + this.negativeTtlMs, MAX_UNKNOWN);
      return fail(
        record.token_expires_at !== null
          ? new AppError('key_not_found', 'OAuth access token expired: refresh it at the token endpoint')
          : new AppError('key_not_found', 'API key expired: it was rotated and its grace period is over; use its replacement'),
      );
    }
    if (record.resource !== null && record.resource !== opts.audience) {
      // A real token used at the wrong door, not a guess: not counted against the address.
      throw new AppError(
        'invalid_api_key',
        `This OAuth access token is for ${record.resource} only (RFC 8707); use an API key here, or send the token to that resource`,
      );
    }
    if (record.type === 'vip' && !(record.plan === 'enterprise' && record.elite)) {
      // A real key whose account changed, not a guess: not counted against the address, and not
      // remembered as unknown (the account may become elite enterprise again).
      throw new AppError('key_not_found', "API key no longer authenticates: this VIP key's account is no longer enterprise and elite");
    }
    if (throttle) putBounded(this.recent, hash, now, MAX_RECENT);
    this.lastUsed?.record(record.key_id);
    return callerFromRecord(record);
  }

  /** One Postgres query per key at a time; the answer is cached (a missing or revoked key as unknown). */
  private lookup(hash: string): Promise<KeyRecord | null> {
    const pending = this.inflight.get(hash);
    if (pending) return pending;
    const generation = this.generation;
    const p = this.accounts
      .findKeyByHash(hash)
      .then((found) => this.remember(hash, found, generation))
      .finally(() => {
        if (this.inflight.get(hash) === p) this.inflight.delete(hash);
      });
    this.inflight.set(hash, p);
    return p;
  }

  /** Caches a lookup's answer and returns the record if the key is live. */
  private remember(hash: string, found: KeyRecord | null, generation: number): KeyRecord | null {
    // An expired key is returned (not remembered as unknown here) so `authenticate` names why it fails.
    const record = found && !found.revoked_at ? found : null;
    const now = Date.now();
    if (record) {
      // A record read before a key change may be stale; one read after it is cached by its own lookup.
      if (this.ttlMs > 0 && generation === this.generation) {
        if (this.cache.size >= MAX_CACHED) this.cache.clear();
        this.cache.set(hash, { at: now, record });
      }
    } else if (this.negativeTtlMs > 0) {
      // Never stale: no key change makes a missing or revoked key valid.
      putBounded(this.unknown, hash, now + this.negativeTtlMs, MAX_UNKNOWN);
    }
    return record;
  }

  private lookupBatched(hash: string): Promise<KeyRecord | null> {
    return new Promise((resolve, reject) => {
      const waiters = this.queued.get(hash);
      if (waiters) waiters.push({ resolve, reject });
      else this.queued.set(hash, [{ resolve, reject }]);
      this.scheduleBatch();
    });
  }

  private scheduleBatch(): void {
    if (this.batchRunning || this.batchTimer || this.queued.size === 0) return;
    const wait = Math.max(0, this.lastBatchAt + BATCH_SPACING_MS - Date.now());
    this.batchTimer = setTimeout(() => {
      this.batchTimer = null;
      void this.runBatch();
    }, wait);
  }

  private async runBatch(): Promise<void> {
    const batch = this.queued;
    this.queued = new Map();
    this.batchRunning = true;
    this.lastBatchAt = Date.now();
    this.batchedLookups++;
    const generation = this.generation;
    const hashes = [...batch.keys()];
    try {
      const found = await this.accounts.findKeysByHash(hashes);
      for (const [hash, waiters] of batch) {
        const record = this.remember(hash, found.get(hash) ?? null, generation);
        for (const w of waiters) w.resolve(record);
      }
    } catch (e) {
      for (const waiters of batch.values()) for (const w of waiters) w.reject(e);
    } finally {
      this.batchRunning = false;
      this.scheduleBatch();
    }
  }

  /**
   * Forgets every cached key record (a key was revoked, an account's plan or status changed). Keys
   * known as unknown stay so: none of those changes makes a missing or revoked key valid.
   */
  clear(): void {
    this.generation++;
    this.cache.clear();
    this.inflight.clear();
  }
}
