import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import type { Hex } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { settleResponseFromHeader } from 'x402/types';
import { sql } from '../../src/db/pool.js';
import type { PaymentRequirements } from '../../src/pay/x402/requirements.js';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { PAY_TO, signPayment, toHeader } from '../helpers/x402-sign.js';

/**
 * Pay-per-call on the root protocol (POST /): direct, chain and parallel requests are priced as the
 * total of their steps and paid all or nothing; streaming needs a key.
 */

let h: Harness;

beforeAll(async () => {
  h = await startHarness({ X402_ENABLED: 'true', X402_PAY_TO: PAY_TO, X402_SETTLEMENT: 'deferred' }, { workers: ['core', 'text'] });
});

afterAll(async () => {
  await h?.close();
});

const LedgerRow = z.object({ account_id: z.string().nullable(), kind: z.string(), tool: z.string().nullable(), delta_cents: z.number() });
const PaymentRow = z.object({ status: z.string(), tool: z.string(), value_atomic: z.string(), error: z.string().nullable() });

const ledgerOf = (payer: string) =>
  h.container.pool.any(sql.type(LedgerRow)`
    SELECT account_id, kind, tool, delta_cents FROM ledger WHERE payer = ${payer.toLowerCase()} ORDER BY id`);
const paymentsOf = (payer: string) =>
  h.container.pool.any(sql.type(PaymentRow)`
    SELECT status, tool, value_atomic::text AS value_atomic, error FROM x402_payments WHERE payer = ${payer.toLowerCase()} ORDER BY created_at, id`);

function newPayer(): { key: Hex; address: string } {
  const key = generatePrivateKey();
  return { key, address: privateKeyToAccount(key).address };
}

const root = (body: unknown, headers: Record<string, string> = {}) =>
  h.request({ method: 'POST', url: '/', headers: { 'content-type': 'application/json', ...headers }, payload: JSON.stringify(body) });

async function offer(body: unknown): Promise<PaymentRequirements> {
  const res = await root(body);
  expect(res.statusCode).toBe(402);
  return json(res).accepts[0];
}

/** Asks for the price, signs it and sends the request again with the payment. */
async function paid(body: unknown, payer: { key: Hex }) {
  return root(body, { 'x-payment': toHeader(await signPayment(await offer(body), { privateKey: payer.key })) });
}

describe('a chain without a key', () => {
  const body = { chain: ['compute', 'compute'], q: '2*3' };

  it('is answered 402 priced as the total of its steps, for the root resource', async () => {
    const res = await root(body);
    expect(res.statusCode).toBe(402);
    expect(res.headers['x-payment-amount']).toBe('0.04');
    expect(json(res)).toMatchObject({ x402Version: 1, code: 'payment_required' });
    expect(json(res).accepts[0]).toMatchObject({ scheme: 'exact', maxAmountRequired: '40000', resource: 'http://localhost/', payTo: PAY_TO });
    expect(json(res).accepts[0].description).toMatch(/compute -> compute/);
  });

  it('runs every step for a signed payment and records one ledger entry for the chain under the payer', async () => {
    const payer = newPayer();
    const res = await paid(body, payer);
    expect(res.statusCode).toBe(200);
    expect(json(res)).toEqual({
      steps: [
        { tool: 'compute', result: expect.objectContaining({ expression: '2*3', result: '6' }), cost_cents: 2 },
        { tool: 'compute', result: expect.objectContaining({ expression: '6', value: 6 }), cost_cents: 2 },
      ],
      result: expect.objectContaining({ value: 6 }),
      cost_cents: 4,
      remaining_credits: null,
    });
    expect(settleResponseFromHeader(res.headers['x-payment-response'] as string)).toMatchObject({ success: true, payer: payer.address });
    expect(await paymentsOf(payer.address)).toEqual([{ status: 'awaiting_settlement', tool: 'chain:compute,compute', value_atomic: '40000', error: null }]);
    expect(await ledgerOf(payer.address)).toEqual([{ account_id: null, kind: 'payment', tool: 'chain:compute,compute', delta_cents: -4 }]);
    // The flow has no owner key: its jobs cannot be read through GET /jobs.
    const acct = await h.account('pro', 10);
    const job = await h.request({ method: 'GET', url: `/jobs/${res.headers['x-job-id']}`, headers: { authorization: `Bearer ${acct.apiKey}` } });
    expect(job.statusCode).toBe(404);
  });

  it('that fails part-way returns the error without any step result, charges nothing and marks the payment failed', async () => {
    const payer = newPayer();
    // zeros(1000) works, but its 3000-character result is too long an expression for step 2.
    const res = await paid({ chain: ['compute', 'compute'], q: 'zeros(1000)' }, payer);
    expect(res.statusCode).toBe(400);
    const { error } = json(res);
    expect(error.code).toBe('invalid_input');
    expect(error.message).toMatch(/^Chain step 2 of 2 \(compute\) failed: Input for compute is invalid/);
    expect(error.message).toMatch(/nothing was charged/);
    expect(error.failed_step).toMatchObject({ index: 1, tool: 'compute', error: { code: 'invalid_input' } });
    expect(error).not.toHaveProperty('steps');
    expect(error).not.toHaveProperty('result');
    expect(JSON.stringify(error)).not.toContain('0, 0, 0');
    expect(res.headers['x-payment-response']).toBeUndefined();
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'failed', error: 'call: invalid_input' }]);
    expect(await ledgerOf(payer.address)).toEqual([]);
  });
});

describe('a parallel request without a key', () => {
  it('is priced as the total of its tools and returns every result for a signed payment', async () => {
    const body = { parallel: ['compute', 'compute', 'compute'], q: '7*6' };
    const req = await offer(body);
    expect(req.maxAmountRequired).toBe('60000');
    const payer = newPayer();
    const res = await root(body, { 'x-payment': toHeader(await signPayment(req, { privateKey: payer.key })) });
    expect(res.statusCode).toBe(200);
    expect(json(res)).toEqual({
      results: {
        compute: { result: expect.objectContaining({ value: 42 }), cost_cents: 2 },
        'compute#2': { result: expect.objectContaining({ value: 42 }), cost_cents: 2 },
        'compute#3': { result: expect.objectContaining({ value: 42 }), cost_cents: 2 },
      },
      cost_cents: 6,
      remaining_credits: null,
    });
    expect(await ledgerOf(payer.address)).toEqual([{ account_id: null, kind: 'payment', tool: 'parallel:compute,compute,compute', delta_cents: -6 }]);
  });

  it('with a failing tool fails whole: no result is handed out and nothing is charged', async () => {
    const payer = newPayer();
    // The expression passes compute's input schema but builds more than COMPUTE_MAX_ELEMENTS when it
    // runs; context_health reads the same q as text and succeeds.
    const res = await paid({ parallel: ['context_health', 'compute'], q: 'ones(2000, 2000)' }, payer);
    expect(res.statusCode, res.body).toBe(400);
    const { error } = json(res);
    expect(error.message).toMatch(/^Parallel step 2 of 2 \(compute\) failed: .*COMPUTE_MAX_ELEMENTS.*nothing was charged/);
    expect(error.failed_steps).toEqual([expect.objectContaining({ index: 1, tool: 'compute', key: 'compute' })]);
    expect(error).not.toHaveProperty('results');
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'failed', tool: 'parallel:context_health,compute', value_atomic: '30000' }]);
    expect(await ledgerOf(payer.address)).toEqual([]);
  });
});

describe('a direct request without a key', () => {
  it('is priced and paid like POST /tools/{m}', async () => {
    const body = { m: 'compute', q: '2 * (3 + 4)' };
    expect((await offer(body)).maxAmountRequired).toBe('20000');
    const payer = newPayer();
    const res = await paid(body, payer);
    expect(res.statusCode).toBe(200);
    expect(json(res)).toMatchObject({ result: { value: 14 }, cost_cents: 2, remaining_credits: null });
    expect(await ledgerOf(payer.address)).toEqual([{ account_id: null, kind: 'payment', tool: 'compute', delta_cents: -2 }]);
  });
});

describe('requests that cannot be paid per call', () => {
  it('stream: true and Last-Event-ID resumes need a key (401)', async () => {
    const stream = await root({ stream: true, m: 'compute', q: '1+1' });
    expect(stream.statusCode).toBe(401);
    expect(json(stream).error).toMatchObject({ code: 'unauthorized', message: expect.stringMatching(/^stream: true is not available with pay-per-call/) });
    expect(stream.headers['x-payment-required']).toBeUndefined();
    const resume = await root({ m: 'compute', q: '1+1' }, { accept: 'text/event-stream', 'last-event-id': 'core-abc:0' });
    expect(resume.statusCode).toBe(401);
    expect(json(resume).error.message).toMatch(/^Resuming an event stream \(Last-Event-ID\) is not available with pay-per-call/);
  });

  it('free requests need a key, and bad input is refused before a price is asked', async () => {
    const free = await root({ chain: ['check_balance', 'check_balance'], q: 'x' });
    expect(free.statusCode).toBe(401);
    // A free step needs a key inside a chain as it does alone (named once, however often it is listed).
    expect(json(free).error.message).toMatch(/^check_balance \(in this chain request\) is free but needs an API key/);
    expect(json(free).error.free_tools).toEqual(['check_balance']);
    const bad = await root({ parallel: ['compute', 'compute'], q: '' });
    expect(bad.statusCode).toBe(400);
    expect(bad.headers['x-payment-required']).toBeUndefined();
  });
});
