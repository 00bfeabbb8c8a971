import { createCipheriv, createDecipheriv, createHash, createHmac, randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import { ConfigError, type Config } from '../config.js';
import { AppError } from '../errors.js';
import type { Redis } from '../queue/redis.js';
import { accountTag } from '../queue/keyspace.js';
import type { KeyInfo } from './accounts.js';
import { isProduction } from '../config.js';

import {
  PASSPORT_MIN_TTL_S,
  PASSPORT_MAX_TTL_S,
  PASSPORT_DEFAULT_TTL_S,
  PASSPORT_LABEL_MAX,
  PASSPORT_PAGE_MAX,
  SELF,
  HANDLE_RE,
  DELIVERY_RE,
  type PassportMeta,
  type PassportPut,
  type PassportContent,
  type PassportPage,
  type Delivery,
  type InboxPage,
  type SendResult,
  type PageOpts,
  type PassportApi,
} from '../tools/core/passport-api.js';

/**
 * Passports: blobs of text one key of an account leaves for itself or hands to another key (or agent)
 * of the same account, e.g. a handoff brief between two agents. They live in Redis only, each with a
 * TTL from 60 s to 30 days, and are never money: nothing here touches Postgres except the read-only
 * look-up of a recipient key.
 *
 * Layout, under `${REDIS_PREFIX}:pp:{a<shard>}:<account>` (sandbox keys under `${REDIS_PREFIX}:pp:test:{a<shard>}:<account>`,
 * so a sandbox key never sees or fills the live namespace and vice versa):
 * - `:p:<handle>`   hash {meta, data}: both sealed with AES-256-GCM under PASSPORT_KEY (the content
 *                   and its metadata, label and sha256 included, are never stored in clear);
 * - `:idx`          sorted set handle -> expiry (ms): the account's live passports, counted against
 *                   PASSPORTS_PER_ACCOUNT atomically in a Lua script that first drops expired entries;
 * - `:inbox:<key>`  sorted set delivery id -> expiry (ms): deliveries addressed to one key;
 * - `:d:<delivery>` JSON {delivery_id, handle, from_key_id, to_key_id, sent_at, expires_at}: ids only.
 * Every key has a TTL: a passport and a delivery expire with themselves, a sorted set with its latest
 * member. Handles are 24 random bytes (crypto.randomBytes), so they cannot be guessed; and since every
 * look-up happens inside the caller's account namespace, another account's handle is simply not found.
 *
 * The GCM additional data binds each sealed value to its namespace and handle: a blob copied to another
 * account's or passport's key does not open.
 *
 * PASSPORT_KEY (32 bytes, 64 hex characters or base64) is required in production; `npm start` and the
 * workers beside it generate one once into the data directory and reuse it (src/bootstrap.ts). Only a
 * process built without either (tests calling loadConfig directly) falls back to a random key of its
 * own, with a warning: its passports open in no other process and do not survive it.
 */

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

export interface PassportScope {
  accountId: string;
  /** The caller's key (production, agent, sub or test key id). */
  callerKeyId: string | null;
  sandbox: boolean;
  /**
   * The call's job id. A job that runs again (a retry, or a redelivery after a worker died) derives the
   * same handle and delivery id from it, so it overwrites what its earlier run stored instead of
   * storing a second passport or delivering twice. Absent: random ids.
   */
  callId?: string;
  /**
   * A sub-key's view: it sees, reads, sends on and deletes only the passports it stored and those
   * delivered to it. The account's other keys see every passport of the account.
   */
  ownOnly?: boolean;
}

/** Finds the key a delivery goes to, inside one account; null when there is none that may receive. */
export type RecipientResolver = (accountId: string, to: string) => Promise<string | null>;

/** The keys a key replaced through rotations (its predecessors), oldest or newest in any order. */
export type PredecessorResolver = (accountId: string, keyId: string) => Promise<string[]>;

// --- keys -----------------------------------------------------------------------------------------

let processKey: Buffer | null = null;
let warned = false;
const parsedKeys = new Map<string, Buffer>();

/**
 * PASSPORT_KEY as 32 bytes. Unset: refused in production; elsewhere the entry points fill it from the data
 * dir (src/bootstrap.ts), so only a container built without them (tests) gets one random key for the life
 * of this process (logged once).
 */
export function passportKey(config: Pick<Config, 'PASSPORT_KEY'>, log?: Pick<Logger, 'warn'>): Buffer {
  const configured = config.PASSPORT_KEY;
  if (configured) {
    let key = parsedKeys.get(configured);
    if (!key) {
      key = /^[0-9a-fA-F]{64}$/.test(configured) ? Buffer.from(configured, 'hex') : Buffer.from(configured, 'base64');
      if (key.length !== 32) throw new ConfigError('PASSPORT_KEY must be 32 bytes, as 64 hex characters or base64');
      parsedKeys.set(configured, key);
    }
    return key;
  }
  // Production never gets a key of one process (passports would not survive a restart): the entry points
  // refuse to start without PASSPORT_KEY (src/bootstrap.ts), and so does this, for any other way in.
  if (isProduction()) {
    throw new ConfigError(
      'PASSPORT_KEY is required in production: passports sealed under a random key of one process open in no other (`openssl rand -hex 32`)',
    );
  }
  if (!processKey) processKey = randomBytes(32);
  if (!warned) {
    warned = true;
    log?.warn(
      'PASSPORT_KEY is not set: passports are encrypted under a random key of this process, so they do not survive a restart and other processes cannot read them',
    );
  }
  return processKey;
}

const VERSION = 1;

function seal(key: Buffer, plain: Buffer, aad: string): Buffer {
  const iv = randomBytes(12);
  const cipher = createCipheriv('aes-256-gcm', key, iv);
  cipher.setAAD(Buffer.from(aad, 'utf8'));
  const body = Buffer.concat([cipher.update(plain), cipher.final()]);
  return Buffer.concat([Buffer.from([VERSION]), iv, cipher.getAuthTag(), body]);
}

/** Opens one sealed value (null when `key` or `aad` is not the one it was sealed with); the start-up check uses it too. */
export function openSealed(key: Buffer, blob: Buffer, aad: string): Buffer | null {
  if (blob.length < 29 || blob[0] !== VERSION) return null;
  try {
    const decipher = createDecipheriv('aes-256-gcm', key, blob.subarray(1, 13));
    decipher.setAAD(Buffer.from(aad, 'utf8'));
    decipher.setAuthTag(blob.subarray(13, 29));
    return Buffer.concat([decipher.update(blob.subarray(29)), decipher.final()]);
  } catch {
    return null;
  }
}

// --- scripts --------------------------------------------------------------------------------------

/**
 * Adds one member to a capped sorted set of expiries and writes its record, atomically.
 * KEYS: set, record   ARGV: now, expiresAt, cap, member, recordPrefix, kind ('hash'|'string'), field1, value1 [, field2, value2]
 * Drops expired members first; when still at the cap, drops members whose record is gone (deleted,
 * or evicted under memory pressure) before refusing. A member already present is rewritten (its
 * record and expiry) without counting again. Returns 1, or 0 at the cap.
 */
const ADD = `
local now = tonumber(ARGV[1])
local cap = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
-- A member already there (a job run again) is rewritten, not counted twice.
if not redis.call('ZSCORE', KEYS[1], ARGV[4]) and redis.call('ZCARD', KEYS[1]) >= cap then
  local members = redis.call('ZRANGE', KEYS[1], 0, -1)
  for _, m in ipairs(members) do
    if redis.call('EXISTS', ARGV[5] .. m) == 0 then redis.call('ZREM', KEYS[1], m) end
  end
  if redis.call('ZCARD', KEYS[1]) >= cap then return 0 end
end
if ARGV[6] == 'hash' then
  redis.call('HSET', KEYS[2], ARGV[7], ARGV[8], ARGV[9], ARGV[10])
else
  redis.call('SET', KEYS[2], ARGV[8])
end
redis.call('PEXPIREAT', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], top[2])
return 1
`;

/**
 * Moves the inboxes of rotated-away keys into their replacement's, keeping the latest expiry of each.
 * KEYS: destination, sources...
 */
const MERGE = `
local moved = 0
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('ZUNIONSTORE', KEYS[1], 2, KEYS[1], KEYS[i], 'AGGREGATE', 'MAX')
    redis.call('DEL', KEYS[i])
    moved = moved + 1
  end
end
if moved > 0 then
  local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if top[2] then redis.call('PEXPIREAT', KEYS[1], top[2]) end
end
return moved
`;

type Scripted = Redis & {
  tgPassportAdd(set: string, record: string, ...argv: Array<string | number | Buffer>): Promise<number>;
  tgPassportMerge(numKeys: number, ...keys: string[]): Promise<number>;
};

// --- the service ----------------------------------------------------------------------------------

export interface PassportDeps {
  redis: Redis;
  config: Pick<Config, 'REDIS_PREFIX' | 'PASSPORT_KEY' | 'PASSPORT_MAX_BYTES' | 'PASSPORTS_PER_ACCOUNT'>;
  log?: Pick<Logger, 'warn'>;
  /** Needed by send; without it every recipient but `self` is not found. */
  resolveRecipient?: RecipientResolver;
  /** Keys the caller's key replaced (rotation): their inboxes move into the caller's on `inbox`. */
  predecessors?: PredecessorResolver;
  /** Clock (ms); tests move it. */
  now?: () => number;
}

const iso = (ms: number) => new Date(ms).toISOString();

function newId(prefix: string, bytes: number): string {
  return prefix + randomBytes(bytes).toString('base64url');
}

function notFound(handle: string): AppError {
  return new AppError('not_found', `No passport ${handle} in this account (it may have expired or been deleted)`);
}

function clampTtl(ttl: number | undefined): number {
  const t = ttl ?? PASSPORT_DEFAULT_TTL_S;
  if (!Number.isInteger(t) || t < PASSPORT_MIN_TTL_S || t > PASSPORT_MAX_TTL_S) {
    throw new AppError('invalid_input', `ttl_s must be an integer from ${PASSPORT_MIN_TTL_S} to ${PASSPORT_MAX_TTL_S} seconds`);
  }
  return t;
}

function pageOf(opts: PageOpts | undefined): { offset: number; limit: number } {
  const limit = opts?.limit ?? 50;
  if (!Number.isInteger(limit) || limit < 1 || limit > PASSPORT_PAGE_MAX) throw new AppError('invalid_input', `limit must be 1-${PASSPORT_PAGE_MAX}`);
  const cursor = opts?.cursor ?? '0';
  if (!/^\d{1,7}$/.test(cursor)) throw new AppError('invalid_input', 'cursor must be a next_cursor from an earlier page');
  return { offset: Number(cursor), limit };
}

export class PassportService {
  private readonly redis: Scripted;
  private readonly now: () => number;

  constructor(private readonly deps: PassportDeps) {
    const r: Redis = deps.redis;
    if (!('tgPassportAdd' in r)) r.defineCommand('tgPassportAdd', { numberOfKeys: 2, lua: ADD });
    if (!('tgPassportMerge' in r)) r.defineCommand('tgPassportMerge', { lua: MERGE });
    this.redis = r as Scripted;
    this.now = deps.now ?? Date.now;
  }

  /** The API a handler gets: every operation inside the caller's account (and sandbox namespace). */
  forCaller(scope: PassportScope): PassportApi {
    return {
      put: (i) => this.put(scope, i),
      get: (h) => this.get(scope, h),
      list: (o) => this.list(scope, o),
      inbox: (o) => this.inbox(scope, o),
      delete: (h) => this.delete(scope, h),
      dismiss: (d) => this.dismiss(scope, d),
      send: (i) => this.send(scope, i),
    };
  }

  /**
   * `${prefix}:pp:[test:]{a<shard>}:<account>`: the namespace of one account's passports, in its
   * account's cluster slot (src/queue/keyspace.ts), so the scripts and transactions below, which touch
   * several keys of one namespace, work on a Redis Cluster.
   */
  namespace(scope: Pick<PassportScope, 'accountId' | 'sandbox'>): string {
    return `${this.deps.config.REDIS_PREFIX}:pp:${scope.sandbox ? 'test:' : ''}${accountTag(scope.accountId)}:${scope.accountId}`;
  }

  private key(): Buffer {
    return passportKey(this.deps.config, this.deps.log);
  }

  /**
   * A new handle or delivery id: random, or, for a call with a job id, an HMAC of it under
   * PASSPORT_KEY (as unguessable as a random one to anyone without the key, and the same on every run
   * of that job).
   */
  private id(scope: PassportScope, prefix: string, bytes: number, purpose: string): string {
    if (!scope.callId) return newId(prefix, bytes);
    const mac = createHmac('sha256', this.key())
      .update(`${this.namespace(scope)}|${scope.callId}|${purpose}`)
      .digest();
    return prefix + mac.subarray(0, bytes).toString('base64url');
  }

  async put(scope: PassportScope, input: { content: string; label?: string | null; ttl_s?: number }): Promise<PassportPut> {
    const { meta, data } = this.prepare(scope, input);
    const ns = this.namespace(scope);
    const added = await this.redis.tgPassportAdd(
      `${ns}:idx`,
      `${ns}:p:${meta.handle}`,
      Date.parse(meta.created_at),
      Date.parse(meta.expires_at),
      this.deps.config.PASSPORTS_PER_ACCOUNT,
      meta.handle,
      `${ns}:p:`,
      'hash',
      'meta',
      this.sealMeta(ns, meta),
      'data',
      data,
    );
    if (added !== 1) {
      const cap = this.deps.config.PASSPORTS_PER_ACCOUNT;
      throw new AppError('limit_exceeded', `This account already has ${cap} live passports; delete some or let them expire`, {
        limit: 'passports_per_account',
        limit_value: cap,
      });
    }
    return { handle: meta.handle, bytes: meta.bytes, sha256: meta.sha256, expires_at: meta.expires_at };
  }

  /** Checks and seals new content; nothing is written. */
  private prepare(scope: PassportScope, input: { content: string; label?: string | null; ttl_s?: number }): { meta: PassportMeta; data: Buffer } {
    const { content } = input;
    if (typeof content !== 'string') throw new AppError('invalid_input', 'content must be a string');
    // A lone surrogate has no UTF-8 form: it would come back as U+FFFD, not as what was sent.
    if (LONE_SURROGATE.test(content)) throw new AppError('invalid_input', 'content is not valid Unicode (it holds a lone surrogate)');
    const plain = Buffer.from(content, 'utf8');
    const max = this.deps.config.PASSPORT_MAX_BYTES;
    if (plain.length > max) {
      throw new AppError('limit_exceeded', `content is ${plain.length} bytes of UTF-8; a passport holds at most ${max}`, {
        limit: 'passport_bytes',
        limit_value: max,
      });
    }
    const label = input.label ?? null;
    if (label !== null && (typeof label !== 'string' || label.length > PASSPORT_LABEL_MAX)) {
      throw new AppError('invalid_input', `label must be at most ${PASSPORT_LABEL_MAX} characters`);
    }
    const ttl = clampTtl(input.ttl_s);
    const now = this.now();
    const ns = this.namespace(scope);
    const handle = this.id(scope, 'pp_', 24, 'handle');
    const meta: PassportMeta = {
      handle,
      label,
      bytes: plain.length,
      sha256: createHash('sha256').update(plain).digest('hex'),
      created_at: iso(now),
      expires_at: iso(now + ttl * 1000),
      from_key_id: scope.callerKeyId,
    };
    return { meta, data: seal(this.key(), plain, `${ns}|${handle}|data`) };
  }

  private sealMeta(ns: string, meta: PassportMeta): Buffer {
    return seal(this.key(), Buffer.from(JSON.stringify(meta), 'utf8'), `${ns}|${meta.handle}|meta`);
  }

  private openMeta(ns: string, handle: string, blob: Buffer | null): PassportMeta | null {
    if (!blob) return null;
    const plain = openSealed(this.key(), blob, `${ns}|${handle}|meta`);
    return plain ? (JSON.parse(plain.toString('utf8')) as PassportMeta) : null;
  }

  /** The passport's metadata, or null when it is gone (or sealed under another key). */
  private async meta(ns: string, handle: string): Promise<PassportMeta | null> {
    if (!HANDLE_RE.test(handle)) return null;
    return this.openMeta(ns, handle, await this.redis.hgetBuffer(`${ns}:p:${handle}`, 'meta'));
  }

  /**
   * Whether a sub-key's scope may see this passport: it stored it, or it was delivered to it. The
   * account's other keys see all. A passport it may not see answers as not found, so nothing tells
   * it that one exists.
   */
  private async visible(scope: PassportScope, ns: string, meta: PassportMeta): Promise<boolean> {
    if (!scope.ownOnly) return true;
    if (!scope.callerKeyId) return false;
    if (meta.from_key_id === scope.callerKeyId) return true;
    return (await this.deliveredHandles(scope, ns)).has(meta.handle);
  }

  /** Handles of the live deliveries in the caller's inbox (at most PASSPORTS_PER_ACCOUNT). */
  private async deliveredHandles(scope: PassportScope, ns: string): Promise<Set<string>> {
    const ids = await this.redis.zrangebyscore(`${ns}:inbox:${scope.callerKeyId}`, `(${this.now()}`, '+inf');
    if (!ids.length) return new Set();
    const records = await this.redis.mget(...ids.map((d) => `${ns}:d:${d}`));
    const handles = new Set<string>();
    for (const r of records) if (r) handles.add((JSON.parse(r) as { handle: string }).handle);
    return handles;
  }

  async get(scope: PassportScope, handle: string): Promise<PassportContent> {
    if (!HANDLE_RE.test(handle)) throw notFound(String(handle).slice(0, 40));
    const ns = this.namespace(scope);
    const [metaBlob, data] = await this.redis.hmgetBuffer(`${ns}:p:${handle}`, 'meta', 'data');
    if (!metaBlob || !data) throw notFound(handle);
    const meta = this.openMeta(ns, handle, metaBlob);
    if (meta && !(await this.visible(scope, ns, meta))) throw notFound(handle);
    const plain = meta ? openSealed(this.key(), data, `${ns}|${handle}|data`) : null;
    if (!meta || !plain) {
      // Stored under another PASSPORT_KEY (a restart without one, or a rotated key): unreadable here.
      throw new AppError(
        'not_found',
        `Passport ${handle} cannot be read with this service's PASSPORT_KEY (stored under another key, or by another process without one)`,
      );
    }
    const sha256 = createHash('sha256').update(plain).digest('hex');
    if (sha256 !== meta.sha256) throw new AppError('internal_error', `Passport ${handle} failed its integrity check`);
    return { ...meta, content: plain.toString('utf8') };
  }

  async list(scope: PassportScope, opts?: PageOpts): Promise<PassportPage> {
    const ns = this.namespace(scope);
    if (scope.ownOnly) return this.listOwn(scope, ns, opts);
    const { handles, total, next } = await this.page(`${ns}:idx`, opts);
    if (!handles.length) return { passports: [], total, next_cursor: next };
    const pipe = this.redis.pipeline();
    for (const h of handles) pipe.hgetBuffer(`${ns}:p:${h}`, 'meta');
    const rows = (await pipe.exec()) ?? [];
    const passports: PassportMeta[] = [];
    const gone: string[] = [];
    handles.forEach((h, i) => {
      const m = this.openMeta(ns, h, (rows[i]?.[1] as Buffer | null) ?? null);
      if (m) passports.push(m);
      else gone.push(h);
    });
    // Gone ones leave the index; unreadable ones (sealed under another PASSPORT_KEY) still count until they expire.
    const dropped = gone.length ? await this.dropGone(`${ns}:idx`, ns, gone, 'p') : 0;
    return { passports, total: total - dropped, next_cursor: next };
  }

  /**
   * A sub-key's list: the passports it stored. Their key is inside the sealed metadata, so the
   * account's index (at most PASSPORTS_PER_ACCOUNT) is read whole and filtered, then paged.
   */
  private async listOwn(scope: PassportScope, ns: string, opts?: PageOpts): Promise<PassportPage> {
    const { offset, limit } = pageOf(opts);
    const handles = await this.redis.zrangebyscore(`${ns}:idx`, `(${this.now()}`, '+inf');
    const pipe = this.redis.pipeline();
    for (const h of handles) pipe.hgetBuffer(`${ns}:p:${h}`, 'meta');
    const rows = handles.length ? ((await pipe.exec()) ?? []) : [];
    const own: PassportMeta[] = [];
    handles.forEach((h, i) => {
      const m = this.openMeta(ns, h, (rows[i]?.[1] as Buffer | null) ?? null);
      if (m && scope.callerKeyId && m.from_key_id === scope.callerKeyId) own.push(m);
    });
    const passports = own.slice(offset, offset + limit);
    const more = offset + passports.length < own.length && passports.length === limit;
    return { passports, total: own.length, next_cursor: more ? String(offset + limit) : null };
  }

  /** Removes index members whose record no longer exists (an unreadable one stays: it still counts). */
  private async dropGone(set: string, ns: string, members: string[], kind: 'p' | 'd'): Promise<number> {
    const pipe = this.redis.pipeline();
    for (const m of members) pipe.exists(`${ns}:${kind}:${m}`);
    const rows = (await pipe.exec()) ?? [];
    const missing = members.filter((_, i) => rows[i]?.[1] === 0);
    if (missing.length) await this.redis.zrem(set, ...missing);
    return missing.length;
  }

  /** One page of a sorted set of expiries: live members, soonest expiry first. */
  private async page(set: string, opts: PageOpts | undefined): Promise<{ handles: string[]; total: number; next: string | null }> {
    const { offset, limit } = pageOf(opts);
    const now = this.now();
    const [, countRow, rangeRow] =
      (await this.redis.multi().zremrangebyscore(set, '-inf', now).zcard(set).zrangebyscore(set, `(${now}`, '+inf', 'LIMIT', offset, limit).exec()) ?? [];
    const total = Number(countRow?.[1] ?? 0);
    const handles = (rangeRow?.[1] as string[] | undefined) ?? [];
    return { handles, total, next: offset + handles.length < total && handles.length === limit ? String(offset + limit) : null };
  }

  async inbox(scope: PassportScope, opts?: PageOpts): Promise<InboxPage> {
    if (!scope.callerKeyId) throw new AppError('forbidden', 'An inbox belongs to a key; call with an API key');
    const ns = this.namespace(scope);
    const set = `${ns}:inbox:${scope.callerKeyId}`;
    // A rotated key's replacement inherits what was delivered to the key it replaced.
    const before = this.deps.predecessors ? await this.deps.predecessors(scope.accountId, scope.callerKeyId) : [];
    if (before.length) await this.redis.tgPassportMerge(before.length + 1, set, ...before.map((k) => `${ns}:inbox:${k}`));
    const { handles: ids, total, next } = await this.page(set, opts);
    if (!ids.length) return { deliveries: [], total, next_cursor: next };
    const records = await this.redis.mget(...ids.map((d) => `${ns}:d:${d}`));
    const parsed = records.map((r) =>
      r ? (JSON.parse(r) as { delivery_id: string; handle: string; from_key_id: string | null; sent_at: string; expires_at: string }) : null,
    );
    const pipe = this.redis.pipeline();
    for (const r of parsed) pipe.hgetBuffer(`${ns}:p:${r?.handle ?? 'none'}`, 'meta');
    const metas = (await pipe.exec()) ?? [];
    const deliveries: Delivery[] = [];
    const gone: string[] = [];
    parsed.forEach((r, i) => {
      const m = r ? this.openMeta(ns, r.handle, (metas[i]?.[1] as Buffer | null) ?? null) : null;
      if (!r || !m) {
        gone.push(ids[i]!);
        return;
      }
      deliveries.push({
        delivery_id: r.delivery_id,
        handle: r.handle,
        from_key_id: r.from_key_id,
        label: m.label,
        bytes: m.bytes,
        sha256: m.sha256,
        sent_at: r.sent_at,
        expires_at: r.expires_at,
      });
    });
    // A delivery whose passport was deleted (or expired early) leaves the inbox.
    if (gone.length) await this.redis.zrem(set, ...gone);
    return { deliveries, total: total - gone.length, next_cursor: next };
  }

  async delete(scope: PassportScope, handle: string): Promise<{ handle: string; deleted: true }> {
    if (!HANDLE_RE.test(handle)) throw notFound(String(handle).slice(0, 40));
    const ns = this.namespace(scope);
    if (scope.ownOnly) {
      const meta = await this.meta(ns, handle);
      if (!meta || !(await this.visible(scope, ns, meta))) throw notFound(handle);
    }
    const rows = await this.redis.multi().del(`${ns}:p:${handle}`).zrem(`${ns}:idx`, handle).exec();
    if (rows?.[0]?.[1] !== 1) throw notFound(handle);
    return { handle, deleted: true };
  }

  async dismiss(scope: PassportScope, deliveryId: string): Promise<{ delivery_id: string; deleted: true }> {
    if (!scope.callerKeyId) throw new AppError('forbidden', 'An inbox belongs to a key; call with an API key');
    const missing = new AppError('not_found', `No delivery ${String(deliveryId).slice(0, 40)} in this key's inbox`);
    if (!DELIVERY_RE.test(deliveryId)) throw missing;
    const ns = this.namespace(scope);
    const removed = await this.redis.zrem(`${ns}:inbox:${scope.callerKeyId}`, deliveryId);
    if (removed !== 1) throw missing;
    await this.redis.del(`${ns}:d:${deliveryId}`);
    return { delivery_id: deliveryId, deleted: true };
  }

  async send(scope: PassportScope, input: { to: string; handle?: string; content?: string; label?: string | null; ttl_s?: number }): Promise<SendResult> {
    if ((input.handle === undefined) === (input.content === undefined)) {
      throw new AppError('invalid_input', 'Send either handle (an existing passport) or content (a new one), not both');
    }
    if (input.handle !== undefined && input.label !== undefined && input.label !== null) {
      throw new AppError('invalid_input', 'label names new content; an existing passport keeps its own');
    }
    const toKeyId = await this.recipient(scope, input.to);
    const ns = this.namespace(scope);
    const now = this.now();
    let handle: string;
    let expiresMs: number;
    let created = false;
    if (input.handle !== undefined) {
      const meta = await this.meta(ns, input.handle);
      // A sub-key passes on only what it may read itself.
      if (!meta || !(await this.visible(scope, ns, meta))) throw notFound(String(input.handle).slice(0, 40));
      handle = meta.handle;
      // The delivery lasts as long as the passport, or less when ttl_s says so.
      expiresMs = Date.parse(meta.expires_at);
      if (input.ttl_s !== undefined) expiresMs = Math.min(expiresMs, now + clampTtl(input.ttl_s) * 1000);
    } else if (scope.sandbox) {
      const { meta } = this.prepare(scope, { content: input.content!, label: input.label, ttl_s: input.ttl_s });
      handle = meta.handle;
      expiresMs = Date.parse(meta.expires_at);
    } else {
      const put = await this.put(scope, { content: input.content!, label: input.label, ttl_s: input.ttl_s });
      handle = put.handle;
      expiresMs = Date.parse(put.expires_at);
      created = true;
    }
    const deliveryId = this.id(scope, 'dl_', 16, 'delivery');
    const result: SendResult = { delivery_id: deliveryId, handle, to_key_id: toKeyId, expires_at: iso(expiresMs) };
    // Sandbox keys: checked like a real send, but nothing is stored or delivered.
    if (scope.sandbox) return { ...result, dry_run: true };
    const record = JSON.stringify({
      delivery_id: deliveryId,
      handle,
      from_key_id: scope.callerKeyId,
      to_key_id: toKeyId,
      sent_at: iso(now),
      expires_at: iso(expiresMs),
    });
    const cap = this.deps.config.PASSPORTS_PER_ACCOUNT;
    const added = await this.redis.tgPassportAdd(
      `${ns}:inbox:${toKeyId}`,
      `${ns}:d:${deliveryId}`,
      now,
      expiresMs,
      cap,
      deliveryId,
      `${ns}:d:`,
      'string',
      '',
      record,
    );
    if (added !== 1) {
      if (created) await this.delete(scope, handle).catch(() => undefined);
      throw new AppError('limit_exceeded', `The recipient's inbox already holds ${cap} deliveries`, { limit: 'passport_inbox', limit_value: cap });
    }
    return result;
  }

  private async recipient(scope: PassportScope, to: string): Promise<string> {
    if (to === SELF) {
      if (!scope.callerKeyId) throw new AppError('forbidden', 'Only a call made with an API key can send to "self"');
      return scope.callerKeyId;
    }
    const found = this.deps.resolveRecipient ? await this.deps.resolveRecipient(scope.accountId, to) : null;
    if (!found) {
      // The same answer for an unknown key, another account's key and a revoked one: nothing to probe.
      throw new AppError('not_found', `No key or agent "${String(to).slice(0, 80)}" in this account can receive passports`);
    }
    return found;
  }
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

type KeyLister = { listKeys(accountId: string): Promise<KeyInfo[]> };

/**
 * Recipients from the account's keys (AccountsRepo.listKeys): a key id, or an agent key's name (the
 * newest live one when a rotation leaves two). A rotated key's id reaches its replacement. Revoked and
 * expired keys, and sandbox (test) keys, whose passports live in a namespace of their own, cannot receive.
 */
export function recipientsFrom(accounts: KeyLister, now: () => number = Date.now): RecipientResolver {
  return async (accountId, to) => {
    const all = await accounts.listKeys(accountId);
    const live = (k: KeyInfo) => k.type !== 'test' && k.revoked_at === null && (k.expires_at === null || Date.parse(k.expires_at) > now());
    if (UUID.test(to)) {
      const byId = new Map(all.map((k) => [k.key_id, k]));
      let k = byId.get(to.toLowerCase());
      // Follow rotations to the key in use now (a revoked key is never followed).
      for (let hops = 0; k && k.revoked_at === null && k.replaced_by_key_id && !live(k) && hops < 32; hops++) k = byId.get(k.replaced_by_key_id);
      return k && live(k) ? k.key_id : null;
    }
    const agents = all.filter((k) => live(k) && k.type === 'agent' && k.name === to);
    return (agents.find((k) => k.replaced_by_key_id === null) ?? agents[0])?.key_id ?? null;
  };
}

/** The keys `keyId` replaced, through any number of rotations. */
export function predecessorsFrom(accounts: KeyLister): PredecessorResolver {
  return async (accountId, keyId) => {
    const all = await accounts.listKeys(accountId);
    const found = new Set<string>([keyId]);
    for (let grew = true; grew; ) {
      grew = false;
      for (const k of all) {
        if (k.replaced_by_key_id && found.has(k.replaced_by_key_id) && !found.has(k.key_id)) {
          found.add(k.key_id);
          grew = true;
        }
      }
    }
    found.delete(keyId);
    return [...found];
  };
}

/** ctx.passports for one call (the runner builds it when the call has an account and Redis is there). */
export function passportsFor(deps: { redis: Redis; config: Config; accounts: KeyLister; log?: Pick<Logger, 'warn'> }, scope: PassportScope): PassportApi {
  return new PassportService({
    redis: deps.redis,
    config: deps.config,
    log: deps.log,
    resolveRecipient: recipientsFrom(deps.accounts),
    predecessors: predecessorsFrom(deps.accounts),
  }).forCaller(scope);
}
