import type Stripe from 'stripe';
import type { DatabasePool, DatabaseTransactionConnection } from 'slonik';
import type { Logger } from 'pino';
import { z } from 'zod';
import type { Config } from '../../config.js';
import { sql } from '../../db/pool.js';
import { AppError } from '../../errors.js';
import { creditPaid } from '../../money/partners.js';
import type { CreditReservations } from '../../money/holds.js';
import { stripeFailed } from './client.js';
import { type After, accountOfCustomer, idOf, StripeRef } from './effects.js';
import { type SubscriptionState, SubscriptionStateSchema, applySubscription, grantInvoice, InvoiceSchema, invoiceSubscriptionId } from './subscriptions.js';

/**
 * POST /stripe/webhook's work. Every event is verified (Stripe-Signature over the raw body), then
 * recorded in stripe_events in the same transaction as its effect: a second delivery of the same
 * event, from a retry, a replay or another replica at the same moment, finds the row (or waits on
 * the first one's insert) and changes nothing.
 *
 * Event payloads can arrive late and out of order, so state that changes over time (a charge's
 * refunded amount, a dispute's status, a subscription's price and period) is read back from Stripe
 * before it is acted on, and every effect is keyed so the same state applied twice is one effect:
 *
 * - checkout.session.completed (mode payment, payment_status paid): credits amount_total once,
 *   ledger key `card-topup:<session>`, with the referring partner's share.
 * - charge.refunded: debits what Stripe's cumulative amount_refunded adds to what was already
 *   debited, key `card-refund:<charge>:<amount_refunded>`, never below a zero balance: what could not
 *   be taken back is recorded as the top-up's shortfall_cents and logged.
 * - charge.dispute.*: a dispute freezes what it covers (debited like a refund, key
 *   `card-dispute:<dispute>`); won, the frozen credits come back (`card-dispute-won:<dispute>`); lost,
 *   they stay debited.
 * - customer.subscription.* and invoice.paid: subscriptions.ts.
 * - anything else: acknowledged and ignored.
 */

export interface WebhookDeps {
  config: Config;
  pool: DatabasePool;
  stripe: Stripe;
  credits: Pick<CreditReservations, 'toppedUp'>;
  /** Called after a commit that changed an account's plan (cached key records carry the plan). */
  plansChanged: () => Promise<void>;
  log: Pick<Logger, 'info' | 'warn' | 'error'>;
}

export const EventSchema = z.object({
  id: z.string().regex(/^evt_[A-Za-z0-9_]+$/),
  type: z.string().min(1),
  created: z.number().int(),
  data: z.object({ object: z.record(z.unknown()) }),
});
export type StripeEvent = z.infer<typeof EventSchema>;

export interface WebhookOutcome {
  event_id: string;
  type: string;
  /** processed: this delivery had the effect; duplicate: an earlier one did; ignored: not an event this service acts on. */
  outcome: 'processed' | 'duplicate' | 'ignored';
}

/** Verifies the signature on the raw body; 400 invalid_input (nothing changes) when it does not match. */
export function verifyEvent(deps: Pick<WebhookDeps, 'config' | 'stripe'>, raw: Buffer | undefined, signature: string | undefined): StripeEvent {
  if (!signature) throw new AppError('invalid_input', 'Missing Stripe-Signature header', { reason: 'signature_missing' });
  if (!raw || raw.length === 0) throw new AppError('invalid_input', 'Empty webhook body', { reason: 'body_missing' });
  let event: unknown;
  try {
    event = deps.stripe.webhooks.constructEvent(raw, signature, deps.config.STRIPE_WEBHOOK_SECRET);
  } catch {
    // The library's message may quote the expected signature's scheme, never the secret; ours says less.
    throw new AppError('invalid_input', 'Stripe-Signature does not match the body (or its timestamp is too old)', { reason: 'signature_invalid' });
  }
  const parsed = EventSchema.safeParse(event);
  if (!parsed.success) throw new AppError('invalid_input', 'The signed body is not a Stripe event', { reason: 'not_an_event' });
  return parsed.data;
}

const SessionSchema = z.object({
  id: z.string().regex(/^cs_[A-Za-z0-9_]+$/),
  mode: z.string(),
  payment_status: z.string(),
  amount_total: z.number().int().nullable(),
  currency: z.string().nullable().optional(),
  client_reference_id: z.string().nullable(),
  customer: StripeRef.nullable(),
  payment_intent: StripeRef.nullable(),
  subscription: StripeRef.nullable().optional(),
  metadata: z.record(z.string()).nullable().optional(),
});
type Session = z.infer<typeof SessionSchema>;
const ChargeSchema = z.object({
  id: z.string(),
  amount: z.number().int(),
  amount_refunded: z.number().int(),
  payment_intent: StripeRef.nullable(),
});
const DisputeSchema = z.object({
  id: z.string().regex(/^dp_[A-Za-z0-9_]+$/),
  amount: z.number().int(),
  status: z.string(),
  payment_intent: StripeRef.nullable(),
});

const Uuid = z.string().uuid();
const Exists = z.object({ id: z.string() });
const TopupRow = z.object({ session_id: z.string(), account_id: z.string(), amount_cents: z.number().int(), refunded_cents: z.number().int() });
const DisputeRow = z.object({ account_id: z.string(), debited_cents: z.number().int(), status: z.string() });

/**
 * Moves an account's credits by `delta` (negative: a refund or a freeze) with its ledger line, keyed.
 * A debit takes at most the balance: the rest is returned as the shortfall. Nothing happens when the
 * key was already used.
 */
async function adjust(tx: DatabaseTransactionConnection, after: After, accountId: string, delta: number, entryKey: string) {
  const balance = await tx.oneFirst(sql.type(z.object({ credits: z.number().int() }))`SELECT credits FROM accounts WHERE id = ${accountId} FOR UPDATE`);
  const moved = delta >= 0 ? delta : -Math.min(-delta, Math.max(0, balance));
  const inserted = await tx.maybeOneFirst(sql.type(z.object({ id: z.number() }))`
    INSERT INTO ledger (entry_key, account_id, kind, delta_cents) VALUES (${entryKey}, ${accountId}, 'topup', ${moved})
    ON CONFLICT (entry_key) DO NOTHING RETURNING id`);
  if (inserted === null) return { inserted: false, moved: 0, shortfall: 0 };
  if (moved !== 0) {
    await tx.query(sql.unsafe`UPDATE accounts SET credits = credits + ${moved} WHERE id = ${accountId}`);
    after.credit.push({ accountId, cents: moved });
  }
  return { inserted: true, moved, shortfall: delta < 0 ? -delta + moved : 0 };
}

export class CardWebhooks {
  constructor(private readonly deps: WebhookDeps) {}

  /** Acts on one verified event (at most once per event id, whatever the deliveries). */
  async handle(event: StripeEvent): Promise<WebhookOutcome> {
    const base = { event_id: event.id, type: event.type };
    const obj = event.data.object;
    let work: ((tx: DatabaseTransactionConnection, after: After) => Promise<string | null>) | null = null;
    switch (event.type) {
      case 'checkout.session.completed':
      case 'checkout.session.async_payment_succeeded': {
        const s = this.parse(SessionSchema, obj, event);
        if (s.mode === 'payment' && s.payment_status === 'paid') work = (tx, after) => this.creditSession(tx, after, s);
        else if (s.mode === 'subscription' && idOf(s.subscription)) {
          const state = await this.subscription(idOf(s.subscription)!);
          work = (tx, after) => applySubscription(this.deps.config, tx, after, state);
        }
        break;
      }
      case 'charge.refunded': {
        const charge = this.parse(ChargeSchema, await this.retrieve(() => this.deps.stripe.charges.retrieve(String(obj.id)), 'read the charge'), event);
        const session = await this.topupSessionFor(idOf(charge.payment_intent));
        if (session) work = (tx, after) => this.refund(tx, after, session, charge);
        break;
      }
      case 'charge.dispute.created':
      case 'charge.dispute.updated':
      case 'charge.dispute.closed':
      case 'charge.dispute.funds_withdrawn':
      case 'charge.dispute.funds_reinstated': {
        const dispute = this.parse(DisputeSchema, await this.retrieve(() => this.deps.stripe.disputes.retrieve(String(obj.id)), 'read the dispute'), event);
        const session = await this.topupSessionFor(idOf(dispute.payment_intent));
        if (session) work = (tx, after) => this.dispute(tx, after, session, dispute);
        break;
      }
      case 'customer.subscription.created':
      case 'customer.subscription.updated':
      case 'customer.subscription.deleted':
      case 'customer.subscription.paused':
      case 'customer.subscription.resumed': {
        const state = await this.subscription(String(obj.id));
        work = (tx, after) => applySubscription(this.deps.config, tx, after, state);
        break;
      }
      case 'invoice.paid': {
        const invoice = this.parse(InvoiceSchema, obj, event);
        const subId = invoiceSubscriptionId(invoice);
        const state = subId ? await this.subscription(subId) : null;
        // The subscription's row first, then the account's: every path locks in that order (no deadlock
        // between an invoice and a subscription event of the same account on two replicas).
        work = async (tx, after) => {
          const applied = state ? await applySubscription(this.deps.config, tx, after, state) : null;
          const granted = await grantInvoice(this.deps.config, tx, after, invoice);
          return granted ?? applied;
        };
        break;
      }
      default:
        break;
    }
    if (!work) {
      // Recorded too, so the event log shows it arrived; it moves nothing.
      await this.deps.pool.query(sql.unsafe`INSERT INTO stripe_events (id, type) VALUES (${event.id}, ${event.type}) ON CONFLICT (id) DO NOTHING`);
      return { ...base, outcome: 'ignored' };
    }
    const after: After = { credit: [], planChanged: false };
    const run = work;
    const outcome = await this.deps.pool.transaction(async (tx) => {
      const fresh = await tx.maybeOneFirst(sql.type(z.object({ id: z.string() }))`
        INSERT INTO stripe_events (id, type) VALUES (${event.id}, ${event.type}) ON CONFLICT (id) DO NOTHING RETURNING id`);
      if (fresh === null) return 'duplicate' as const;
      const accountId = await run(tx, after);
      if (accountId) await tx.query(sql.unsafe`UPDATE stripe_events SET account_id = ${accountId} WHERE id = ${event.id}`);
      return 'processed' as const;
    });
    // Committed: raise (or lower) admission's cached available credit. Should this fail, the
    // reconciler rebuilds it from Postgres.
    for (const c of after.credit) await this.deps.credits.toppedUp(c.accountId, c.cents);
    if (after.planChanged) await this.deps.plansChanged();
    if (outcome === 'processed') this.deps.log.info({ eventId: event.id, type: event.type }, 'stripe event processed');
    return { ...base, outcome };
  }

  private parse<S extends z.ZodTypeAny>(schema: S, value: unknown, event: StripeEvent): z.output<S> {
    const r = schema.safeParse(value);
    if (!r.success) throw new AppError('invalid_input', `The ${event.type} event's object is not what Stripe sends`, { reason: 'unexpected_object' });
    return r.data;
  }

  private async retrieve<T>(f: () => Promise<T>, what: string): Promise<T> {
    try {
      return await f();
    } catch (e) {
      throw stripeFailed(e, what);
    }
  }

  private async subscription(id: string): Promise<SubscriptionState> {
    const sub = await this.retrieve(() => this.deps.stripe.subscriptions.retrieve(id), 'read the subscription');
    const r = SubscriptionStateSchema.safeParse(sub);
    if (!r.success) throw new AppError('upstream_error', 'Stripe answered a subscription this service cannot read', { upstream: 'stripe' });
    return r.data;
  }

  /**
   * The paid top-up session behind a payment intent: from card_topups when it was credited, else
   * asked of Stripe (a refund or dispute delivered before its checkout.session.completed), else null
   * (not a top-up: a subscription's invoice, or another integration's payment).
   */
  private async topupSessionFor(paymentIntent: string | null): Promise<Session | null> {
    if (!paymentIntent) return null;
    const known = await this.deps.pool.maybeOne(sql.type(z.object({ session_id: z.string() }))`
      SELECT session_id FROM card_topups WHERE payment_intent = ${paymentIntent}`);
    const found: unknown = known
      ? await this.retrieve(() => this.deps.stripe.checkout.sessions.retrieve(known.session_id), 'read the Checkout session')
      : (await this.retrieve(() => this.deps.stripe.checkout.sessions.list({ payment_intent: paymentIntent, limit: 1 }), 'find the Checkout session')).data[0];
    const s = found ? SessionSchema.safeParse(found) : null;
    if (!s?.success || s.data.mode !== 'payment' || s.data.payment_status !== 'paid') return null;
    return s.data;
  }

  /** Credits a paid top-up session once; the account is ours only if the customer is its customer. */
  private async creditSession(tx: DatabaseTransactionConnection, after: After, s: Session): Promise<string | null> {
    const accountId = s.client_reference_id;
    const amount = s.amount_total ?? 0;
    // Credits are US cents: top-ups are opened in usd only (checkout.ts).
    if (!accountId || !Uuid.safeParse(accountId).success || amount <= 0 || s.currency !== 'usd') {
      this.deps.log.warn({ sessionId: s.id }, 'paid Checkout session without an account or an amount in usd: not credited');
      return null;
    }
    const owner = await accountOfCustomer(tx, idOf(s.customer));
    const exists = await tx.maybeOne(sql.type(Exists)`SELECT id FROM accounts WHERE id = ${accountId}`);
    if (!exists || owner !== accountId) {
      this.deps.log.warn({ sessionId: s.id }, 'paid Checkout session whose customer is not the account it names: not credited');
      return null;
    }
    await tx.query(sql.unsafe`
      INSERT INTO card_topups (session_id, account_id, payment_intent, amount_cents)
      VALUES (${s.id}, ${accountId}, ${idOf(s.payment_intent)}, ${amount})
      ON CONFLICT (session_id) DO NOTHING`);
    const r = await creditPaid(tx, {
      accountId,
      cents: amount,
      paidCents: amount,
      entryKey: `card-topup:${s.id}`,
      payer: null,
      sharePct: this.deps.config.PARTNER_SHARE_PCT,
    });
    if (r.inserted) after.credit.push({ accountId, cents: amount });
    return accountId;
  }

  private async lockTopup(tx: DatabaseTransactionConnection, after: After, s: Session) {
    let row = await tx.maybeOne(sql.type(TopupRow)`
      SELECT session_id, account_id, amount_cents, refunded_cents FROM card_topups WHERE session_id = ${s.id} FOR UPDATE`);
    if (!row) {
      // The refund or dispute came first: the payment is credited now, then taken back below.
      if (!(await this.creditSession(tx, after, s))) return null;
      row = await tx.one(sql.type(TopupRow)`
        SELECT session_id, account_id, amount_cents, refunded_cents FROM card_topups WHERE session_id = ${s.id} FOR UPDATE`);
    }
    return row;
  }

  private async refund(tx: DatabaseTransactionConnection, after: After, s: Session, charge: z.infer<typeof ChargeSchema>) {
    const row = await this.lockTopup(tx, after, s);
    if (!row) return null;
    const total = Math.min(charge.amount_refunded, row.amount_cents);
    const delta = total - row.refunded_cents;
    if (delta <= 0) return row.account_id;
    const r = await adjust(tx, after, row.account_id, -delta, `card-refund:${charge.id}:${total}`);
    await tx.query(sql.unsafe`
      UPDATE card_topups SET refunded_cents = ${total}, shortfall_cents = shortfall_cents + ${r.shortfall} WHERE session_id = ${row.session_id}`);
    if (r.shortfall > 0)
      this.deps.log.warn(
        { accountId: row.account_id, sessionId: row.session_id, refunded: delta, shortfall: r.shortfall },
        'card refund larger than the balance: the rest was already spent',
      );
    return row.account_id;
  }

  private async dispute(tx: DatabaseTransactionConnection, after: After, s: Session, d: z.infer<typeof DisputeSchema>) {
    const row = await this.lockTopup(tx, after, s);
    if (!row) return null;
    const target = d.status === 'lost' ? 'lost' : ['won', 'warning_closed', 'prevented'].includes(d.status) ? 'won' : 'open';
    const amount = Math.min(d.amount, row.amount_cents);
    await tx.query(sql.unsafe`
      INSERT INTO card_disputes (dispute_id, session_id, account_id, amount_cents, status)
      VALUES (${d.id}, ${row.session_id}, ${row.account_id}, ${amount}, 'open') ON CONFLICT (dispute_id) DO NOTHING`);
    const cur = await tx.one(sql.type(DisputeRow)`SELECT account_id, debited_cents, status FROM card_disputes WHERE dispute_id = ${d.id} FOR UPDATE`);
    if (cur.status !== 'open') return row.account_id;
    // Open or lost: the disputed credits are frozen (once). Won first seen: nothing was ever frozen.
    let debited = cur.debited_cents;
    if (target !== 'won') {
      const r = await adjust(tx, after, row.account_id, -amount, `card-dispute:${d.id}`);
      if (r.inserted) {
        debited = -r.moved;
        await tx.query(sql.unsafe`UPDATE card_disputes SET debited_cents = ${debited}, shortfall_cents = ${r.shortfall} WHERE dispute_id = ${d.id}`);
        if (r.shortfall > 0)
          this.deps.log.warn({ accountId: row.account_id, disputeId: d.id, shortfall: r.shortfall }, 'disputed amount larger than the balance');
      }
    }
    if (target === 'won' && debited > 0) await adjust(tx, after, row.account_id, debited, `card-dispute-won:${d.id}`);
    if (target !== 'open') await tx.query(sql.unsafe`UPDATE card_disputes SET status = ${target}, updated_at = now() WHERE dispute_id = ${d.id}`);
    return row.account_id;
  }
}
