import type { FastifyInstance, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { PLANS } from '../../tools/types.js';
import { KEY_TYPES } from '../../access/key-format.js';
import { PartnerCode } from '../../money/partners.js';
import { AwaitingPaymentSchema } from '../../pay/x402/store.js';
import { AdminService } from '../../ops/admin.js';
import { AUDIT_ACTIONS, AuditRecordSchema, tokenFingerprint, type Actor } from '../../ops/audit.js';
import { bearerToken, sameSecret } from '../../ops/operator-token.js';
import { throttlePerAddress } from './browser-pages.js';
import { errors, input, media, named, ok, type RouteSchema } from './route-schema.js';

/**
 * The admin HTTP API under /admin/v1: what the admin CLI does, over HTTP, through the same service
 * (src/ops/admin.ts), each change written to the audit log with the token's fingerprint and the
 * request id. `Authorization: Bearer <ADMIN_TOKEN>`; without ADMIN_TOKEN every route answers 404 like
 * an unknown one. Failed attempts are counted per client address: past AUTH_FAILURES in the window,
 * that address gets 429 even with the right token, so guessing stays slow.
 */
export const ADMIN_API_PREFIX = '/admin/v1';
const AUTH_FAILURES = 20;
const AUTH_WINDOW_SECONDS = 300;
const FAILURES = 'admin-auth-fail';

const uuid = (what: string) => z.string().uuid(`${what} must be an id (uuid)`);
const AccountParams = z.object({ account_id: uuid('account_id').describe('An account id.') });
const KeyParams = z.object({ key_id: uuid('key_id').describe('A key id.') });
const PaymentParams = z.object({ payment_id: uuid('payment_id').describe('An x402 payment id (GET /admin/v1/payments lists them).') });
const Limit = z.coerce.number().int().min(1).max(200).default(50).describe('Page size, 1 to 200 (default 50).');
const Datetime = z.string().datetime({ offset: true, message: 'must be an ISO 8601 date-time' });
const Reason = z.string().trim().min(1).max(400);
const IdempotencyKey = z
  .string()
  .regex(/^[A-Za-z0-9_.:-]{8,100}$/, 'must be 8 to 100 letters, digits, _ . : or -')
  .describe('Makes a retry safe: the same key again (with the same amount) changes nothing and answers the balance.');

const AdminAccount = named(
  'AdminAccount',
  z.object({
    account_id: z.string().uuid(),
    name: z.string().nullable(),
    plan: z.enum(PLANS),
    credits: z.number().int().describe('Balance in cents.'),
    rpm: z.number().int().nullable().describe("Requests per minute; null: the plan's default."),
    elite: z.boolean(),
    max_in_flight: z.number().int().nullable().describe("Jobs in flight at once; null: the plan's default."),
    created_at: z.string().datetime(),
  }),
);
const AccountList = z.object({
  accounts: z.array(AdminAccount).describe('Newest first.'),
  next_cursor: z.string().nullable().describe('Pass as `cursor` for the next page; null on the last.'),
});
const AccountShown = AdminAccount.extend({ used_this_month: z.number().int().describe('Cents charged this calendar month (UTC).') });
const NewAccount = z.object({
  account_id: z.string().uuid(),
  api_key: z.string().describe('Its production key, shown only in this answer (never in the audit log).'),
  key_id: z.string().uuid(),
  plan: z.enum(PLANS),
  credits: z.number().int(),
});
const AccountLimits = z.object({
  account_id: z.string().uuid(),
  plan: z.enum(PLANS),
  rpm: z.number().int().nullable(),
  elite: z.boolean(),
  max_in_flight: z.number().int().nullable(),
  credits: z.number().int(),
});
const Balance = z.object({
  account_id: z.string().uuid(),
  credits: z.number().int().describe('The balance after the change.'),
  paid_cents: z.number().int().optional(),
  replayed: z.literal(true).optional().describe('A retry with an idempotency_key already used: nothing changed.'),
});
const AdminKey = z.object({
  key_id: z.string().uuid(),
  type: z.enum(KEY_TYPES),
  display_prefix: z.string(),
  name: z.string().nullable(),
  created_at: z.string().datetime(),
  last_used_at: z.string().datetime().nullable(),
  revoked_at: z.string().datetime().nullable(),
  expires_at: z.string().datetime().nullable(),
  replaced_by_key_id: z.string().uuid().nullable(),
});
const KeyList = z.object({ account_id: z.string().uuid(), keys: z.array(AdminKey).describe('Newest first, revoked and rotated keys included.') });
const NewKey = z.object({
  key_id: z.string().uuid(),
  api_key: z.string().describe('Shown only in this answer (never in the audit log).'),
  type: z.enum(KEY_TYPES),
  account_id: z.string().uuid(),
  display_prefix: z.string(),
  name: z.string().nullable(),
});
const RevokedKey = z.object({
  key_id: z.string().uuid(),
  account_id: z.string().uuid(),
  type: z.enum(KEY_TYPES),
  revoked: z.literal(true),
  revoked_at: z.string().datetime().describe('When it was first revoked.'),
});
const Partner = z.object({ partner_id: z.string().uuid(), name: z.string(), code: z.string() });
const PartnerReport = z.object({
  month: z.string(),
  partners: z.array(
    z.object({
      partner_id: z.string().uuid(),
      name: z.string(),
      code: z.string(),
      referred_accounts: z.number().int(),
      new_accounts: z.number().int(),
      payments: z.number().int(),
      revenue_cents: z.number().int(),
      share_cents: z.number().int(),
    }),
  ),
});
const PaymentList = z.object({
  count: z.number().int(),
  // The payment store's own row, without the signed payload.
  payments: z.array(
    AwaitingPaymentSchema.omit({ payment_payload: true }).extend({ expired: z.boolean().describe('The authorization can no longer be settled.') }),
  ),
});
const SettleSummary = z.object({ settled: z.number().int(), failed: z.number().int(), expired: z.number().int(), retry: z.number().int() });
const PaymentMarked = z.object({
  id: z.string().uuid(),
  status: z.enum(['settled', 'failed']),
  tx_hash: z.string().optional(),
  error: z.string().optional(),
});
const AuditPage = z.object({
  records: z.array(named('AuditRecord', AuditRecordSchema)).describe('Newest first.'),
  next_cursor: z.string().nullable().describe('Pass as `cursor` for the next page; null on the last.'),
});

const AccountsQuery = z.object({
  plan: z.enum(PLANS).optional(),
  name_contains: z.string().min(1).max(200).optional().describe('Case-insensitive part of the name.'),
  created_from: Datetime.optional().describe('Created at or after.'),
  created_to: Datetime.optional().describe('Created before.'),
  cursor: uuid('cursor').optional().describe("The previous page's next_cursor."),
  limit: Limit,
});
const CreateAccountBody = z.object({
  plan: z.enum(PLANS),
  credits: z.number().int().min(0).max(1e12).describe('Opening balance in cents.'),
  name: z.string().trim().min(1).max(200).optional(),
});
const PatchAccountBody = z
  .object({
    plan: z.enum(PLANS).optional(),
    elite: z.boolean().optional(),
    rpm: z.number().int().positive().max(1e6).nullable().optional().describe("Requests per minute; null: back to the plan's default."),
    max_in_flight: z.number().int().positive().max(1e5).nullable().optional().describe("Jobs in flight at once; null: back to the plan's default."),
  })
  .strict()
  .refine((b) => Object.keys(b).length > 0, 'name at least one of plan, elite, rpm, max_in_flight');
const AddCreditsBody = z
  .object({
    cents: z.number().int().positive().max(1e12),
    reason: Reason.optional(),
    paid_cents: z.number().int().min(0).max(1e12).optional().describe('Real money received for them (revenue; earns a referring partner its share).'),
    idempotency_key: IdempotencyKey.optional(),
  })
  .strict();
const RemoveCreditsBody = z.object({ cents: z.number().int().positive().max(1e12), reason: Reason, idempotency_key: IdempotencyKey.optional() }).strict();
const CreateKeyBody = z.object({ type: z.enum(['production', 'test', 'agent', 'vip']), name: z.string().trim().min(1).max(200).optional() }).strict();
const CreatePartnerBody = z.object({ name: z.string().trim().min(1).max(200), code: PartnerCode }).strict();
const MonthQuery = z.object({
  month: z
    .string()
    .regex(/^\d{4}-(0[1-9]|1[0-2])$/, 'must be YYYY-MM')
    .optional()
    .describe('YYYY-MM; default: the current month (UTC).'),
});
const MarkSettledBody = z.object({ tx_hash: z.string().regex(/^0x[0-9a-fA-F]{64}$/, 'must be a 0x-prefixed 32-byte transaction hash') }).strict();
const MarkFailedBody = z.object({ reason: Reason }).strict();
const AuditQuery = z.object({
  account_id: uuid('account_id').optional(),
  action: z.enum(AUDIT_ACTIONS).optional(),
  actor_kind: z.enum(['admin-api', 'cli', 'system']).optional(),
  since: Datetime.optional().describe('At or after.'),
  until: Datetime.optional().describe('Before.'),
  cursor: z
    .string()
    .regex(/^\d{1,15}$/, "must be a previous page's next_cursor")
    .transform(Number)
    .optional(),
  limit: Limit,
});

const ADMIN: Pick<RouteSchema, 'tags' | 'security'> & { tags: ['Operators']; security: 'admin' } = { tags: ['Operators'], security: 'admin' };

export async function adminApiRoutes(app: FastifyInstance): Promise<void> {
  const { config, accounts, credits, redis, pool } = app.container;
  const token = config.ADMIN_TOKEN;
  const service = new AdminService({
    accounts,
    credits,
    redis,
    prefix: config.REDIS_PREFIX,
    pool,
    sharePct: config.PARTNER_SHARE_PCT,
    auth: app.container.api?.auth,
  });
  const fingerprint = token ? tokenFingerprint(token) : '';

  /** The address's failure counter (throttlePerAddress's key for FAILURES). */
  const failures = (req: FastifyRequest) => `${config.REDIS_PREFIX}:${FAILURES}:${req.ip ?? 'unknown'}`;

  async function authorize(req: FastifyRequest): Promise<void> {
    if (!token) throw new AppError('not_found', `No route ${req.method} ${req.url.split('?')[0]}. GET / lists the endpoints.`);
    const [count, ttl] = await Promise.all([redis.get(failures(req)), redis.ttl(failures(req))]);
    if (Number(count ?? 0) >= AUTH_FAILURES) {
      const wait = Math.max(ttl, 1);
      throw new AppError(
        'rate_limited',
        `Too many failed admin authentications from this address; retry in ${wait} s`,
        { retry_after: wait },
        {
          headers: { 'retry-after': String(wait) },
        },
      );
    }
    if (sameSecret(bearerToken(req.headers.authorization), token)) return;
    await throttlePerAddress(redis, config.REDIS_PREFIX, req, {
      what: FAILURES,
      limit: AUTH_FAILURES,
      windowSeconds: AUTH_WINDOW_SECONDS,
      says: 'Too many failed admin authentications from this address',
    });
    throw new AppError(
      'unauthorized',
      'The admin API needs Authorization: Bearer <ADMIN_TOKEN>',
      {},
      { headers: { 'www-authenticate': 'Bearer realm="tollgate-admin"' } },
    );
  }

  /** The service acting for this request: recorded as the admin API with the token's fingerprint and the request id. */
  const as = (req: FastifyRequest) => service.as({ kind: 'admin-api', id: fingerprint, requestId: req.id } satisfies Actor);

  await app.register(
    async (scope) => {
      scope.addHook('onRequest', async (req, reply) => {
        reply.header('cache-control', 'no-store');
        await authorize(req);
      });

      // Accounts

      scope.get(
        '/accounts',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminListAccounts',
            summary: 'Accounts, newest first, filtered and paged',
            querystring: AccountsQuery,
            response: { '200': ok(AccountList, 'A page of accounts.'), ...errors(['400', '404']) },
          } satisfies RouteSchema,
        },
        async (req) => {
          const q = input<typeof AccountsQuery>(req, 'querystring', 'Account query is invalid');
          return as(req).listAccounts({
            plan: q.plan,
            nameContains: q.name_contains,
            createdFrom: q.created_from,
            createdTo: q.created_to,
            after: q.cursor,
            limit: q.limit,
          });
        },
      );

      scope.post(
        '/accounts',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminCreateAccount',
            summary: 'Create an account with a production key (shown once)',
            body: CreateAccountBody,
            bodyExamples: { pro: { summary: 'A pro account with $10', value: { plan: 'pro', credits: 1000, name: 'Acme' } } },
            response: { '201': ok(NewAccount, 'The account and its key.'), ...errors(['400', '404', '413', '415']) },
          } satisfies RouteSchema,
        },
        async (req, reply) => {
          const b = input<typeof CreateAccountBody>(req, 'body', 'Account is invalid');
          return reply.code(201).send(await as(req).createAccount(b.plan, b.credits, b.name));
        },
      );

      scope.get(
        '/accounts/:account_id',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminShowAccount',
            summary: 'One account, with its use this month',
            params: AccountParams,
            response: { '200': ok(AccountShown, 'The account.'), ...errors(['400', '404']) },
          } satisfies RouteSchema,
        },
        async (req) => as(req).showAccount(input<typeof AccountParams>(req, 'params', 'Account id is invalid').account_id),
      );

      scope.patch(
        '/accounts/:account_id',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminUpdateAccount',
            summary: 'Change plan, elite or limits (rpm, max_in_flight); every replica applies them at once',
            params: AccountParams,
            body: PatchAccountBody,
            bodyExamples: {
              plan: { summary: 'Move to enterprise with a custom rate', value: { plan: 'enterprise', rpm: 600 } },
              reset: { summary: "Back to the plan's default concurrency", value: { max_in_flight: null } },
            },
            response: { '200': ok(AccountLimits, 'The account after the change.'), ...errors(['400', '404', '413', '415']) },
          } satisfies RouteSchema,
        },
        async (req) => {
          const { account_id } = input<typeof AccountParams>(req, 'params', 'Account id is invalid');
          const b = input<typeof PatchAccountBody>(req, 'body', 'Account change is invalid');
          return as(req).setAccount(account_id, { plan: b.plan, elite: b.elite, rpm: b.rpm, maxInFlight: b.max_in_flight });
        },
      );

      scope.post(
        '/accounts/:account_id/credits/add',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminAddCredits',
            summary: 'Add credits (a ledger line), optionally recording money received',
            params: AccountParams,
            body: AddCreditsBody,
            bodyExamples: {
              gift: { summary: 'A goodwill credit', value: { cents: 500, reason: 'outage on 2025-01-03', idempotency_key: 'ticket-4411' } },
              paid: { summary: 'Paid by invoice', value: { cents: 10000, paid_cents: 10000, reason: 'invoice 2025-017' } },
            },
            response: { '200': ok(Balance, 'The balance after the change.'), ...errors(['400', '404', '413', '415', '422']) },
          } satisfies RouteSchema,
        },
        async (req) => {
          const { account_id } = input<typeof AccountParams>(req, 'params', 'Account id is invalid');
          const b = input<typeof AddCreditsBody>(req, 'body', 'Credits are invalid');
          return as(req).addCredits(account_id, b.cents, { reason: b.reason, paidCents: b.paid_cents, idempotencyKey: b.idempotency_key });
        },
      );

      scope.post(
        '/accounts/:account_id/credits/remove',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminRemoveCredits',
            summary: 'Remove credits (a negative ledger line), never more than admission could still spend',
            description: 'Refused with 402 insufficient_credits when the balance less the holds of calls in flight is below `cents`; a reason is required.',
            params: AccountParams,
            body: RemoveCreditsBody,
            bodyExamples: { refund: { summary: 'Credits refunded by card', value: { cents: 2500, reason: 'refunded by card, ticket 4412' } } },
            response: { '200': ok(Balance, 'The balance after the change.'), ...errors(['400', '402', '404', '413', '415', '422']) },
          } satisfies RouteSchema,
        },
        async (req) => {
          const { account_id } = input<typeof AccountParams>(req, 'params', 'Account id is invalid');
          const b = input<typeof RemoveCreditsBody>(req, 'body', 'Credits are invalid');
          return as(req).removeCredits(account_id, b.cents, { reason: b.reason, idempotencyKey: b.idempotency_key });
        },
      );

      // Keys

      scope.get(
        '/accounts/:account_id/keys',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminListKeys',
            summary: "The account's keys, without secrets",
            params: AccountParams,
            response: { '200': ok(KeyList, 'Its keys.'), ...errors(['400', '404']) },
          } satisfies RouteSchema,
        },
        async (req) => as(req).listKeys(input<typeof AccountParams>(req, 'params', 'Account id is invalid').account_id),
      );

      scope.post(
        '/accounts/:account_id/keys',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminCreateKey',
            summary: 'Create a key (shown once); VIP keys only for elite enterprise accounts',
            params: AccountParams,
            body: CreateKeyBody,
            bodyExamples: { agent: { summary: 'A key for an agent', value: { type: 'agent', name: 'nightly-crawler' } } },
            response: { '201': ok(NewKey, 'The key.'), ...errors(['400', '403', '404', '413', '415']) },
          } satisfies RouteSchema,
        },
        async (req, reply) => {
          const { account_id } = input<typeof AccountParams>(req, 'params', 'Account id is invalid');
          const b = input<typeof CreateKeyBody>(req, 'body', 'Key is invalid');
          return reply.code(201).send(await as(req).createKey(account_id, b.type, b.name));
        },
      );

      scope.post(
        '/keys/:key_id/revoke',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminRevokeKey',
            summary: 'Revoke a key, on every replica at once',
            description: 'Any key of any account, sub-keys and grants included. Revoking a revoked key changes nothing and answers its first revocation.',
            params: KeyParams,
            response: { '200': ok(RevokedKey, 'The key, revoked.'), ...errors(['400', '404']) },
          } satisfies RouteSchema,
        },
        async (req) => as(req).revokeKey(input<typeof KeyParams>(req, 'params', 'Key id is invalid').key_id),
      );

      // Partners

      scope.post(
        '/partners',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminCreatePartner',
            summary: 'Create a partner with a referral code',
            body: CreatePartnerBody,
            bodyExamples: { partner: { summary: 'A reseller', value: { name: 'Example Reseller', code: 'EXAMPLE-20' } } },
            response: { '201': ok(Partner, 'The partner.'), ...errors(['400', '404', '413', '415']) },
          } satisfies RouteSchema,
        },
        async (req, reply) => {
          const b = input<typeof CreatePartnerBody>(req, 'body', 'Partner is invalid');
          return reply.code(201).send(await as(req).createPartner(b.name, b.code));
        },
      );

      scope.get(
        '/partners/report',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminPartnerReport',
            summary: 'Per partner, one month (default: this one): referred accounts, revenue and share (cents)',
            querystring: MonthQuery,
            response: { '200': ok(PartnerReport, 'The report.'), ...errors(['400', '404']) },
          } satisfies RouteSchema,
        },
        async (req) => {
          const { month } = input<typeof MonthQuery>(req, 'querystring', 'Month is invalid');
          return as(req).partnerReport(month ?? new Date().toISOString().slice(0, 7));
        },
      );

      // Payments

      scope.get(
        '/payments',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminListPayments',
            summary: 'x402 payments awaiting settlement',
            response: { '200': ok(PaymentList, 'Oldest first.'), ...errors(['404']) },
          } satisfies RouteSchema,
        },
        async (req) => as(req).listPayments(),
      );

      scope.get(
        '/payments/export',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminExportPayments',
            summary: "The same as JSON lines, each with the facilitator's /settle body",
            response: { '200': media('application/x-ndjson', 'One JSON object a line.'), ...errors(['404']) },
          } satisfies RouteSchema,
        },
        async (req, reply) => reply.type('application/x-ndjson; charset=utf-8').send(await as(req).exportPayments()),
      );

      scope.post(
        '/payments/settle',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminSettlePayments',
            summary: 'Submit them to X402_FACILITATOR_URL, or on chain with X402_RPC_URL + X402_SETTLER_PRIVATE_KEY',
            response: { '200': ok(SettleSummary, 'What happened to each.'), ...errors(['400', '404', '502']) },
          } satisfies RouteSchema,
        },
        async (req) => as(req).settlePayments(config),
      );

      scope.post(
        '/payments/:payment_id/mark-settled',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminMarkPaymentSettled',
            summary: 'Record a payment settled elsewhere, with its transaction hash',
            params: PaymentParams,
            body: MarkSettledBody,
            bodyExamples: { settled: { summary: 'Settled by hand', value: { tx_hash: `0x${'ab'.repeat(32)}` } } },
            response: { '200': ok(PaymentMarked, 'The payment, settled.'), ...errors(['400', '404', '413', '415']) },
          } satisfies RouteSchema,
        },
        async (req) => {
          const { payment_id } = input<typeof PaymentParams>(req, 'params', 'Payment id is invalid');
          return as(req).markPaymentSettled(payment_id, input<typeof MarkSettledBody>(req, 'body', 'Payment is invalid').tx_hash);
        },
      );

      scope.post(
        '/payments/:payment_id/mark-failed',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminMarkPaymentFailed',
            summary: 'Record a payment that will not be settled, with the reason',
            params: PaymentParams,
            body: MarkFailedBody,
            bodyExamples: { failed: { summary: 'The payer revoked it', value: { reason: 'authorization cancelled on chain' } } },
            response: { '200': ok(PaymentMarked, 'The payment, failed.'), ...errors(['400', '404', '413', '415']) },
          } satisfies RouteSchema,
        },
        async (req) => {
          const { payment_id } = input<typeof PaymentParams>(req, 'params', 'Payment id is invalid');
          return as(req).markPaymentFailed(payment_id, input<typeof MarkFailedBody>(req, 'body', 'Payment is invalid').reason);
        },
      );

      // The audit log

      scope.get(
        '/audit',
        {
          schema: {
            ...ADMIN,
            operationId: 'adminAudit',
            summary: 'The audit log: every change made through this API or the admin CLI, newest first',
            querystring: AuditQuery,
            response: { '200': ok(AuditPage, 'A page of records.'), ...errors(['400', '404']) },
          } satisfies RouteSchema,
        },
        async (req) => {
          const q = input<typeof AuditQuery>(req, 'querystring', 'Audit query is invalid');
          return as(req).audit({
            accountId: q.account_id,
            action: q.action,
            actorKind: q.actor_kind,
            since: q.since,
            until: q.until,
            beforeId: q.cursor,
            limit: q.limit,
          });
        },
      );
    },
    { prefix: ADMIN_API_PREFIX },
  );
}
