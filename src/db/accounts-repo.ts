import { z } from 'zod';
import { sql, type DatabasePool } from './pool.js';
import { PLANS } from '../tools/types.js';
import { KEY_TYPES, generateKey, type KeyType } from '../services/keys.js';
import { AppError } from '../errors.js';

export const AccountSchema = z.object({
  id: z.string().uuid(),
  name: z.string().nullable(),
  plan: z.enum(PLANS),
  credits: z.number().int(),
  rpm: z.number().int().nullable(),
  elite: z.boolean(),
  max_in_flight: z.number().int().nullable(),
  created_at: z.string(),
});
export type Account = z.infer<typeof AccountSchema>;

/** What authentication needs about a key, joined with its account. */
export const KeyRecordSchema = z.object({
  key_id: z.string().uuid(),
  account_id: z.string().uuid(),
  type: z.enum(KEY_TYPES),
  name: z.string().nullable(),
  plan: z.enum(PLANS),
  rpm: z.number().int().nullable(),
  elite: z.boolean(),
  max_in_flight: z.number().int().nullable(),
  monthly_limit_cents: z.number().int().nullable(),
  allowed_tools: z.array(z.string()).nullable(),
  revoked_at: z.string().nullable(),
});
export type KeyRecord = z.infer<typeof KeyRecordSchema>;

export const SubKeySchema = z.object({
  key_id: z.string().uuid(),
  name: z.string().nullable(),
  display_prefix: z.string(),
  monthly_limit: z.number().int(),
  allowed_tools: z.array(z.string()),
  used_this_month: z.number().int(),
  created_at: z.string(),
});
export type SubKey = z.infer<typeof SubKeySchema>;

const monthStart = sql.fragment`date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`;

export class AccountsRepo {
  constructor(private readonly pool: DatabasePool) {}

  async createAccount(input: { plan: Account['plan']; credits: number; name?: string | null }): Promise<Account> {
    return this.pool.transaction(async (tx) => {
      const account = await tx.one(sql.type(AccountSchema)`
        INSERT INTO accounts (plan, credits, name) VALUES (${input.plan}, ${input.credits}, ${input.name ?? null})
        RETURNING id, name, plan, credits, rpm, elite, max_in_flight, created_at`);
      await tx.query(sql.unsafe`
        INSERT INTO ledger (entry_key, account_id, kind, delta_cents)
        VALUES (${'opening:' + account.id}, ${account.id}, 'opening', ${input.credits})`);
      return account;
    });
  }

  async getAccount(id: string): Promise<Account> {
    const row = await this.pool.maybeOne(sql.type(AccountSchema)`
      SELECT id, name, plan, credits, rpm, elite, max_in_flight, created_at FROM accounts WHERE id = ${id}`);
    if (!row) throw new AppError('not_found', `No account ${id}`);
    return row;
  }

  async credits(id: string): Promise<number> {
    const row = await this.pool.maybeOneFirst(sql.type(z.object({ credits: z.number().int() }))`
      SELECT credits FROM accounts WHERE id = ${id}`);
    if (row === null) throw new AppError('not_found', `No account ${id}`);
    return row;
  }

  /** Adds credits and records the top-up in the ledger, in one transaction. */
  async addCredits(id: string, cents: number, entryKey: string): Promise<number> {
    return this.pool.transaction(async (tx) => {
      const inserted = await tx.maybeOneFirst(sql.type(z.object({ id: z.number() }))`
        INSERT INTO ledger (entry_key, account_id, kind, delta_cents) VALUES (${entryKey}, ${id}, 'topup', ${cents})
        ON CONFLICT (entry_key) DO NOTHING RETURNING id`);
      const credits = inserted === null
        ? await tx.maybeOneFirst(sql.type(z.object({ credits: z.number().int() }))`SELECT credits FROM accounts WHERE id = ${id}`)
        : await tx.maybeOneFirst(sql.type(z.object({ credits: z.number().int() }))`
            UPDATE accounts SET credits = credits + ${cents} WHERE id = ${id} RETURNING credits`);
      if (credits === null) throw new AppError('not_found', `No account ${id}`);
      return credits;
    });
  }

  async setAccount(id: string, patch: { plan?: Account['plan']; rpm?: number | null; elite?: boolean; maxInFlight?: number | null }): Promise<Account> {
    const row = await this.pool.maybeOne(sql.type(AccountSchema)`
      UPDATE accounts SET
        plan = COALESCE(${patch.plan ?? null}, plan),
        rpm = CASE WHEN ${patch.rpm !== undefined} THEN ${patch.rpm ?? null}::integer ELSE rpm END,
        elite = COALESCE(${patch.elite ?? null}::boolean, elite),
        max_in_flight = CASE WHEN ${patch.maxInFlight !== undefined} THEN ${patch.maxInFlight ?? null}::integer ELSE max_in_flight END
      WHERE id = ${id}
      RETURNING id, name, plan, credits, rpm, elite, max_in_flight, created_at`);
    if (!row) throw new AppError('not_found', `No account ${id}`);
    return row;
  }

  async createKey(input: {
    accountId: string;
    type: KeyType;
    name?: string | null;
    monthlyLimitCents?: number | null;
    allowedTools?: string[] | null;
    createdByKeyId?: string | null;
  }): Promise<{ key_id: string; api_key: string; display_prefix: string; created_at: string }> {
    const { key, hash, displayPrefix } = generateKey(input.type);
    const row = await this.pool.one(sql.type(z.object({ id: z.string(), created_at: z.string() }))`
      INSERT INTO api_keys (account_id, key_hash, display_prefix, type, name, monthly_limit_cents, allowed_tools, created_by_key_id)
      VALUES (${input.accountId}, ${hash}, ${displayPrefix}, ${input.type}, ${input.name ?? null},
              ${input.monthlyLimitCents ?? null},
              ${input.allowedTools ? sql.array(input.allowedTools, 'text') : null},
              ${input.createdByKeyId ?? null})
      RETURNING id, created_at`);
    return { key_id: row.id, api_key: key, display_prefix: displayPrefix, created_at: row.created_at };
  }

  async findKeyByHash(hash: string): Promise<KeyRecord | null> {
    return (await this.findKeysByHash([hash])).get(hash) ?? null;
  }

  /** Keys by hash, many in one query (authentication batches lookups from throttled addresses). */
  async findKeysByHash(hashes: string[]): Promise<Map<string, KeyRecord>> {
    const rows = await this.pool.any(sql.type(KeyRecordSchema.extend({ key_hash: z.string() }))`
      SELECT k.key_hash, k.id AS key_id, k.account_id, k.type, k.name, a.plan, a.rpm, a.elite, a.max_in_flight,
             k.monthly_limit_cents, k.allowed_tools, k.revoked_at
      FROM api_keys k JOIN accounts a ON a.id = k.account_id
      WHERE k.key_hash = ANY(${sql.array(hashes, 'text')})`);
    return new Map(rows.map(({ key_hash, ...record }) => [key_hash, record]));
  }

  /** Revokes a key; with `accountId`, only a key of that account. Returns the key's hash, or null. */
  async revokeKey(keyId: string, opts: { accountId?: string; type?: KeyType } = {}): Promise<string | null> {
    return this.pool.maybeOneFirst(sql.type(z.object({ key_hash: z.string() }))`
      UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now())
      WHERE id = ${keyId}
        ${opts.accountId ? sql.fragment`AND account_id = ${opts.accountId}` : sql.fragment``}
        ${opts.type ? sql.fragment`AND type = ${opts.type}` : sql.fragment``}
      RETURNING key_hash`);
  }

  /** Cents charged this calendar month (UTC) by one key. */
  async keyUsedThisMonth(keyId: string): Promise<number> {
    return this.pool.oneFirst(sql.type(z.object({ used: z.number().int() }))`
      SELECT COALESCE(-SUM(delta_cents), 0)::bigint AS used FROM ledger
      WHERE key_id = ${keyId} AND kind = 'charge' AND created_at >= ${monthStart}`);
  }

  /** Cents charged this calendar month (UTC) to the account. */
  async accountUsedThisMonth(accountId: string): Promise<number> {
    return this.pool.oneFirst(sql.type(z.object({ used: z.number().int() }))`
      SELECT COALESCE(-SUM(delta_cents), 0)::bigint AS used FROM ledger
      WHERE account_id = ${accountId} AND kind = 'charge' AND created_at >= ${monthStart}`);
  }

  /** Balance, plan and this month's use: the account's, or a sub-key's own use when given one. */
  async balanceView(accountId: string, subKeyId: string | null): Promise<{ credits: number; plan: Account['plan']; used_this_month: number }> {
    const [account, used] = await Promise.all([
      this.getAccount(accountId),
      subKeyId ? this.keyUsedThisMonth(subKeyId) : this.accountUsedThisMonth(accountId),
    ]);
    return { credits: account.credits, plan: account.plan, used_this_month: used };
  }

  async listSubKeys(accountId: string): Promise<SubKey[]> {
    const rows = await this.pool.any(sql.type(SubKeySchema)`
      SELECT k.id AS key_id, k.name, k.display_prefix, k.monthly_limit_cents AS monthly_limit,
             k.allowed_tools, k.created_at,
             COALESCE((SELECT -SUM(l.delta_cents) FROM ledger l
                       WHERE l.key_id = k.id AND l.kind = 'charge' AND l.created_at >= ${monthStart}), 0)::bigint AS used_this_month
      FROM api_keys k
      WHERE k.account_id = ${accountId} AND k.type = 'sub' AND k.revoked_at IS NULL
      ORDER BY k.created_at`);
    return [...rows];
  }
}
