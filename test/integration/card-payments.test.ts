import Stripe from 'stripe';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { sql } from '../../src/db/pool.js';
import { createPartner } from '../../src/money/partners.js';
import { deliver, only } from '../fakes/stripe/deliver.js';
import { type FakeStripe, type SignedEvent, startFakeStripe } from '../fakes/stripe/fake-stripe.js';
import { signPayload } from '../fakes/stripe/sign.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';

/**
 * Card top-ups through Stripe Checkout, against a local fake of Stripe's API: the session opened,
 * paid, and its webhook delivered again and again, out of order, to two replicas at once; bad
 * signatures; refunds and disputes by the documented rule; bad input; Stripe unset.
 */

let fake: FakeStripe;
let h: Harness;
let replica: Harness;
let off: Harness;

beforeAll(async () => {
  fake = await startFakeStripe();
  const env = { STRIPE_SECRET_KEY: fake.secretKey, STRIPE_WEBHOOK_SECRET: fake.webhookSecret, STRIPE_API_URL: fake.url, RECONCILE_SECONDS: '0' };
  h = await startHarness(env, { workers: [] });
  // A second API replica: same database, same Redis prefix.
  replica = await startHarness({ ...env, REDIS_PREFIX: h.config.REDIS_PREFIX }, { workers: [] });
  off = await startHarness({ RECONCILE_SECONDS: '0' }, { workers: [] });
}, 90_000);

afterAll(async () => {
  await replica?.close();
  await h?.close();
  await off?.close();
  await fake?.close();
});

const auth = (a: TestAccount) => ({ authorization: `Bearer ${a.apiKey}`, 'content-type': 'application/json' });

async function checkout(a: TestAccount, cents: number): Promise<{ id: string; url: string }> {
  const res = await h.request({ method: 'POST', url: '/credits/checkout', headers: auth(a), payload: { cents } });
  expect(res.statusCode, res.body).toBe(201);
  return json(res);
}

/** Opens a top-up and pays it at the fake: the events Stripe would send. */
async function paidTopup(a: TestAccount, cents: number) {
  const s = await checkout(a, cents);
  const { events } = await fake.act(`/_fake/checkout/${s.id}/pay`);
  const session = fake.objects.get(s.id)!;
  return {
    session: s,
    events,
    completed: only(events, 'checkout.session.completed'),
    charge: fake.objects.get(session.payment_intent)!.latest_charge as string,
  };
}

const credits = (a: TestAccount) => h.credits(a.accountId);
const lines = (entryKey: string) =>
  h.container.pool.any(sql.type(z.object({ delta_cents: z.number(), kind: z.string() }))`SELECT delta_cents, kind FROM ledger WHERE entry_key = ${entryKey}`);

/** What settlement would do for a call: the balance spent, with its ledger line. */
async function spend(a: TestAccount, cents: number) {
  await h.container.pool.transaction(async (tx) => {
    await tx.query(
      sql.unsafe`INSERT INTO ledger (entry_key, account_id, kind, delta_cents, tool) VALUES (${`test-spend:${crypto.randomUUID()}`}, ${a.accountId}, 'charge', ${-cents}, 'test')`,
    );
    await tx.query(sql.unsafe`UPDATE accounts SET credits = credits - ${cents} WHERE id = ${a.accountId}`);
  });
}

describe('the fake speaks Stripe', () => {
  it('signs events as Stripe does (cross-checked with the stripe package) and the client verifies them', () => {
    const payload = JSON.stringify({ id: 'evt_1', object: 'event' });
    const t = 1_700_000_000;
    expect(signPayload(payload, fake.webhookSecret, t)).toBe(Stripe.webhooks.generateTestHeaderString({ payload, secret: fake.webhookSecret, timestamp: t }));
    const now = signPayload(payload, fake.webhookSecret);
    expect(new Stripe('sk_test_x').webhooks.constructEvent(payload, now, fake.webhookSecret).id).toBe('evt_1');
  });

  it('refuses a wrong key (401), answers Stripe error objects, and replays an Idempotency-Key', async () => {
    const port = Number(new URL(fake.url).port);
    const wrong = new Stripe('sk_test_wrong', { host: '127.0.0.1', port, protocol: 'http', maxNetworkRetries: 0 });
    await expect(wrong.customers.create({})).rejects.toMatchObject({ type: 'StripeAuthenticationError', statusCode: 401 });
    const client = new Stripe(fake.secretKey, { host: '127.0.0.1', port, protocol: 'http', maxNetworkRetries: 0 });
    await expect(client.customers.retrieve('cus_nope')).rejects.toMatchObject({ statusCode: 404, code: 'resource_missing', param: 'id' });
    await expect(client.checkout.sessions.create({ line_items: [] } as never)).rejects.toMatchObject({
      statusCode: 400,
      code: 'parameter_missing',
      param: 'mode',
    });
    const a = await client.customers.create({ metadata: { account_id: 'x' } }, { idempotencyKey: 'same-key' });
    const b = await client.customers.create({ metadata: { account_id: 'x' } }, { idempotencyKey: 'same-key' });
    expect(b.id).toBe(a.id);
    expect(a.metadata).toEqual({ account_id: 'x' });
    await expect(client.customers.create({ metadata: { account_id: 'y' } }, { idempotencyKey: 'same-key' })).rejects.toMatchObject({
      type: 'StripeIdempotencyError',
      statusCode: 400,
    });
  });
});

describe('POST /credits/checkout', () => {
  it('creates the customer once (account id and partner code in metadata) and a payment session for exactly the cents', async () => {
    const code = `CARD-${Math.random().toString(36).slice(2, 8)}`;
    const partner = await createPartner(h.container.pool, 'Card partner', code);
    const signup = await h.admin.signUp('card@example.com', partner.id, null);
    const a = { accountId: signup.account_id, apiKey: signup.api_key, keyId: signup.key_id };
    const first = await checkout(a, 1234);
    expect(first.id).toMatch(/^cs_test_/);
    expect(first.url).toContain(first.id);
    await checkout(a, 777);
    const customers = fake.requests.filter((r) => r.path === '/v1/customers');
    const mine = customers.filter((r) => (r.params.metadata as Record<string, string>).account_id === a.accountId);
    expect(mine).toHaveLength(1);
    expect(mine[0]!.params.metadata).toEqual({ account_id: a.accountId, partner_code: code });
    const sessions = fake.requests.filter((r) => r.path === '/v1/checkout/sessions' && r.params.client_reference_id === a.accountId);
    expect(sessions).toHaveLength(2);
    expect(sessions[0]!.params).toMatchObject({
      mode: 'payment',
      line_items: [{ quantity: '1', price_data: { currency: 'usd', unit_amount: '1234' } }],
      metadata: { account_id: a.accountId },
    });
    expect(sessions[0]!.params.customer).toBe(sessions[1]!.params.customer);
  });

  it.each([
    ['negative', { cents: -500 }],
    ['zero', { cents: 0 }],
    ['below CHECKOUT_MIN_CENTS', { cents: 499 }],
    ['above CHECKOUT_MAX_CENTS', { cents: 100_001 }],
    ['huge', { cents: 1e300 }],
    ['fractional', { cents: 500.5 }],
    ['a string', { cents: '500' }],
    ['missing', {}],
    ['with an unknown field', { cents: 500, currency: 'eur' }],
  ])('refuses %s cents with 400 invalid_input and asks Stripe nothing', async (_name, body) => {
    const a = await h.account('free', 0);
    const before = fake.requests.length;
    const res = await h.request({ method: 'POST', url: '/credits/checkout', headers: auth(a), payload: body });
    expect(res.statusCode).toBe(400);
    expect(json(res).error.code).toBe('invalid_input');
    expect(fake.requests.length).toBe(before);
  });

  it('needs a key (401) that may pay (sandbox 403) and a JSON body', async () => {
    const a = await h.account('free', 0);
    expect(
      (await h.request({ method: 'POST', url: '/credits/checkout', headers: { 'content-type': 'application/json' }, payload: { cents: 500 } })).statusCode,
    ).toBe(401);
    const sandbox = await h.key(a.accountId, 'test');
    const res = await h.request({ method: 'POST', url: '/credits/checkout', headers: auth({ ...a, apiKey: sandbox.apiKey }), payload: { cents: 500 } });
    expect(res.statusCode).toBe(403);
    const bad = await h.request({ method: 'POST', url: '/credits/checkout', headers: auth(a), payload: '{"cents": ' });
    expect(bad.statusCode).toBe(400);
    expect(json(bad).error.code).toBe('invalid_input');
  });
});

describe('checkout.session.completed', () => {
  it('credits the amount once though delivered three times, after an unrelated event, and shows in GET /usage', async () => {
    const a = await h.account('free', 0);
    const { session, events, completed } = await paidTopup(a, 2500);
    const { events: unrelated } = await fake.act('/_fake/events/unrelated');
    // The unrelated event and the payment's other events first, then the completion three times.
    const outcomes: string[] = [];
    for (const e of [...unrelated, ...events.filter((x) => x !== completed), completed, completed, completed]) {
      const res = await deliver(h, e);
      expect(res.statusCode, res.body).toBe(200);
      outcomes.push(`${e.type}:${json(res).outcome}`);
    }
    expect(outcomes).toEqual([
      'customer.updated:ignored',
      'payment_intent.succeeded:ignored',
      'charge.succeeded:ignored',
      'checkout.session.completed:processed',
      'checkout.session.completed:duplicate',
      'checkout.session.completed:duplicate',
    ]);
    expect(await credits(a)).toBe(2500);
    expect(await lines(`card-topup:${session.id}`)).toEqual([{ delta_cents: 2500, kind: 'topup' }]);
    expect(await h.container.credits.available(a.accountId)).toBe(2500);
    const usage = json(await h.request({ method: 'GET', url: '/usage', headers: auth(a) }));
    expect(usage.topups).toEqual({ cents: 2500, count: 1 });
    expect(usage.balance.end_cents).toBe(2500);
  });

  it('credits once when delivered concurrently to two API replicas', async () => {
    const a = await h.account('free', 100);
    const { session, completed } = await paidTopup(a, 4321);
    const results = await Promise.all([deliver(h, completed), deliver(replica, completed), deliver(h, completed), deliver(replica, completed)]);
    expect(results.map((r) => r.statusCode)).toEqual([200, 200, 200, 200]);
    expect(results.map((r) => json(r).outcome).sort()).toEqual(['duplicate', 'duplicate', 'duplicate', 'processed']);
    expect(await credits(a)).toBe(4421);
    expect(await lines(`card-topup:${session.id}`)).toHaveLength(1);
    expect(await h.container.credits.available(a.accountId)).toBe(4421);
  });

  it('earns the referring partner 20% of the payment, floored to cents, once', async () => {
    const code = `TOPUP-${Math.random().toString(36).slice(2, 8)}`;
    const partner = await createPartner(h.container.pool, 'Top-up partner', code);
    const signup = await h.admin.signUp('referred@example.com', partner.id, null);
    const a = { accountId: signup.account_id, apiKey: signup.api_key, keyId: signup.key_id };
    const { session, completed } = await paidTopup(a, 1999);
    await Promise.all([deliver(h, completed), deliver(replica, completed)]);
    const shares = await h.container.pool.any(sql.type(z.object({ revenue_cents: z.number(), share_cents: z.number() }))`
      SELECT revenue_cents, share_cents FROM partner_ledger WHERE entry_key = ${`card-topup:${session.id}`}`);
    expect(shares).toEqual([{ revenue_cents: 1999, share_cents: 399 }]);
  });

  it('refuses a missing, wrong or stale signature with 400 and changes nothing; the genuine delivery still counts', async () => {
    const a = await h.account('free', 0);
    const { completed } = await paidTopup(a, 600);
    const t = Math.floor(Date.now() / 1000);
    const tampered: SignedEvent = { ...completed, payload: completed.payload.replace('"amount_total": 600', '"amount_total": 60000') };
    const attempts = [
      deliver(h, completed, ''),
      deliver(h, completed, signPayload(completed.payload, 'whsec_not_the_secret')),
      deliver(h, tampered),
      deliver(h, completed, signPayload(completed.payload, fake.webhookSecret, t - 3600)),
      h.request({ method: 'POST', url: '/stripe/webhook', headers: { 'content-type': 'application/json' }, payload: completed.payload }),
    ];
    for (const res of await Promise.all(attempts)) {
      expect(res.statusCode, res.body).toBe(400);
      expect(json(res).error.code).toBe('invalid_input');
    }
    expect(await credits(a)).toBe(0);
    const recorded = await h.container.pool.exists(sql.unsafe`SELECT 1 FROM stripe_events WHERE id = ${completed.id}`);
    expect(recorded).toBe(false);
    expect(json(await deliver(h, completed)).outcome).toBe('processed');
    expect(await credits(a)).toBe(600);
  });
});

describe('refunds and disputes', () => {
  it('a refund debits the newly refunded amount once, whatever the deliveries and their order', async () => {
    const a = await h.account('free', 0);
    const { completed, charge } = await paidTopup(a, 3000);
    await deliver(h, completed);
    const first = only((await fake.act(`/_fake/charges/${charge}/refund`, { amount: 1000 })).events, 'charge.refunded');
    const second = only((await fake.act(`/_fake/charges/${charge}/refund`, { amount: 500 })).events, 'charge.refunded');
    // The later event first, then the earlier one, then both again, on both replicas.
    for (const e of [second, first, second, first]) expect((await deliver(replica, e)).statusCode).toBe(200);
    await Promise.all([deliver(h, first), deliver(replica, second)]);
    expect(await credits(a)).toBe(1500);
    const refundLines = await h.container.pool.any(sql.type(z.object({ entry_key: z.string(), delta_cents: z.number() }))`
      SELECT entry_key, delta_cents FROM ledger WHERE account_id = ${a.accountId} AND entry_key LIKE 'card-refund:%' ORDER BY id`);
    // Stripe's charge says 1500 refunded by the time either event is read: one debit for both refunds.
    expect(refundLines).toEqual([{ entry_key: `card-refund:${charge}:1500`, delta_cents: -1500 }]);
    const usage = json(await h.request({ method: 'GET', url: '/usage', headers: auth(a) }));
    expect(usage.topups).toEqual({ cents: 1500, count: 2 });
  });

  it('a refund of credits already spent debits what is left and records the shortfall', async () => {
    const a = await h.account('free', 0);
    const { session, completed, charge } = await paidTopup(a, 2000);
    await deliver(h, completed);
    await spend(a, 1700);
    const refunded = only((await fake.act(`/_fake/charges/${charge}/refund`)).events, 'charge.refunded');
    await deliver(h, refunded);
    await deliver(replica, refunded);
    expect(await credits(a)).toBe(0);
    const row = await h.container.pool.one(sql.type(z.object({ refunded_cents: z.number(), shortfall_cents: z.number() }))`
      SELECT refunded_cents, shortfall_cents FROM card_topups WHERE session_id = ${session.id}`);
    expect(row).toEqual({ refunded_cents: 2000, shortfall_cents: 1700 });
    expect(await h.ledgerSum(a.accountId)).toBe(0);
    expect(h.logs.some((l) => l.includes('card refund larger than the balance'))).toBe(true);
  });

  it('a refund delivered before its checkout.session.completed credits the payment first, then takes the refund', async () => {
    const a = await h.account('free', 0);
    const { completed, charge } = await paidTopup(a, 1000);
    const refunded = only((await fake.act(`/_fake/charges/${charge}/refund`, { amount: 400 })).events, 'charge.refunded');
    expect(json(await deliver(h, refunded)).outcome).toBe('processed');
    expect(await credits(a)).toBe(600);
    expect(json(await deliver(h, completed)).outcome).toBe('processed');
    expect(await credits(a)).toBe(600);
  });

  it('a dispute freezes what it covers; won gives it back, lost keeps it; each once', async () => {
    const a = await h.account('free', 0);
    const one = await paidTopup(a, 1500);
    const two = await paidTopup(a, 800);
    await deliver(h, one.completed);
    await deliver(h, two.completed);
    const d1 = (await fake.act<{ dispute: { id: string }; events: SignedEvent[] }>(`/_fake/charges/${one.charge}/dispute`)).events[0]!;
    await Promise.all([deliver(h, d1), deliver(replica, d1)]);
    expect(await credits(a)).toBe(800);
    const won = (await fake.act(`/_fake/disputes/${JSON.parse(d1.payload).data.object.id}/close`, { status: 'won' })).events[0]!;
    await deliver(h, won);
    await deliver(h, d1);
    await deliver(replica, won);
    expect(await credits(a)).toBe(2300);
    const d2 = (await fake.act(`/_fake/charges/${two.charge}/dispute`)).events[0]!;
    const lost = (await fake.act(`/_fake/disputes/${JSON.parse(d2.payload).data.object.id}/close`, { status: 'lost' })).events[0]!;
    // Closed (lost) arrives before created: frozen once, and it stays.
    await deliver(h, lost);
    await deliver(h, d2);
    expect(await credits(a)).toBe(1500);
    expect(await h.ledgerSum(a.accountId)).toBe(1500);
  });
});

describe('Stripe unset', () => {
  it.each([
    ['/credits/checkout', { cents: 500 }],
    ['/billing/subscribe', { plan: 'pro' }],
    ['/billing/portal', undefined],
    ['/stripe/webhook', { id: 'evt_1' }],
  ])('POST %s answers 503 payments_unavailable', async (url, body) => {
    const a = await off.account('free', 0);
    const headers = body ? { ...auth(a), 'stripe-signature': 't=1,v1=00' } : { authorization: `Bearer ${a.apiKey}` };
    const res = await off.request({ method: 'POST', url, headers, ...(body ? { payload: body } : {}) });
    expect(res.statusCode).toBe(503);
    expect(json(res).error.code).toBe('payments_unavailable');
  });
});

describe('GET /subscribe without Stripe', () => {
  it('offers no card payments', async () => {
    const page = json(await off.request({ method: 'GET', url: '/subscribe', headers: { accept: 'application/json' } }));
    expect(page.card).toMatchObject({ enabled: false, plans: [] });
    const html = await off.request({ method: 'GET', url: '/subscribe' });
    expect(html.statusCode).toBe(200);
    expect(html.body).not.toContain('Pay by card');
    expect(html.body).not.toContain('/credits/checkout');
  });
});

describe('Stripe refusing or unknown', () => {
  it('a key Stripe refuses is 502 upstream_error naming no key, and nothing is recorded', async () => {
    const wrongKey = `sk_test_${'z'.repeat(24)}`;
    const bad = await startHarness(
      { STRIPE_SECRET_KEY: wrongKey, STRIPE_WEBHOOK_SECRET: fake.webhookSecret, STRIPE_API_URL: fake.url, RECONCILE_SECONDS: '0' },
      { workers: [] },
    );
    try {
      const a = await bad.account('free', 0);
      const res = await bad.request({ method: 'POST', url: '/credits/checkout', headers: auth(a), payload: { cents: 500 } });
      expect(res.statusCode).toBe(502);
      expect(json(res).error).toMatchObject({ code: 'upstream_error', upstream: 'stripe', upstream_status: 401 });
      expect(res.body).not.toContain('zzzz');
      expect(bad.logs.join('\n')).not.toContain('zzzz');
      const customers = await bad.container.pool.exists(sql.unsafe`SELECT 1 FROM stripe_customers WHERE account_id = ${a.accountId}`);
      expect(customers).toBe(false);
    } finally {
      await bad.close();
    }
  });

  it('a paid session of a customer this service did not create is acknowledged and credits nothing', async () => {
    const a = await h.account('free', 0);
    const port = Number(new URL(fake.url).port);
    const other = new Stripe(fake.secretKey, { host: '127.0.0.1', port, protocol: 'http' });
    // Another integration on the same Stripe account, naming our account id in client_reference_id.
    const stranger = await other.customers.create({});
    const s = await other.checkout.sessions.create({
      mode: 'payment',
      customer: stranger.id,
      client_reference_id: a.accountId,
      line_items: [{ quantity: 1, price_data: { currency: 'usd', unit_amount: 5000, product_data: { name: 'elsewhere' } } }],
      success_url: 'https://example.com',
    });
    const { events } = await fake.act(`/_fake/checkout/${s.id}/pay`);
    const res = await deliver(h, only(events, 'checkout.session.completed'));
    expect(res.statusCode).toBe(200);
    expect(await credits(a)).toBe(0);
  });
});

describe('secrets', () => {
  it('never logs the secret key or the webhook secret', () => {
    const all = [...h.logs, ...replica.logs].join('\n');
    expect(all.length).toBeGreaterThan(0);
    expect(all).not.toContain(fake.secretKey);
    expect(all).not.toContain(fake.webhookSecret);
  });
});
