import { z } from 'zod';
import type { Logger } from 'pino';
import type { Config } from '../config.js';
import { sql, type DatabasePool } from '../db/pool.js';
import { AppError, isAppError } from '../errors.js';
import type { CreditReservations } from '../money/holds.js';
import { creditPaid } from '../money/partners.js';
import {
  ATOMIC_UNITS_PER_CENT,
  abandonPayment,
  admitPayment,
  completePayment,
  hasPayment,
  paymentRequiredError,
  type PaidCall,
  type PaymentHeaders,
  type X402Deps,
} from './x402/index.js';

/**
 * Top-ups paid with x402 (issue 15, part 3): the same admission, verification and settlement as
 * pay-per-call (src/pay/x402/flow.ts), with the account's credits raised only after settlement.
 *
 * Crash safety: the payment row names its account (x402_payments.account_id) before it is settled,
 * and the credit is keyed `topup:<payment id>` in the ledger. creditSettledTopups credits every
 * settled top-up payment without that line; it runs right after settlement, at start-up and on an
 * interval (src/faces/http/credits.ts), so a crash between settlement and credit is repaired, and a
 * replay, retry or second recovery credits nothing more.
 */

export const TOPUP_TOOL = 'topup';

export function topupEntryKey(paymentId: string): string {
  return `topup:${paymentId}`;
}

export interface TopupDeps {
  config: Config;
  pool: DatabasePool;
  credits: CreditReservations;
  /** Absent when x402 is off. */
  x402?: X402Deps;
  log?: Pick<Logger, 'error' | 'warn'>;
}

export interface TopupResult {
  cents: number;
  credits: number;
  payment: { transaction: string; network: string };
  headers: Record<string, string>;
}

/**
 * Why top-ups cannot be sold here, or undefined. Deferred settlement is refused: its payments are
 * only checked offline and may never settle, and credits are never added before settlement.
 */
export function topupUnavailable(deps: Pick<TopupDeps, 'x402'>): AppError | undefined {
  const what =
    'Top-ups are paid with x402: configure X402_ENABLED=true, X402_PAY_TO and a settlement mode that moves money at once ' +
    '(X402_FACILITATOR_URL, or X402_RPC_URL + X402_SETTLER_PRIVATE_KEY).';
  if (!deps.x402) return new AppError('topup_unavailable', `${what} Until then an operator adds credits (admin credits add).`);
  if (deps.x402.settler.mode === 'deferred') {
    return new AppError(
      'topup_unavailable',
      `${what} Deferred settlement (X402_SETTLEMENT=deferred) cannot pay top-ups: credits are added only after a payment settles.`,
      {
        settlement: 'deferred',
      },
    );
  }
  return undefined;
}

export function topupCall(cents: number, resource: string): PaidCall {
  return { tool: TOPUP_TOOL, priceCents: cents, resource, description: `Top-up: ${cents} cents of Tollgate credits` };
}

/**
 * Without a payment: the 402 with the exact amount. With one: verify, name the account on the
 * payment row, settle, then credit. A failed settlement throws (completePayment) and adds nothing.
 */
export async function topUp(deps: TopupDeps, accountId: string, cents: number, resource: string, payment: PaymentHeaders): Promise<TopupResult> {
  const unavailable = topupUnavailable(deps);
  if (unavailable) throw unavailable;
  const x402 = deps.x402!;
  const call = topupCall(cents, resource);
  if (!hasPayment(payment)) throw paymentRequiredError(x402.config, call);
  const admitted = await admitPayment(x402, payment, call);
  try {
    await deps.pool.query(sql.unsafe`UPDATE x402_payments SET account_id = ${accountId} WHERE id = ${admitted.id}`);
  } catch (e) {
    await abandonPayment(x402, admitted, isAppError(e) ? e.code : 'internal_error');
    throw e;
  }
  const { settlement, headers } = await completePayment(x402, admitted);
  // Settled: from here the credit is owed. If it fails now, the recovery pass adds it later.
  let credits: number;
  try {
    credits = (await creditTopupPayment(deps, admitted.id, accountId, cents, admitted.payer)).credits;
  } catch (e) {
    deps.log?.error({ err: e, paymentId: admitted.id }, 'top-up settled but not yet credited; the recovery pass will credit it');
    throw new AppError(
      'service_unavailable',
      'Your payment settled but the credit could not be recorded yet. It will be added automatically within a minute; check GET /balance. Do not pay again.',
      { payment_id: admitted.id, transaction: settlement.transaction },
      { retryable: false, headers },
    );
  }
  return { cents, credits, payment: { transaction: settlement.transaction, network: settlement.network }, headers };
}

/** Credits one settled top-up payment (idempotent), then raises Redis's available-credit cache. */
async function creditTopupPayment(deps: TopupDeps, paymentId: string, accountId: string, cents: number, payer: string) {
  const r = await creditPaid(deps.pool, {
    accountId,
    cents,
    paidCents: cents,
    entryKey: topupEntryKey(paymentId),
    payer,
    sharePct: deps.config.PARTNER_SHARE_PCT,
  });
  // As `credits add` does. Should this fail, the reconciler rebuilds avail from Postgres.
  if (r.inserted) await deps.credits.toppedUp(accountId, cents);
  return r;
}

const Owed = z.object({ id: z.string().uuid(), account_id: z.string().uuid(), value_atomic: z.string(), payer: z.string() });

/**
 * Credits every settled top-up payment that has no ledger line yet (a crash between settlement and
 * credit). Safe to run anywhere, any number of times at once: the ledger key makes each credit once.
 */
export async function creditSettledTopups(deps: Omit<TopupDeps, 'x402'>): Promise<{ credited: number }> {
  const rows = await deps.pool.any(sql.type(Owed)`
    SELECT p.id, p.account_id, p.value_atomic::text AS value_atomic, p.payer
    FROM x402_payments p
    WHERE p.account_id IS NOT NULL AND p.status = 'settled' AND p.tool = ${TOPUP_TOOL}
      AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.entry_key = 'topup:' || p.id::text)
    ORDER BY p.settled_at
    LIMIT 1000`);
  let credited = 0;
  for (const p of rows) {
    const cents = Number(BigInt(p.value_atomic) / ATOMIC_UNITS_PER_CENT);
    const r = await creditTopupPayment(deps, p.id, p.account_id, cents, p.payer);
    if (r.inserted) {
      credited++;
      deps.log?.warn({ paymentId: p.id, accountId: p.account_id, cents }, 'top-up credited by the recovery pass');
    }
  }
  return { credited };
}
