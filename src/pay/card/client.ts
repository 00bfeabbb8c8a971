import Stripe from 'stripe';
import type { Config } from '../../config.js';
import { AppError } from '../../errors.js';
import type { Plan } from '../../tools/types.js';

/**
 * The official Stripe client, pointed at STRIPE_API_URL when set (a local fake or stripe-mock). Network
 * failures are retried by the client itself (with an Idempotency-Key it generates, so a retried POST
 * creates nothing twice).
 */
export function stripeClient(config: Config): Stripe | undefined {
  if (!config.STRIPE_SECRET_KEY) return undefined;
  const target = config.STRIPE_API_URL ? new URL(config.STRIPE_API_URL) : undefined;
  return new Stripe(config.STRIPE_SECRET_KEY, {
    maxNetworkRetries: 2,
    timeout: 10_000,
    ...(target
      ? {
          host: target.hostname,
          port: target.port || (target.protocol === 'https:' ? 443 : 80),
          protocol: target.protocol === 'http:' ? 'http' : 'https',
        }
      : {}),
  });
}

export function paymentsUnavailable(): AppError {
  return new AppError('payments_unavailable', 'Card payments are not configured on this service (STRIPE_SECRET_KEY); ask the operator, or top up with x402.');
}

/** A Stripe API failure as the envelope's 502: the message names Stripe's error type, never the key. */
export function stripeFailed(e: unknown, what: string): AppError {
  if (e instanceof AppError) return e;
  const err = e as { type?: string; code?: string; statusCode?: number };
  return new AppError(
    'upstream_error',
    `Stripe could not ${what}${err.type ? ` (${err.type}${err.code ? `: ${err.code}` : ''})` : ''}; nothing was charged, try again`,
    {
      upstream: 'stripe',
      ...(err.statusCode ? { upstream_status: err.statusCode } : {}),
    },
  );
}

/** Plans sold by subscription, cheapest first; rank decides upgrade (at once) or downgrade (at period end). */
export const PAID_PLANS = ['starter', 'pro', 'enterprise'] as const satisfies readonly Plan[];
export type PaidPlan = (typeof PAID_PLANS)[number];
const RANK: Record<Plan, number> = { free: 0, starter: 1, pro: 2, enterprise: 3 };
export const planRank = (p: Plan): number => RANK[p];

export function planPrice(config: Config, plan: PaidPlan): string {
  return { starter: config.STRIPE_PRICE_STARTER, pro: config.STRIPE_PRICE_PRO, enterprise: config.STRIPE_PRICE_ENTERPRISE }[plan];
}

export function planCredits(config: Config, plan: PaidPlan): number {
  return { starter: config.PLAN_CREDITS_STARTER, pro: config.PLAN_CREDITS_PRO, enterprise: config.PLAN_CREDITS_ENTERPRISE }[plan];
}

/** The plan a configured Price sells, or null for a Price this service does not know. */
export function planOfPrice(config: Config, priceId: string | null | undefined): PaidPlan | null {
  if (!priceId) return null;
  return PAID_PLANS.find((p) => planPrice(config, p) === priceId) ?? null;
}

/** The plans with a Price configured: the ones offered by card. */
export function pricedPlans(config: Config): PaidPlan[] {
  return PAID_PLANS.filter((p) => planPrice(config, p) !== '');
}
