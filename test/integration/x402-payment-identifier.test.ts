import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import type { Address } from 'viem';
import { decodePaymentRequiredHeader } from '@x402/core/http';
import { wrapFetchWithPayment, decodePaymentResponseHeader, x402Client } from '@x402/fetch';
import { ExactEvmScheme } from '@x402/evm';
import { sql } from '../../src/db/pool.js';
import { startChain, type Chain, type Wallet } from '../helpers/chain.js';
import { startHarness, type Harness } from '../helpers/harness.js';

/**
 * x402's payment-identifier extension over HTTP (PAYMENT-SIGNATURE), on anvil with the service
 * settling itself: @x402/fetch with the id added the way x402's extension docs show (a hook before
 * the payment is created). A retry of the same payment answers the first result and settles nothing;
 * another payment or request under the same id is 409.
 */

let chain: Chain;
let h: Harness;
let base: string;
let payTo: Address;

beforeAll(async () => {
  chain = await startChain();
  const settler = await chain.newWallet();
  payTo = (await chain.newWallet()).address;
  h = await startHarness(
    { X402_ENABLED: 'true', X402_PAY_TO: payTo, X402_RPC_URL: chain.rpcUrl, X402_SETTLER_PRIVATE_KEY: settler.privateKey },
    { workers: ['core'] },
  );
  await h.app.listen({ port: 0, host: '127.0.0.1' });
  base = `http://127.0.0.1:${(h.app.server.address() as AddressInfo).port}`;
}, 60_000);

afterAll(async () => {
  await h?.close();
  await chain?.stop();
});

const PaymentRow = z.object({ status: z.string() });
const paymentsOf = (payer: Address) =>
  h.container.pool.any(sql.type(PaymentRow)`SELECT status FROM x402_payments WHERE payer = ${payer.toLowerCase()} ORDER BY created_at`);

async function funded(atomic: bigint): Promise<Wallet> {
  const w = await chain.newWallet();
  await chain.mint(w.address, atomic);
  return w;
}

const newId = () => `pay_${crypto.randomUUID().replaceAll('-', '')}`;

/** @x402/fetch paying as `payer`, the id in every payment, and the PAYMENT-SIGNATURE headers it sent. */
function payingFetch(payer: Wallet, id: () => string | undefined) {
  const sent: string[] = [];
  const client = new x402Client().register('eip155:*', new ExactEvmScheme(payer.account));
  client.onBeforePaymentCreation(async ({ paymentRequired }) => {
    const ext = paymentRequired.extensions?.['payment-identifier'] as { info?: { id?: string } } | undefined;
    const value = id();
    if (ext?.info && value) ext.info.id = value;
  });
  const recording: typeof fetch = async (input, init) => {
    const signature = new Headers((input as Request).headers ?? init?.headers).get('payment-signature');
    if (signature) sent.push(signature);
    return fetch(input, init);
  };
  return { fetch: wrapFetchWithPayment(recording, client), sent };
}

const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
  fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });

describe('payment-identifier over HTTP', () => {
  it('is declared in the PAYMENT-REQUIRED offer, optional, with the schema of its id', async () => {
    const res = await post('/tools/compute', { expression: '1' });
    expect(res.status).toBe(402);
    expect(decodePaymentRequiredHeader(res.headers.get('PAYMENT-REQUIRED')!).extensions).toEqual({
      'payment-identifier': {
        info: { required: false },
        schema: {
          $schema: 'https://json-schema.org/draft/2020-12/schema',
          type: 'object',
          properties: { required: { type: 'boolean' }, id: { type: 'string', minLength: 16, maxLength: 128, pattern: '^[a-zA-Z0-9_-]+$' } },
          required: ['required'],
        },
      },
    });
  });

  it('the same payment sent again answers the first result (Idempotent-Replayed) and is settled once', async () => {
    const payer = await funded(1_000_000n);
    const id = newId();
    const { fetch: pay, sent } = payingFetch(payer, () => id);
    const body = JSON.stringify({ expression: '6*7' });
    const first = await pay(`${base}/tools/compute`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    expect(first.status).toBe(200);
    const firstBody = await first.json();
    expect(sent).toHaveLength(1);
    const again = await post('/tools/compute', { expression: '6*7' }, { 'PAYMENT-SIGNATURE': sent[0]! });
    expect(again.status).toBe(200);
    expect(await again.json()).toEqual(firstBody);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(decodePaymentResponseHeader(again.headers.get('PAYMENT-RESPONSE')!)).toEqual(decodePaymentResponseHeader(first.headers.get('PAYMENT-RESPONSE')!));
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);
    expect(await paymentsOf(payer.address)).toEqual([{ status: 'settled' }]);
  });

  it('the same id with a new payment, or the same payment for another body, is 409; nothing more moves', async () => {
    const payer = await funded(1_000_000n);
    const id = newId();
    const { fetch: pay, sent } = payingFetch(payer, () => id);
    const call = (expression: string) =>
      pay(`${base}/tools/compute`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ expression }) });
    expect((await call('2+2')).status).toBe(200);
    // @x402/fetch signs a new payment for the retry, under the same id.
    const newPayment = await call('2+2');
    expect(newPayment.status).toBe(409);
    expect(await newPayment.json()).toMatchObject({ error: { code: 'payment_identifier_reused', payment_identifier: id } });
    const otherBody = await post('/tools/compute', { expression: '3+3' }, { 'PAYMENT-SIGNATURE': sent[0]! });
    expect(otherBody.status).toBe(409);
    expect(await otherBody.json()).toMatchObject({ error: { code: 'payment_identifier_reused' } });
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);
    expect(await paymentsOf(payer.address)).toEqual([{ status: 'settled' }]);
  });

  it('the same payment eight times at once: one run and one settlement; the others replay it or are told it is in progress', async () => {
    const payer2 = await funded(1_000_000n);
    const id2 = newId();
    // Sign without sending: the signature of a first request that the network lost.
    const offer = decodePaymentRequiredHeader((await post('/tools/compute', { expression: '5*5' })).headers.get('PAYMENT-REQUIRED')!);
    const client = new x402Client().register('eip155:*', new ExactEvmScheme(payer2.account));
    (offer.extensions!['payment-identifier'] as { info: { id: string } }).info.id = id2;
    const payment = await client.createPaymentPayload(offer);
    const header = Buffer.from(JSON.stringify(payment)).toString('base64');
    const answers = await Promise.all(Array.from({ length: 8 }, () => post('/tools/compute', { expression: '5*5' }, { 'PAYMENT-SIGNATURE': header })));
    const statuses = answers.map((r) => r.status);
    expect(statuses.filter((s) => s === 200).length).toBeGreaterThanOrEqual(1);
    expect(statuses.every((s) => s === 200 || s === 409)).toBe(true);
    for (const r of answers.filter((r) => r.status === 409)) expect(await r.json()).toMatchObject({ error: { code: 'idempotency_in_progress' } });
    expect(await chain.balanceOf(payer2.address)).toBe(1_000_000n - 20_000n);
    expect(await paymentsOf(payer2.address)).toEqual([{ status: 'settled' }]);
  });

  it('an id outside the format is 400 and nothing is reserved; a payment refused before running frees its id', async () => {
    const payer = await funded(1_000_000n);
    let id: string | undefined = 'too_short';
    const bad = payingFetch(payer, () => id);
    const res = await bad.fetch(`${base}/tools/compute`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"expression":"1"}' });
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({
      error: { code: 'invalid_input', message: expect.stringMatching(/payment-identifier extension id must be 16 to 128/) },
    });
    expect(await paymentsOf(payer.address)).toEqual([]);
    // An unfunded payer is refused (402) before anything runs: the id stays free for a funded retry.
    const poor = await chain.newWallet();
    id = newId();
    const refused = await payingFetch(poor, () => id).fetch(`${base}/tools/compute`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"expression":"1"}',
    });
    expect(refused.status).toBe(402);
    await chain.mint(poor.address, 100_000n);
    const retried = await payingFetch(poor, () => id).fetch(`${base}/tools/compute`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"expression":"1"}',
    });
    expect(retried.status).toBe(200);
    expect(await chain.balanceOf(poor.address)).toBe(80_000n);
  });

  it('an Idempotency-Key beside a payment identifier: the identifier governs', async () => {
    const payer = await funded(1_000_000n);
    const id = newId();
    const { fetch: pay, sent } = payingFetch(payer, () => id);
    const headers = { 'content-type': 'application/json', 'idempotency-key': 'k-1' };
    expect((await pay(`${base}/tools/compute`, { method: 'POST', headers, body: '{"expression":"8"}' })).status).toBe(200);
    const replay = await post('/tools/compute', { expression: '8' }, { 'PAYMENT-SIGNATURE': sent[0]!, 'idempotency-key': 'another' });
    expect(replay.status).toBe(200);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await paymentsOf(payer.address)).toEqual([{ status: 'settled' }]);
  });
});
