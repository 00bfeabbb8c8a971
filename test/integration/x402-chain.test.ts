import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createWalletClient, http, type Address, type Hex } from 'viem';
import { baseSepolia } from 'viem/chains';
import { wrapFetchWithPaymentFromConfig, decodePaymentResponseHeader } from '@x402/fetch';
import { decodePaymentRequiredHeader } from '@x402/core/http';
import { ExactEvmScheme } from '@x402/evm';
import { wrapFetchWithPayment as wrapFetchV1, decodeXPaymentResponse } from 'x402-fetch';
import { sql } from '../../src/db/pool.js';
import type { PaymentRequirements } from '../../src/pay/x402/requirements.js';
import { startChain, type Chain, type Wallet } from '../helpers/chain.js';
import { deferred, startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import { startHarness, type Harness } from '../helpers/harness.js';
import { signPayment, toHeader } from '../helpers/x402-sign.js';

/**
 * Self-settlement against a real chain: anvil (chain id 84532) with an EIP-3009 token at Base
 * Sepolia's USDC address, the service settling with its own key (X402_RPC_URL +
 * X402_SETTLER_PRIVATE_KEY). Balances, authorization state and receipts are read from the chain, and
 * the unmodified x402 clients (v2 `@x402/fetch` + `@x402/evm`, v1 `x402-fetch`) pay with their
 * documented set-up.
 */

let chain: Chain;
let h: Harness;
let base: string;
let model: FakeOpenAI;
let settler: Wallet;
let payTo: Address;

beforeAll(async () => {
  chain = await startChain();
  settler = await chain.newWallet();
  payTo = (await chain.newWallet()).address;
  model = await startFakeOpenAI();
  h = await startHarness(
    {
      X402_ENABLED: 'true',
      X402_PAY_TO: payTo,
      X402_RPC_URL: chain.rpcUrl,
      X402_SETTLER_PRIVATE_KEY: settler.privateKey,
      LLM_BASE_URL: model.baseURL,
    },
    { workers: ['core', 'llm'] },
  );
  await h.app.listen({ port: 0, host: '127.0.0.1' });
  base = `http://127.0.0.1:${(h.app.server.address() as AddressInfo).port}`;
}, 60_000);

afterAll(async () => {
  await h?.close();
  await model?.close();
  await chain?.stop();
});

const PaymentRow = z.object({ status: z.string(), tx_hash: z.string().nullable(), error: z.string().nullable(), x402_version: z.number() });
async function paymentsOf(payer: Address) {
  return h.container.pool.any(sql.type(PaymentRow)`
    SELECT status, tx_hash, error, x402_version FROM x402_payments WHERE payer = ${payer.toLowerCase()} ORDER BY created_at`);
}

/** A payer holding `atomic` units of the token (and 1 ETH, unused: payers never pay gas). */
async function funded(atomic: bigint): Promise<Wallet> {
  const w = await chain.newWallet();
  if (atomic > 0n) await chain.mint(w.address, atomic);
  return w;
}

async function post(path: string, body: unknown, headers: Record<string, string> = {}) {
  return fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
}

/** The v1 requirements of a paid call, from its 402. */
async function offer(path: string, body: unknown): Promise<PaymentRequirements> {
  const res = await post(path, body);
  expect(res.status).toBe(402);
  return ((await res.json()) as { accepts: PaymentRequirements[] }).accepts[0]!;
}

describe('unmodified x402 clients pay against the self-settled chain', () => {
  it('@x402/fetch + @x402/evm (v2), documented set-up: the price moves on chain and the answer names the transaction', async () => {
    const payer = await funded(1_000_000n);
    const before = { payer: await chain.balanceOf(payer.address), payTo: await chain.balanceOf(payTo) };
    const fetchWithPayment = wrapFetchWithPaymentFromConfig(fetch, {
      schemes: [{ network: 'eip155:*', client: new ExactEvmScheme(payer.account) }],
    });
    const res = await fetchWithPayment(`${base}/tools/compute`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ expression: '6*7' }),
    });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { result: { value: number } }).result.value).toBe(42);
    const settlement = decodePaymentResponseHeader(res.headers.get('PAYMENT-RESPONSE')!);
    expect(settlement).toMatchObject({ success: true, network: 'eip155:84532', payer: payer.address });
    // The transaction is real: mined, successful, and it moved exactly the price.
    const receipt = await chain.publicClient.getTransactionReceipt({ hash: settlement.transaction as Hex });
    expect(receipt.status).toBe('success');
    expect(receipt.from.toLowerCase()).toBe(settler.address.toLowerCase());
    expect(await chain.balanceOf(payer.address)).toBe(before.payer - 20_000n);
    expect(await chain.balanceOf(payTo)).toBe(before.payTo + 20_000n);
    expect(await paymentsOf(payer.address)).toEqual([{ status: 'settled', tx_hash: settlement.transaction, error: null, x402_version: 2 }]);
    // v1 clients read the same settlement, network by name.
    expect(decodeXPaymentResponse(res.headers.get('X-PAYMENT-RESPONSE')!)).toMatchObject({
      success: true,
      transaction: settlement.transaction,
      network: 'base-sepolia',
    });
  });

  it('x402-fetch 1.x (v1), documented set-up: pays the same way through X-PAYMENT', async () => {
    const payer = await funded(1_000_000n);
    const before = await chain.balanceOf(payTo);
    const client = createWalletClient({ account: payer.account, transport: http(chain.rpcUrl), chain: baseSepolia });
    // The README's set-up, as is; x402's types want a wallet extended with public actions, which
    // signing does not use, hence the cast.
    const fetchWithPay = wrapFetchV1(fetch, client as unknown as Parameters<typeof wrapFetchV1>[1]);
    const res = await fetchWithPay(`${base}/tools/compute`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ expression: '2^10' }),
    });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { result: { value: number } }).result.value).toBe(1024);
    const settlement = decodeXPaymentResponse(res.headers.get('X-PAYMENT-RESPONSE')!);
    expect(settlement).toMatchObject({ success: true, network: 'base-sepolia' });
    expect((await chain.publicClient.getTransactionReceipt({ hash: settlement.transaction as Hex })).status).toBe('success');
    expect(await chain.balanceOf(payTo)).toBe(before + 20_000n);
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'settled', x402_version: 1 }]);
  });

  it('the 402 carries the v1 body, the v2 PAYMENT-REQUIRED header and the X-Payment-* headers', async () => {
    const res = await post('/tools/compute', { expression: '1' });
    expect(res.status).toBe(402);
    const v1 = (await res.json()) as { x402Version: number; accepts: PaymentRequirements[] };
    expect(v1).toMatchObject({ x402Version: 1, accepts: [{ network: 'base-sepolia', maxAmountRequired: '20000', payTo }] });
    expect(decodePaymentRequiredHeader(res.headers.get('PAYMENT-REQUIRED')!)).toMatchObject({
      x402Version: 2,
      resource: { url: `${base}/tools/compute` },
      accepts: [{ scheme: 'exact', network: 'eip155:84532', amount: '20000', asset: chain.usdc, payTo, extra: { name: 'USDC', version: '2' } }],
    });
    expect(res.headers.get('x-payment-amount')).toBe('0.02');
    expect(res.headers.get('x-payment-network')).toBe('base-sepolia');
  });
});

describe('no work without verified funds', () => {
  it('an unfunded payer is refused 402 insufficient_funds, the tool never runs and nothing moves', async () => {
    const payer = await funded(0n);
    const body = { problem: 'What is 2 + 2?' };
    const requirements = await offer('/tools/genius', body);
    const calls = model.requests.length;
    const res = await post('/tools/genius', body, { 'X-PAYMENT': toHeader(await signPayment(requirements, { privateKey: payer.privateKey })) });
    expect(res.status).toBe(402);
    expect(await res.json()).toMatchObject({ code: 'payment_invalid', reason: 'insufficient_funds' });
    // The model was never asked: the tool did not run.
    expect(model.requests.length).toBe(calls);
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'failed', error: 'verify: insufficient_funds' }]);
  });

  it('a payer holding less than the price is refused the same way', async () => {
    const payer = await funded(19_999n);
    const requirements = await offer('/tools/compute', { expression: '1+1' });
    const res = await post(
      '/tools/compute',
      { expression: '1+1' },
      { 'X-PAYMENT': toHeader(await signPayment(requirements, { privateKey: payer.privateKey })) },
    );
    expect(res.status).toBe(402);
    expect(await res.json()).toMatchObject({ reason: 'insufficient_funds' });
    expect(await chain.balanceOf(payer.address)).toBe(19_999n);
  });
});

describe('one authorization, one settlement', () => {
  it('replayed after it settled: the same request gets the first answer and its settlement, another request 402; the chain moved once', async () => {
    const payer = await funded(1_000_000n);
    const requirements = await offer('/tools/compute', { expression: '3+4' });
    const header = toHeader(await signPayment(requirements, { privateKey: payer.privateKey }));
    const first = await post('/tools/compute', { expression: '3+4' }, { 'X-PAYMENT': header });
    expect(first.status).toBe(200);
    const again = await post('/tools/compute', { expression: '3+4' }, { 'X-PAYMENT': header });
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(await again.json()).toEqual(await first.json());
    expect(decodeXPaymentResponse(again.headers.get('X-PAYMENT-RESPONSE')!)).toEqual(decodeXPaymentResponse(first.headers.get('X-PAYMENT-RESPONSE')!));
    const other = await post('/tools/compute', { expression: '3+5' }, { 'X-PAYMENT': header });
    expect(other.status).toBe(402);
    expect(await other.json()).toMatchObject({ code: 'payment_already_used' });
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);
    expect(await paymentsOf(payer.address)).toHaveLength(1);
  });

  it('sent 8 times at once: one runs and settles, the others are refused or get its answer; one transfer on chain', async () => {
    const payer = await funded(1_000_000n);
    const requirements = await offer('/tools/compute', { expression: '5*5' });
    const header = toHeader(await signPayment(requirements, { privateKey: payer.privateKey }));
    const answers = await Promise.all(Array.from({ length: 8 }, () => post('/tools/compute', { expression: '5*5' }, { 'X-PAYMENT': header })));
    const fresh = answers.filter((r) => r.status === 200 && r.headers.get('idempotent-replayed') !== 'true');
    expect(fresh).toHaveLength(1);
    // Copies that arrive while it runs: 402; while it settles: 409 (retry); after: its answer again.
    for (const r of answers) expect([200, 402, 409]).toContain(r.status);
    const tx = decodeXPaymentResponse(fresh[0]!.headers.get('X-PAYMENT-RESPONSE')!).transaction;
    for (const r of answers.filter((r) => r.status === 200)) expect(decodeXPaymentResponse(r.headers.get('X-PAYMENT-RESPONSE')!).transaction).toBe(tx);
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'settled' }]);
  });

  it('different payers at once: every settlement goes through (submissions never race for the settler nonce)', async () => {
    const payers: Wallet[] = [];
    for (let i = 0; i < 6; i++) payers.push(await funded(100_000n)); // one minter: one at a time
    const requirements = await offer('/tools/compute', { expression: '1+1' });
    const payToBefore = await chain.balanceOf(payTo);
    const answers = await Promise.all(
      payers.map(async (p) =>
        post('/tools/compute', { expression: '1+1' }, { 'X-PAYMENT': toHeader(await signPayment(requirements, { privateKey: p.privateKey })) }),
      ),
    );
    expect(answers.map((r) => r.status)).toEqual([200, 200, 200, 200, 200, 200]);
    const hashes = answers.map((r) => decodeXPaymentResponse(r.headers.get('X-PAYMENT-RESPONSE')!).transaction);
    expect(new Set(hashes).size).toBe(6);
    for (const p of payers) expect(await chain.balanceOf(p.address)).toBe(80_000n);
    expect(await chain.balanceOf(payTo)).toBe(payToBefore + 6n * 20_000n);
  });

  it('an authorization already used on chain (submitted by someone else) is refused before anything runs', async () => {
    const payer = await funded(1_000_000n);
    const requirements = await offer('/tools/compute', { expression: '9-1' });
    const payment = await signPayment(requirements, { privateKey: payer.privateKey });
    // The payer (or anyone holding the signed authorization) submits it directly.
    const { parseSignature } = await import('viem');
    const a = payment.payload.authorization;
    const sig = parseSignature(payment.payload.signature as Hex);
    // A stranger's wallet, not the service's settler: the settler's nonce stays the service's own.
    const stranger = await chain.newWallet();
    const hash = await chain.walletClient(stranger.privateKey).writeContract({
      address: chain.usdc,
      abi: (await import('../../src/pay/x402/chain-settler.js')).EIP3009_ABI,
      functionName: 'transferWithAuthorization',
      args: [a.from as Address, a.to as Address, BigInt(a.value), BigInt(a.validAfter), BigInt(a.validBefore), a.nonce as Hex, Number(sig.v), sig.r, sig.s],
    });
    // writeContract returns once the node has the transaction; under load the block can come later.
    expect((await chain.publicClient.waitForTransactionReceipt({ hash })).status).toBe('success');
    expect(await chain.authorizationState(payer.address, a.nonce as Hex)).toBe(true);
    const res = await post('/tools/compute', { expression: '9-1' }, { 'X-PAYMENT': toHeader(payment) });
    expect(res.status).toBe(402);
    expect(await res.json()).toMatchObject({ code: 'payment_already_used', reason: 'nonce_already_used' });
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);
  });
});

describe('a settlement that cannot go through withholds the result', () => {
  it('funds moved away between verify and settle: 402 settlement_failed, no result, nothing moved to us', async () => {
    const body = { problem: 'What is 2 + 2?' };
    const requirements = await offer('/tools/genius', body);
    const price = BigInt(requirements.maxAmountRequired);
    const payer = await funded(price);
    const elsewhere = (await chain.newWallet()).address;
    const payToBefore = await chain.balanceOf(payTo);
    // The model holds its answer until the payer has emptied its account.
    const gate = deferred();
    const asked = deferred();
    model.enqueue({
      type: 'tokens',
      tokens: ['Four', '.'],
      beforeToken: (i) => {
        if (i !== 0) return undefined;
        asked.resolve();
        return gate.promise;
      },
    });
    const pending = post('/tools/genius', body, { 'X-PAYMENT': toHeader(await signPayment(requirements, { privateKey: payer.privateKey })) });
    await asked.promise; // verified (funds were there) and running
    await chain.transferAway(payer.privateKey, elsewhere, price);
    gate.resolve();
    const res = await pending;
    expect(res.status).toBe(402);
    const answer = (await res.json()) as Record<string, unknown>;
    expect(answer).toMatchObject({ code: 'payment_invalid', reason: 'settlement_failed' });
    expect(String(answer.settlement_error)).toMatch(/^transaction_reverted/);
    expect(answer).not.toHaveProperty('result');
    expect(JSON.stringify(answer)).not.toContain('Four');
    expect(await chain.balanceOf(payTo)).toBe(payToBefore);
    expect(await chain.balanceOf(elsewhere)).toBe(price);
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'failed', error: expect.stringMatching(/^settle: transaction_reverted/) }]);
  });
});
