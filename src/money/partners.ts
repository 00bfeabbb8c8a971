import { z } from 'zod';
import type { CommonQueryMethods } from 'slonik';
import { sql } from '../db/pool.js';
import { AppError } from '../errors.js';

/**
 * Partner attribution (issue 15, part 6). A partner has a code; an account that signs up with it is
 * referred (signups.partner_id), and every payment that account makes (top-ups, and operator credits
 * recorded with --paid-cents) earns the partner PARTNER_SHARE_PCT percent in partner_ledger.
 *
 * Rounding: floor to whole cents, so 333 cents at 20% earns 66 and the fraction stays with the
 * platform; the sum of shares never exceeds what was paid.
 */

export const PARTNER_CODE_RE = /^[A-Za-z0-9_-]{3,32}$/;
export const PartnerCode = z.string().regex(PARTNER_CODE_RE, 'must be 3 to 32 letters, digits, _ or -');

export function partnerShareCents(revenueCents: number, pct: number): number {
  return Math.floor((revenueCents * pct) / 100);
}

const PartnerRow = z.object({ id: z.string().uuid(), name: z.string(), code: z.string() });
export type Partner = z.infer<typeof PartnerRow>;

/** Case-insensitive: codes are typed by people. Malformed codes are simply unknown. */
export async function findPartnerByCode(db: CommonQueryMethods, code: string): Promise<Partner | null> {
  if (!PARTNER_CODE_RE.test(code)) return null;
  return db.maybeOne(sql.type(PartnerRow)`SELECT id, name, code FROM partners WHERE lower(code) = lower(${code})`);
}

export async function createPartner(db: CommonQueryMethods, name: string, code: string): Promise<Partner> {
  const row = await db.maybeOne(sql.type(PartnerRow)`
    INSERT INTO partners (name, code) VALUES (${name}, ${code})
    ON CONFLICT ((lower(code))) DO NOTHING
    RETURNING id, name, code`);
  if (!row) throw new AppError('invalid_input', `A partner with code '${code}' already exists (codes are unique regardless of case)`, { reason: 'code_taken' });
  return row;
}

export interface PaidCredit {
  accountId: string;
  /** Credits added to the account. */
  cents: number;
  /** Real money received for them (partner shares are computed from this). */
  paidCents: number;
  /** The ledger line's unique key: a second credit with the same key changes nothing. */
  entryKey: string;
  /** x402 payer address, for top-ups. */
  payer?: string | null;
  sharePct: number;
}

const Credited = z.object({ credits: z.number().int() });

/**
 * Credits an account for money received, in one transaction: the ledger line (kind 'topup', keyed by
 * `entryKey`), accounts.credits, and the referring partner's share. Returns `inserted: false` (and
 * the balance unchanged) when the line already exists, so retries and recoveries credit once. The
 * caller raises Redis's available-credit cache (CreditReservations.toppedUp) only when inserted.
 */
export async function creditPaid(pool: CommonQueryMethods, c: PaidCredit): Promise<{ inserted: boolean; credits: number }> {
  return pool.transaction(async (tx) => {
    const inserted = await tx.maybeOneFirst(sql.type(z.object({ id: z.number() }))`
      INSERT INTO ledger (entry_key, account_id, kind, delta_cents, payer, paid_cents)
      VALUES (${c.entryKey}, ${c.accountId}, 'topup', ${c.cents}, ${c.payer ?? null}, ${c.paidCents})
      ON CONFLICT (entry_key) DO NOTHING RETURNING id`);
    if (inserted === null) {
      const row = await tx.maybeOne(sql.type(Credited)`SELECT credits FROM accounts WHERE id = ${c.accountId}`);
      if (!row) throw new AppError('not_found', `No account ${c.accountId}`);
      return { inserted: false, credits: row.credits };
    }
    const row = await tx.maybeOne(sql.type(Credited)`UPDATE accounts SET credits = credits + ${c.cents} WHERE id = ${c.accountId} RETURNING credits`);
    if (!row) throw new AppError('not_found', `No account ${c.accountId}`);
    if (c.paidCents > 0) {
      await tx.query(sql.unsafe`
        INSERT INTO partner_ledger (entry_key, partner_id, account_id, revenue_cents, share_pct, share_cents)
        SELECT ${c.entryKey}, s.partner_id, s.account_id, ${c.paidCents}, ${c.sharePct}, ${partnerShareCents(c.paidCents, c.sharePct)}
        FROM signups s WHERE s.account_id = ${c.accountId} AND s.partner_id IS NOT NULL
        ON CONFLICT (entry_key) DO NOTHING`);
    }
    return { inserted: true, credits: row.credits };
  });
}

const ReportRow = z.object({
  partner_id: z.string().uuid(),
  name: z.string(),
  code: z.string(),
  referred_accounts: z.coerce.number().int(),
  new_accounts: z.coerce.number().int(),
  payments: z.coerce.number().int(),
  revenue_cents: z.coerce.number().int(),
  share_cents: z.coerce.number().int(),
});
export type PartnerReportRow = z.infer<typeof ReportRow>;

/**
 * One calendar month (UTC) per partner: accounts referred by the month's end, of which new in it;
 * payments, revenue and share earned in it. Every partner is listed, earning or not.
 */
export async function partnerReport(db: CommonQueryMethods, month: string): Promise<{ month: string; partners: PartnerReportRow[] }> {
  const m = /^(\d{4})-(0[1-9]|1[0-2])$/.exec(month);
  if (!m) throw new AppError('invalid_input', '--month must be YYYY-MM');
  const start = `${m[1]}-${m[2]}-01T00:00:00Z`;
  const rows = await db.any(sql.type(ReportRow)`
    WITH bounds AS (SELECT ${start}::timestamptz AS s, ${start}::timestamptz + interval '1 month' AS e)
    SELECT p.id AS partner_id, p.name, p.code,
      (SELECT count(*) FROM signups s, bounds b WHERE s.partner_id = p.id AND s.created_at < b.e) AS referred_accounts,
      (SELECT count(*) FROM signups s, bounds b WHERE s.partner_id = p.id AND s.created_at >= b.s AND s.created_at < b.e) AS new_accounts,
      (SELECT count(*) FROM partner_ledger l, bounds b WHERE l.partner_id = p.id AND l.created_at >= b.s AND l.created_at < b.e) AS payments,
      (SELECT coalesce(sum(revenue_cents), 0) FROM partner_ledger l, bounds b WHERE l.partner_id = p.id AND l.created_at >= b.s AND l.created_at < b.e) AS revenue_cents,
      (SELECT coalesce(sum(share_cents), 0) FROM partner_ledger l, bounds b WHERE l.partner_id = p.id AND l.created_at >= b.s AND l.created_at < b.e) AS share_cents
    FROM partners p ORDER BY p.created_at, p.id`);
  return { month, partners: [...rows] };
}
