import Stripe from 'stripe';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { sql } from '../../src/db/pool.js';
import { createPartner } from '../../src/money/partners.js';
import { deliver, only } from '../fakes/stripe/deliver.js';
import { type FakeStripe, type SignedEvent, startFakeStripe } from '../fakes/stripe/fake-stripe.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';

/**
 * Plans by subscription through Stripe Checkout, against the local fake of Stripe's API: subscribe,
 * upgrade (at once), renewal (credits per paid invoice), downgrade and cancellation (at the period's
 * end), events delivered late, twice and out of order, the referring partner's 20% of every invoice,
 * and the billing portal.
 */

let fake: FakeStripe;
let h: Harness;
let replica: Harness;
const price = { starter: '', pro: '' };
const STARTER_CENTS = 999;
const PRO_CENTS = 2999;

beforeAll(async () => {
  fake = await startFakeStripe();
  const port = Number(new URL(fake.url).port);
  // The operator's Prices, created through Stripe's API as an operator would.
  const stripe = new Stripe(fake.secretKey, { host: '127.0.0.1', port, protocol: 'http' });
  price.starter = (
    await stripe.prices.create({ currency: 'usd', unit_amount: STARTER_CENTS, recurring: { interval: 'month' }, product_data: { name: 'Starter' } })
  ).id;
  price.pro = (await stripe.prices.create({ currency: 'usd', unit_amount: PRO_CENTS, recurring: { interval: 'month' }, product_data: { name: 'Pro' } })).id;
  const env = {
    STRIPE_SECRET_KEY: fake.secretKey,
    STRIPE_WEBHOOK_SECRET: fake.webhookSecret,
    STRIPE_API_URL: fake.url,
    STRIPE_PRICE_STARTER: price.starter,
    STRIPE_PRICE_PRO: price.pro,
    PLAN_CREDITS_STARTER: '1000',
    PLAN_CREDITS_PRO: '5000',
    RECONCILE_SECONDS: '0',
  };
  h = await startHarness(env, { workers: [] });
  replica = await startHarness({ ...env, REDIS_PREFIX: h.config.REDIS_PREFIX }, { workers: [] });
}, 90_000);

afterAll(async () => {
  await replica?.close();
  await h?.close();
  await fake?.close();
});

const auth = (a: TestAccount) => ({ authorization: `Bearer ${a.apiKey}`, 'content-type': 'application/json' });
const subscribeReq = (a: TestAccount, body: unknown) => h.request({ method: 'POST', url: '/billing/subscribe', headers: auth(a), payload: body as object });

async function deliverAll(events: SignedEvent[], to: Harness = h) {
  for (const e of events) {
    const res = await deliver(to, e);
    expect(res.statusCode, res.body).toBe(200);
  }
}

/** Subscribes through Checkout and pays; answers the subscription id and the events Stripe sent. */
async function subscribe(a: TestAccount, plan: 'starter' | 'pro') {
  const res = await subscribeReq(a, { plan });
  expect(res.statusCode, res.body).toBe(201);
  const { id } = json(res);
  const { events } = await fake.act(`/_fake/checkout/${id}/pay`);
  const sub = fake.objects.get(id)!.subscription as string;
  return { sub, events };
}

const plan = async (a: TestAccount) => (await h.container.accounts.getAccount(a.accountId)).plan;
/** The plan as the API sees it through the key (cached key records carry the plan). */
const apiPlan = async (a: TestAccount, on: Harness = h) => json(await on.request({ method: 'GET', url: '/balance', headers: auth(a) })).plan;
const pending = (sub: string) =>
  h.container.pool.oneFirst(
    sql.type(z.object({ pending_plan: z.string().nullable() }))`SELECT pending_plan FROM card_subscriptions WHERE subscription_id = ${sub}`,
  );

describe('subscribing', () => {
  it('opens Checkout in subscription mode for the plan\u2019s Price, and the paid invoice sets the plan and grants its credits once', async () => {
    const a = await h.account('free', 0);
    expect(await apiPlan(a)).toBe('free');
    const { sub, events } = await subscribe(a, 'pro');
    const session = fake.requests.filter((r) => r.path === '/v1/checkout/sessions').at(-1)!;
    expect(session.params).toMatchObject({ mode: 'subscription', line_items: [{ price: price.pro, quantity: '1' }], client_reference_id: a.accountId });
    // Reversed, then again, then concurrently to both replicas.
    await deliverAll([...events].reverse());
    await deliverAll(events);
    await Promise.all(events.flatMap((e) => [deliver(h, e), deliver(replica, e)]));
    expect(await plan(a)).toBe('pro');
    expect(await apiPlan(a)).toBe('pro');
    expect(await apiPlan(a, replica)).toBe('pro');
    expect(await h.credits(a.accountId)).toBe(5000);
    expect(await pending(sub)).toBeNull();
  });

  it.each([
    ['free', { plan: 'free' }],
    ['unknown', { plan: 'gold' }],
    ['unpriced (no STRIPE_PRICE_ENTERPRISE)', { plan: 'enterprise' }],
    ['missing', {}],
    ['a number', { plan: 2 }],
  ])('refuses a %s plan with 400 invalid_input', async (_name, body) => {
    const a = await h.account('free', 0);
    const res = await subscribeReq(a, body);
    expect(res.statusCode).toBe(400);
    expect(json(res).error.code).toBe('invalid_input');
  });

  it('refuses a second subscription while one is live (409 subscription_exists)', async () => {
    const a = await h.account('free', 0);
    const { events } = await subscribe(a, 'starter');
    await deliverAll(events);
    const res = await subscribeReq(a, { plan: 'pro' });
    expect(res.statusCode).toBe(409);
    expect(json(res).error.code).toBe('subscription_exists');
  });
});

describe('changes', () => {
  it('an upgrade applies at once; a renewal grants the plan\u2019s credits again', async () => {
    const a = await h.account('free', 0);
    const { sub, events } = await subscribe(a, 'starter');
    await deliverAll(events);
    expect(await plan(a)).toBe('starter');
    const up = (await fake.act(`/_fake/subscriptions/${sub}/price`, { price: price.pro })).events;
    await deliverAll(up, replica);
    expect(await apiPlan(a)).toBe('pro');
    // The stale created event afterwards changes nothing: the state is read back from Stripe.
    await deliverAll([only(events, 'customer.subscription.created')]);
    expect(await plan(a)).toBe('pro');
    const renewed = (await fake.act(`/_fake/subscriptions/${sub}/renew`)).events;
    await deliverAll([...renewed, ...renewed]);
    expect(await plan(a)).toBe('pro');
    expect(await h.credits(a.accountId)).toBe(1000 + 5000);
  });

  it('a downgrade waits for the end of the paid period', async () => {
    const a = await h.account('free', 0);
    const { sub, events } = await subscribe(a, 'pro');
    await deliverAll(events);
    const down = (await fake.act(`/_fake/subscriptions/${sub}/price`, { price: price.starter })).events;
    await deliverAll(down);
    await deliverAll(events);
    expect(await plan(a)).toBe('pro');
    expect(await pending(sub)).toBe('starter');
    const renewed = (await fake.act(`/_fake/subscriptions/${sub}/renew`)).events;
    // invoice.paid first (as the fake sends), then once more in the other order on the replica.
    await deliverAll(renewed);
    await deliverAll([...renewed].reverse(), replica);
    expect(await plan(a)).toBe('starter');
    expect(await apiPlan(a)).toBe('starter');
    expect(await pending(sub)).toBeNull();
    expect(await h.credits(a.accountId)).toBe(5000 + 1000);
  });

  it('a cancellation keeps the plan to the period\u2019s end, then the account is free', async () => {
    const a = await h.account('free', 0);
    const { sub, events } = await subscribe(a, 'pro');
    await deliverAll(events);
    const cancel = (await fake.act(`/_fake/subscriptions/${sub}/cancel`, { at_period_end: true })).events;
    await deliverAll(cancel);
    expect(await plan(a)).toBe('pro');
    expect(await pending(sub)).toBe('free');
    const ended = (await fake.act(`/_fake/subscriptions/${sub}/renew`)).events;
    expect(ended.map((e) => e.type)).toEqual(['customer.subscription.deleted']);
    await deliverAll(ended);
    expect(await plan(a)).toBe('free');
    expect(await apiPlan(a)).toBe('free');
    // Every earlier event again, late: the subscription has ended, the plan stays free, no credits more.
    await deliverAll([...events, ...cancel]);
    expect(await plan(a)).toBe('free');
    expect(await h.credits(a.accountId)).toBe(5000);
    // Ended: a new subscription may be opened.
    expect((await subscribeReq(a, { plan: 'starter' })).statusCode).toBe(201);
  });
});

describe('partners', () => {
  it('a referred customer\u2019s every paid invoice earns the partner exactly 20%, floored to cents', async () => {
    const code = `SUB-${Math.random().toString(36).slice(2, 8)}`;
    const partner = await createPartner(h.container.pool, 'Subscription partner', code);
    // The attribution code carried from /subscribe through POST /signup.
    const page = json(await h.request({ method: 'GET', url: `/subscribe?attribution_code=${code}`, headers: { accept: 'application/json' } }));
    expect(page.attribution.known).toBe(true);
    const signup = await h.admin.signUp('subscriber@example.com', partner.id, null);
    const a = { accountId: signup.account_id, apiKey: signup.api_key, keyId: signup.key_id };
    const { sub, events } = await subscribe(a, 'pro');
    await deliverAll(events);
    const renewed = (await fake.act(`/_fake/subscriptions/${sub}/renew`)).events;
    await Promise.all(renewed.flatMap((e) => [deliver(h, e), deliver(replica, e)]));
    const customer = fake.requests.find((r) => r.path === '/v1/customers' && (r.params.metadata as Record<string, string>).account_id === a.accountId);
    expect(customer!.params.metadata).toEqual({ account_id: a.accountId, partner_code: code });
    const shares = await h.container.pool.any(sql.type(z.object({ revenue_cents: z.number(), share_cents: z.number() }))`
      SELECT revenue_cents, share_cents FROM partner_ledger WHERE partner_id = ${partner.id} ORDER BY id`);
    expect(shares).toEqual([
      { revenue_cents: PRO_CENTS, share_cents: 599 },
      { revenue_cents: PRO_CENTS, share_cents: 599 },
    ]);
  });
});

describe('GET /subscribe and POST /billing/portal', () => {
  it('the page lists the plans sold by card and how to subscribe', async () => {
    const page = json(await h.request({ method: 'GET', url: '/subscribe', headers: { accept: 'application/json' } }));
    expect(page.card.enabled).toBe(true);
    expect(page.card.plans).toEqual([
      { plan: 'starter', monthly_credits: 1000 },
      { plan: 'pro', monthly_credits: 5000 },
    ]);
    expect(page.card.how).toContain('/billing/subscribe');
    const html = await h.request({ method: 'GET', url: '/subscribe' });
    expect(html.body).toContain('Pay by card');
  });

  it('answers a portal URL for the account\u2019s customer, 404 without one', async () => {
    const none = await h.account('free', 0);
    const missing = await h.request({ method: 'POST', url: '/billing/portal', headers: { authorization: `Bearer ${none.apiKey}` } });
    expect(missing.statusCode).toBe(404);
    expect(json(missing).error.code).toBe('not_found');
    const a = await h.account('free', 0);
    await subscribe(a, 'starter');
    const res = await h.request({ method: 'POST', url: '/billing/portal', headers: { authorization: `Bearer ${a.apiKey}` } });
    expect(res.statusCode, res.body).toBe(200);
    expect(json(res).url).toMatch(/\/_fake\/portal\//);
    const asked = fake.requests.filter((r) => r.path === '/v1/billing_portal/sessions').at(-1)!;
    expect(asked.params.customer).toMatch(/^cus_/);
    expect(asked.params.return_url).toMatch(/\/subscribe$/);
  });
});
