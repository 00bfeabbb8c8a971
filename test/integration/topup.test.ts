import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { z } from 'zod';
import type { Address } from 'viem';
import { decodePaymentRequiredHeader } from '@x402/core/http';
import { decodeXPaymentResponse } from 'x402-fetch';
import { sql } from '../../src/db/pool.js';
import type { PaymentRequirements } from '../../src/pay/x402/requirements.js';
import { creditSettledTopups } from '../../src/pay/topup.js';
import { startChain, type Chain, type Wallet } from '../helpers/chain.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { signPayment, toHeader } from '../helpers/x402-sign.js';

/**
 * POST /credits/topup against a real chain (anvil, self-settlement): credits rise by exactly the
 * amount settled on chain, once, and only after settlement.
 */

let chain: Chain;
let h: Harness;
let settlerWallet: Wallet;
let payTo: Address;

beforeAll(async () => {
  chain = await startChain();
  settlerWallet = await chain.newWallet();
  payTo = (await chain.newWallet()).address;
  h = await startHarness(
    { X402_ENABLED: 'true', X402_PAY_TO: payTo, X402_RPC_URL: chain.rpcUrl, X402_SETTLER_PRIVATE_KEY: settlerWallet.privateKey, RECONCILE_SECONDS: '0' },
    { workers: [] },
  );
}, 60_000);

afterAll(async () => {
  await h?.close();
  await chain?.stop();
});

function topup(apiKey: string, body: unknown, headers: Record<string, string> = {}) {
  return h.request({
    method: 'POST',
    url: '/credits/topup',
    headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json', ...headers },
    payload: JSON.stringify(body),
  });
}

async function balance(apiKey: string): Promise<number> {
  const res = await h.request({ method: 'GET', url: '/balance', headers: { authorization: `Bearer ${apiKey}` } });
  expect(res.statusCode).toBe(200);
  return json(res).credits as number;
}

async function offer(apiKey: string, cents: number): Promise<PaymentRequirements> {
  const res = await topup(apiKey, { cents });
  expect(res.statusCode).toBe(402);
  return (json(res).accepts as PaymentRequirements[])[0]!;
}

async function funded(atomic: bigint): Promise<Wallet> {
  const w = await chain.newWallet();
  if (atomic > 0n) await chain.mint(w.address, atomic);
  return w;
}

const LedgerRow = z.object({
  entry_key: z.string(),
  kind: z.string(),
  delta_cents: z.number(),
  paid_cents: z.number().nullable(),
  payer: z.string().nullable(),
});
async function topupLines(accountId: string) {
  return h.container.pool.any(sql.type(LedgerRow)`
    SELECT entry_key, kind, delta_cents, paid_cents, payer FROM ledger WHERE account_id = ${accountId} AND kind = 'topup' AND entry_key LIKE 'topup:%' AND paid_cents IS NOT NULL ORDER BY id`);
}

async function paymentRows(accountId: string) {
  return h.container.pool.any(sql.type(z.object({ id: z.string(), status: z.string(), tool: z.string() }))`
    SELECT id, status, tool FROM x402_payments WHERE account_id = ${accountId} ORDER BY created_at`);
}

describe('POST /credits/topup asks for the exact amount', () => {
  let acct: TestAccount;
  beforeAll(async () => {
    acct = await h.account('free', 0);
  });

  it('without a payment: 402 with N cents as atomic units in the v1 body and the v2 PAYMENT-REQUIRED header', async () => {
    const res = await topup(acct.apiKey, { cents: 1234 });
    expect(res.statusCode).toBe(402);
    expect(json(res)).toMatchObject({
      x402Version: 1,
      accepts: [{ scheme: 'exact', maxAmountRequired: '12340000', payTo, resource: 'http://localhost/credits/topup' }],
    });
    expect(decodePaymentRequiredHeader(String(res.headers['payment-required']))).toMatchObject({
      x402Version: 2,
      accepts: [{ amount: '12340000', network: 'eip155:84532', payTo }],
    });
    expect(await balance(acct.apiKey)).toBe(0);
  });

  it('out-of-range or malformed cents: 400 before any payment is asked, nothing recorded', async () => {
    for (const body of [{ cents: 499 }, { cents: 100_001 }, { cents: 10.5 }, { cents: '1000' }, {}, { cents: 1000, extra: 1 }]) {
      const res = await topup(acct.apiKey, body);
      expect(res.statusCode, JSON.stringify(body)).toBe(400);
      expect(json(res).error.code).toBe('invalid_input');
      expect(res.headers['payment-required']).toBeUndefined();
    }
    expect(await paymentRows(acct.accountId)).toEqual([]);
  });

  it('sub-keys and sandbox keys: 403 forbidden; no key: 401', async () => {
    const ent = await h.account('enterprise', 1000);
    const created = await h.request({
      method: 'POST',
      url: '/subkeys/create',
      headers: { authorization: `Bearer ${ent.apiKey}`, 'content-type': 'application/json' },
      payload: JSON.stringify({ name: 'ci', monthly_limit: 100, allowed_tools: ['compute'] }),
    });
    expect(created.statusCode).toBe(201);
    const sub = json(created).api_key as string;
    const sandbox = await h.key(ent.accountId, 'test');
    for (const key of [sub, sandbox.apiKey]) {
      const res = await topup(key, { cents: 1000 });
      expect(res.statusCode).toBe(403);
      expect(json(res).error.code).toBe('forbidden');
    }
    const agent = await h.key(ent.accountId, 'agent');
    expect((await topup(agent.apiKey, { cents: 1000 })).statusCode).toBe(402);
    const anon = await h.request({ method: 'POST', url: '/credits/topup', headers: { 'content-type': 'application/json' }, payload: '{"cents":1000}' });
    expect(anon.statusCode).toBe(401);
  });
});

describe('paid top-ups on chain', () => {
  it('credits rise by exactly N only after settlement; the payer pays exactly N*10000; a replay tops up once', async () => {
    const acct = await h.account('free', 0);
    const payer = await funded(50_000_000n);
    const payToBefore = await chain.balanceOf(payTo);
    const requirements = await offer(acct.apiKey, 2500);
    const header = toHeader(await signPayment(requirements, { privateKey: payer.privateKey }));

    // Settlement held in the mempool: verified, submitted, not mined. Nothing is credited yet.
    await chain.setAutomine(false);
    let res;
    try {
      const pending = topup(acct.apiKey, { cents: 2500 }, { 'X-PAYMENT': header });
      const deadline = Date.now() + 10_000;
      while ((await paymentRows(acct.accountId)).length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      await new Promise((r) => setTimeout(r, 500));
      expect(await paymentRows(acct.accountId)).toMatchObject([{ status: 'reserved', tool: 'topup' }]);
      expect(await balance(acct.apiKey)).toBe(0);
      expect(await topupLines(acct.accountId)).toEqual([]);
      await chain.mine();
      res = await pending;
    } finally {
      await chain.setAutomine(true);
    }
    expect(res.statusCode).toBe(200);
    const body = json(res);
    expect(body).toMatchObject({ cents: 2500, credits: 2500, payment: { network: 'base-sepolia', transaction: expect.stringMatching(/^0x[0-9a-f]{64}$/) } });
    expect(decodeXPaymentResponse(String(res.headers['x-payment-response']))).toMatchObject({ success: true, transaction: body.payment.transaction });
    expect(res.headers['payment-response']).toBeDefined();
    expect(await balance(acct.apiKey)).toBe(2500);
    expect(await chain.balanceOf(payer.address)).toBe(50_000_000n - 25_000_000n);
    expect(await chain.balanceOf(payTo)).toBe(payToBefore + 25_000_000n);
    const [row] = await paymentRows(acct.accountId);
    expect(row).toMatchObject({ status: 'settled' });
    expect(await topupLines(acct.accountId)).toEqual([
      { entry_key: `topup:${row!.id}`, kind: 'topup', delta_cents: 2500, paid_cents: 2500, payer: payer.address.toLowerCase() },
    ]);
    expect(await h.ledgerSum(acct.accountId)).toBe(await h.credits(acct.accountId));

    const again = await topup(acct.apiKey, { cents: 2500 }, { 'X-PAYMENT': header });
    expect(again.statusCode).toBe(402);
    expect(json(again)).toMatchObject({ code: 'payment_already_used' });
    expect(await balance(acct.apiKey)).toBe(2500);
    expect(await chain.balanceOf(payer.address)).toBe(25_000_000n);
    // The recovery pass finds nothing owed.
    expect(await creditSettledTopups({ config: h.config, pool: h.container.pool, credits: h.container.credits })).toEqual({ credited: 0 });
    expect(await balance(acct.apiKey)).toBe(2500);
  });

  it('the credit reaches admission at once: the account can spend it on the next call', async () => {
    const acct = await h.account('free', 0);
    const payer = await funded(10_000_000n);
    // Admission's Redis cache is loaded before the top-up, then must rise with it.
    expect(await h.container.credits.available(acct.accountId)).toBe(0);
    const requirements = await offer(acct.apiKey, 500);
    const res = await topup(
      acct.apiKey,
      { cents: 500 },
      {
        'PAYMENT-SIGNATURE': toHeader({
          x402Version: 2,
          accepted: v2Accepted(requirements),
          payload: (await signPayment(requirements, { privateKey: payer.privateKey })).payload,
        }),
      },
    );
    expect(res.statusCode, res.body).toBe(200);
    expect(await h.container.credits.available(acct.accountId)).toBe(500);
  });

  it('funds moved away after signing, before the request: refused, nothing added, nothing moved to us', async () => {
    const acct = await h.account('free', 0);
    const payer = await funded(10_000_000n);
    const requirements = await offer(acct.apiKey, 1000);
    const header = toHeader(await signPayment(requirements, { privateKey: payer.privateKey }));
    const elsewhere = (await chain.newWallet()).address;
    await chain.transferAway(payer.privateKey, elsewhere, 10_000_000n);
    const payToBefore = await chain.balanceOf(payTo);
    const res = await topup(acct.apiKey, { cents: 1000 }, { 'X-PAYMENT': header });
    expect(res.statusCode).toBe(402);
    expect(json(res)).toMatchObject({ code: 'payment_invalid', reason: 'insufficient_funds' });
    expect(await balance(acct.apiKey)).toBe(0);
    expect(await topupLines(acct.accountId)).toEqual([]);
    expect(await chain.balanceOf(payTo)).toBe(payToBefore);
  });

  it('funds moved away between verification and settlement: the settlement reverts, nothing is added', async () => {
    const acct = await h.account('free', 0);
    const payer = await funded(10_000_000n);
    const requirements = await offer(acct.apiKey, 1000);
    const header = toHeader(await signPayment(requirements, { privateKey: payer.privateKey }));
    const elsewhere = (await chain.newWallet()).address;
    const settler = h.container.api!.payPerCall!.deps.x402.settler;
    const settle = settler.settle.bind(settler);
    // The payer empties its wallet after the funds check passed, right before our transfer goes out.
    settler.settle = async (...args) => {
      await chain.transferAway(payer.privateKey, elsewhere, 10_000_000n);
      return settle(...args);
    };
    let res;
    try {
      res = await topup(acct.apiKey, { cents: 1000 }, { 'X-PAYMENT': header });
    } finally {
      settler.settle = settle;
    }
    expect(res.statusCode).toBe(402);
    expect(json(res)).toMatchObject({ code: 'payment_invalid', reason: 'settlement_failed' });
    expect(await balance(acct.apiKey)).toBe(0);
    expect(await topupLines(acct.accountId)).toEqual([]);
    expect(await paymentRows(acct.accountId)).toMatchObject([{ status: 'failed' }]);
    expect(await creditSettledTopups({ config: h.config, pool: h.container.pool, credits: h.container.credits })).toEqual({ credited: 0 });
    expect(await balance(acct.apiKey)).toBe(0);
  });

  it('a crash between settlement and credit is repaired once by the recovery pass', async () => {
    const acct = await h.account('free', 0);
    const payer = await funded(10_000_000n);
    const requirements = await offer(acct.apiKey, 700);
    const header = toHeader(await signPayment(requirements, { privateKey: payer.privateKey }));
    // The credit's transaction fails for this account (as if the process died after settling).
    const fn = `tg_fail_topup_${acct.accountId.replace(/-/g, '')}`;
    const admin = new pg.Client({ connectionString: h.config.DATABASE_URL });
    await admin.connect();
    await admin.query(`
      CREATE FUNCTION ${fn}() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN IF NEW.account_id = '${acct.accountId}' THEN RAISE EXCEPTION 'simulated crash'; END IF; RETURN NEW; END $$`);
    await admin.query(`CREATE TRIGGER ${fn} BEFORE INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION ${fn}()`);
    let res;
    try {
      res = await topup(acct.apiKey, { cents: 700 }, { 'X-PAYMENT': header });
    } finally {
      await admin.query(`DROP TRIGGER ${fn} ON ledger`);
      await admin.query(`DROP FUNCTION ${fn}()`);
      await admin.end();
    }
    expect(res.statusCode).toBe(503);
    expect(json(res).error).toMatchObject({ code: 'service_unavailable', transaction: expect.stringMatching(/^0x/) });
    expect(await chain.balanceOf(payer.address)).toBe(10_000_000n - 7_000_000n);
    expect(await balance(acct.apiKey)).toBe(0);
    expect(await paymentRows(acct.accountId)).toMatchObject([{ status: 'settled' }]);

    const deps = { config: h.config, pool: h.container.pool, credits: h.container.credits };
    const runs = await Promise.all([creditSettledTopups(deps), creditSettledTopups(deps)]);
    expect(runs.reduce((n, r) => n + r.credited, 0)).toBe(1);
    expect(await creditSettledTopups(deps)).toEqual({ credited: 0 });
    expect(await balance(acct.apiKey)).toBe(700);
    expect(await topupLines(acct.accountId)).toHaveLength(1);
    expect(await h.ledgerSum(acct.accountId)).toBe(700);
  });
});

describe('the payment must match the top-up', () => {
  it('a payment signed for 500 cents does not buy 1,000: refused, nothing moves, nothing added', async () => {
    const acct = await h.account('free', 0);
    const payer = await funded(50_000_000n);
    const header = toHeader(await signPayment(await offer(acct.apiKey, 500), { privateKey: payer.privateKey }));
    const res = await topup(acct.apiKey, { cents: 1000 }, { 'X-PAYMENT': header });
    expect(res.statusCode).toBe(402);
    expect(json(res).code).toBe('payment_invalid');
    expect(await balance(acct.apiKey)).toBe(0);
    expect(await chain.balanceOf(payer.address)).toBe(50_000_000n);
  });
});

describe('x402 off', () => {
  it('503 topup_unavailable naming what to configure (after input is checked)', async () => {
    const off = await startHarness({}, { workers: [] });
    try {
      const acct = await off.account('free', 0);
      const res = await off.request({
        method: 'POST',
        url: '/credits/topup',
        headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json' },
        payload: JSON.stringify({ cents: 1000 }),
      });
      expect(res.statusCode).toBe(503);
      const err = json(res).error;
      expect(err.code).toBe('topup_unavailable');
      expect(err.message).toMatch(/X402_ENABLED/);
      expect(err.message).toMatch(/X402_PAY_TO/);
      expect(err.message).toMatch(/X402_FACILITATOR_URL|X402_RPC_URL/);
      const bad = await off.request({
        method: 'POST',
        url: '/credits/topup',
        headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json' },
        payload: JSON.stringify({ cents: 1 }),
      });
      expect(bad.statusCode).toBe(400);
    } finally {
      await off.close();
    }
  });

  it('deferred settlement cannot pay top-ups: 503 topup_unavailable (credits only after settlement)', async () => {
    const deferredH = await startHarness({ X402_ENABLED: 'true', X402_PAY_TO: payTo, X402_SETTLEMENT: 'deferred' }, { workers: [] });
    try {
      const acct = await deferredH.account('free', 0);
      const res = await deferredH.request({
        method: 'POST',
        url: '/credits/topup',
        headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json' },
        payload: JSON.stringify({ cents: 1000 }),
      });
      expect(res.statusCode).toBe(503);
      expect(json(res).error).toMatchObject({ code: 'topup_unavailable', settlement: 'deferred' });
    } finally {
      await deferredH.close();
    }
  });
});

/** The v2 `accepted` entry for the v1 requirements (what a v2 client echoes back). */
function v2Accepted(r: PaymentRequirements) {
  return {
    scheme: r.scheme,
    network: 'eip155:84532',
    amount: r.maxAmountRequired,
    asset: r.asset,
    payTo: r.payTo,
    maxTimeoutSeconds: r.maxTimeoutSeconds,
    extra: r.extra,
  };
}

describe('OpenAPI', () => {
  it('documents POST /credits/topup, GET /subscribe and POST /signup with their errors', async () => {
    const doc = json(await h.request({ method: 'GET', url: '/openapi.json' }));
    const topupOp = doc.paths['/credits/topup'].post;
    expect(Object.keys(topupOp.responses).sort()).toEqual(expect.arrayContaining(['200', '400', '401', '402', '403', '429', '503']));
    // A key (it names the account) and a payment: both, never one instead of the other.
    expect(topupOp.security).toEqual([
      { bearerAuth: [], x402Payment: [] },
      { bearerAuth: [], x402PaymentV1: [] },
    ]);
    expect(topupOp.responses['402']).toEqual({ $ref: '#/components/responses/PaymentRequired' });
    expect(doc.components.schemas.TopupRequest.properties.cents).toMatchObject({ minimum: 500, maximum: 100_000 });
    expect(doc.paths['/subscribe'].get.responses['200'].content).toHaveProperty('text/html');
    const signupOp = doc.paths['/signup'].post;
    expect(signupOp.security).toEqual([]);
    expect(Object.keys(signupOp.responses)).toEqual(expect.arrayContaining(['201', '400', '404', '429']));
    // Sign-up never says an email is taken (that told strangers which emails have accounts).
    expect(signupOp.responses).not.toHaveProperty('409');
    expect(doc.components.schemas.ErrorCode.enum).toEqual(expect.arrayContaining(['topup_unavailable']));
    expect(doc.components.schemas.ErrorCode.enum).not.toContain('email_taken');
  });
});
