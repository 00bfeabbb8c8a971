import { createHash, randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { decodeForm, type FormObject, type FormValue } from './form.js';
import { signPayload } from './sign.js';

/**
 * A local fake of Stripe's API for the endpoints Tollgate uses, in Stripe's wire format as its
 * published OpenAPI description (github.com/stripe/openapi, spec3 and its fixtures) states it:
 *
 * - requests are form-encoded with bracket notation, authenticated with `Authorization: Bearer sk_...`
 *   (401 otherwise); a POST's `Idempotency-Key` replays the first answer (`Idempotent-Replayed: true`)
 *   and a reuse with other parameters is 400 `idempotency_error`;
 * - answers are the objects of API version 2025-03-31 and later: `object` and Stripe's id prefixes
 *   (cus_, cs_, pi_, ch_, re_, dp_, sub_, si_, in_, il_, price_, prod_, bps_, evt_), a subscription's
 *   period on its items, an invoice's subscription under `parent.subscription_details`, a line's
 *   price under `pricing.price_details`;
 * - errors are `{"error": {"type", "code", "message", "param"}}` with Stripe's statuses (400
 *   parameter_missing / parameter_invalid_integer, 404 resource_missing, 401, 404 for unknown URLs).
 *
 * Control endpoints outside Stripe's paths (`/_fake/...`) change its state as a customer or the card
 * network would (pay a Checkout session, renew, change or cancel a subscription, refund, dispute)
 * and answer the events Stripe would send, each with its raw payload and `Stripe-Signature`, for the
 * test to deliver as often, in whatever order and as concurrently as it likes.
 */

export const FAKE_API_VERSION = '2026-10-28.endive';
const DAY = 86_400;
const PERIOD = 30 * DAY;

type Obj = Record<string, any>;

export interface SignedEvent {
  id: string;
  type: string;
  /** The raw JSON body Stripe would POST. */
  payload: string;
  /** Its Stripe-Signature header. */
  signature: string;
}

export interface FakeStripe {
  url: string;
  secretKey: string;
  webhookSecret: string;
  /** Every API request (not control requests): method, path, decoded params, headers. */
  requests: Array<{ method: string; path: string; params: FormObject; idempotencyKey?: string }>;
  /** Every event produced, in order. */
  events: SignedEvent[];
  /** Stored objects by id (read-only use in tests). */
  objects: Map<string, Obj>;
  /** POSTs a control request (`/_fake/...`) and answers its JSON (events the change produced); throws on a Stripe error. */
  act<T = { events: SignedEvent[] }>(path: string, body?: Record<string, unknown>): Promise<T>;
  /** Moves the fake's clock (seconds since epoch) by `seconds`. */
  advance(seconds: number): void;
  now(): number;
  close(): Promise<void>;
}

class StripeError extends Error {
  constructor(
    readonly status: number,
    readonly type: string,
    message: string,
    readonly code?: string,
    readonly param?: string,
  ) {
    super(message);
  }
  body() {
    return { error: { type: this.type, message: this.message, ...(this.code ? { code: this.code } : {}), ...(this.param ? { param: this.param } : {}) } };
  }
}

const missing = (param: string) => new StripeError(400, 'invalid_request_error', `Missing required param: ${param}.`, 'parameter_missing', param);
const noSuch = (what: string, id: string, param = 'id') => new StripeError(404, 'invalid_request_error', `No such ${what}: '${id}'`, 'resource_missing', param);

function str(p: FormObject, key: string, required = false): string | undefined {
  const v = p[key];
  if (v === undefined || v === '') {
    if (required) throw missing(key);
    return undefined;
  }
  if (typeof v !== 'string') throw new StripeError(400, 'invalid_request_error', `Invalid string: ${key}`, 'parameter_invalid_string', key);
  return v;
}

function int(v: FormValue | undefined, param: string): number {
  if (typeof v !== 'string' || !/^-?\d+$/.test(v))
    throw new StripeError(400, 'invalid_request_error', `Invalid integer: ${String(v)}`, 'parameter_invalid_integer', param);
  return Number(v);
}

function metadata(v: FormValue | undefined): Record<string, string> {
  if (v === undefined || v === '') return {};
  if (typeof v !== 'object' || Array.isArray(v)) throw new StripeError(400, 'invalid_request_error', 'Invalid object', 'parameter_invalid_object', 'metadata');
  const out: Record<string, string> = {};
  for (const [k, x] of Object.entries(v)) if (typeof x === 'string') out[k] = x;
  return out;
}

const clone = <T>(x: T): T => JSON.parse(JSON.stringify(x)) as T;

export async function startFakeStripe(opts: { secretKey?: string; webhookSecret?: string; port?: number } = {}): Promise<FakeStripe> {
  const secretKey = opts.secretKey ?? `sk_test_${randomBytes(12).toString('hex')}`;
  const webhookSecret = opts.webhookSecret ?? `whsec_${randomBytes(16).toString('hex')}`;
  const objects = new Map<string, Obj>();
  const requests: FakeStripe['requests'] = [];
  const events: SignedEvent[] = [];
  const idempotent = new Map<string, { fingerprint: string; status: number; body: string }>();
  let clockOffset = 0;
  const now = () => Math.floor(Date.now() / 1000) + clockOffset;
  const id = (prefix: string) => `${prefix}_${randomBytes(12).toString('base64url').replace(/[-_]/g, 'x')}`;

  function get(prefix: string, what: string, key: string | undefined, param = 'id'): Obj {
    const o = key ? objects.get(key) : undefined;
    if (!o || !key!.startsWith(`${prefix}_`)) throw noSuch(what, key ?? '', param);
    return o;
  }

  function emit(type: string, object: Obj, previous?: Obj): SignedEvent {
    const event = {
      id: id('evt'),
      object: 'event',
      api_version: FAKE_API_VERSION,
      created: now(),
      data: { object: clone(object), ...(previous ? { previous_attributes: previous } : {}) },
      livemode: false,
      pending_webhooks: 1,
      request: { id: null, idempotency_key: null },
      type,
    };
    objects.set(event.id, event);
    const payload = JSON.stringify(event, null, 2);
    const signed = { id: event.id, type, payload, signature: signPayload(payload, webhookSecret) };
    events.push(signed);
    return signed;
  }

  function list(data: Obj[], url: string) {
    return { object: 'list', data, has_more: false, url };
  }

  function customer(p: FormObject): Obj {
    const c = {
      id: id('cus'),
      object: 'customer',
      address: null,
      balance: 0,
      created: now(),
      currency: null,
      default_source: null,
      delinquent: false,
      description: str(p, 'description') ?? null,
      email: str(p, 'email') ?? null,
      invoice_prefix: randomBytes(4).toString('hex').toUpperCase(),
      invoice_settings: { custom_fields: null, default_payment_method: null, footer: null, rendering_options: null },
      livemode: false,
      metadata: metadata(p.metadata),
      name: str(p, 'name') ?? null,
      phone: null,
      preferred_locales: [],
      shipping: null,
      tax_exempt: 'none',
      test_clock: null,
    };
    objects.set(c.id, c);
    return c;
  }

  function price(p: FormObject): Obj {
    const currency = str(p, 'currency', true)!;
    const unit = int(p.unit_amount, 'unit_amount');
    const recurring = p.recurring as FormObject | undefined;
    let product = str(p, 'product');
    if (!product) {
      const pd = p.product_data as FormObject | undefined;
      if (!pd) throw missing('product');
      product = id('prod');
      objects.set(product, { id: product, object: 'product', name: str(pd, 'name', true), active: true, created: now(), metadata: {} });
    }
    const pr = {
      id: id('price'),
      object: 'price',
      active: true,
      billing_scheme: 'per_unit',
      created: now(),
      currency,
      livemode: false,
      lookup_key: str(p, 'lookup_key') ?? null,
      metadata: metadata(p.metadata),
      nickname: str(p, 'nickname') ?? null,
      product,
      recurring: recurring
        ? { interval: str(recurring, 'interval', true), interval_count: 1, meter: null, usage_type: 'licensed', trial_period_days: null }
        : null,
      tax_behavior: 'unspecified',
      type: recurring ? 'recurring' : 'one_time',
      unit_amount: unit,
      unit_amount_decimal: String(unit),
    };
    objects.set(pr.id, pr);
    return pr;
  }

  function checkoutSession(p: FormObject, base: string): Obj {
    const mode = str(p, 'mode', true)!;
    if (!['payment', 'subscription', 'setup'].includes(mode))
      throw new StripeError(400, 'invalid_request_error', `Invalid mode: must be one of payment, setup, or subscription`, 'parameter_invalid_string', 'mode');
    const cust = str(p, 'customer');
    if (cust) get('cus', 'customer', cust, 'customer');
    const items = p.line_items;
    if (!Array.isArray(items) || items.length === 0) throw missing('line_items');
    let total = 0;
    let currency = 'usd';
    const lines = items.map((raw, i) => {
      const li = raw as FormObject;
      const quantity = li.quantity === undefined ? 1 : int(li.quantity, `line_items[${i}][quantity]`);
      let pr: Obj;
      const priceId = str(li, 'price');
      if (priceId) pr = get('price', 'price', priceId, `line_items[${i}][price]`);
      else if (li.price_data) {
        const pd = li.price_data as FormObject;
        const unit = int(pd.unit_amount, `line_items[${i}][price_data][unit_amount]`);
        if (unit < 0) throw new StripeError(400, 'invalid_request_error', 'This value must be greater than or equal to 0.', 'parameter_invalid_integer');
        pr = price({ ...pd, unit_amount: String(unit) });
      } else throw missing(`line_items[${i}][price]`);
      if (mode === 'subscription' && !pr.recurring)
        throw new StripeError(400, 'invalid_request_error', 'You must provide at least one recurring price in `subscription` mode when using prices.');
      if (mode === 'payment' && pr.recurring) throw new StripeError(400, 'invalid_request_error', 'You specified `payment` mode but passed a recurring price.');
      total += pr.unit_amount * quantity;
      currency = pr.currency;
      return {
        id: id('li'),
        object: 'item',
        amount_subtotal: pr.unit_amount * quantity,
        amount_total: pr.unit_amount * quantity,
        currency,
        price: pr,
        quantity,
      };
    });
    if (mode === 'payment' && total < 50)
      throw new StripeError(400, 'invalid_request_error', 'The Checkout Session\u2019s total amount due must add up to at least $0.50 usd', 'amount_too_small');
    const sid = `cs_test_${randomBytes(24).toString('base64url').replace(/[-_]/g, 'x')}`;
    const s = {
      id: sid,
      object: 'checkout.session',
      amount_subtotal: total,
      amount_total: total,
      cancel_url: str(p, 'cancel_url') ?? null,
      client_reference_id: str(p, 'client_reference_id') ?? null,
      created: now(),
      currency,
      customer: cust ?? null,
      customer_email: str(p, 'customer_email') ?? null,
      expires_at: now() + DAY,
      invoice: null,
      livemode: false,
      metadata: metadata(p.metadata),
      mode,
      payment_intent: null as string | null,
      payment_status: 'unpaid',
      status: 'open',
      subscription: null as string | null,
      success_url: str(p, 'success_url') ?? null,
      url: `${base}/_fake/checkout/${sid}`,
      // Not part of the object Stripe answers; kept for the fake's own bookkeeping.
      _lines: lines,
      _subscription_metadata: metadata((p.subscription_data as FormObject | undefined)?.metadata),
      _payment_intent_metadata: metadata((p.payment_intent_data as FormObject | undefined)?.metadata),
    };
    objects.set(sid, s);
    return s;
  }

  const view = (o: Obj) => Object.fromEntries(Object.entries(o).filter(([k]) => !k.startsWith('_')));

  function charge(amount: number, currency: string, customerId: string | null, pi: string, invoice: string | null, meta: Record<string, string>): Obj {
    const ch = {
      id: id('ch'),
      object: 'charge',
      amount,
      amount_captured: amount,
      amount_refunded: 0,
      balance_transaction: id('txn'),
      captured: true,
      created: now(),
      currency,
      customer: customerId,
      description: null,
      disputed: false,
      invoice,
      livemode: false,
      metadata: meta,
      paid: true,
      payment_intent: pi,
      payment_method: id('pm'),
      refunded: false,
      status: 'succeeded',
    };
    objects.set(ch.id, ch);
    return ch;
  }

  function paymentIntent(amount: number, currency: string, customerId: string | null, meta: Record<string, string>): Obj {
    const pi = {
      id: id('pi'),
      object: 'payment_intent',
      amount,
      amount_received: amount,
      currency,
      customer: customerId,
      created: now(),
      latest_charge: null as string | null,
      livemode: false,
      metadata: meta,
      status: 'succeeded',
    };
    objects.set(pi.id, pi);
    const ch = charge(amount, currency, customerId, pi.id, null, {});
    pi.latest_charge = ch.id;
    return pi;
  }

  function subItem(subId: string, pr: Obj, start: number): Obj {
    return {
      id: id('si'),
      object: 'subscription_item',
      created: now(),
      current_period_end: start + PERIOD,
      current_period_start: start,
      metadata: {},
      price: pr,
      quantity: 1,
      subscription: subId,
    };
  }

  function invoice(sub: Obj, reason: string): Obj {
    const item = sub.items.data[0];
    const pr = item.price;
    const inv = {
      id: id('in'),
      object: 'invoice',
      amount_due: pr.unit_amount,
      amount_paid: pr.unit_amount,
      amount_remaining: 0,
      attempt_count: 1,
      attempted: true,
      billing_reason: reason,
      collection_method: 'charge_automatically',
      created: now(),
      currency: pr.currency,
      customer: sub.customer,
      lines: list(
        [
          {
            id: id('il'),
            object: 'line_item',
            amount: pr.unit_amount,
            currency: pr.currency,
            description: `1 \u00d7 (at $${(pr.unit_amount / 100).toFixed(2)} / month)`,
            metadata: {},
            parent: {
              type: 'subscription_item_details',
              subscription_item_details: { subscription: sub.id, subscription_item: item.id, proration: false, invoice_item: null },
            },
            period: { start: item.current_period_start, end: item.current_period_end },
            pricing: { type: 'price_details', price_details: { price: pr.id, product: pr.product }, unit_amount_decimal: String(pr.unit_amount) },
            quantity: 1,
          },
        ],
        '/v1/invoices/lines',
      ),
      livemode: false,
      metadata: {},
      parent: { type: 'subscription_details', quote_details: null, subscription_details: { metadata: sub.metadata, subscription: sub.id } },
      period_end: item.current_period_start,
      period_start: item.current_period_start,
      status: 'paid',
      status_transitions: { paid_at: now(), finalized_at: now() },
      subtotal: pr.unit_amount,
      total: pr.unit_amount,
    };
    objects.set(inv.id, inv);
    charge(pr.unit_amount, pr.currency, sub.customer, id('pi'), inv.id, {});
    sub.latest_invoice = inv.id;
    return inv;
  }

  // Control: what a customer, a renewal, the bank or the card network does.
  function control(method: string, path: string, p: Obj): unknown {
    let m: RegExpExecArray | null;
    if (method === 'POST' && (m = /^\/_fake\/checkout\/([^/]+)\/pay$/.exec(path))) {
      const s = get('cs', 'checkout session', m[1]);
      if (s.status !== 'open') throw new StripeError(400, 'invalid_request_error', `Checkout session ${s.id} is ${s.status}`);
      const out: SignedEvent[] = [];
      s.status = 'complete';
      s.payment_status = 'paid';
      if (s.mode === 'payment') {
        const pi = paymentIntent(s.amount_total, s.currency, s.customer, s._payment_intent_metadata);
        s.payment_intent = pi.id;
        out.push(emit('payment_intent.succeeded', pi), emit('charge.succeeded', objects.get(pi.latest_charge)!));
        out.push(emit('checkout.session.completed', view(s)));
      } else if (s.mode === 'subscription') {
        const subId = id('sub');
        const start = now();
        const sub = {
          id: subId,
          object: 'subscription',
          billing_cycle_anchor: start,
          cancel_at: null as number | null,
          cancel_at_period_end: false,
          canceled_at: null as number | null,
          collection_method: 'charge_automatically',
          created: start,
          currency: s.currency,
          customer: s.customer,
          ended_at: null as number | null,
          items: list([subItem(subId, s._lines[0].price, start)], `/v1/subscription_items?subscription=${subId}`),
          latest_invoice: null as string | null,
          livemode: false,
          metadata: s._subscription_metadata,
          start_date: start,
          status: 'active',
        };
        objects.set(subId, sub);
        const inv = invoice(sub, 'subscription_create');
        s.subscription = subId;
        s.invoice = inv.id;
        out.push(emit('customer.subscription.created', sub), emit('invoice.paid', inv), emit('checkout.session.completed', view(s)));
      }
      return { events: out };
    }
    if (method === 'POST' && (m = /^\/_fake\/subscriptions\/([^/]+)\/(renew|price|cancel)$/.exec(path))) {
      const sub = get('sub', 'subscription', m[1]);
      if (sub.status === 'canceled') throw new StripeError(400, 'invalid_request_error', `Subscription ${sub.id} is canceled`);
      const item = sub.items.data[0];
      if (m[2] === 'renew') {
        // The period ends: a subscription set to cancel then ends; otherwise the next is invoiced.
        clockOffset += Math.max(0, item.current_period_end - now());
        if (sub.cancel_at_period_end) {
          sub.status = 'canceled';
          sub.ended_at = now();
          sub.canceled_at ??= now();
          return { events: [emit('customer.subscription.deleted', sub)] };
        }
        const previous = { items: clone(sub.items) };
        item.current_period_start = item.current_period_end;
        item.current_period_end = item.current_period_start + PERIOD;
        const inv = invoice(sub, 'subscription_cycle');
        return { events: [emit('invoice.paid', inv), emit('customer.subscription.updated', sub, previous)] };
      }
      if (m[2] === 'price') {
        // As POST /v1/subscriptions/{id} with items[0][price] and proration_behavior=none.
        const previous = { items: clone(sub.items) };
        item.price = get('price', 'price', p.price, 'price');
        return { events: [emit('customer.subscription.updated', sub, previous)] };
      }
      if (p.at_period_end === false) {
        sub.status = 'canceled';
        sub.canceled_at = now();
        sub.ended_at = now();
        return { events: [emit('customer.subscription.deleted', sub)] };
      }
      sub.cancel_at_period_end = true;
      sub.cancel_at = item.current_period_end;
      sub.canceled_at = now();
      return { events: [emit('customer.subscription.updated', sub, { cancel_at_period_end: false, cancel_at: null, canceled_at: null })] };
    }
    if (method === 'POST' && (m = /^\/_fake\/charges\/([^/]+)\/(refund|dispute)$/.exec(path))) {
      const ch = get('ch', 'charge', m[1]);
      const amount = p.amount === undefined ? ch.amount - ch.amount_refunded : Number(p.amount);
      if (m[2] === 'refund') {
        if (!Number.isInteger(amount) || amount <= 0 || amount > ch.amount - ch.amount_refunded)
          throw new StripeError(400, 'invalid_request_error', `Refund amount (${amount}) is greater than unrefunded amount on charge`, 'amount_too_large');
        const re = {
          id: id('re'),
          object: 'refund',
          amount,
          charge: ch.id,
          created: now(),
          currency: ch.currency,
          metadata: {},
          payment_intent: ch.payment_intent,
          reason: p.reason ?? null,
          status: 'succeeded',
        };
        objects.set(re.id, re);
        const previous = { amount_refunded: ch.amount_refunded, refunded: ch.refunded };
        ch.amount_refunded += amount;
        ch.refunded = ch.amount_refunded === ch.amount;
        return { refund: re, events: [emit('refund.created', re), emit('charge.refunded', ch, previous)] };
      }
      const dp = {
        id: id('dp'),
        object: 'dispute',
        amount,
        balance_transactions: [],
        charge: ch.id,
        created: now(),
        currency: ch.currency,
        evidence_details: { due_by: now() + 7 * DAY, has_evidence: false, past_due: false, submission_count: 0 },
        is_charge_refundable: false,
        livemode: false,
        metadata: {},
        payment_intent: ch.payment_intent,
        reason: p.reason ?? 'fraudulent',
        status: 'needs_response',
      };
      objects.set(dp.id, dp);
      ch.disputed = true;
      return { dispute: dp, events: [emit('charge.dispute.created', dp)] };
    }
    if (method === 'POST' && (m = /^\/_fake\/disputes\/([^/]+)\/close$/.exec(path))) {
      const dp = get('dp', 'dispute', m[1]);
      if (p.status !== 'won' && p.status !== 'lost')
        throw new StripeError(400, 'invalid_request_error', 'status must be won or lost', 'parameter_invalid_string', 'status');
      const previous = { status: dp.status };
      dp.status = p.status;
      return { events: [emit('charge.dispute.closed', dp, previous)] };
    }
    if (method === 'POST' && path === '/_fake/events/unrelated') {
      return { events: [emit('customer.updated', { id: id('cus'), object: 'customer', metadata: {} }, { email: null })] };
    }
    throw new StripeError(404, 'invalid_request_error', `Unrecognized fake control URL (${method}: ${path})`);
  }

  // The Stripe API itself.
  function api(method: string, path: string, p: FormObject, base: string): { status?: number; body: unknown } {
    let m: RegExpExecArray | null;
    if (method === 'POST' && path === '/v1/customers') return { body: customer(p) };
    if (method === 'GET' && (m = /^\/v1\/customers\/([^/]+)$/.exec(path))) return { body: get('cus', 'customer', m[1]) };
    if (method === 'POST' && path === '/v1/prices') return { body: price(p) };
    if (method === 'GET' && (m = /^\/v1\/prices\/([^/]+)$/.exec(path))) return { body: get('price', 'price', m[1]) };
    if (method === 'POST' && path === '/v1/checkout/sessions') return { body: view(checkoutSession(p, base)) };
    if (method === 'GET' && (m = /^\/v1\/checkout\/sessions\/([^/]+)$/.exec(path))) return { body: view(get('cs', 'checkout session', m[1])) };
    if (method === 'GET' && path === '/v1/checkout/sessions') {
      const pi = str(p, 'payment_intent');
      const all = [...objects.values()].filter((o) => o.object === 'checkout.session' && (!pi || o.payment_intent === pi));
      return { body: list(all.map(view), '/v1/checkout/sessions') };
    }
    if (method === 'GET' && (m = /^\/v1\/subscriptions\/([^/]+)$/.exec(path))) return { body: get('sub', 'subscription', m[1]) };
    if (method === 'GET' && (m = /^\/v1\/invoices\/([^/]+)$/.exec(path))) return { body: get('in', 'invoice', m[1]) };
    if (method === 'GET' && (m = /^\/v1\/charges\/([^/]+)$/.exec(path))) return { body: get('ch', 'charge', m[1]) };
    if (method === 'GET' && (m = /^\/v1\/disputes\/([^/]+)$/.exec(path))) return { body: get('dp', 'dispute', m[1]) };
    if (method === 'GET' && (m = /^\/v1\/events\/([^/]+)$/.exec(path))) return { body: get('evt', 'event', m[1]) };
    if (method === 'POST' && path === '/v1/billing_portal/sessions') {
      const cust = str(p, 'customer', true)!;
      get('cus', 'customer', cust, 'customer');
      const s = {
        id: id('bps'),
        object: 'billing_portal.session',
        configuration: 'bpc_fakeDefaultConfiguration',
        created: now(),
        customer: cust,
        flow: null,
        livemode: false,
        locale: null,
        on_behalf_of: null,
        return_url: str(p, 'return_url') ?? null,
        url: `${base}/_fake/portal/${randomBytes(16).toString('hex')}`,
      };
      objects.set(s.id, s);
      return { body: s };
    }
    throw new StripeError(
      404,
      'invalid_request_error',
      `Unrecognized request URL (${method}: ${path}). Please see https://stripe.com/docs or we can help at https://support.stripe.com/.`,
    );
  }

  async function handle(req: IncomingMessage, res: ServerResponse) {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const raw = Buffer.concat(chunks).toString('utf8');
    const url = new URL(req.url ?? '/', 'http://fake');
    const method = req.method ?? 'GET';
    const base = `http://${req.headers.host}`;
    const send = (status: number, body: unknown, headers: Record<string, string> = {}) => {
      const text = typeof body === 'string' ? body : JSON.stringify(body, null, 2);
      res.writeHead(status, {
        'content-type': 'application/json',
        'request-id': `req_${randomBytes(7).toString('hex')}`,
        'stripe-version': FAKE_API_VERSION,
        ...headers,
      });
      res.end(text);
    };
    try {
      if (url.pathname.startsWith('/_fake/')) return send(200, control(method, url.pathname, raw ? (JSON.parse(raw) as Obj) : {}));
      // Stripe takes the key as a bearer token, or as the user name of Basic auth (curl -u sk_test_...:).
      const basic = /^Basic (\S+)$/.exec(req.headers.authorization ?? '')?.[1];
      const given = /^Bearer (\S+)$/.exec(req.headers.authorization ?? '')?.[1] ?? (basic ? Buffer.from(basic, 'base64').toString().split(':')[0] : undefined);
      if (given !== secretKey) {
        const message = given
          ? `Invalid API Key provided: ${given.slice(0, 8)}${'*'.repeat(Math.max(0, given.length - 12))}${given.slice(-4)}`
          : "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').";
        return send(401, new StripeError(401, 'invalid_request_error', message).body(), { 'www-authenticate': 'Bearer realm="Stripe"' });
      }
      const params = method === 'GET' || method === 'DELETE' ? decodeForm(url.search.slice(1)) : decodeForm(raw);
      const key = typeof req.headers['idempotency-key'] === 'string' ? req.headers['idempotency-key'] : undefined;
      requests.push({ method, path: url.pathname, params, ...(key ? { idempotencyKey: key } : {}) });
      if (method === 'POST' && key) {
        const fingerprint = createHash('sha256').update(`${url.pathname}\n${raw}`).digest('hex');
        const seen = idempotent.get(key);
        if (seen) {
          if (seen.fingerprint !== fingerprint)
            return send(
              400,
              new StripeError(
                400,
                'idempotency_error',
                `Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '${key}' if you meant to execute a different request.`,
              ).body(),
            );
          return send(seen.status, seen.body, { 'idempotent-replayed': 'true', 'idempotency-key': key });
        }
        let status = 200;
        let body: string;
        try {
          const out = api(method, url.pathname, params, base);
          status = out.status ?? 200;
          body = JSON.stringify(out.body, null, 2);
        } catch (e) {
          if (!(e instanceof StripeError)) throw e;
          status = e.status;
          body = JSON.stringify(e.body(), null, 2);
        }
        idempotent.set(key, { fingerprint, status, body });
        return send(status, body, { 'idempotency-key': key });
      }
      const out = api(method, url.pathname, params, base);
      return send(out.status ?? 200, out.body);
    } catch (e) {
      if (e instanceof StripeError) return send(e.status, e.body());
      return send(500, { error: { type: 'api_error', message: (e as Error).message } });
    }
  }

  const server = createServer((req, res) => void handle(req, res));
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(opts.port ?? 0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    secretKey,
    webhookSecret,
    requests,
    events,
    objects,
    act: async (path, body) => {
      const res = await fetch(`http://127.0.0.1:${port}${path}`, { method: 'POST', body: body ? JSON.stringify(body) : undefined });
      const out = (await res.json()) as any;
      if (!res.ok) throw new Error(`fake Stripe ${path}: ${res.status} ${JSON.stringify(out)}`);
      return out;
    },
    advance: (s) => {
      clockOffset += s;
    },
    now,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
