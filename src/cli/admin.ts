/**
 * Operator CLI: `npm run admin -- <group> <action> [--flags]`, a client of the same service as the
 * admin HTTP API (src/ops/admin.ts): each change is recorded in the audit log as made by "cli" and the
 * OS user. Prints JSON on stdout. A usage error (unknown command or flag, a missing or malformed flag)
 * prints one plain line and the usage on stderr, exit code 2; any other error prints the envelope on
 * stderr as JSON (one plain line when stderr is a terminal), exit code 1.
 */
import { randomUUID } from 'node:crypto';
import { userInfo } from 'node:os';
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
import { AUDIT_ACTIONS, type Actor } from '../ops/audit.js';
import { AppError, invalidInput, isAppError } from '../errors.js';
import { PLANS } from '../tools/types.js';
import { PartnerCode } from '../money/partners.js';

const USAGE = `usage: npm run admin -- <command>
  account list   [--plan <plan>] [--name-contains <text>] [--created-from <ISO time>] [--created-to <ISO time>]
                 [--limit <1-200>] [--cursor <next_cursor>]       newest first, paged
  account create --plan <free|starter|pro|enterprise> --credits <cents> [--name <text>]
  account create --plan <plan> --credits <cents> --name <text> --if-absent
                                                     the first account with that name if there is one
                                                     (api_key null: keys are stored only as hashes),
                                                     else a new one with its key (the compose seed)
  account show   --account <id>
  account set    --account <id> [--plan <plan>] [--rpm <n|default>] [--elite true|false] [--max-in-flight <n|default>]
  credits add    --account <id> --cents <n> [--paid-cents <n>] [--reason <text>] [--idempotency-key <key>]
                                                     --paid-cents: real money received (revenue;
                                                     earns a referring partner its share)
  credits remove --account <id> --cents <n> --reason <text> [--idempotency-key <key>]
                                                     never more than the balance less calls in flight
  key list       --account <id>                      keys without secrets, newest first
  key create     --account <id> --type <production|test|agent|vip> [--name <text>]
  key revoke     --key <key_id>                      on every replica at once
  payments list                                      x402 payments awaiting settlement (JSON)
  payments export                                    the same as JSON lines, each with the facilitator /settle body
  payments settle                                    submit them to X402_FACILITATOR_URL, or on chain
                                                     yourself with X402_RPC_URL + X402_SETTLER_PRIVATE_KEY
  payments mark-settled --id <payment_id> --tx <transaction hash>
  payments mark-failed  --id <payment_id> --reason <text>
  partner create --name <text> --code <CODE>         codes: 3-32 of A-Z a-z 0-9 _ -, unique regardless of case
  partner report --month YYYY-MM                     per partner: referred accounts, revenue and share (cents)
  audit list     [--account <id>] [--action <action>] [--actor-kind <admin-api|cli|system>]
                 [--since <ISO time>] [--until <ISO time>] [--limit <1-200>] [--cursor <next_cursor>]
Every change is recorded in the audit log (who: cli and your OS user).`;

/** A mistake in the command line itself: answered with the usage, exit code 2. */
class UsageError extends Error {}

const OPTIONS = {
  plan: { type: 'string' },
  credits: { type: 'string' },
  name: { type: 'string' },
  'name-contains': { type: 'string' },
  'created-from': { type: 'string' },
  'created-to': { type: 'string' },
  account: { type: 'string' },
  cents: { type: 'string' },
  'paid-cents': { type: 'string' },
  reason: { type: 'string' },
  'idempotency-key': { type: 'string' },
  code: { type: 'string' },
  month: { type: 'string' },
  type: { type: 'string' },
  key: { type: 'string' },
  rpm: { type: 'string' },
  elite: { type: 'string' },
  'max-in-flight': { type: 'string' },
  id: { type: 'string' },
  tx: { type: 'string' },
  action: { type: 'string' },
  'actor-kind': { type: 'string' },
  since: { type: 'string' },
  until: { type: 'string' },
  limit: { type: 'string' },
  cursor: { type: 'string' },
  'if-absent': { type: 'boolean' },
  help: { type: 'boolean' },
} as const;

function commandLine() {
  try {
    return parseArgs({ allowPositionals: true, options: OPTIONS });
  } catch (e) {
    // node's own message names the flag ("Unknown option '--x'", "Option '--cents <value>' argument missing");
    // its advice on positionals that start with '-' is not what the operator got wrong.
    throw new UsageError((e as Error).message.split('\n')[0]!.replace(/\. To specify a positional argument.*$/, ''));
  }
}

const uuid = z.string({ required_error: 'is required' }).uuid('must be an id (uuid)');
const cents = z.coerce.number({ required_error: 'is required' }).int('must be a whole number of cents').min(0);
const positiveCents = z.coerce.number({ required_error: 'is required' }).int('must be a whole number of cents').positive('must be more than 0');
const plan = z.enum(PLANS);
const text = z.string({ required_error: 'is required' }).trim().min(1, 'must not be empty').max(400);
const isoTime = z.string().datetime({ offset: true, message: 'must be an ISO 8601 date-time' });
const limit = z.coerce.number().int().min(1).max(200).default(50);
/** A limit: a positive whole number, or `default` (the plan's). */
const limitOrDefault = z.union([z.literal('default').transform(() => null), z.coerce.number().int().positive()]);

/** Who the audit log says made the changes: the CLI and the OS user running it. */
function cliActor(): Actor {
  let user: string;
  try {
    user = userInfo().username;
  } catch {
    user = process.env.USER ?? process.env.LOGNAME ?? 'unknown';
  }
  return { kind: 'cli', id: user || 'unknown', requestId: `cli-${randomUUID()}` };
}

async function main(): Promise<unknown> {
  const { positionals, values } = commandLine();
  const command = positionals.slice(0, 2).join(' ');
  if (values.help || !command) {
    process.stdout.write(USAGE + '\n');
    process.exit(command ? 0 : 2);
  }
  if (!COMMANDS.has(command)) throw new UsageError(`unknown command '${command}'`);
  /** The flags `command` takes, parsed: a wrong one is a usage error naming it. */
  const flags = <S extends z.ZodRawShape>(schema: S): z.output<z.ZodObject<S>> => {
    const parsed = z.object(schema).safeParse(values);
    if (parsed.success) return parsed.data;
    const err = invalidInput(parsed.error, command);
    const issue = parsed.error.issues[0]!;
    throw new UsageError(issue.path.length ? `${command}: --${issue.path.join('.')} ${issue.message}` : err.message);
  };
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
  }).as(cliActor());
  // `return await` in this block: the pool closes in `finally`, so results are awaited before it.
  try {
    switch (command) {
      case 'account list': {
        const f = flags({
          plan: plan.optional(),
          'name-contains': z.string().min(1).max(200).optional(),
          'created-from': isoTime.optional(),
          'created-to': isoTime.optional(),
          cursor: uuid.optional(),
          limit,
        });
        return await admin.listAccounts({
          plan: f.plan,
          nameContains: f['name-contains'],
          createdFrom: f['created-from'],
          createdTo: f['created-to'],
          after: f.cursor,
          limit: f.limit,
        });
      }
      case 'account create': {
        if (values['if-absent']) {
          const f = flags({ plan, credits: cents, name: z.string({ required_error: 'is required with --if-absent' }).trim().min(1), 'if-absent': z.boolean() });
          return await admin.createAccountIfAbsent(f.plan, f.credits, f.name);
        }
        const f = flags({ plan, credits: cents, name: z.string().optional() });
        return await admin.createAccount(f.plan, f.credits, f.name);
      }
      case 'account show':
        return await admin.showAccount(flags({ account: uuid }).account);
      case 'account set': {
        const f = flags({
          account: uuid,
          plan: plan.optional(),
          rpm: limitOrDefault.optional(),
          elite: z
            .enum(['true', 'false'])
            .transform((v) => v === 'true')
            .optional(),
          'max-in-flight': limitOrDefault.optional(),
        });
        return await admin.setAccount(f.account, { plan: f.plan, rpm: f.rpm, elite: f.elite, maxInFlight: f['max-in-flight'] });
      }
      case 'credits add': {
        const f = flags({
          account: uuid,
          cents: positiveCents,
          'paid-cents': cents.optional(),
          reason: text.optional(),
          'idempotency-key': z.string().optional(),
        });
        return await admin.addCredits(f.account, f.cents, { paidCents: f['paid-cents'], reason: f.reason, idempotencyKey: f['idempotency-key'] });
      }
      case 'credits remove': {
        const f = flags({ account: uuid, cents: positiveCents, reason: text, 'idempotency-key': z.string().optional() });
        return await admin.removeCredits(f.account, f.cents, { reason: f.reason, idempotencyKey: f['idempotency-key'] });
      }
      case 'partner create': {
        const f = flags({ name: z.string({ required_error: 'is required' }).trim().min(1).max(200), code: PartnerCode });
        return await admin.createPartner(f.name, f.code);
      }
      case 'partner report': {
        const f = flags({ month: z.string({ required_error: 'is required' }).regex(/^\d{4}-(0[1-9]|1[0-2])$/, 'must be YYYY-MM') });
        return await admin.partnerReport(f.month);
      }
      case 'key list':
        return await admin.listKeys(flags({ account: uuid }).account);
      case 'key create': {
        const f = flags({ account: uuid, type: z.enum(['production', 'test', 'agent', 'vip']), name: z.string().optional() });
        return await admin.createKey(f.account, f.type, f.name);
      }
      case 'key revoke':
        return await admin.revokeKey(flags({ key: uuid }).key);
      case 'payments list':
        return await admin.listPayments();
      case 'payments export':
        return await admin.exportPayments();
      case 'payments settle':
        return await admin.settlePayments(config);
      case 'payments mark-settled': {
        const f = flags({
          id: uuid,
          tx: z.string({ required_error: 'is required' }).regex(/^0x[0-9a-fA-F]{64}$/, 'must be a 0x-prefixed 32-byte transaction hash'),
        });
        return await admin.markPaymentSettled(f.id, f.tx);
      }
      case 'payments mark-failed': {
        const f = flags({ id: uuid, reason: text });
        return await admin.markPaymentFailed(f.id, f.reason);
      }
      case 'audit list': {
        const f = flags({
          account: uuid.optional(),
          action: z.enum(AUDIT_ACTIONS).optional(),
          'actor-kind': z.enum(['admin-api', 'cli', 'system']).optional(),
          since: isoTime.optional(),
          until: isoTime.optional(),
          cursor: z
            .string()
            .regex(/^\d{1,15}$/, "must be a previous page's next_cursor")
            .transform(Number)
            .optional(),
          limit,
        });
        return await admin.audit({
          accountId: f.account,
          action: f.action,
          actorKind: f['actor-kind'],
          since: f.since,
          until: f.until,
          beforeId: f.cursor,
          limit: f.limit,
        });
      }
      default:
        throw new UsageError(`unknown command '${command}'`);
    }
  } finally {
    await pool.end();
    redis.disconnect();
  }
}

const COMMANDS = new Set(
  USAGE.split('\n')
    .map((l) => /^ {2}([a-z]+ [a-z-]+)\s/.exec(l)?.[1])
    .filter((c): c is string => !!c),
);

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
      if (e instanceof UsageError) {
        process.stderr.write(`error: ${e.message}\n\n${USAGE}\n`);
        process.exit(2);
      }
      const err = isAppError(e) ? e : new AppError('internal_error', (e as Error).message);
      // Scripts read the envelope; a person at a terminal reads one line.
      process.stderr.write(
        process.stderr.isTTY
          ? `error (${err.code}): ${err.message}\n`
          : JSON.stringify({ error: { code: err.code, message: err.message, ...err.details } }) + '\n',
      );
      process.exit(1);
    },
  );
