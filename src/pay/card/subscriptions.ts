import type { DatabaseTransactionConnection } from 'slonik';
import { z } from 'zod';
import type { Config } from '../../config.js';
import { sql } from '../../db/pool.js';
import { creditPaid } from '../../money/partners.js';
import type { Plan } from '../../tools/types.js';
import { planCredits, planOfPrice, planRank } from './client.js';
import { type After, accountOfCustomer, idOf, StripeRef } from './effects.js';

/**
 * Plans sold by subscription. The plan in force is decided from the subscription's state as Stripe
 * answers it now (retrieved on every event, so late or reordered payloads cannot move it back):
 *
 * - a higher plan (upgrade) applies at once;
 * - a lower plan seen mid-period (downgrade) is pending (`pending_plan`) until the period the current
 *   plan was paid for ends, i.e. until Stripe reports a period starting at or after its end;
 * - `cancel_at_period_end` keeps the plan to the period's end (pending 'free'); the subscription
 *   ending (status canceled, unpaid or incomplete_expired: customer.subscription.deleted) sets 'free';
 * - invoice.paid grants PLAN_CREDITS_<PLAN> once per invoice of a period (billing_reason
 *   subscription_create or subscription_cycle; ledger key `card-invoice:<invoice>`), and every paid
 *   invoice, proration included, earns the referring partner PARTNER_SHARE_PCT of amount_paid.
 */

const LIVE = new Set(['active', 'trialing', 'past_due']);

export const SubscriptionStateSchema = z.object({
  id: z.string().regex(/^sub_[A-Za-z0-9_]+$/),
  customer: StripeRef,
  status: z.string(),
  cancel_at_period_end: z.boolean(),
  items: z.object({
    data: z.array(z.object({ price: z.object({ id: z.string() }), current_period_start: z.number().int(), current_period_end: z.number().int() })).min(1),
  }),
});
export type SubscriptionState = z.infer<typeof SubscriptionStateSchema>;

const Row = z.object({ plan: z.string(), period_end: z.number().int().nullable() });
const PlanRow = z.object({ plan: z.string() });

/** Sets the subscription's row and its account's plan from Stripe's current state; returns the account. */
export async function applySubscription(config: Config, tx: DatabaseTransactionConnection, after: After, sub: SubscriptionState): Promise<string | null> {
  const customer = idOf(sub.customer);
  const accountId = await accountOfCustomer(tx, customer);
  if (!accountId) return null;
  const item = sub.items.data[0]!;
  const plan = planOfPrice(config, item.price.id);
  await tx.query(sql.unsafe`
    INSERT INTO card_subscriptions (subscription_id, account_id, customer_id, status, plan)
    VALUES (${sub.id}, ${accountId}, ${customer}, ${sub.status}, 'free') ON CONFLICT (subscription_id) DO NOTHING`);
  const row = await tx.one(sql.type(Row)`
    SELECT plan, extract(epoch FROM period_end)::bigint AS period_end FROM card_subscriptions WHERE subscription_id = ${sub.id} FOR UPDATE`);
  const live = LIVE.has(sub.status);
  let applied = row.plan as Plan;
  let periodEnd = row.period_end;
  let pending: Plan | null = null;
  if (!live) {
    applied = 'free';
  } else if (plan) {
    const newPeriod = periodEnd === null || item.current_period_start >= periodEnd;
    if (newPeriod || planRank(plan) >= planRank(applied)) {
      applied = plan;
      periodEnd = item.current_period_end;
    } else {
      pending = plan;
    }
    if (sub.cancel_at_period_end) pending = 'free';
  }
  await tx.query(sql.unsafe`
    UPDATE card_subscriptions SET status = ${sub.status}, price_id = ${item.price.id}, plan = ${applied}, pending_plan = ${pending},
      period_end = ${periodEnd === null ? null : sql.fragment`to_timestamp(${periodEnd})`}, cancel_at_period_end = ${sub.cancel_at_period_end}, updated_at = now()
    WHERE subscription_id = ${sub.id}`);
  // The account follows its live subscription; an ended one sets 'free' only if no other is live.
  const otherLive = await tx.exists(sql.unsafe`
    SELECT 1 FROM card_subscriptions WHERE account_id = ${accountId} AND subscription_id <> ${sub.id} AND status IN ('active', 'trialing', 'past_due')`);
  if (!live && otherLive) return accountId;
  const changed = await tx.maybeOne(sql.type(PlanRow)`
    UPDATE accounts SET plan = ${applied} WHERE id = ${accountId} AND plan <> ${applied} RETURNING plan`);
  if (changed) after.planChanged = true;
  return accountId;
}

const LineSchema = z.object({
  amount: z.number().int().optional(),
  pricing: z
    .object({ price_details: z.object({ price: StripeRef }).optional() })
    .nullable()
    .optional(),
  // API versions before 2025-03-31 put the price on the line itself.
  price: z.object({ id: z.string() }).nullable().optional(),
});

export const InvoiceSchema = z.object({
  id: z.string().regex(/^in_[A-Za-z0-9_]+$/),
  customer: StripeRef.nullable(),
  amount_paid: z.number().int().min(0),
  billing_reason: z.string().nullable(),
  parent: z
    .object({ subscription_details: z.object({ subscription: StripeRef }).nullable().optional() })
    .nullable()
    .optional(),
  subscription: StripeRef.nullable().optional(),
  lines: z.object({ data: z.array(LineSchema) }),
});
export type Invoice = z.infer<typeof InvoiceSchema>;

export function invoiceSubscriptionId(inv: Invoice): string | null {
  return idOf(inv.parent?.subscription_details?.subscription) ?? idOf(inv.subscription);
}

const PERIOD_REASONS = new Set(['subscription_create', 'subscription_cycle']);

/** Grants one paid invoice's plan credits and the partner's share, once (key `card-invoice:<id>`). */
export async function grantInvoice(config: Config, tx: DatabaseTransactionConnection, after: After, inv: Invoice): Promise<string | null> {
  const accountId = await accountOfCustomer(tx, idOf(inv.customer));
  if (!accountId || !invoiceSubscriptionId(inv)) return null;
  const plans = inv.lines.data.map((l) => planOfPrice(config, idOf(l.pricing?.price_details?.price) ?? l.price?.id)).filter((p) => p !== null);
  const plan = plans.sort((a, b) => planRank(b) - planRank(a))[0] ?? null;
  const cents = plan && inv.billing_reason && PERIOD_REASONS.has(inv.billing_reason) ? planCredits(config, plan) : 0;
  if (cents === 0 && inv.amount_paid === 0) return accountId;
  const r = await creditPaid(tx, {
    accountId,
    cents,
    paidCents: inv.amount_paid,
    entryKey: `card-invoice:${inv.id}`,
    payer: null,
    sharePct: config.PARTNER_SHARE_PCT,
  });
  if (r.inserted && cents > 0) after.credit.push({ accountId, cents });
  return accountId;
}
