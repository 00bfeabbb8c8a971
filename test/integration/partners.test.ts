import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import type { Address } from 'viem';
import { sql } from '../../src/db/pool.js';
import { partnerShareCents } from '../../src/money/partners.js';
import type { PaymentRequirements } from '../../src/pay/x402/requirements.js';
import { startChain, type Chain, type Wallet } from '../helpers/chain.js';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { signPayment, toHeader } from '../helpers/x402-sign.js';

/**
 * Partner attribution: a partner's code on GET /subscribe and POST /signup, the share of every
 * payment by a referred account (top-ups on a real chain, operator credits with --paid-cents), and
 * the operator's report, run as the CLI.
 */

let chain: Chain;
let h: Harness;
let payTo: Address;
const root = fileURLToPath(new URL('../../', import.meta.url));
const run = promisify(execFile);
// One code per run: partner codes are unique in the (shared) test database.
const CODE = `ACME-${Math.random().toString(36).slice(2, 8)}`;

beforeAll(async () => {
  chain = await startChain();
  const settler = await chain.newWallet();
  payTo = (await chain.newWallet()).address;
  h = await startHarness(
    {
      X402_ENABLED: 'true',
      X402_PAY_TO: payTo,
      X402_RPC_URL: chain.rpcUrl,
      X402_SETTLER_PRIVATE_KEY: settler.privateKey,
      SIGNUP_ENABLED: 'true',
      SIGNUP_PER_HOUR: '3',
      RECONCILE_SECONDS: '0',
    },
    { workers: [] },
  );
}, 60_000);

afterAll(async () => {
  await h?.close();
  await chain?.stop();
});

async function admin(args: string[]) {
  try {
    const { stdout } = await run(process.execPath, ['--import', 'tsx', 'src/cli/admin.ts', ...args], {
      cwd: root,
      env: { ...process.env, DATABASE_URL: h.config.DATABASE_URL, REDIS_URL: h.config.REDIS_URL, REDIS_PREFIX: h.config.REDIS_PREFIX, LOG_LEVEL: 'warn' },
    });
    return { code: 0, out: JSON.parse(stdout), err: null };
  } catch (e) {
    const err = e as { code: number; stderr: string };
    // Exit code 2: a usage error, one plain line (then the usage); 1: the error envelope as JSON.
    if (err.code === 2) return { code: 2, out: null, err: { usage: err.stderr.split('\n')[0] } as Record<string, unknown> };
    return { code: err.code, out: null, err: JSON.parse(err.stderr).error as Record<string, unknown> };
  }
}

let address = 0;
/** Each sign-up from its own client address, so only the rate-limit test meets the limit. */
function signup(body: unknown, remoteAddress = `10.1.0.${++address}`) {
  return h.request({ method: 'POST', url: '/signup', remoteAddress, headers: { 'content-type': 'application/json' }, payload: JSON.stringify(body) });
}

function email(): string {
  return `user-${Math.random().toString(36).slice(2, 10)}@example.com`;
}

const month = new Date().toISOString().slice(0, 7);

describe('partners, sign-up and shares', () => {
  let referred: { accountId: string; apiKey: string };

  it('partner create: the CLI creates a partner; codes are unique regardless of case and checked', async () => {
    const created = await admin(['partner', 'create', '--name', 'Acme Agency', '--code', CODE]);
    expect(created.code).toBe(0);
    expect(created.out).toMatchObject({ name: 'Acme Agency', code: CODE, partner_id: expect.any(String) });
    const dup = await admin(['partner', 'create', '--name', 'Copycat', '--code', CODE.toLowerCase()]);
    expect(dup.code).toBe(1);
    expect(dup.err).toMatchObject({ code: 'invalid_input', reason: 'code_taken' });
    const bad = await admin(['partner', 'create', '--name', 'Bad', '--code', 'a b']);
    expect(bad).toMatchObject({ code: 2, err: { usage: expect.stringMatching(/^error: partner create: --code must be/) } });
  }, 60_000);

  it('GET /subscribe: HTML by default, JSON on request; it says a code will be recorded without naming the partner, or that it is unknown', async () => {
    const html = await h.request({ method: 'GET', url: `/subscribe?attribution_code=${CODE}` });
    expect(html.statusCode).toBe(200);
    expect(html.headers['content-type']).toMatch(/text\/html/);
    expect(html.body).toContain(CODE);
    expect(html.body).toContain('will be recorded');
    expect(html.body).not.toContain('Acme Agency');
    expect(html.body).toContain('/signup');
    for (const plan of ['free', 'starter', 'pro', 'enterprise']) expect(html.body).toContain(plan);

    const asJson = await h.request({ method: 'GET', url: `/subscribe?attribution_code=${CODE}`, headers: { accept: 'application/json' } });
    expect(asJson.statusCode).toBe(200);
    const page = json(asJson);
    expect(page.plans.map((p: { plan: string }) => p.plan)).toEqual(['free', 'starter', 'pro', 'enterprise']);
    expect(page.attribution).toMatchObject({ code: CODE, known: true });
    expect(page.attribution).not.toHaveProperty('partner');
    expect(asJson.body).not.toContain('Acme Agency');
    expect(page.signup).toMatchObject({ enabled: true });
    expect(page.signup.example).toContain(CODE);

    const unknown = await h.request({ method: 'GET', url: '/subscribe?attribution_code=<NOPE>' });
    expect(unknown.statusCode).toBe(200);
    expect(unknown.body).toMatch(/is unknown/);
    expect(unknown.body).not.toContain('<NOPE>');
    expect(unknown.body).toContain('&lt;NOPE&gt;');
    const unknownJson = json(await h.request({ method: 'GET', url: '/subscribe?attribution_code=NOPE123', headers: { accept: 'application/json' } }));
    expect(unknownJson.attribution).toMatchObject({ code: 'NOPE123', known: false });
  });

  it('POST /signup: a free account with its key shown once and the referral recorded; bad input 400; an email used before answers alike', async () => {
    const address = email();
    const res = await signup({ email: address, attribution_code: CODE.toLowerCase() });
    expect(res.statusCode).toBe(201);
    const body = json(res);
    expect(body).toMatchObject({ plan: 'free', credits: 0, email: address, api_key: expect.any(String), account_id: expect.any(String) });
    referred = { accountId: body.account_id, apiKey: body.api_key };
    const bal = await h.request({ method: 'GET', url: '/balance', headers: { authorization: `Bearer ${referred.apiKey}` } });
    expect(bal.statusCode).toBe(200);
    expect(json(bal)).toMatchObject({ plan: 'free', credits: 0 });

    expect(json(await signup({ email: email(), attribution_code: 'NOPE123' }))).toMatchObject({
      error: { code: 'invalid_input', reason: 'unknown_attribution_code' },
    });
    expect((await signup({ email: 'not-an-email' })).statusCode).toBe(400);
    expect((await signup({ email: email(), extra: true })).statusCode).toBe(400);
    // The same email again: another new account, answered exactly as the first (nothing tells the email was used).
    const again = await signup({ email: address });
    expect(again.statusCode).toBe(201);
    expect(Object.keys(json(again)).sort()).toEqual(Object.keys(body).sort());
    expect(json(again).account_id).not.toBe(body.account_id);
  });

  it('a referred account topping up 1,000 cents earns its partner 200', async () => {
    const payer: Wallet = await chain.newWallet();
    await chain.mint(payer.address, 10_000_000n);
    const auth = { authorization: `Bearer ${referred.apiKey}`, 'content-type': 'application/json' };
    const offer = await h.request({ method: 'POST', url: '/credits/topup', headers: auth, payload: '{"cents":1000}' });
    expect(offer.statusCode).toBe(402);
    const requirements = (json(offer).accepts as PaymentRequirements[])[0]!;
    const header = toHeader(await signPayment(requirements, { privateKey: payer.privateKey }));
    const paid = await h.request({ method: 'POST', url: '/credits/topup', headers: { ...auth, 'x-payment': header }, payload: '{"cents":1000}' });
    expect(paid.statusCode, paid.body).toBe(200);
    expect(json(paid)).toMatchObject({ cents: 1000, credits: 1000 });
    // A replay neither credits nor earns again.
    expect((await h.request({ method: 'POST', url: '/credits/topup', headers: { ...auth, 'x-payment': header }, payload: '{"cents":1000}' })).statusCode).toBe(
      402,
    );
    const shares = await h.container.pool.any(sql.type(z.object({ revenue_cents: z.number(), share_cents: z.number(), share_pct: z.number() }))`
      SELECT revenue_cents, share_cents, share_pct FROM partner_ledger WHERE account_id = ${referred.accountId} ORDER BY id`);
    expect(shares).toEqual([{ revenue_cents: 1000, share_cents: 200, share_pct: 20 }]);
  });

  it('credits add --paid-cents 333 earns 66 (floor: the fraction stays with the platform); without --paid-cents nothing', async () => {
    expect(partnerShareCents(333, 20)).toBe(66);
    const r = await admin(['credits', 'add', '--account', referred.accountId, '--cents', '333', '--paid-cents', '333']);
    expect(r.code).toBe(0);
    expect(r.out).toMatchObject({ credits: 1333, paid_cents: 333 });
    expect((await admin(['credits', 'add', '--account', referred.accountId, '--cents', '50'])).out).toMatchObject({ credits: 1383 });
    // A gift to an account nobody referred earns nobody anything.
    const plain = await h.account('free', 0);
    expect((await admin(['credits', 'add', '--account', plain.accountId, '--cents', '100', '--paid-cents', '100'])).code).toBe(0);
    const shares = await h.container.pool.anyFirst(sql.type(z.object({ share_cents: z.number() }))`
      SELECT share_cents FROM partner_ledger WHERE account_id IN (${referred.accountId}, ${plain.accountId}) ORDER BY id`);
    expect(shares).toEqual([200, 66]);
    expect(await h.ledgerSum(referred.accountId)).toBe(await h.credits(referred.accountId));
    expect(await h.credits(referred.accountId)).toBe(1383);
  }, 180_000);

  it('partner report --month shows referred accounts, revenue and share', async () => {
    const r = await admin(['partner', 'report', '--month', month]);
    expect(r.code).toBe(0);
    expect(r.out.month).toBe(month);
    const acme = r.out.partners.find((p: { code: string }) => p.code === CODE);
    expect(acme).toMatchObject({ name: 'Acme Agency', referred_accounts: 1, new_accounts: 1, payments: 2, revenue_cents: 1333, share_cents: 266 });
    const other = await admin(['partner', 'report', '--month', '2001-01']);
    expect(other.out.partners.find((p: { code: string }) => p.code === CODE)).toMatchObject({ referred_accounts: 0, revenue_cents: 0, share_cents: 0 });
    expect(await admin(['partner', 'report', '--month', '2026-13'])).toMatchObject({
      code: 2,
      err: { usage: 'error: partner report: --month must be YYYY-MM' },
    });
  }, 60_000);

  it('sign-ups are rate-limited per client address: 429 with Retry-After', async () => {
    const from = '10.9.9.9';
    for (let i = 0; i < 3; i++) expect((await signup({ email: email() }, from)).statusCode).toBe(201);
    const limited = await signup({ email: email() }, from);
    expect(limited.statusCode).toBe(429);
    expect(json(limited).error.code).toBe('rate_limited');
    expect(Number(limited.headers['retry-after'])).toBeGreaterThan(0);
    expect(Number(limited.headers['retry-after'])).toBeLessThanOrEqual(3600);
    // Another address is unaffected.
    expect((await signup({ email: email() }, '10.9.9.10')).statusCode).toBe(201);
  });

  it('SIGNUP_ENABLED off: POST /signup is 404, GET /subscribe still explains how to get an account', async () => {
    const off = await startHarness({}, { workers: [] });
    try {
      const res = await off.request({
        method: 'POST',
        url: '/signup',
        headers: { 'content-type': 'application/json' },
        payload: JSON.stringify({ email: email() }),
      });
      expect(res.statusCode).toBe(404);
      expect(json(res).error.code).toBe('not_found');
      const page = json(await off.request({ method: 'GET', url: '/subscribe', headers: { accept: 'application/json' } }));
      expect(page.signup).toMatchObject({ enabled: false });
      expect(page.attribution).toBeNull();
    } finally {
      await off.close();
    }
  });
});
