/**
 * Operator CLI: `npm run admin -- <group> <action> [--flags]`. Prints JSON on stdout; errors as the
 * usual envelope on stderr with exit code 1.
 */
import { parseArgs } from 'node:util';
import { z } from 'zod';
import { checkServices, die, runMigrations, makeLogger } from '../bootstrap.js';
import { ConfigError, loadConfig } from '../config.js';
import { stopEmbedded } from '../ops/embedded.js';
import { openPool } from '../db/pool.js';
import { AccountsRepo } from '../access/accounts.js';
import { connectRedis } from '../queue/redis.js';
import { CreditReservations } from '../money/holds.js';
import { AdminService } from '../ops/admin.js';
import { AppError, isAppError } from '../errors.js';
import { PLANS } from '../tools/types.js';
import { parseOrThrow } from '../errors.js';
import { PartnerCode } from '../money/partners.js';
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

const USAGE = `usage: npm run admin -- <command>
  account create --plan <free|starter|pro|enterprise> --credits <cents> [--name <text>]
  account create --plan <plan> --credits <cents> --name <text> --if-absent
                                                     the first account with that name if there is one
                                                     (api_key null: keys are stored only as hashes),
                                                     else a new one with its key (the compose seed)
  account show   --account <id>
  account set    --account <id> [--plan <plan>] [--rpm <n>] [--elite true|false] [--max-in-flight <n>]
  credits add    --account <id> --cents <n> [--paid-cents <n>]
                                                     --paid-cents: real money received (revenue;
                                                     earns a referring partner its share)
  key create     --account <id> --type <production|test|agent|vip> [--name <text>]
  key revoke     --key <key_id>
  payments list                                      x402 payments awaiting settlement (JSON)
  payments export                                    the same as JSON lines, each with the facilitator /settle body
  payments settle                                    submit them to X402_FACILITATOR_URL, or on chain
                                                     yourself with X402_RPC_URL + X402_SETTLER_PRIVATE_KEY
  payments mark-settled --id <payment_id> --tx <transaction hash>
  payments mark-failed  --id <payment_id> --reason <text>
  partner create --name <text> --code <CODE>         codes: 3-32 of A-Z a-z 0-9 _ -, unique regardless of case
  partner report --month YYYY-MM                     per partner: referred accounts, revenue and share (cents)`;

const { positionals, values } = parseArgs({
  allowPositionals: true,
  options: {
    plan: { type: 'string' },
    credits: { type: 'string' },
    name: { type: 'string' },
    account: { type: 'string' },
    cents: { type: 'string' },
    'paid-cents': { type: 'string' },
    code: { type: 'string' },
    month: { type: 'string' },
    type: { type: 'string' },
    key: { type: 'string' },
    rpm: { type: 'string' },
    elite: { type: 'string' },
    'max-in-flight': { type: 'string' },
    id: { type: 'string' },
    tx: { type: 'string' },
    reason: { type: 'string' },
    'if-absent': { type: 'boolean' },
    help: { type: 'boolean' },
  },
});

const uuid = z.string({ required_error: 'is required' }).uuid('must be an id (uuid)');
const cents = z.coerce.number({ required_error: 'is required' }).int('must be a whole number of cents').min(0);
const plan = z.enum(PLANS);

async function main(): Promise<unknown> {
  const command = positionals.slice(0, 2).join(' ');
  if (values.help || !command) {
    process.stdout.write(USAGE + '\n');
    process.exit(command ? 0 : 2);
  }
  // The CLI takes payments, it does not sell calls: the "exactly one settlement mode" rule of the
  // service does not apply, so a deferred deployment can name where to settle for this command only.
  let config;
  try {
    config = loadConfig(process.env, { X402_ENABLED: 'false' });
  } catch (e) {
    if (e instanceof ConfigError) die(e.message);
    throw e;
  }
  await checkServices(config);
  await runMigrations(config, makeLogger({ ...config, LOG_LEVEL: 'warn' }));
  const pool = await openPool(config.DATABASE_URL, { maximumPoolSize: 2 });
  const redis = connectRedis(config.REDIS_URL);
  const accounts = new AccountsRepo(pool);
  const admin = new AdminService({
    accounts,
    credits: new CreditReservations(redis, config.REDIS_PREFIX, accounts),
    redis,
    prefix: config.REDIS_PREFIX,
    pool,
    sharePct: config.PARTNER_SHARE_PCT,
  });
  const flags = (schema: z.ZodRawShape) => parseOrThrow(z.object(schema), values, `${command}`);
  try {
    switch (command) {
      case 'account create': {
        if (values['if-absent']) {
          const f = flags({ plan, credits: cents, name: z.string({ required_error: 'is required with --if-absent' }).trim().min(1), 'if-absent': z.boolean() });
          return await admin.createAccountIfAbsent(f.plan, f.credits, f.name);
        }
        const f = flags({ plan, credits: cents, name: z.string().optional() });
        const r = await admin.createAccount(f.plan, f.credits, f.name);
        return { account_id: r.account_id, api_key: r.api_key, key_id: r.key_id, plan: r.plan, credits: r.credits };
      }
      case 'account show':
        return await admin.showAccount(flags({ account: uuid }).account);
      case 'account set': {
        const f = flags({
          account: uuid,
          plan: plan.optional(),
          rpm: z.coerce.number().int().positive().optional(),
          elite: z
            .enum(['true', 'false'])
            .transform((v) => v === 'true')
            .optional(),
          'max-in-flight': z.coerce.number().int().positive().optional(),
        });
        return await admin.setAccount(f.account, { plan: f.plan, rpm: f.rpm, elite: f.elite, maxInFlight: f['max-in-flight'] });
      }
      case 'credits add': {
        const f = flags({ account: uuid, cents, 'paid-cents': cents.optional() });
        return await admin.addCredits(f.account, f.cents, f['paid-cents']);
      }
      case 'partner create': {
        const f = flags({ name: z.string({ required_error: 'is required' }).trim().min(1).max(200), code: PartnerCode });
        return await admin.createPartner(f.name, f.code);
      }
      case 'partner report': {
        const f = flags({ month: z.string({ required_error: 'is required' }).regex(/^\d{4}-(0[1-9]|1[0-2])$/, 'must be YYYY-MM') });
        return await admin.partnerReport(f.month);
      }
      case 'key create': {
        const f = flags({ account: uuid, type: z.enum(['production', 'test', 'agent', 'vip']), name: z.string().optional() });
        return await admin.createKey(f.account, f.type, f.name);
      }
      case 'key revoke':
        return await admin.revokeKey(flags({ key: uuid }).key);
      case 'payments list': {
        const now = BigInt(Math.floor(Date.now() / 1000));
        const payments = (await listAwaitingSettlement(pool, { limit: 100_000 })).map(({ payment_payload: _p, payment_requirements: _r, ...p }) => ({
          ...p,
          expired: BigInt(p.valid_before) <= now,
        }));
        return { count: payments.length, payments };
      }
      // `return await` in this block: the pool closes in `finally`, so results are awaited before it.
      case 'payments export':
        return await exportAwaitingSettlement(pool);
      case 'payments settle':
        return await settleAwaitingPayments(pool, await collector(config));
      case 'payments mark-settled': {
        const f = flags({
          id: uuid,
          tx: z.string({ required_error: 'is required' }).regex(/^0x[0-9a-fA-F]{64}$/, 'must be a 0x-prefixed 32-byte transaction hash'),
        });
        if (!(await markSettled(pool, f.id, f.tx.toLowerCase()))) throw paymentNotOpen(f.id);
        return { id: f.id, status: 'settled', tx_hash: f.tx.toLowerCase() };
      }
      case 'payments mark-failed': {
        const f = flags({ id: uuid, reason: z.string({ required_error: 'is required' }).trim().min(1).max(400) });
        if (!(await markFailed(pool, f.id, `operator: ${f.reason}`))) throw paymentNotOpen(f.id);
        return { id: f.id, status: 'failed', error: `operator: ${f.reason}` };
      }
      default:
        throw new AppError('invalid_input', `unknown command '${command}'\n${USAGE}`);
    }
  } finally {
    await pool.end();
    redis.disconnect();
  }
}

/** Where `payments settle` submits deferred payments: a facilitator, or the chain with our own key. */
async function collector(config: ReturnType<typeof loadConfig>): Promise<PaymentSettler> {
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

// Embedded Postgres/Redis this command started (none when the service already runs them) stop first.
main()
  .finally(() => stopEmbedded())
  .then(
    (out) => {
      // A string is already the output (payments export: JSON lines).
      process.stdout.write(typeof out === 'string' ? out : JSON.stringify(out) + '\n');
      process.exit(0);
    },
    (e) => {
      const err = isAppError(e) ? e : new AppError('internal_error', (e as Error).message);
      process.stderr.write(JSON.stringify({ error: { code: err.code, message: err.message, ...err.details } }) + '\n');
      process.exit(1);
    },
  );
