import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createPool } from 'slonik';
import { z } from 'zod';
import type { Hex } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { createSigner, PaymentRequirementsSchema, SettleRequestSchema, settleResponseFromHeader } from 'x402/types';
import { createPaymentHeader, selectPaymentRequirements } from 'x402/client';
import { migrate } from '../../src/db/migrate.js';
import { ensureDatabase, sql } from '../../src/db/pool.js';
import type { PaymentRequirements } from '../../src/pay/x402/requirements.js';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { OTHER, OTHER_KEY, PAY_TO, signPayment, toHeader } from '../helpers/x402-sign.js';
import { fakeTxHash, startFakeFacilitator, type FakeFacilitator } from '../helpers/fake-facilitator.js';
import { deferred, startFakeOpenAI } from '../helpers/fake-openai.js';

/**
 * Pay-per-call end to end through real HTTP requests: the 402, signed retries, replay protection,
 * settlement through a facilitator, a standard x402 client, and the operator commands. The file has
 * a database of its own so that "nothing was recorded" can be checked against whole tables.
 */

const dbUrl = (() => {
  const u = new URL(inject('databaseUrl'));
  u.pathname = `/tollgate_x402_${randomBytes(4).toString('hex')}`;
  return u.toString();
})();
const x402Env = { DATABASE_URL: dbUrl, X402_ENABLED: 'true', X402_PAY_TO: PAY_TO, X402_SETTLEMENT: 'deferred' };
const USDC_BASE_SEPOLIA = '0x036CbD53842c5426634e7929541eC2318f3dCF7e';
const PUBLIC_BASE = 'https://api.tollgate.test';

let h: Harness; // payments verified locally, awaiting settlement
let hf: Harness; // payments settled through the fake facilitator
let fake: FakeFacilitator;

beforeAll(async () => {
  await ensureDatabase(dbUrl);
  await migrate(dbUrl);
  fake = await startFakeFacilitator();
  h = await startHarness(x402Env, { workers: ['core'] });
  const { X402_SETTLEMENT: _deferred, ...base } = x402Env;
  hf = await startHarness({ ...base, X402_FACILITATOR_URL: fake.url, PUBLIC_BASE_URL: PUBLIC_BASE }, { workers: ['core'] });
});

afterAll(async () => {
  await h?.close();
  await hf?.close();
  await fake?.close();
  const u = new URL(dbUrl);
  u.pathname = '/postgres';
  const admin = await createPool(u.toString(), { maximumPoolSize: 1 });
  await admin.query(sql.unsafe`DROP DATABASE IF EXISTS ${sql.identifier([new URL(dbUrl).pathname.slice(1)])} WITH (FORCE)`);
  await admin.end();
});

const LedgerRow = z.object({
  entry_key: z.string(),
  account_id: z.string().nullable(),
  kind: z.string(),
  tool: z.string().nullable(),
  delta_cents: z.number(),
});
const PaymentRow = z.object({
  id: z.string(),
  status: z.string(),
  tool: z.string(),
  value_atomic: z.string(),
  tx_hash: z.string().nullable(),
  error: z.string().nullable(),
});
const Count = z.object({ n: z.number() });

const ledgerOf = (payer: string) =>
  h.container.pool.any(sql.type(LedgerRow)`
    SELECT entry_key, account_id, kind, tool, delta_cents FROM ledger WHERE payer = ${payer.toLowerCase()} ORDER BY id`);
const paymentsOf = (payer: string) =>
  h.container.pool.any(sql.type(PaymentRow)`
    SELECT id, status, tool, value_atomic::text AS value_atomic, tx_hash, error FROM x402_payments
    WHERE payer = ${payer.toLowerCase()} ORDER BY created_at, id`);
const tableCounts = async () => ({
  ledger: await h.container.pool.oneFirst(sql.type(Count)`SELECT count(*)::bigint AS n FROM ledger`),
  payments: await h.container.pool.oneFirst(sql.type(Count)`SELECT count(*)::bigint AS n FROM x402_payments`),
});

/** A payer of its own per test, so each test reads only its own rows. */
function newPayer(): { key: Hex; address: string } {
  const key = generatePrivateKey();
  return { key, address: privateKeyToAccount(key).address };
}

const pay = (harness: Harness, tool: string, body: unknown, payment?: string, headers: Record<string, string> = {}) =>
  harness.call(tool, body, undefined, payment === undefined ? headers : { 'x-payment': payment, ...headers });

async function offer(harness: Harness, tool: string, body: unknown): Promise<PaymentRequirements> {
  const res = await pay(harness, tool, body);
  expect(res.statusCode).toBe(402);
  return json(res).accepts[0];
}

const EXPOSED = ['X-Payment-Required', 'X-Payment-Amount', 'X-Payment-Currency', 'X-Payment-Network', 'X-Payment-Response'];

function expectPaymentError(res: Awaited<ReturnType<Harness['call']>>, code: string, reason?: string) {
  expect(res.statusCode).toBe(402);
  expect(res.headers).toMatchObject({
    'x-payment-required': 'true',
    'x-payment-currency': 'USDC',
    'x-payment-network': 'base-sepolia',
    'cache-control': 'no-store',
  });
  const body = json(res);
  expect(body).toMatchObject({ x402Version: 1, code, request_id: res.headers['x-request-id'] });
  expect(typeof body.error).toBe('string');
  if (reason) expect(body.reason).toBe(reason);
  expect(body.accepts).toHaveLength(1);
  expect(PaymentRequirementsSchema.safeParse(body.accepts[0]).success).toBe(true);
  return body;
}

describe('a paid call without a key', () => {
  it('is answered 402 with the price in the X-Payment-* headers and x402 requirements in the body', async () => {
    const res = await pay(h, 'compute', { expression: '1+1' });
    const body = expectPaymentError(res, 'payment_required');
    expect(res.headers['x-payment-amount']).toBe('0.02');
    const exposed = String(res.headers['access-control-expose-headers']).split(/,\s*/);
    for (const name of EXPOSED) expect(exposed).toContain(name);
    expect(res.headers['x-ratelimit-limit']).toBeUndefined();
    expect(body.error).toMatch(/0\.02 USDC/);
    expect(body.accepts[0]).toMatchObject({
      scheme: 'exact',
      network: 'base-sepolia',
      maxAmountRequired: '20000',
      resource: 'http://localhost/tools/compute',
      mimeType: 'application/json',
      payTo: PAY_TO,
      // Deferred settlement asks for authorizations valid long enough for an operator to collect them.
      maxTimeoutSeconds: 3600,
      asset: USDC_BASE_SEPOLIA,
      extra: { name: 'USDC', version: '2' },
    });
    expect(body.accepts[0].description).toMatch(/^compute: /);
    expect(body.accepts[0].outputSchema.input).toMatchObject({ type: 'http', method: 'POST', bodyFields: { properties: { expression: { type: 'string' } } } });
  });

  it('uses PUBLIC_BASE_URL for the resource when it is set', async () => {
    expect((await offer(hf, 'compute', { expression: '1' })).resource).toBe(`${PUBLIC_BASE}/tools/compute`);
  });

  it('is refused before any payment is asked for when the tool is free, the input is bad or the tool unknown', async () => {
    const free = await pay(h, 'check_balance', {});
    expect(free.statusCode).toBe(401);
    expect(json(free).error).toMatchObject({ code: 'unauthorized', message: expect.stringMatching(/free but needs an API key/) });
    expect(free.headers['x-payment-required']).toBeUndefined();
    expect(json(await pay(h, 'compute', { expression: 7 })).error.code).toBe('invalid_input');
    expect((await pay(h, 'no_such_tool', {})).statusCode).toBe(404);
  });

  it('with a key, is a key call: an X-Payment beside it is ignored', async () => {
    const acct = await h.account('pro', 100);
    const payer = newPayer();
    const payment = toHeader(await signPayment(await offer(h, 'compute', { expression: '2+2' }), { privateKey: payer.key }));
    const res = await h.call('compute', { expression: '2+2' }, acct.apiKey, { 'x-payment': payment });
    expect(json(res)).toMatchObject({ result: { value: 4 }, cost_cents: 2, remaining_credits: 98 });
    expect(res.headers['x-payment-response']).toBeUndefined();
    expect(await paymentsOf(payer.address)).toEqual([]);
  });
});

describe('a signed payment', () => {
  it('runs the tool once, records the payment and the ledger entry under the payer, and says so in X-Payment-Response', async () => {
    const payer = newPayer();
    const payment = await signPayment(await offer(h, 'compute', { expression: '6*7' }), { privateKey: payer.key });
    const res = await pay(h, 'compute', { expression: '6*7' }, toHeader(payment));
    expect(res.statusCode).toBe(200);
    expect(json(res)).toEqual({ result: expect.objectContaining({ value: 42 }), cost_cents: 2, remaining_credits: null });
    expect(settleResponseFromHeader(res.headers['x-payment-response'] as string)).toEqual({
      success: true,
      transaction: '',
      network: 'base-sepolia',
      payer: payer.address,
    });
    expect(String(res.headers['access-control-expose-headers'])).toContain('X-Payment-Response');
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'awaiting_settlement', tool: 'compute', value_atomic: '20000', tx_hash: null }]);
    expect(await ledgerOf(payer.address)).toEqual([
      {
        entry_key: expect.stringMatching(new RegExp(`^x402:.+:${res.headers['x-job-id']}$`)),
        account_id: null,
        kind: 'payment',
        tool: 'compute',
        delta_cents: -2,
      },
    ]);
  });

  const now = () => Math.floor(Date.now() / 1000);
  const refusals: Array<[string, string, (req: PaymentRequirements, key: Hex) => Promise<string>]> = [
    ['wrong amount', 'invalid_amount', async (req, key) => toHeader(await signPayment(req, { privateKey: key, authorization: { value: '10000' } }))],
    ['wrong payee', 'invalid_payee', async (req, key) => toHeader(await signPayment(req, { privateKey: key, authorization: { to: OTHER.address } }))],
    [
      'expired',
      'payment_expired',
      async (req, key) =>
        toHeader(await signPayment(req, { privateKey: key, authorization: { validAfter: String(now() - 600), validBefore: String(now() - 10) } })),
    ],
    [
      'not yet valid',
      'payment_not_yet_valid',
      async (req, key) =>
        toHeader(await signPayment(req, { privateKey: key, authorization: { validAfter: String(now() + 3600), validBefore: String(now() + 7200) } })),
    ],
    ['for another network', 'invalid_network', async (req, key) => toHeader(await signPayment(req, { privateKey: key, network: 'base' }))],
    [
      'signed by someone else',
      'invalid_signature',
      async (req, key) => toHeader(await signPayment(req, { privateKey: OTHER_KEY, authorization: { from: privateKeyToAccount(key).address } })),
    ],
    ['not base64', 'malformed_payment', async () => 'this is not base64!'],
    ['not an x402 payment', 'malformed_payment', async () => toHeader({ x402Version: 1, scheme: 'exact', network: 'base-sepolia', payload: {} })],
  ];

  it.each(refusals)('%s is refused (%s) with fresh requirements, and nothing runs', async (_name, reason, make) => {
    const payer = newPayer();
    const req = await offer(h, 'compute', { expression: '1+2' });
    const before = await tableCounts();
    const res = await pay(h, 'compute', { expression: '1+2' }, await make(req, payer.key));
    const body = expectPaymentError(res, 'payment_invalid', reason);
    expect(body.accepts[0]).toEqual(req);
    expect(body.result).toBeUndefined();
    expect(await tableCounts()).toEqual(before);
  });

  it('sent again for the same request is answered with the first answer (replayed), and the tool ran once', async () => {
    const payer = newPayer();
    const header = toHeader(await signPayment(await offer(h, 'compute', { expression: '3*3' }), { privateKey: payer.key }));
    const first = await pay(h, 'compute', { expression: '3*3' }, header);
    expect(first.statusCode).toBe(200);
    const again = await pay(h, 'compute', { expression: '3*3' }, header);
    expect(again.statusCode).toBe(200);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(json(again)).toEqual(json(first));
    expect(again.headers['x-payment-response']).toBe(first.headers['x-payment-response']);
    expect(await ledgerOf(payer.address)).toHaveLength(1);
    expect(await paymentsOf(payer.address)).toHaveLength(1);
  });

  it('used again for another request is refused as already used, and the tool ran once', async () => {
    const payer = newPayer();
    const header = toHeader(await signPayment(await offer(h, 'compute', { expression: '3*3' }), { privateKey: payer.key }));
    expect((await pay(h, 'compute', { expression: '3*3' }, header)).statusCode).toBe(200);
    const other = await pay(h, 'compute', { expression: '3*4' }, header);
    expectPaymentError(other, 'payment_already_used', 'nonce_already_used');
    expect(await ledgerOf(payer.address)).toHaveLength(1);
    expect(await paymentsOf(payer.address)).toHaveLength(1);
  });

  it('sent several times at the same moment runs the tool exactly once', async () => {
    const payer = newPayer();
    const header = toHeader(await signPayment(await offer(h, 'compute', { expression: '4*4' }), { privateKey: payer.key }));
    const results = await Promise.all(Array.from({ length: 5 }, () => pay(h, 'compute', { expression: '4*4' }, header)));
    // One runs. A copy arriving while it runs is refused (402), one arriving while it settles is told
    // to retry (409), one arriving after it was answered gets that answer again.
    const ok = results.filter((r) => r.statusCode === 200);
    expect(ok.filter((r) => r.headers['idempotent-replayed'] !== 'true')).toHaveLength(1);
    for (const r of ok) expect(json(r).result.value).toBe(16);
    for (const r of results.filter((r) => r.statusCode === 409)) expect(json(r).error.code).toBe('idempotency_in_progress');
    for (const r of results.filter((r) => r.statusCode !== 200 && r.statusCode !== 409)) expectPaymentError(r, 'payment_already_used', 'nonce_already_used');
    expect(await ledgerOf(payer.address)).toHaveLength(1);
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'awaiting_settlement' }]);
  });

  it('is not charged when the tool fails: the tool error is returned and the payment recorded as failed', async () => {
    const payer = newPayer();
    // Valid for the schema, so it is admitted; mathjs refuses it when the tool runs.
    const body = { expression: 'no_such_function(1)' };
    const header = toHeader(await signPayment(await offer(h, 'compute', body), { privateKey: payer.key }));
    const res = await pay(h, 'compute', body, header);
    expect(res.statusCode).toBe(400);
    expect(json(res).error).toMatchObject({ code: 'invalid_input', message: expect.stringMatching(/Cannot evaluate/) });
    expect(res.headers['x-payment-response']).toBeUndefined();
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'failed', error: 'call: invalid_input' }]);
    expect(await ledgerOf(payer.address)).toEqual([]);
  });

  it('with an Idempotency-Key, a retry under a new payment gets the first response and is not charged again', async () => {
    const payer = newPayer();
    const body = { expression: '5*5' };
    const idem = { 'idempotency-key': `x402-${randomBytes(6).toString('hex')}` };
    const first = await pay(h, 'compute', body, toHeader(await signPayment(await offer(h, 'compute', body), { privateKey: payer.key })), idem);
    expect(first.statusCode).toBe(200);
    const retry = await pay(h, 'compute', body, toHeader(await signPayment(await offer(h, 'compute', body), { privateKey: payer.key })), idem);
    expect(retry.statusCode).toBe(200);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(retry.body).toBe(first.body);
    expect(retry.headers['x-job-id']).toBe(first.headers['x-job-id']);
    expect(retry.headers['x-payment-response']).toBe(first.headers['x-payment-response']);
    expect(await ledgerOf(payer.address)).toHaveLength(1);
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'awaiting_settlement' }, { status: 'failed', error: 'call: idempotent_replay' }]);
  });
});

describe('a standard x402 client', () => {
  it('completes a paid call with the x402 package and plain fetch, against a listening server', async () => {
    await h.app.listen({ port: 0, host: '127.0.0.1' });
    const url = `http://127.0.0.1:${(h.app.server.address() as AddressInfo).port}/tools/compute`;
    const init = { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ expression: 'sqrt(144)' }) };
    const payerKey = generatePrivateKey();

    // What x402-fetch does: read the 402, pick a requirement, sign it with the wallet, retry.
    const first = await fetch(url, init);
    expect(first.status).toBe(402);
    const { x402Version, accepts } = (await first.json()) as { x402Version: number; accepts: unknown[] };
    const chosen = selectPaymentRequirements(
      accepts.map((a) => PaymentRequirementsSchema.parse(a)),
      'base-sepolia',
      'exact',
    );
    const wallet = await createSigner('base-sepolia', payerKey);
    const header = await createPaymentHeader(wallet, x402Version, chosen);
    const paid = await fetch(url, { ...init, headers: { ...init.headers, 'X-PAYMENT': header } });

    expect(paid.status).toBe(200);
    expect(((await paid.json()) as { result: { value: number } }).result.value).toBe(12);
    const settlement = settleResponseFromHeader(paid.headers.get('x-payment-response')!);
    expect(settlement).toMatchObject({ success: true, network: 'base-sepolia', payer: privateKeyToAccount(payerKey).address });
    expect(await ledgerOf(privateKeyToAccount(payerKey).address)).toHaveLength(1);
  });
});

describe('with a facilitator', () => {
  it('settles before answering: the result comes with the transaction in X-Payment-Response', async () => {
    const payer = newPayer();
    const req = await offer(hf, 'compute', { expression: '10/4' });
    const payment = await signPayment(req, { privateKey: payer.key });
    const res = await pay(hf, 'compute', { expression: '10/4' }, toHeader(payment));
    expect(res.statusCode).toBe(200);
    expect(json(res).result.value).toBe(2.5);
    const tx = fakeTxHash(payment.payload.authorization.nonce);
    expect(settleResponseFromHeader(res.headers['x-payment-response'] as string)).toEqual({
      success: true,
      transaction: tx,
      network: 'base-sepolia',
      payer: payer.address,
    });
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'settled', tx_hash: tx }]);
    const calls = fake.requests.filter((r) => r.body.paymentPayload.payload.authorization.nonce === payment.payload.authorization.nonce);
    expect(calls.map((c) => c.path)).toEqual(['/verify', '/settle']);
    // The fake lists v2 on /supported, so a v1 client's payment reaches it in v2's shape: the same offer
    // (CAIP-2 network, `amount`) and the same signed authorization.
    const v2Requirements = {
      scheme: 'exact',
      network: 'eip155:84532',
      asset: req.asset,
      amount: req.maxAmountRequired,
      payTo: req.payTo,
      maxTimeoutSeconds: req.maxTimeoutSeconds,
      extra: req.extra,
    };
    expect(calls[1]!.body).toMatchObject({
      x402Version: 2,
      paymentRequirements: v2Requirements,
      paymentPayload: { x402Version: 2, accepted: v2Requirements, payload: payment.payload, resource: { url: req.resource } },
    });
    expect(await ledgerOf(payer.address)).toMatchObject([{ kind: 'payment', delta_cents: -2 }]);
  });

  it('withholds the result when settlement fails, and nothing is charged or recorded as paid', async () => {
    const payer = newPayer();
    const payment = await signPayment(await offer(hf, 'compute', { expression: '7*6' }), { privateKey: payer.key });
    fake.script('/settle', {
      status: 400,
      body: { success: false, errorReason: 'insufficient_funds', transaction: '', network: 'base-sepolia', payer: payer.address },
    });
    const res = await pay(hf, 'compute', { expression: '7*6' }, toHeader(payment));
    const body = expectPaymentError(res, 'payment_invalid', 'settlement_failed');
    expect(body.settlement_error).toBe('insufficient_funds');
    expect(body).not.toHaveProperty('result');
    expect(settleResponseFromHeader(res.headers['x-payment-response'] as string)).toMatchObject({ success: false, errorReason: 'insufficient_funds' });
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'failed', error: 'settle: insufficient_funds', tx_hash: null }]);
    // Nothing reaches the ledger for a payment that did not settle.
    expect(await ledgerOf(payer.address)).toEqual([]);
  });
});

describe('a paid call that outlasts the sync timeout', () => {
  it('answers 504 without settling, and records nothing when the job finishes later', async () => {
    const model = await startFakeOpenAI();
    const slow = await startHarness({ ...x402Env, SYNC_TIMEOUT_MS: '300', LLM_BASE_URL: model.baseURL }, { workers: ['llm'] });
    try {
      const gate = deferred();
      model.enqueue({ type: 'tokens', tokens: ['Four', '.'], beforeToken: (i) => (i === 0 ? gate.promise : undefined) });
      const payer = newPayer();
      const body = { problem: 'What is 2 + 2?' };
      const res = await pay(slow, 'genius', body, toHeader(await signPayment(await offer(slow, 'genius', body), { privateKey: payer.key })));
      expect(res.statusCode).toBe(504);
      expect(json(res).error).toMatchObject({ code: 'timeout', message: expect.stringMatching(/nothing was charged/), job_id: expect.any(String) });
      expect(res.headers['x-payment-response']).toBeUndefined();
      expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'failed', error: 'call: timeout' }]);

      // The model answers after all: the job completes, and still nothing is recorded as paid.
      const jobId = json(res).error.job_id as string;
      const done = slow.container.api!.dispatcher.waitFor(jobId, 20_000);
      gate.resolve();
      expect((await done.outcome).state).toBe('completed');
      expect(await ledgerOf(payer.address)).toEqual([]);
    } finally {
      await slow.close();
      await model.close();
    }
  });
});

describe('with pay-per-call disabled', () => {
  it('a call without a key is 401 unauthorized, X-Payment or not', async () => {
    const off = await startHarness({ DATABASE_URL: dbUrl }, { workers: [] });
    try {
      for (const headers of [{}, { 'x-payment': toHeader({ x402Version: 1 }) }] as Array<Record<string, string>>) {
        const res = await off.call('compute', { expression: '1' }, undefined, headers);
        expect(res.statusCode).toBe(401);
        expect(json(res).error.code).toBe('unauthorized');
        expect(res.headers['x-payment-required']).toBeUndefined();
      }
    } finally {
      await off.close();
    }
  });
});

describe('operator commands (npm run admin -- payments ...)', () => {
  const root = fileURLToPath(new URL('../../', import.meta.url));
  const run = promisify(execFile);
  async function admin(args: string[], env: Record<string, string> = {}) {
    try {
      const { stdout } = await run(process.execPath, ['--import', 'tsx', 'src/cli/admin.ts', ...args], {
        cwd: root,
        env: {
          ...process.env,
          DATABASE_URL: dbUrl,
          REDIS_URL: h.config.REDIS_URL,
          REDIS_PREFIX: h.config.REDIS_PREFIX,
          LOG_LEVEL: 'warn',
          X402_PAY_TO: PAY_TO,
          ...env,
        },
      });
      return { code: 0, stdout, stderr: '' };
    } catch (e) {
      const err = e as { code: number; stdout: string; stderr: string };
      return { code: err.code, stdout: err.stdout, stderr: err.stderr };
    }
  }

  async function awaitingPayment(): Promise<string> {
    const payer = newPayer();
    const res = await pay(
      h,
      'compute',
      { expression: '1+1' },
      toHeader(await signPayment(await offer(h, 'compute', { expression: '1+1' }), { privateKey: payer.key })),
    );
    expect(res.statusCode).toBe(200);
    return (await paymentsOf(payer.address))[0]!.id;
  }

  it('list, export, mark-settled, mark-failed and settle', { timeout: 300_000 }, async () => {
    const [a, b, c] = [await awaitingPayment(), await awaitingPayment(), await awaitingPayment()];

    const listed = JSON.parse((await admin(['payments', 'list'])).stdout);
    const ids = listed.payments.map((p: { id: string }) => p.id);
    expect(ids).toEqual(expect.arrayContaining([a, b, c]));
    expect(listed.count).toBe(ids.length);
    expect(listed.payments.find((p: { id: string }) => p.id === c)).toMatchObject({ tool: 'compute', value_atomic: '20000', expired: false });

    const lines = (await admin(['payments', 'export'])).stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines.map((l) => l.id)).toEqual(ids);
    for (const l of lines) expect(SettleRequestSchema.safeParse(l.settle_request).success).toBe(true);

    const tx = `0x${'ab'.repeat(32)}`;
    expect(JSON.parse((await admin(['payments', 'mark-settled', '--id', a, '--tx', tx])).stdout)).toEqual({ id: a, status: 'settled', tx_hash: tx });
    const failed = await admin(['payments', 'mark-failed', '--id', b, '--reason', 'transfer reverted']);
    expect(JSON.parse(failed.stdout)).toMatchObject({ id: b, status: 'failed', error: 'operator: transfer reverted' });
    const final = await admin(['payments', 'mark-settled', '--id', b, '--tx', tx]);
    expect(final.code).toBe(1);
    expect(JSON.parse(final.stderr).error.code).toBe('not_found');
    const badTx = await admin(['payments', 'mark-settled', '--id', c, '--tx', '0x1234']);
    // A malformed flag is a usage error: one plain line naming it, then the usage, exit code 2.
    expect(badTx.code).toBe(2);
    expect(badTx.stderr.split('\n')[0]).toBe('error: payments mark-settled: --tx must be a 0x-prefixed 32-byte transaction hash');

    expect(JSON.parse((await admin(['payments', 'settle'])).stderr).error.message).toMatch(/X402_FACILITATOR_URL/);
    const waiting = ids.length - 2;
    const settled = await admin(['payments', 'settle'], { X402_FACILITATOR_URL: fake.url });
    expect(settled.stderr).toBe('');
    const summary = JSON.parse(settled.stdout);
    // Earlier tests' payments may have passed their validBefore by now; those are failed as expired.
    expect(summary.settled + summary.expired).toBe(waiting);
    expect(summary.settled).toBeGreaterThanOrEqual(1);
    const rowC = await h.container.pool.one(sql.type(PaymentRow)`
      SELECT id, status, tool, value_atomic::text AS value_atomic, tx_hash, error FROM x402_payments WHERE id = ${c}`);
    expect(rowC).toMatchObject({ status: 'settled', tx_hash: expect.stringMatching(/^0x[0-9a-f]{64}$/) });
    expect(JSON.parse((await admin(['payments', 'list'])).stdout)).toEqual({ count: 0, payments: [] });
  });
});
