import type { FastifyInstance } from 'fastify';
import { requireNotInGrace } from '../../access/keys.js';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { usageScope } from '../../access/usage.js';
import type { AccountsRepo, LedgerEntry, UsageScope } from '../../access/accounts.js';
import { KEY_TYPES } from '../../access/key-format.js';
import { RATE_LIMIT } from './openapi-components.js';
import { errors, input, named, ok, type RouteSchema } from './route-schema.js';

export const ENTRIES_DEFAULT = 50;
export const ENTRIES_MAX = 200;

/** GET /usage query string: one calendar month, UTC. */
export const UsageQuery = z
  .object({
    month: z
      .string()
      .regex(/^\d{4}-(0[1-9]|1[0-2])$/, 'month must be YYYY-MM, e.g. 2025-01')
      .optional()
      .describe('A calendar month, UTC (YYYY-MM); the current one when left out.'),
  })
  .strict();

/** GET /usage/entries query string. */
export const EntriesQuery = z
  .object({
    limit: z.coerce
      .number({ invalid_type_error: 'limit must be a number' })
      .int('limit must be a whole number')
      .min(1, 'limit must be at least 1')
      .max(ENTRIES_MAX, `limit must be at most ${ENTRIES_MAX}`)
      .default(ENTRIES_DEFAULT)
      .describe(`Lines per page (1 to ${ENTRIES_MAX}).`),
    cursor: z.string().min(1).max(200).optional().describe("The previous page's next_cursor, unchanged."),
    tool: z.string().min(1).max(200).optional().describe("Only this tool's lines."),
    key_id: z.string().uuid('key_id must be a key id (uuid)').optional().describe("Only this key's lines."),
    since: z
      .string()
      .datetime({ offset: true, message: 'since must be an ISO 8601 time, e.g. 2025-01-31T00:00:00Z' })
      .optional()
      .describe('Only lines at or after this time.'),
  })
  .strict();

/** The month's bounds, UTC: `[from, to)`. */
export function monthBounds(month: string): { from: string; to: string } {
  const [y, m] = month.split('-').map(Number) as [number, number];
  return { from: new Date(Date.UTC(y, m - 1, 1)).toISOString(), to: new Date(Date.UTC(y, m, 1)).toISOString() };
}

function currentMonth(): string {
  return new Date().toISOString().slice(0, 7);
}

/**
 * Opaque keyset cursor: the last line's created_at and id. Only the id orders the pages (ids only
 * grow), so a line inserted while a client pages is never shown twice and never shifts a page.
 */
function encodeCursor(e: LedgerEntry): string {
  return Buffer.from(JSON.stringify([e.created_at, e.id])).toString('base64url');
}

function decodeCursor(cursor: string): number {
  try {
    const v = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as unknown;
    if (
      Array.isArray(v) &&
      v.length === 2 &&
      typeof v[0] === 'string' &&
      !Number.isNaN(Date.parse(v[0])) &&
      Number.isSafeInteger(v[1]) &&
      (v[1] as number) > 0
    ) {
      return v[1] as number;
    }
  } catch {
    // fall through
  }
  throw new AppError('invalid_input', 'cursor is not one this service gave out: pass next_cursor from the previous page unchanged', {
    issues: [{ path: ['cursor'], message: 'invalid cursor' }],
  });
}

/** A ledger line as GET /usage/entries shows it. `amount_cents` is what it did to the balance. */
function entryView(e: LedgerEntry) {
  return {
    id: String(e.id),
    kind: e.kind,
    tool: e.tool,
    key_id: e.key_id,
    amount_cents: e.delta_cents,
    ...(e.kind === 'charge' ? { job_id: e.entry_key } : {}),
    agent_name: e.agent_name,
    created_at: e.created_at,
  };
}

/** GET /usage's answer: every figure is a sum of the month's ledger lines in the caller's scope. */
export async function usageReport(accounts: AccountsRepo, scope: UsageScope, month: string) {
  const { from, to } = monthBounds(month);
  const u = await accounts.usage(scope, from, to);
  const kind = (k: string) => u.byKind.find((r) => r.kind === k) ?? { cents: 0, lines: 0 };
  const charges = kind('charge');
  const topups = kind('topup');
  const opening = kind('opening');
  const payment = kind('payment');
  const net = u.byKind.reduce((s, r) => s + r.cents, 0);
  return {
    month,
    from,
    to,
    scope: scope.keyId ? 'key' : 'account',
    ...(scope.keyId ? { key_id: scope.keyId } : {}),
    unit: 'cents',
    total: { cents: -charges.cents, calls: charges.lines },
    by_tool: u.byTool.map((r) => ({ tool: r.tool, cents: r.cents, calls: r.calls })),
    by_key: u.byKey.map((r) => ({ key_id: r.key_id, type: r.type, name: r.name, display_prefix: r.display_prefix, cents: r.cents, calls: r.calls })),
    by_day: u.byDay.map((r) => ({ day: r.day, cents: r.cents, calls: r.calls })),
    topups: { cents: topups.cents, count: topups.lines },
    // Signed moves of the balance: start + opening + topups + charges (+ payments) = end.
    balance: scope.keyId
      ? null
      : {
          start_cents: u.before,
          opening_cents: opening.cents,
          topups_cents: topups.cents,
          charges_cents: charges.cents,
          ...(payment.lines ? { payments_cents: payment.cents } : {}),
          end_cents: u.before + net,
        },
  };
}

/** A sum of charges (fresh schemas each time: a shared one would be written as a pointer into another schema). */
const totals = () => ({ cents: z.number().int().describe('Cents charged (positive).'), calls: z.number().int() });

const UsageTotalSchema = named('UsageTotal', z.object(totals()));

const UsageSchema = named(
  'Usage',
  z
    .object({
      month: z.string().regex(/^\d{4}-\d{2}$/),
      from: z.string().datetime(),
      to: z.string().datetime().describe('Exclusive.'),
      scope: z.enum(['account', 'key']).describe('key for a sub-key or sandbox key (its own lines only), account otherwise.'),
      key_id: z.string().uuid().optional().describe('With scope key: the calling key.'),
      unit: z.literal('cents'),
      total: UsageTotalSchema,
      by_tool: z.array(z.object({ tool: z.string().nullable(), ...totals() })).describe('Most charged first.'),
      by_key: z
        .array(
          z.object({
            key_id: z.string().uuid().nullable(),
            type: z.enum(KEY_TYPES).nullable(),
            name: z.string().nullable(),
            display_prefix: z.string().nullable(),
            ...totals(),
          }),
        )
        .describe('Most charged first.'),
      by_day: z.array(z.object({ day: z.string().date(), ...totals() })).describe('Days with charges, oldest first (UTC).'),
      topups: z.object({ cents: z.number().int(), count: z.number().int() }),
      balance: z
        .object({
          start_cents: z.number().int().describe('The balance when the month began.'),
          opening_cents: z.number().int().describe("The account's opening credits, if it was opened this month."),
          topups_cents: z.number().int(),
          charges_cents: z.number().int().describe('Negative: what the charges took.'),
          payments_cents: z.number().int().optional().describe('Only when the month has payment lines.'),
          end_cents: z.number().int().describe('start + opening + top-ups + charges (+ payments).'),
        })
        .nullable()
        .describe('Signed moves of the balance; null with scope key.'),
    })
    .describe(
      "A month of the ledger in the caller's scope. `total` is every charge of the month. Charges are positive cents in total, by_tool, by_key and by_day; `balance` moves are signed " +
        '(start + opening + top-ups + charges = end). `balance` is null for a sub-key or sandbox key, which see their own lines only.',
    ),
);

const LedgerEntryListSchema = named(
  'LedgerEntryList',
  z.object({
    entries: z.array(
      z.object({
        id: z.string(),
        kind: z.enum(['charge', 'topup', 'opening', 'payment']),
        tool: z.string().nullable(),
        key_id: z.string().uuid().nullable(),
        amount_cents: z.number().int().describe('Signed move of the balance (a charge is negative).'),
        job_id: z.string().optional().describe('Charges only: the call that was charged.'),
        agent_name: z.string().nullable(),
        created_at: z.string().datetime(),
      }),
    ),
    next_cursor: z.string().nullable().describe('Pass as `cursor` for the next (older) page; null on the last page.'),
  }),
);

const GRACE = 'A rotated key in its grace: 403 key_in_grace.';

export async function usageRoutes(app: FastifyInstance): Promise<void> {
  const { accounts } = app.container;

  app.get(
    '/usage',
    {
      schema: {
        operationId: 'getUsage',
        tags: ['Account'],
        summary: "A month's charges by tool, key and day, its top-ups and balance moves, from the ledger",
        description:
          "A calendar month (UTC, ?month=YYYY-MM, the current one by default) of the ledger: charges by tool, key and day, top-ups and the balance's moves. " +
          `A sub-key or sandbox key sees its own lines only. ${GRACE}`,
        querystring: UsageQuery,
        response: { '200': ok(UsageSchema, "The month's usage from the ledger.", { headers: RATE_LIMIT }), ...errors(['400', '403']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      requireNotInGrace(caller, "read the account's usage");
      const q = input<typeof UsageQuery>(req, 'querystring', 'Usage query is invalid');
      return usageReport(accounts, usageScope(caller), q.month ?? currentMonth());
    },
  );

  app.get(
    '/usage/entries',
    {
      schema: {
        operationId: 'listUsageEntries',
        tags: ['Account'],
        summary: 'Ledger lines, newest first (limit, cursor, tool, key_id, since)',
        description: `The ledger's lines in the caller's scope, newest first, a page at a time (a sub-key or sandbox key: its own lines only). ${GRACE}`,
        querystring: EntriesQuery,
        response: { '200': ok(LedgerEntryListSchema, 'Ledger lines, newest first.', { headers: RATE_LIMIT }), ...errors(['400', '403']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      requireNotInGrace(caller, "read the account's usage");
      const q = input<typeof EntriesQuery>(req, 'querystring', 'Usage entries query is invalid');
      const beforeId = q.cursor ? decodeCursor(q.cursor) : null;
      // One more than asked tells whether another page exists.
      const rows = await accounts.ledgerEntries(usageScope(caller), {
        beforeId,
        limit: q.limit + 1,
        tool: q.tool,
        keyId: q.key_id,
        since: q.since,
      });
      const page = rows.slice(0, q.limit);
      const last = page[page.length - 1];
      return { entries: page.map(entryView), next_cursor: rows.length > q.limit && last ? encodeCursor(last) : null };
    },
  );
}
