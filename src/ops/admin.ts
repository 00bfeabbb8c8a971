/**
 * ops/: what operators use. Admin actions (this file: the CLI's accounts, keys, credits, partners),
 * the queue dashboard, embedded Postgres and Redis for the one-command start, the client package,
 * metrics and the sealed-key checks at start-up.
 */
import { randomUUID } from 'node:crypto';
import type { Redis } from '../queue/redis.js';
import { AppError } from '../errors.js';
import { AccountSchema, type AccountsRepo } from '../access/accounts.js';
import { sql, type DatabasePool } from '../db/pool.js';
import type { Plan } from '../tools/types.js';
import type { CreditReservations } from '../money/holds.js';
import { KeyAuthenticator } from '../access/auth.js';
import { createPartner, creditPaid, partnerReport } from '../money/partners.js';
import type { KeyType } from '../access/key-format.js';

/** Operator actions, shared by the admin CLI and the demo seed. */
export class AdminService {
  constructor(
    private readonly deps: {
      accounts: AccountsRepo;
      credits: CreditReservations;
      redis: Redis;
      prefix: string;
      /** Needed by createAccountIfAbsent, sign-up, partners and paid credits. */
      pool?: DatabasePool;
      /** PARTNER_SHARE_PCT, for credits added with paid cents (default 20). */
      sharePct?: number;
    },
  ) {}

  async createAccount(plan: Plan, credits: number, name?: string) {
    const account = await this.deps.accounts.createAccount({ plan, credits, name: name ?? null });
    const key = await this.deps.accounts.createKey({ accountId: account.id, type: 'production', name: 'default' });
    return { account_id: account.id, api_key: key.api_key, key_id: key.key_id, plan: account.plan, credits: account.credits };
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
    const pool = this.deps.pool;
    if (!pool) throw new Error('AdminService.createAccountIfAbsent needs the database pool');
    const lockKey = 'tollgate:account-by-name:' + name;
    // A session lock on a connection of its own, not a transaction: the repository creates the
    // account and its key on other connections (slonik refuses those inside a transaction), and
    // both commit before the lock is released, so the next caller finds the account.
    return pool.connect(async (conn) => {
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

  /**
   * `paidCents`: real money the operator received for these credits. It is recorded on the ledger
   * line (ledger.paid_cents) and earns a referring partner its share, in the same transaction.
   */
  async addCredits(accountId: string, cents: number, paidCents?: number) {
    if (!Number.isInteger(cents) || cents <= 0) throw new AppError('invalid_input', '--cents must be a positive whole number');
    const entryKey = `topup:${randomUUID()}`;
    if (paidCents === undefined) {
      const credits = await this.deps.accounts.addCredits(accountId, cents, entryKey);
      await this.deps.credits.toppedUp(accountId, cents);
      return { account_id: accountId, credits };
    }
    if (!Number.isInteger(paidCents) || paidCents < 0) throw new AppError('invalid_input', '--paid-cents must be a whole number of cents');
    const pool = this.requirePool('addCredits with paid cents');
    const { credits } = await creditPaid(pool, { accountId, cents, paidCents, entryKey, sharePct: this.deps.sharePct ?? 20 });
    await this.deps.credits.toppedUp(accountId, cents);
    return { account_id: accountId, credits, paid_cents: paidCents };
  }

  async createPartner(name: string, code: string) {
    const p = await createPartner(this.requirePool('createPartner'), name, code);
    return { partner_id: p.id, name: p.name, code: p.code };
  }

  async partnerReport(month: string) {
    return partnerReport(this.requirePool('partnerReport'), month);
  }

  /**
   * Self-service sign-up (POST /signup): a free account with a production key (shown once), its
   * email and its referral. Each sign-up is a new account (see below).
   */
  async signUp(email: string, partnerId: string | null, clientAddress: string | null) {
    const pool = this.requirePool('signUp');
    // No check that the email is new: saying so would tell anyone which emails have accounts
    // (issue 26). The email is an unverified contact; several accounts may give the same one.
    const r = await this.createAccount('free', 0, email);
    await pool.query(sql.unsafe`
      INSERT INTO signups (account_id, email, partner_id, client_address) VALUES (${r.account_id}, ${email}, ${partnerId}, ${clientAddress})`);
    return r;
  }

  private requirePool(what: string): DatabasePool {
    if (!this.deps.pool) throw new Error(`AdminService.${what} needs the database pool`);
    return this.deps.pool;
  }

  async createKey(accountId: string, type: KeyType, name?: string) {
    const account = await this.deps.accounts.getAccount(accountId);
    if (type === 'vip' && !(account.plan === 'enterprise' && account.elite)) {
      throw new AppError(
        'forbidden',
        'VIP keys (titan_vip_) are only for enterprise accounts marked elite: run `account set --account <id> --plan enterprise --elite true` first',
      );
    }
    if (type === 'sub') throw new AppError('invalid_input', 'Sub-keys are created by the account itself with POST /subkeys/create');
    const key = await this.deps.accounts.createKey({ accountId, type, name: name ?? (type === 'agent' ? 'agent' : null) });
    return { key_id: key.key_id, api_key: key.api_key, type, account_id: accountId };
  }

  async revokeKey(keyId: string) {
    const hash = await this.deps.accounts.revokeKey(keyId);
    if (!hash) throw new AppError('not_found', `No key ${keyId}`);
    await KeyAuthenticator.broadcast(this.deps.redis, this.deps.prefix);
    return { key_id: keyId, revoked: true };
  }

  async showAccount(accountId: string) {
    const [account, used] = await Promise.all([this.deps.accounts.getAccount(accountId), this.deps.accounts.accountUsedThisMonth(accountId)]);
    return {
      account_id: account.id,
      name: account.name,
      plan: account.plan,
      credits: account.credits,
      used_this_month: used,
      rpm: account.rpm,
      elite: account.elite,
      max_in_flight: account.max_in_flight,
      created_at: account.created_at,
    };
  }

  async setAccount(accountId: string, patch: { plan?: Plan; rpm?: number; elite?: boolean; maxInFlight?: number }) {
    const account = await this.deps.accounts.setAccount(accountId, patch);
    await KeyAuthenticator.broadcast(this.deps.redis, this.deps.prefix);
    return {
      account_id: account.id,
      plan: account.plan,
      rpm: account.rpm,
      elite: account.elite,
      max_in_flight: account.max_in_flight,
      credits: account.credits,
    };
  }
}
