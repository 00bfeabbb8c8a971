import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { AppError } from '../errors.js';
import type { AccountsRepo, KeyRecord } from '../db/accounts-repo.js';
import type { Plan } from '../tools/types.js';
import { parseKey, type KeyType } from './keys.js';

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
    subKey:
      r.type === 'sub'
        ? { keyId: r.key_id, monthlyLimitCents: r.monthly_limit_cents ?? 0, allowedTools: r.allowed_tools ?? [] }
        : null,
  };
}

/**
 * Resolves `Authorization: Bearer <key>` to a caller. Lookups are cached in memory for
 * KEY_CACHE_SECONDS; revocations and plan changes are also broadcast on a Redis channel so every
 * replica drops its cache at once.
 */
export class KeyAuthenticator {
  private readonly cache = new Map<string, { at: number; record: KeyRecord | null }>();
  readonly channel: string;

  constructor(
    private readonly accounts: AccountsRepo,
    private readonly ttlMs: number,
    prefix: string,
  ) {
    this.channel = `${prefix}:keys:changed`;
  }

  /** Subscribes to key changes; `sub` must be a connection dedicated to subscriptions. */
  async listen(sub: Redis, log: Logger): Promise<void> {
    await sub.subscribe(this.channel);
    sub.on('message', (channel) => {
      if (channel === this.channel) this.cache.clear();
    });
    sub.on('error', (err) => log.warn({ err: err.message }, 'key change subscription error'));
  }

  /** Tells every replica that keys or accounts changed. */
  static async broadcast(redis: Redis, prefix: string): Promise<void> {
    await redis.publish(`${prefix}:keys:changed`, '1');
  }

  async authenticate(header: string | undefined): Promise<KeyCaller> {
    if (!header) throw new AppError('unauthorized', 'Send your API key as Authorization: Bearer <key>');
    const m = /^Bearer\s+(\S+)\s*$/i.exec(header);
    if (!m) throw new AppError('invalid_api_key', 'Authorization header must be "Bearer <key>"');
    const { hash } = parseKey(m[1]!);
    const now = Date.now();
    let hit = this.cache.get(hash);
    if (!hit || now - hit.at > this.ttlMs) {
      hit = { at: now, record: await this.accounts.findKeyByHash(hash) };
      if (this.ttlMs > 0) {
        if (this.cache.size > 10_000) this.cache.clear();
        this.cache.set(hash, hit);
      }
    }
    const record = hit.record;
    if (!record || record.revoked_at) throw new AppError('key_not_found', 'API key does not exist or was revoked');
    return callerFromRecord(record);
  }

  clear(): void {
    this.cache.clear();
  }
}
