import { z } from 'zod';
import type { CommonQueryMethods } from 'slonik';
import { sql } from '../db/pool.js';
import { PLANS } from '../tools/types.js';
import { KEY_TYPES, generateKey, type KeyType } from './key-format.js';
import { AppError } from '../errors.js';
import { StoredToolSetSchema, isToolSetGone } from './tool-sets.js';

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
  /** Set on a rotated key: it stops authenticating then, whatever any cache holds. */
  expires_at: z.string().nullable(),
  /** Keys this one replaced by rotation, directly or through others (their jobs are this key's too). */
  predecessors: z.array(z.string().uuid()),
  /** The key's default tool set (src/access/tool-sets.ts), as stored; null when it has none. */
  tool_set: StoredToolSetSchema.nullish(),
  /** Found through an OAuth access token: the resource it is for (RFC 8707), else null. */
  resource: z.string().nullable(),
  /** Found through an OAuth access token: when the token stops working, else null. */
  token_expires_at: z.string().nullable(),
});
export type KeyRecord = z.infer<typeof KeyRecordSchema>;

export const SubKeySchema = z.object({
  key_id: z.string().uuid(),
  name: z.string().nullable(),
  display_prefix: z.string(),
  monthly_limit: z.number().int(),
  allowed_tools: z.array(z.string()),
  tool_set: z.string().nullable(),
  used_this_month: z.number().int(),
  created_at: z.string(),
});
export type SubKey = z.infer<typeof SubKeySchema>;

/** A key as GET /keys shows it: never its hash. */
export const KeyInfoSchema = z.object({
  key_id: z.string().uuid(),
  type: z.enum(KEY_TYPES),
  display_prefix: z.string(),
  name: z.string().nullable(),
  created_at: z.string(),
  last_used_at: z.string().nullable(),
  revoked_at: z.string().nullable(),
  expires_at: z.string().nullable(),
  replaced_by_key_id: z.string().uuid().nullable(),
});
export type KeyInfo = z.infer<typeof KeyInfoSchema>;

/** Where a usage query looks: the whole account, or one key's own lines (sub-keys, sandbox keys). */
export interface UsageScope {
  accountId: string;
  keyId: string | null;
}

export const LedgerEntrySchema = z.object({
  id: z.number().int(),
  kind: z.enum(['charge', 'topup', 'opening', 'payment']),
  tool: z.string().nullable(),
  key_id: z.string().uuid().nullable(),
  delta_cents: z.number().int(),
  agent_name: z.string().nullable(),
  entry_key: z.string(),
  created_at: z.string(),
});
export type LedgerEntry = z.infer<typeof LedgerEntrySchema>;

const Totals = z.object({ cents: z.number().int(), calls: z.number().int() });
const KindSum = z.object({ kind: z.string(), cents: z.number().int(), lines: z.number().int() });

/**
 * How far back a key's rotations are followed for job ownership. Each rotation replaces one key, so
 * the walk is a line; the bound only keeps a pathological history from growing every lookup.
 */
const MAX_PREDECESSORS = 1_000;

const monthStart = sql.fragment`date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`;

/** One page of the operators' account list (newest first); `after`: the last account id of the page before. */
export interface AccountQuery {
  plan?: Account['plan'];
  nameContains?: string;
  createdFrom?: string;
  createdTo?: string;
  after?: string;
  limit: number;
}

export class AccountsRepo {
  /** `pool`: the pool, or a transaction's connection, so a change can commit with what the caller writes beside it. */
  constructor(private readonly pool: CommonQueryMethods) {}

  /**
   * Runs `work` in one transaction, with a repository on it: what `work` writes beside the
   * repository's own statements (an audit record) commits with them or not at all.
   */
  inTransaction<T>(work: (accounts: AccountsRepo, tx: CommonQueryMethods) => Promise<T>): Promise<T> {
    return this.pool.transaction((tx) => work(new AccountsRepo(tx), tx));
  }

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

  /**
   * Accounts newest first, filtered, keyset-paged on (created_at, id): the page after `after` starts
   * below that account, so pages neither repeat nor skip one while accounts are being created.
   */
  async listAccounts(q: AccountQuery): Promise<Account[]> {
    // LIKE's own wildcards in the text are matched literally.
    const pattern = q.nameContains === undefined ? null : '%' + q.nameContains.replace(/[\\%_]/g, (c) => '\\' + c) + '%';
    const rows = await this.pool.any(sql.type(AccountSchema)`
      SELECT id, name, plan, credits, rpm, elite, max_in_flight, created_at FROM accounts
      WHERE true
        ${q.plan ? sql.fragment`AND plan = ${q.plan}` : sql.fragment``}
        ${pattern !== null ? sql.fragment`AND name ILIKE ${pattern}` : sql.fragment``}
        ${q.createdFrom ? sql.fragment`AND created_at >= ${q.createdFrom}::timestamptz` : sql.fragment``}
        ${q.createdTo ? sql.fragment`AND created_at < ${q.createdTo}::timestamptz` : sql.fragment``}
        ${q.after ? sql.fragment`AND (created_at, id) < (SELECT created_at, id FROM accounts WHERE id = ${q.after})` : sql.fragment``}
      ORDER BY created_at DESC, id DESC
      LIMIT ${q.limit}`);
    return [...rows];
  }

  /** The account, its row locked until the caller's transaction ends (for a change recorded with its state before). */
  async lockAccount(id: string): Promise<Account> {
    const row = await this.pool.maybeOne(sql.type(AccountSchema)`
      SELECT id, name, plan, credits, rpm, elite, max_in_flight, created_at FROM accounts WHERE id = ${id} FOR UPDATE`);
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
      const credits =
        inserted === null
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
    /** A tool set of the account, by name, as the key's default set: no such set, no key (invalid_input). */
    toolSet?: string | null;
  }): Promise<{ key_id: string; api_key: string; display_prefix: string; created_at: string }> {
    const { key, hash, displayPrefix } = generateKey(input.type);
    // The set is found in the statement itself: a name the account has no set by inserts nothing, and
    // a set deleted meanwhile fails the key's reference to it, so no key is made without its set.
    const toolSet = input.toolSet ?? null;
    const row = await this.pool
      .maybeOne(sql.type(z.object({ id: z.string(), created_at: z.string() }))`
      INSERT INTO api_keys (account_id, key_hash, display_prefix, type, name, monthly_limit_cents, allowed_tools, created_by_key_id, tool_set_id)
      SELECT ${input.accountId}, ${hash}, ${displayPrefix}, ${input.type}, ${input.name ?? null},
             ${input.monthlyLimitCents ?? null},
             ${input.allowedTools ? sql.array(input.allowedTools, 'text') : null},
             ${input.createdByKeyId ?? null}, s.id
      FROM (SELECT (SELECT id FROM tool_sets WHERE account_id = ${input.accountId} AND name = ${toolSet}) AS id) s
      WHERE ${toolSet}::text IS NULL OR s.id IS NOT NULL
      RETURNING id, created_at`)
      .catch((e: unknown) => {
        if (isToolSetGone(e)) return null;
        throw e;
      });
    if (!row)
      throw new AppError('invalid_input', `No tool set named ${toolSet} on this account`, { issues: [{ path: ['tool_set'], message: 'unknown tool set' }] });
    return { key_id: row.id, api_key: key, display_prefix: displayPrefix, created_at: row.created_at };
  }

  async findKeyByHash(hash: string): Promise<KeyRecord | null> {
    return (await this.findKeysByHash([hash])).get(hash) ?? null;
  }

  /** Keys by hash, many in one query (authentication batches lookups from throttled addresses). */
  async findKeysByHash(hashes: string[]): Promise<Map<string, KeyRecord>> {
    // A key is found by its own hash, or (a grant) through one of its OAuth access tokens. A grant's
    // own key_hash is the hash of a secret nobody was ever given; it is never matched.
    const rows = await this.pool.any(sql.type(KeyRecordSchema.extend({ key_hash: z.string() }))`
      WITH found AS (
        SELECT key_hash AS hash, id, NULL::text AS resource, NULL::timestamptz AS token_expires_at
        FROM api_keys WHERE key_hash = ANY(${sql.array(hashes, 'text')}) AND type <> 'grant'
        UNION ALL
        SELECT token_hash, grant_key_id, resource, expires_at
        FROM oauth_tokens WHERE token_hash = ANY(${sql.array(hashes, 'text')}) AND kind = 'access'
      )
      SELECT f.hash AS key_hash, f.resource, f.token_expires_at, k.id AS key_id, k.account_id, k.type, k.name, a.plan, a.rpm, a.elite, a.max_in_flight,
             k.monthly_limit_cents, k.allowed_tools, k.revoked_at, k.expires_at,
             (SELECT json_build_object('name', ts.name, 'tools', ts.tools, 'families', ts.families)
              FROM tool_sets ts WHERE ts.id = k.tool_set_id) AS tool_set,
             ARRAY(
               WITH RECURSIVE pred(id, depth) AS (
                 SELECT p.id, 1 FROM api_keys p WHERE p.replaced_by_key_id = k.id
                 UNION ALL
                 SELECT p.id, pred.depth + 1 FROM api_keys p JOIN pred ON p.replaced_by_key_id = pred.id
                 WHERE pred.depth < ${MAX_PREDECESSORS}
               )
               SELECT id FROM pred
             )::text[] AS predecessors
      FROM found f JOIN api_keys k ON k.id = f.id JOIN accounts a ON a.id = k.account_id`);
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

  /**
   * Revokes one key of the account at once, whatever its type or state (a rotated key in its grace
   * included). Revoking a revoked key changes nothing and answers its first revocation. Null when
   * the account has no such key.
   */
  async revokeAccountKey(keyId: string, accountId: string): Promise<{ key_id: string; type: KeyType; revoked_at: string; key_hash: string } | null> {
    return this.pool.maybeOne(sql.type(z.object({ key_id: z.string(), type: z.enum(KEY_TYPES), revoked_at: z.string(), key_hash: z.string() }))`
      UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now())
      WHERE id = ${keyId} AND account_id = ${accountId}
      RETURNING id AS key_id, type, revoked_at, key_hash`);
  }

  /** One key without its secret or hash, with its account; locked until the caller's transaction ends. Null when there is none. */
  async lockKey(keyId: string): Promise<(KeyInfo & { account_id: string }) | null> {
    return this.pool.maybeOne(sql.type(KeyInfoSchema.extend({ account_id: z.string().uuid() }))`
      SELECT id AS key_id, account_id, type, display_prefix, name, created_at, last_used_at, revoked_at, expires_at, replaced_by_key_id
      FROM api_keys WHERE id = ${keyId}
      FOR UPDATE`);
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
    const [account, used] = await Promise.all([this.getAccount(accountId), subKeyId ? this.keyUsedThisMonth(subKeyId) : this.accountUsedThisMonth(accountId)]);
    return { credits: account.credits, plan: account.plan, used_this_month: used };
  }

  async listSubKeys(accountId: string): Promise<SubKey[]> {
    const rows = await this.pool.any(sql.type(SubKeySchema)`
      SELECT k.id AS key_id, k.name, k.display_prefix, k.monthly_limit_cents AS monthly_limit,
             k.allowed_tools, k.created_at, (SELECT ts.name FROM tool_sets ts WHERE ts.id = k.tool_set_id) AS tool_set,
             COALESCE((SELECT -SUM(l.delta_cents) FROM ledger l
                       WHERE l.key_id = k.id AND l.kind = 'charge' AND l.created_at >= ${monthStart}), 0)::bigint AS used_this_month
      FROM api_keys k
      WHERE k.account_id = ${accountId} AND k.type = 'sub' AND k.revoked_at IS NULL
      ORDER BY k.created_at`);
    return [...rows];
  }

  /** Every key of the account, newest first, without secrets or hashes. */
  async listKeys(accountId: string): Promise<KeyInfo[]> {
    const rows = await this.pool.any(sql.type(KeyInfoSchema)`
      SELECT id AS key_id, type, display_prefix, name, created_at, last_used_at, revoked_at, expires_at, replaced_by_key_id
      FROM api_keys WHERE account_id = ${accountId}
      ORDER BY created_at DESC, id`);
    return [...rows];
  }

  /**
   * Replaces a key with a new one of the same type and name; the old one expires `graceSeconds`
   * from now (Postgres's clock). The row is locked so two rotations of one key cannot both win.
   * Null when the account has no such key; `state` says why an existing key cannot be rotated.
   */
  async rotateKey(
    keyId: string,
    accountId: string,
    graceSeconds: number,
    rotatable: readonly KeyType[],
  ): Promise<
    | { ok: true; old: KeyInfo; created: { key_id: string; api_key: string; display_prefix: string; created_at: string }; hash: string }
    | { ok: false; state: 'missing' | 'not_rotatable' | 'revoked' | 'expired' | 'rotated'; type?: KeyType }
  > {
    return this.pool.transaction(async (tx) => {
      const old = await tx.maybeOne(sql.type(KeyInfoSchema.extend({ key_hash: z.string(), expired: z.boolean(), tool_set_id: z.string().uuid().nullable() }))`
        SELECT id AS key_id, type, display_prefix, name, created_at, last_used_at, revoked_at, expires_at, replaced_by_key_id,
               key_hash, (expires_at IS NOT NULL AND expires_at <= now()) AS expired, tool_set_id
        FROM api_keys WHERE id = ${keyId} AND account_id = ${accountId}
        FOR UPDATE`);
      if (!old) return { ok: false as const, state: 'missing' as const };
      if (!rotatable.includes(old.type)) return { ok: false as const, state: 'not_rotatable' as const, type: old.type };
      if (old.revoked_at) return { ok: false as const, state: 'revoked' as const };
      if (old.expired) return { ok: false as const, state: 'expired' as const };
      if (old.replaced_by_key_id) return { ok: false as const, state: 'rotated' as const };
      const { key, hash, displayPrefix } = generateKey(old.type);
      const row = await tx.one(sql.type(z.object({ id: z.string(), created_at: z.string() }))`
        INSERT INTO api_keys (account_id, key_hash, display_prefix, type, name, created_by_key_id, tool_set_id)
        VALUES (${accountId}, ${hash}, ${displayPrefix}, ${old.type}, ${old.name}, ${old.key_id}, ${old.tool_set_id})
        RETURNING id, created_at`);
      const updated = await tx.one(sql.type(KeyInfoSchema)`
        UPDATE api_keys SET expires_at = now() + make_interval(secs => ${graceSeconds}), replaced_by_key_id = ${row.id}
        WHERE id = ${old.key_id}
        RETURNING id AS key_id, type, display_prefix, name, created_at, last_used_at, revoked_at, expires_at, replaced_by_key_id`);
      return {
        ok: true as const,
        old: updated,
        hash: old.key_hash,
        created: { key_id: row.id, api_key: key, display_prefix: displayPrefix, created_at: row.created_at },
      };
    });
  }

  /** Records that a key was used now (callers rate-limit this: it is not meant for every request). */
  async touchKey(keyId: string): Promise<void> {
    await this.pool.query(sql.unsafe`UPDATE api_keys SET last_used_at = now() WHERE id = ${keyId}`);
  }

  /**
   * A month of the ledger for GET /usage, all from the ledger itself: charges by tool, key and day,
   * every kind's sum, and (for an account) the balance before the month. Charges are negative
   * `delta_cents`; the totals here are the cents charged, positive.
   */
  async usage(scope: UsageScope, from: string, to: string) {
    const where = sql.fragment`account_id = ${scope.accountId}
      ${scope.keyId ? sql.fragment`AND key_id = ${scope.keyId}` : sql.fragment``}`;
    const inMonth = sql.fragment`${where} AND created_at >= ${from}::timestamptz AND created_at < ${to}::timestamptz`;
    // One snapshot for every figure, so lines settled meanwhile cannot make the totals disagree.
    return this.pool.transaction(async (tx) => {
      await tx.query(sql.unsafe`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY`);
      const byTool = await tx.any(sql.type(Totals.extend({ tool: z.string().nullable() }))`
        SELECT tool, (-SUM(delta_cents))::bigint AS cents, count(*)::bigint AS calls
        FROM ledger WHERE ${inMonth} AND kind = 'charge' GROUP BY tool ORDER BY cents DESC, tool`);
      const byKey = await tx.any(sql.type(
        Totals.extend({
          key_id: z.string().nullable(),
          type: z.enum(KEY_TYPES).nullable(),
          name: z.string().nullable(),
          display_prefix: z.string().nullable(),
        }),
      )`
        SELECT l.key_id, k.type, k.name, k.display_prefix, (-SUM(l.delta_cents))::bigint AS cents, count(*)::bigint AS calls
        FROM ledger l LEFT JOIN api_keys k ON k.id = l.key_id
        WHERE l.account_id = ${scope.accountId}
          ${scope.keyId ? sql.fragment`AND l.key_id = ${scope.keyId}` : sql.fragment``}
          AND l.created_at >= ${from}::timestamptz AND l.created_at < ${to}::timestamptz AND l.kind = 'charge'
        GROUP BY l.key_id, k.type, k.name, k.display_prefix ORDER BY cents DESC, l.key_id`);
      const byDay = await tx.any(sql.type(Totals.extend({ day: z.string() }))`
        SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day, (-SUM(delta_cents))::bigint AS cents, count(*)::bigint AS calls
        FROM ledger WHERE ${inMonth} AND kind = 'charge' GROUP BY 1 ORDER BY 1`);
      const byKind = await tx.any(sql.type(KindSum)`
        SELECT kind, SUM(delta_cents)::bigint AS cents, count(*)::bigint AS lines
        FROM ledger WHERE ${inMonth} GROUP BY kind ORDER BY kind`);
      const before = await tx.oneFirst(sql.type(z.object({ s: z.number().int() }))`
        SELECT COALESCE(SUM(delta_cents), 0)::bigint AS s FROM ledger WHERE ${where} AND created_at < ${from}::timestamptz`);
      return { byTool: [...byTool], byKey: [...byKey], byDay: [...byDay], byKind: [...byKind], before };
    });
  }

  /** Ledger lines newest first, keyset-paged by id (ids only grow, so pages never repeat a line). */
  async ledgerEntries(scope: UsageScope, q: { beforeId: number | null; limit: number; tool?: string; keyId?: string; since?: string }): Promise<LedgerEntry[]> {
    const rows = await this.pool.any(sql.type(LedgerEntrySchema)`
      SELECT id, kind, tool, key_id, delta_cents, agent_name, entry_key, created_at FROM ledger
      WHERE account_id = ${scope.accountId}
        ${scope.keyId ? sql.fragment`AND key_id = ${scope.keyId}` : sql.fragment``}
        ${q.keyId ? sql.fragment`AND key_id = ${q.keyId}` : sql.fragment``}
        ${q.tool ? sql.fragment`AND tool = ${q.tool}` : sql.fragment``}
        ${q.since ? sql.fragment`AND created_at >= ${q.since}::timestamptz` : sql.fragment``}
        ${q.beforeId !== null ? sql.fragment`AND id < ${q.beforeId}` : sql.fragment``}
      ORDER BY id DESC
      LIMIT ${q.limit}`);
    return [...rows];
  }
}
