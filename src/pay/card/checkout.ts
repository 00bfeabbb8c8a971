import type Stripe from 'stripe';
import type { DatabasePool } from 'slonik';
import { z } from 'zod';
import type { Config } from '../../config.js';
import { sql } from '../../db/pool.js';
import { AppError } from '../../errors.js';
import { type PaidPlan, planPrice, stripeFailed } from './client.js';

/**
 * What an account starts at Stripe: its customer (once), a Checkout session for a card top-up or a
 * plan subscription, and a Billing Portal session. Nothing here credits anything: credits and plans
 * move only on verified webhooks (webhook.ts), so a session opened and abandoned costs nothing.
 */

export interface CardDeps {
  config: Config;
  pool: DatabasePool;
  stripe: Stripe;
}

const CustomerRow = z.object({ customer_id: z.string() });
const Referral = z.object({ code: z.string() });

export async function customerOf(pool: DatabasePool, accountId: string): Promise<string | null> {
  return pool.maybeOneFirst(sql.type(CustomerRow)`SELECT customer_id FROM stripe_customers WHERE account_id = ${accountId}`);
}

/**
 * The account's Stripe customer, created on first use with the account id and its sign-up's partner
 * code in metadata. The creation's Idempotency-Key is derived from the account, so two replicas that
 * race here get the same customer from Stripe and the table keeps one row.
 */
export async function ensureCustomer(deps: CardDeps, accountId: string): Promise<string> {
  const known = await customerOf(deps.pool, accountId);
  if (known) return known;
  const referral = await deps.pool.maybeOne(sql.type(Referral)`
    SELECT p.code FROM signups s JOIN partners p ON p.id = s.partner_id WHERE s.account_id = ${accountId}`);
  let customer: Stripe.Customer;
  try {
    customer = await deps.stripe.customers.create(
      { metadata: { account_id: accountId, ...(referral ? { partner_code: referral.code } : {}) } },
      { idempotencyKey: `tollgate-customer-${accountId}` },
    );
  } catch (e) {
    throw stripeFailed(e, 'create the customer');
  }
  await deps.pool.query(sql.unsafe`
    INSERT INTO stripe_customers (account_id, customer_id) VALUES (${accountId}, ${customer.id}) ON CONFLICT (account_id) DO NOTHING`);
  return (await customerOf(deps.pool, accountId)) ?? customer.id;
}

export interface OpenedCheckout {
  id: string;
  url: string;
}

/**
 * Opens a Checkout session of the account's customer with what every session of ours carries (the
 * account as client_reference_id, the return pages), and answers its page.
 */
async function openSession(
  deps: CardDeps,
  accountId: string,
  returnBase: string,
  params: Omit<Stripe.Checkout.SessionCreateParams, 'customer' | 'client_reference_id' | 'success_url' | 'cancel_url'>,
): Promise<OpenedCheckout> {
  const customer = await ensureCustomer(deps, accountId);
  try {
    const s = await deps.stripe.checkout.sessions.create({
      ...params,
      customer,
      client_reference_id: accountId,
      success_url: `${returnBase}/subscribe?checkout=complete`,
      cancel_url: `${returnBase}/subscribe?checkout=cancelled`,
    });
    if (!s.url) throw new AppError('upstream_error', 'Stripe answered a Checkout session without a URL', { upstream: 'stripe' });
    return { id: s.id, url: s.url };
  } catch (e) {
    throw stripeFailed(e, 'open a Checkout session');
  }
}

/** A Checkout session (mode payment) for `cents` of credits, one line of exactly that amount. */
export async function openTopupCheckout(deps: CardDeps, accountId: string, cents: number, returnBase: string): Promise<OpenedCheckout> {
  return openSession(deps, accountId, returnBase, {
    mode: 'payment',
    line_items: [{ quantity: 1, price_data: { currency: 'usd', unit_amount: cents, product_data: { name: 'Tollgate credits' } } }],
    metadata: { account_id: accountId, kind: 'topup', cents: String(cents) },
    payment_intent_data: { metadata: { account_id: accountId, kind: 'topup' } },
  });
}

const LiveSubscription = z.object({ subscription_id: z.string(), plan: z.string() });

/** A Checkout session (mode subscription) for a plan whose Price is configured. */
export async function openPlanCheckout(deps: CardDeps, accountId: string, plan: PaidPlan, returnBase: string): Promise<OpenedCheckout> {
  const price = planPrice(deps.config, plan);
  if (!price)
    throw new AppError('invalid_input', `The ${plan} plan is not sold by card here (STRIPE_PRICE_${plan.toUpperCase()} is unset)`, {
      reason: 'plan_not_priced',
    });
  // One subscription per account: a second would bill twice. Changes go through the portal.
  const live = await deps.pool.maybeOne(sql.type(LiveSubscription)`
    SELECT subscription_id, plan FROM card_subscriptions
    WHERE account_id = ${accountId} AND status IN ('active', 'trialing', 'past_due', 'incomplete')
    LIMIT 1`);
  if (live)
    throw new AppError('subscription_exists', 'The account already has a subscription: change or cancel it in the billing portal (POST /billing/portal)', {
      subscription_id: live.subscription_id,
      plan: live.plan,
    });
  return openSession(deps, accountId, returnBase, {
    mode: 'subscription',
    line_items: [{ price, quantity: 1 }],
    metadata: { account_id: accountId, kind: 'subscription', plan },
    subscription_data: { metadata: { account_id: accountId, plan } },
  });
}

/** A Billing Portal session for the account's customer (card, invoices, plan changes, cancellation). */
export async function openPortal(deps: CardDeps, accountId: string, returnUrl: string): Promise<OpenedCheckout> {
  const customer = await customerOf(deps.pool, accountId);
  if (!customer)
    throw new AppError('not_found', 'The account has never paid by card, so it has no billing portal: buy credits (POST /credits/checkout) or a plan first', {
      reason: 'no_stripe_customer',
    });
  try {
    const s = await deps.stripe.billingPortal.sessions.create({ customer, return_url: returnUrl });
    return { id: s.id, url: s.url };
  } catch (e) {
    throw stripeFailed(e, 'open the billing portal');
  }
}
