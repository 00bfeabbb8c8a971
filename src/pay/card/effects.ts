import type { CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import { sql } from '../../db/pool.js';

/** What a webhook's transaction did that Redis and the key cache must learn once it has committed. */
export interface After {
  /** Admission's cached available credit moves by these amounts (negative: a refund or a freeze). */
  credit: Array<{ accountId: string; cents: number }>;
  /** An account's plan changed: cached key records carry the plan. */
  planChanged: boolean;
}

/** An id Stripe sends either as a string or, expanded, as the object. */
export const StripeRef = z.union([z.string(), z.object({ id: z.string() })]);
export const idOf = (v: string | { id: string } | null | undefined): string | null => (v == null ? null : typeof v === 'string' ? v : v.id);

/** The account a Stripe customer belongs to: only customers this service created (stripe_customers). */
export async function accountOfCustomer(db: CommonQueryMethods, customerId: string | null): Promise<string | null> {
  if (!customerId) return null;
  return db.maybeOneFirst(sql.type(z.object({ account_id: z.string() }))`SELECT account_id FROM stripe_customers WHERE customer_id = ${customerId}`);
}
