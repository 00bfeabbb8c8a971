/**
 * ops/: what operators use. Admin actions (this file: accounts, keys, credits, partners and payments,
 * for the admin HTTP API and the admin CLI alike, each change recorded in the audit log), the queue
 * dashboard, embedded Postgres and Redis for the one-command start, the client package, metrics and
 * the sealed-key checks at start-up.
 */
import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import type { CommonQueryMethods } from 'slonik';
import type { Redis } from '../queue/redis.js';
import { AppError, isAppError } from '../errors.js';
import type { Config } from '../config.js';
import { AccountSchema, type AccountsRepo, type Account, type AccountQuery } from '../access/accounts.js';
import { sql, type DatabasePool } from '../db/pool.js';
import type { Plan } from '../tools/types.js';
import type { CreditReservations } from '../money/holds.js';
import { KeyAuthenticator } from '../access/auth.js';
import { createPartner, creditPaid, partnerReport } from '../money/partners.js';
import type { KeyType } from '../access/key-format.js';
import {
  FacilitatorSettler,
  exportAwaitingSettlement,
  listAwaitingSettlement,
  markFailed,
  markSettled,
  networkProfile,
  settleAwaitingPayments,
  type PaymentSettler,
} from '../pay/x402/index.js';
import { appendAudit, listAudit, type Actor, type AuditEntry, type AuditQuery } from './audit.js';

/** Changes made by the service itself (the demo seed, tests' fixtures): recorded too, under this name. */
const SYSTEM: Actor = { kind: 'system', id: 'tollgate', requestId: null };

export interface AdminDeps {
  accounts: AccountsRepo;
  credits: CreditReservations;
  redis: Redis;
  prefix: string;
  /** Needed by createAccountIfAbsent, sign-up, partners, payments and the audit log's reading. */
  pool?: DatabasePool;
  /** PARTNER_SHARE_PCT, for credits added with paid cents (default 20). */
  sharePct?: number;
  /** Who the changes are recorded as (default: the service itself). */
  actor?: Actor;
  /** This process's key cache, emptied at once on a key or account change (other replicas hear the broadcast). */
  auth?: KeyAuthenticator;
}

/** How an operator changes credits: a reason for the record, and a key that makes a retry change nothing. */
export interface CreditChange {
  reason?: string | null;
  /** The same key again (with the same amount) answers the first change's result and changes nothing. */
  idempotencyKey?: string | null;
  /** Added credits only: real money received for them (revenue; earns a referring partner its share). */
  paidCents?: number;
}

const Delta = z.object({ delta_cents: z.number().int(), paid_cents: z.number().int().nullable() });
const PaymentState = z.object({ status: z.string(), tx_hash: z.string().nullable(), error: z.string().nullable() });

/** An account as operators see it (the admin API, the CLI, the audit record). */
function accountView(a: Account) {
  return {
    account_id: a.id,
    name: a.name,
    plan: a.plan,
    credits: a.credits,
    rpm: a.rpm,
    elite: a.elite,
    max_in_flight: a.max_in_flight,
    created_at: a.created_at,
  };
}

const limitsOf = (a: Account) => ({ plan: a.plan, elite: a.elite, rpm: a.rpm, max_in_flight: a.max_in_flight });

/**
 * Operator actions, shared by the admin HTTP API (src/faces/http/admin-api.ts), the admin CLI and the
 * demo seed. Every change commits in one transaction with its audit record (src/ops/audit.ts); what
 * Redis holds (available credits, cached keys) follows once Postgres has committed.
 */
export class AdminService {
  constructor(private readonly deps: AdminDeps) {}

  /** The same service, recording its changes as made by `actor`. */
  as(actor: Actor): AdminService {
    return new AdminService({ ...this.deps, actor });
  }

  private requirePool(what: string): DatabasePool {
    if (!this.deps.pool) throw new Error(`AdminService.${what} needs the database pool`);
    return this.deps.pool;
  }

  private get actor(): Actor {
    return this.deps.actor ?? SYSTEM;
  }

  /**
   * Runs `change` in one transaction, with the accounts repository on that transaction, and appends
   * the audit record it returns there too: the change and its record commit together or not at all.
   */
  private audited<T>(change: (db: CommonQueryMethods, accounts: AccountsRepo) => Promise<{ result: T; audit: AuditEntry | null }>): Promise<T> {
    return this.deps.accounts.inTransaction(async (accounts, tx) => {
      const { result, audit } = await change(tx, accounts);
      if (audit) await appendAudit(tx, this.actor, audit);
      return result;
    });
  }

  /** Every replica forgets cached key records and account limits: this one now, the others on the broadcast. */
  private async keysChanged(): Promise<void> {
    this.deps.auth?.clear();
    await KeyAuthenticator.broadcast(this.deps.redis, this.deps.prefix);
  }

  // Accounts

  /** A new account with a production key (shown once, never recorded). */
  async createAccount(plan: Plan, credits: number, name?: string | null) {
    return this.audited(async (_db, accounts) => {
      const r = await openAccount(accounts, plan, credits, name ?? null);
      return {
        result: { account_id: r.account.id, api_key: r.key.api_key, key_id: r.key.key_id, plan: r.account.plan, credits: r.account.credits },
        audit: {
          action: 'account.create',
          accountId: r.account.id,
          targetId: r.key.key_id,
          before: null,
          after: { ...accountView(r.account), key: { key_id: r.key.key_id, type: 'production', display_prefix: r.key.display_prefix } },
        },
      };
    });
  }

  /**
   * The first account named `name` (oldest first), or a new one with a production key when there is
   * none: what the compose `seed` service runs on every `up`. Concurrent callers are serialised by an
   * advisory lock, so two of them never both create the account.
   *
   * An existing account's key cannot be shown again: only its SHA-256 hash is stored. So `api_key` is
   * null then, and the note says where the key was printed and how to issue another one. No key is
   * issued for an existing account, or every `up` would leave one more live key behind.
   */
  async createAccountIfAbsent(plan: Plan, credits: number, name: string) {
    const lockKey = 'tollgate:account-by-name:' + name;
    // A session lock on a connection of its own, not a transaction: the account is created in a
    // transaction on another connection (slonik refuses another connection inside a transaction),
    // which commits before the lock is released, so the next caller finds the account.
    return this.requirePool('createAccountIfAbsent').connect(async (conn) => {
      await conn.query(sql.unsafe`SELECT pg_advisory_lock(hashtext(${lockKey}))`);
      try {
        const found = await conn.maybeOne(sql.type(AccountSchema)`
          SELECT id, name, plan, credits, rpm, elite, max_in_flight, created_at FROM accounts
          WHERE name = ${name} ORDER BY created_at, id LIMIT 1`);
        if (found) {
          return {
            account_id: found.id,
            created: false,
            api_key: null,
            plan: found.plan,
            credits: found.credits,
            note:
              `Account '${name}' already exists. Its key was printed once, when it was created (keys are stored only as hashes and cannot be shown again); ` +
              `issue another with: admin key create --account ${found.id} --type production`,
          };
        }
        const r = await this.createAccount(plan, credits, name);
        return { ...r, created: true };
      } finally {
        await conn.query(sql.unsafe`SELECT pg_advisory_unlock(hashtext(${lockKey}))`).catch(() => {});
      }
    });
  }

  async listAccounts(q: AccountQuery) {
    // One more than asked tells whether there is a next page.
    const rows = await this.deps.accounts.listAccounts({ ...q, limit: q.limit + 1 });
    const page = rows.slice(0, q.limit);
    return { accounts: page.map(accountView), next_cursor: rows.length > q.limit ? page[page.length - 1]!.id : null };
  }

  async showAccount(accountId: string) {
    const [account, used] = await Promise.all([this.deps.accounts.getAccount(accountId), this.deps.accounts.accountUsedThisMonth(accountId)]);
    return { ...accountView(account), used_this_month: used };
  }

  /** Plan, elite and limits; a limit set to null goes back to the plan's default. */
  async setAccount(accountId: string, patch: { plan?: Plan; rpm?: number | null; elite?: boolean; maxInFlight?: number | null }) {
    const account = await this.audited(async (_db, accounts) => {
      const before = await accounts.lockAccount(accountId);
      const after = await accounts.setAccount(accountId, patch);
      return { result: after, audit: { action: 'account.update', accountId, before: limitsOf(before), after: limitsOf(after) } };
    });
    await this.keysChanged();
    return {
      account_id: account.id,
      plan: account.plan,
      rpm: account.rpm,
      elite: account.elite,
      max_in_flight: account.max_in_flight,
      credits: account.credits,
    };
  }

  // Credits

  /**
   * Adds credits: a ledger line (kind 'topup') and the balance, with the record, in one transaction;
   * then admission's available credits in Redis. `paidCents`: real money the operator received for
   * these credits, recorded on the line (ledger.paid_cents); it earns a referring partner its share.
   */
  async addCredits(accountId: string, cents: number, change: CreditChange = {}) {
    if (!Number.isInteger(cents) || cents <= 0) throw new AppError('invalid_input', 'cents must be a positive whole number');
    const paidCents = change.paidCents;
    if (paidCents !== undefined && (!Number.isInteger(paidCents) || paidCents < 0)) {
      throw new AppError('invalid_input', 'paid_cents must be a whole number of cents');
    }
    const entryKey = this.entryKey(change.idempotencyKey, 'topup');
    const r = await this.audited<{ credits: number; replayed: boolean }>(async (db, accounts) => {
      const replay = await this.replayed(db, entryKey, cents, paidCents ?? null);
      const before = await accounts.lockAccount(accountId);
      if (replay) return { result: { credits: before.credits, replayed: true }, audit: null };
      const credits =
        paidCents === undefined
          ? await accounts.addCredits(accountId, cents, entryKey)
          : (await creditPaid(db, { accountId, cents, paidCents, entryKey, sharePct: this.deps.sharePct ?? 20 })).credits;
      return {
        result: { credits, replayed: false },
        audit: {
          action: 'credits.add',
          accountId,
          before: { credits: before.credits },
          after: { credits, delta_cents: cents, paid_cents: paidCents ?? null, reason: change.reason ?? null, entry_key: entryKey },
        },
      };
    });
    if (!r.replayed) await this.deps.credits.toppedUp(accountId, cents);
    return {
      account_id: accountId,
      credits: r.credits,
      ...(paidCents !== undefined ? { paid_cents: paidCents } : {}),
      ...(r.replayed ? { replayed: true } : {}),
    };
  }

  /**
   * Removes credits, never below what admission could still spend: a hold on the account in Redis
   * first (the same script admission takes its holds with, so a call admitted meanwhile cannot
   * spend them too), then a negative 'topup' ledger line, the balance and the record in one
   * transaction; then the hold is dropped as settled (the balance in Postgres moved), or given back.
   */
  async removeCredits(accountId: string, cents: number, change: CreditChange) {
    if (!Number.isInteger(cents) || cents <= 0) throw new AppError('invalid_input', 'cents must be a positive whole number');
    if (!change.reason?.trim()) throw new AppError('invalid_input', 'a reason is required to remove credits');
    const entryKey = this.entryKey(change.idempotencyKey, 'remove');
    const holdId = `admin-remove:${randomUUID()}`;
    await this.deps.credits.reserve(accountId, [{ holdId, amount: cents }], null).catch((e: unknown) => {
      if (isAppError(e) && e.code === 'insufficient_credits') {
        throw new AppError(
          'insufficient_credits',
          `Cannot remove ${cents} cents: ${e.details.available_cents} are available (the balance less calls in flight)`,
          {
            available_cents: e.details.available_cents,
          },
        );
      }
      throw e;
    });
    let r: { credits: number; replayed: boolean };
    try {
      r = await this.audited<{ credits: number; replayed: boolean }>(async (db, accounts) => {
        const replay = await this.replayed(db, entryKey, -cents, null);
        const before = await accounts.lockAccount(accountId);
        if (replay) return { result: { credits: before.credits, replayed: true }, audit: null };
        const credits = await accounts.addCredits(accountId, -cents, entryKey);
        if (credits < 0)
          throw new AppError('insufficient_credits', `Cannot remove ${cents} cents: the balance is ${before.credits}`, { available_cents: before.credits });
        return {
          result: { credits, replayed: false },
          audit: {
            action: 'credits.remove',
            accountId,
            before: { credits: before.credits },
            after: { credits, delta_cents: -cents, reason: change.reason!.trim(), entry_key: entryKey },
          },
        };
      });
    } catch (e) {
      await this.deps.credits.release(accountId, [holdId]);
      throw e;
    }
    if (r.replayed) await this.deps.credits.release(accountId, [holdId]);
    else await this.deps.credits.settled([{ accountId, holdId }]);
    return { account_id: accountId, credits: r.credits, ...(r.replayed ? { replayed: true } : {}) };
  }

  private entryKey(idempotencyKey: string | null | undefined, kind: 'topup' | 'remove'): string {
    // One namespace for both directions: a key used to add cannot be reused to remove.
    return idempotencyKey ? `admin-credit:${idempotencyKey}` : `${kind}:${randomUUID()}`;
  }

  /**
   * Whether the ledger already has the line `entryKey` (a retried change): true when it matches,
   * 409 when the key was used for another change. Holds a transaction lock on the key, so two
   * requests with one key run one after the other and the second sees the first's line.
   */
  private async replayed(db: CommonQueryMethods, entryKey: string, delta: number, paidCents: number | null): Promise<boolean> {
    await db.query(sql.unsafe`SELECT pg_advisory_xact_lock(hashtext(${entryKey}))`);
    const line = await db.maybeOne(sql.type(Delta)`SELECT delta_cents, paid_cents FROM ledger WHERE entry_key = ${entryKey}`);
    if (!line) return false;
    if (line.delta_cents !== delta || line.paid_cents !== paidCents) {
      throw new AppError('idempotency_key_reused', 'This idempotency key was used for another credit change: use a new key for a new change', {
        delta_cents: line.delta_cents,
      });
    }
    return true;
  }

  // Keys

  async listKeys(accountId: string) {
    await this.deps.accounts.getAccount(accountId);
    return { account_id: accountId, keys: await this.deps.accounts.listKeys(accountId) };
  }

  async createKey(accountId: string, type: KeyType, name?: string | null) {
    if (type === 'sub') throw new AppError('invalid_input', 'Sub-keys are created by the account itself with POST /subkeys/create');
    if (type === 'grant') throw new AppError('invalid_input', 'Grants are created by the account owner through OAuth consent at /mcp');
    return this.audited(async (_db, accounts) => {
      const account = await accounts.lockAccount(accountId);
      if (type === 'vip' && !(account.plan === 'enterprise' && account.elite)) {
        throw new AppError(
          'forbidden',
          'VIP keys (titan_vip_) are only for enterprise accounts marked elite: run `account set --account <id> --plan enterprise --elite true` first',
        );
      }
      const keyName = name ?? (type === 'agent' ? 'agent' : null);
      const key = await accounts.createKey({ accountId, type, name: keyName });
      return {
        result: { key_id: key.key_id, api_key: key.api_key, type, account_id: accountId, display_prefix: key.display_prefix, name: keyName },
        audit: {
          action: 'key.create',
          accountId,
          targetId: key.key_id,
          before: null,
          after: { key_id: key.key_id, type, name: keyName, display_prefix: key.display_prefix },
        },
      };
    });
  }

  /** Revokes a key on every replica at once. Revoking a revoked key changes nothing and answers its first revocation. */
  async revokeKey(keyId: string) {
    const r = await this.audited(async (_db, accounts) => {
      const key = await accounts.lockKey(keyId);
      if (!key) throw new AppError('not_found', `No key ${keyId}`);
      if (key.revoked_at) return { result: { ...key, changed: false }, audit: null };
      await accounts.revokeKey(keyId);
      const after = (await accounts.lockKey(keyId))!;
      const shown = { key_id: key.key_id, type: key.type, display_prefix: key.display_prefix, name: key.name };
      return {
        result: { ...after, changed: true },
        audit: {
          action: 'key.revoke',
          accountId: key.account_id,
          targetId: keyId,
          before: { ...shown, revoked_at: null },
          after: { ...shown, revoked_at: after.revoked_at },
        },
      };
    });
    if (r.changed) await this.keysChanged();
    return { key_id: keyId, account_id: r.account_id, type: r.type, revoked: true as const, revoked_at: r.revoked_at! };
  }

  // Partners

  async createPartner(name: string, code: string) {
    return this.audited(async (db) => {
      const p = await createPartner(db, name, code);
      const view = { partner_id: p.id, name: p.name, code: p.code };
      return { result: view, audit: { action: 'partner.create', targetId: p.id, before: null, after: view } };
    });
  }

  async partnerReport(month: string) {
    return partnerReport(this.requirePool('partnerReport'), month);
  }

  // Payments (x402 payments awaiting settlement)

  async listPayments() {
    const now = BigInt(Math.floor(Date.now() / 1000));
    const payments = (await listAwaitingSettlement(this.requirePool('listPayments'), { limit: 100_000 })).map(
      ({ payment_payload: _p, payment_requirements: _r, ...p }) => ({
        ...p,
        expired: BigInt(p.valid_before) <= now,
      }),
    );
    return { count: payments.length, payments };
  }

  /** JSON lines, each with the facilitator's /settle body. */
  exportPayments(): Promise<string> {
    return exportAwaitingSettlement(this.requirePool('exportPayments'));
  }

  /** Submits every payment awaiting settlement (see paymentCollector); one record for the run, with its summary. */
  async settlePayments(config: Config) {
    const settler = await paymentCollector(config);
    const pool = this.requirePool('settlePayments');
    const summary = await settleAwaitingPayments(pool, settler);
    // The run talks to a facilitator or a chain between its writes, so it is no one transaction: the
    // record follows it, with what it did.
    await appendAudit(pool, this.actor, { action: 'payments.settle', before: null, after: summary });
    return summary;
  }

  async markPaymentSettled(id: string, txHash: string) {
    const hash = txHash.toLowerCase();
    return this.audited(async (db) => {
      const before = await this.openPayment(db, id);
      if (!(await markSettled(db, id, hash))) throw paymentNotOpen(id);
      return {
        result: { id, status: 'settled' as const, tx_hash: hash },
        audit: { action: 'payment.mark_settled', targetId: id, before, after: { status: 'settled', tx_hash: hash } },
      };
    });
  }

  async markPaymentFailed(id: string, reason: string) {
    const error = `operator: ${reason}`;
    return this.audited(async (db) => {
      const before = await this.openPayment(db, id);
      if (!(await markFailed(db, id, error))) throw paymentNotOpen(id);
      return {
        result: { id, status: 'failed' as const, error },
        audit: { action: 'payment.mark_failed', targetId: id, before, after: { status: 'failed', error } },
      };
    });
  }

  /** The payment's state, locked for the transaction; 404 unless it can still be marked. */
  private async openPayment(db: CommonQueryMethods, id: string) {
    const row = await db.maybeOne(sql.type(PaymentState)`SELECT status, tx_hash, error FROM x402_payments WHERE id = ${id} FOR UPDATE`);
    if (!row || !['reserved', 'awaiting_settlement'].includes(row.status)) throw paymentNotOpen(id);
    return row;
  }

  // The record

  async audit(q: AuditQuery) {
    const records = await listAudit(this.requirePool('audit'), { ...q, limit: q.limit + 1 });
    const page = records.slice(0, q.limit);
    return { records: page, next_cursor: records.length > q.limit ? String(page[page.length - 1]!.id) : null };
  }

  // Self-service (not an operator's change: not in the audit log)

  /**
   * Self-service sign-up (POST /signup): a free account with a production key (shown once), its
   * email and its referral, in one transaction. Each sign-up is a new account (see below).
   */
  async signUp(email: string, partnerId: string | null, clientAddress: string | null) {
    // No check that the email is new: saying so would tell anyone which emails have accounts
    // (issue 26). The email is an unverified contact; several accounts may give the same one.
    return this.deps.accounts.inTransaction(async (accounts, tx) => {
      const r = await openAccount(accounts, 'free', 0, email);
      await tx.query(sql.unsafe`
        INSERT INTO signups (account_id, email, partner_id, client_address) VALUES (${r.account.id}, ${email}, ${partnerId}, ${clientAddress})`);
      return { account_id: r.account.id, api_key: r.key.api_key, key_id: r.key.key_id, plan: r.account.plan, credits: r.account.credits };
    });
  }
}

/** An account and its first production key. */
async function openAccount(accounts: AccountsRepo, plan: Plan, credits: number, name: string | null) {
  const account = await accounts.createAccount({ plan, credits, name });
  const key = await accounts.createKey({ accountId: account.id, type: 'production', name: 'default' });
  return { account, key };
}

/** Where `payments settle` submits deferred payments: a facilitator, or the chain with our own key. */
export async function paymentCollector(config: Config): Promise<PaymentSettler> {
  if (!config.X402_PAY_TO) throw new AppError('invalid_input', 'payments settle needs X402_PAY_TO (the address the payments were made to)');
  let settler: PaymentSettler;
  if (config.X402_FACILITATOR_URL) settler = new FacilitatorSettler(config.X402_FACILITATOR_URL, { profile: networkProfile(config) });
  else if (config.X402_RPC_URL && config.X402_SETTLER_PRIVATE_KEY) settler = new (await import('../pay/x402/chain-settler.js')).ChainSettler(config);
  else {
    throw new AppError(
      'invalid_input',
      'payments settle needs X402_FACILITATOR_URL (an x402 facilitator), or X402_RPC_URL + X402_SETTLER_PRIVATE_KEY (submit the transfers yourself)',
    );
  }
  try {
    await settler.start();
  } catch (e) {
    throw new AppError('upstream_error', (e as Error).message);
  }
  return settler;
}

function paymentNotOpen(id: string): AppError {
  return new AppError('not_found', `No x402 payment ${id} that is reserved or awaiting settlement (settled and failed payments are final)`);
}
