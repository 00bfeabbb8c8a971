import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { z } from 'zod';
import type { Address, Hex } from 'viem';
import { decodeXPaymentResponse } from 'x402-fetch';
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client } from '@x402/fetch';
import { ExactEvmScheme } from '@x402/evm';
import { sql } from '../../src/db/pool.js';
import {
  DeferredSettler,
  FacilitatorSettler,
  PaymentReconciler,
  admitPayment,
  completePayment,
  getPayment,
  listStaleReserved,
  markSettling,
  paymentRequirements,
  reconcilePayment,
  reconcilePayments,
  type PaidCall,
  type PaymentReconcilerDeps,
  type PaymentSettler,
  type X402Deps,
} from '../../src/pay/x402/index.js';
import { dropDatabase, freshDatabase } from '../chaos/rig.js';
import { startChain, type Chain, type Wallet } from '../helpers/chain.js';
import { fakeTxHash, startFakeFacilitator, type FakeFacilitator } from '../helpers/fake-facilitator.js';
import { startHarness, type Harness } from '../helpers/harness.js';
import { signPayment, toHeader } from '../helpers/x402-sign.js';

/**
 * The x402 payment reconciler's decisions (src/pay/x402/reconcile.ts), against anvil with the service
 * settling itself. A crash is the settler throwing: after the transfer was mined (the API died before
 * recording it) or before anything was sent (it died right after keeping the answer). Rows are made
 * stale by moving their created_at back past the grace period; passes are run by hand (RECONCILE_SECONDS=0).
 * A pass looks at every payment of its database (a deployment's own), so this file has a database of its
 * own: other files' payments left reserved would otherwise be counted in its passes.
 */

let dbUrl: string;

let chain: Chain;
let h: Harness;
let base: string;
let payTo: Address;
let facilitator: FakeFacilitator;
let x402: X402Deps;
let real: PaymentSettler;

beforeAll(async () => {
  chain = await startChain();
  const settler = await chain.newWallet();
  payTo = (await chain.newWallet()).address;
  facilitator = await startFakeFacilitator();
  dbUrl = await freshDatabase(inject('databaseUrl'), 'x402rec');
  h = await startHarness(
    {
      DATABASE_URL: dbUrl,
      X402_ENABLED: 'true',
      X402_PAY_TO: payTo,
      X402_RPC_URL: chain.rpcUrl,
      X402_SETTLER_PRIVATE_KEY: settler.privateKey,
      RECONCILE_SECONDS: '0',
      X402_RECONCILE_GRACE_SECONDS: '60',
    },
    { workers: ['core'] },
  );
  await h.app.listen({ port: 0, host: '127.0.0.1' });
  base = `http://127.0.0.1:${(h.app.server.address() as AddressInfo).port}`;
  x402 = h.container.api!.payPerCall!.deps.x402;
  real = x402.settler;
}, 60_000);

afterEach(() => {
  x402.settler = real;
});

afterAll(async () => {
  await h?.close();
  await facilitator?.close();
  await chain?.stop();
  if (dbUrl) await dropDatabase(dbUrl);
});

/** The API process "dies" in settlement: before anything is sent, or after the transfer is mined. */
function crashIn(when: 'before_send' | 'after_mined'): void {
  x402.settler = {
    mode: real.mode,
    lookup: real.lookup,
    start: () => real.start(),
    verify: (...a) => real.verify(...a),
    settle: async (...a) => {
      if (when === 'before_send') throw new Error('crash before sending the settlement');
      const r = await real.settle(...a);
      expect(r.success).toBe(true);
      throw new Error('crash after the settlement was mined');
    },
  };
}

const deps = (over: Partial<PaymentReconcilerDeps> = {}): PaymentReconcilerDeps => ({
  config: h.config,
  db: h.container.pool,
  settler: real,
  lookup: real.lookup,
  log: h.container.log,
  ...over,
});

const Row = z.object({ id: z.string(), status: z.string(), tx_hash: z.string().nullable(), error: z.string().nullable() });
const rowsOf = (payer: Address) =>
  h.container.pool.any(sql.type(Row)`SELECT id, status, tx_hash, error FROM x402_payments WHERE payer = ${payer.toLowerCase()} ORDER BY created_at`);
const Ledger = z.object({ entry_key: z.string(), delta_cents: z.number(), kind: z.string() });
const ledgerOf = (payer: Address) =>
  h.container.pool.any(sql.type(Ledger)`SELECT entry_key, delta_cents::int AS delta_cents, kind FROM ledger WHERE payer = ${payer.toLowerCase()}`);

/** Past the grace period: as if reserved an hour ago. */
async function stale(payer: Address): Promise<void> {
  await h.container.pool.query(sql.unsafe`UPDATE x402_payments SET created_at = now() - interval '1 hour' WHERE payer = ${payer.toLowerCase()}`);
}

async function funded(atomic = 1_000_000n): Promise<Wallet> {
  const w = await chain.newWallet();
  await chain.mint(w.address, atomic);
  return w;
}

const post = (body: unknown, headers: Record<string, string> = {}) =>
  fetch(`${base}/tools/compute`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });

async function signedFor(payer: Wallet, body: unknown, authorization: Record<string, string> = {}): Promise<string> {
  const res = await post(body);
  expect(res.status).toBe(402);
  const requirements = ((await res.json()) as { accepts: Parameters<typeof signPayment>[0][] }).accepts[0]!;
  return toHeader(await signPayment(requirements, { privateKey: payer.privateKey, authorization }));
}

describe('settlement started before the crash', () => {
  it('the transfer was mined: settled once with its ledger entry; a retry of the same request gets the answer and the transaction', async () => {
    const payer = await funded();
    const header = await signedFor(payer, { expression: '6*7' });
    crashIn('after_mined');
    const first = await post({ expression: '6*7' }, { 'X-PAYMENT': header });
    expect(first.status).toBe(500);
    x402.settler = real;
    const [row] = await rowsOf(payer.address);
    expect(row).toMatchObject({ status: 'reserved', tx_hash: expect.stringMatching(/^0x[0-9a-f]{64}$/) });
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);

    // Before the reconciler decided: retry later, not "already used".
    const early = await post({ expression: '6*7' }, { 'X-PAYMENT': header });
    expect(early.status).toBe(409);
    expect(early.headers.get('retry-after')).toBe('5');
    expect(await early.json()).toMatchObject({ error: { code: 'idempotency_in_progress' } });
    // Not yet past the grace period: a pass leaves it alone.
    expect((await reconcilePayments(deps())).checked).toBe(0);

    await stale(payer.address);
    expect(await reconcilePayments(deps())).toEqual({ ran: true, checked: 1, outcomes: { settled: 1 } });
    expect(await rowsOf(payer.address)).toEqual([{ id: row!.id, status: 'settled', tx_hash: row!.tx_hash, error: null }]);
    expect(await ledgerOf(payer.address)).toEqual([
      { entry_key: expect.stringMatching(new RegExp(`^x402:${row!.id}:core-`)), delta_cents: -2, kind: 'payment' },
    ]);

    const again = await post({ expression: '6*7' }, { 'X-PAYMENT': header });
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(((await again.json()) as { result: { value: number } }).result.value).toBe(42);
    expect(decodeXPaymentResponse(again.headers.get('X-PAYMENT-RESPONSE')!)).toMatchObject({ success: true, transaction: row!.tx_hash });

    // Nothing left to do, nothing moved twice.
    expect((await reconcilePayments(deps())).checked).toBe(0);
    expect(await ledgerOf(payer.address)).toHaveLength(1);
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);
  });

  it('its transaction was not recorded: the transfer is found by the nonce (AuthorizationUsed) and named', async () => {
    const payer = await funded();
    const header = await signedFor(payer, { expression: '2+2' });
    crashIn('after_mined');
    expect((await post({ expression: '2+2' }, { 'X-PAYMENT': header })).status).toBe(500);
    const [row] = await rowsOf(payer.address);
    await h.container.pool.query(sql.unsafe`UPDATE x402_payments SET tx_hash = NULL WHERE id = ${row!.id}`);
    await stale(payer.address);
    expect((await reconcilePayments(deps())).outcomes).toEqual({ settled: 1 });
    expect(await rowsOf(payer.address)).toMatchObject([{ status: 'settled', tx_hash: row!.tx_hash }]);
    const receipt = await chain.publicClient.getTransactionReceipt({ hash: row!.tx_hash as Hex });
    expect(receipt.status).toBe('success');
  });

  it('nothing was sent and the authorization is still valid: settled now, once, and the retry gets the answer', async () => {
    const payer = await funded();
    const header = await signedFor(payer, { expression: '5*5' });
    crashIn('before_send');
    expect((await post({ expression: '5*5' }, { 'X-PAYMENT': header })).status).toBe(500);
    expect(await rowsOf(payer.address)).toMatchObject([{ status: 'reserved', tx_hash: null }]);
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n);
    await stale(payer.address);
    expect((await reconcilePayments(deps())).outcomes).toEqual({ settled_now: 1 });
    const [row] = await rowsOf(payer.address);
    expect(row).toMatchObject({ status: 'settled', tx_hash: expect.stringMatching(/^0x[0-9a-f]{64}$/) });
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);
    expect(await ledgerOf(payer.address)).toHaveLength(1);
    const again = await post({ expression: '5*5' }, { 'X-PAYMENT': header });
    expect(again.status).toBe(200);
    expect(((await again.json()) as { result: { value: number } }).result.value).toBe(25);
    expect(decodeXPaymentResponse(again.headers.get('X-PAYMENT-RESPONSE')!).transaction).toBe(row!.tx_hash);
  });

  it('two passes at once (two replicas): one settlement, one ledger entry', async () => {
    const payer = await funded();
    crashIn('before_send');
    expect((await post({ expression: '8/2' }, { 'X-PAYMENT': await signedFor(payer, { expression: '8/2' }) })).status).toBe(500);
    await stale(payer.address);
    // Two reconcilers sharing Redis: the lock lets one pass run at a time.
    const make = () => new PaymentReconciler({ ...deps(), redis: h.container.redis, prefix: h.config.REDIS_PREFIX, intervalSeconds: 0 });
    const locked = await Promise.all([make().runOnce(), make().runOnce()]);
    expect(locked.map((r) => r.ran).sort()).toEqual([false, true]);
    expect(await rowsOf(payer.address)).toMatchObject([{ status: 'settled' }]);
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);

    // Without the lock, two passes on a transfer already mined race on the row's compare-and-set: one records it.
    const other = await funded();
    crashIn('after_mined');
    expect((await post({ expression: '8/4' }, { 'X-PAYMENT': await signedFor(other, { expression: '8/4' }) })).status).toBe(500);
    await stale(other.address);
    const bare = await Promise.all([reconcilePayments(deps()), reconcilePayments(deps())]);
    const outcomes = bare.map((r) => Object.keys(r.outcomes).join()).sort();
    expect(outcomes).toEqual(outcomes.includes('') ? ['', 'settled'] : ['raced', 'settled']);
    for (const p of [payer, other]) {
      expect(await ledgerOf(p.address)).toHaveLength(1);
      expect(await chain.balanceOf(p.address)).toBe(1_000_000n - 20_000n);
    }
  });

  it('nothing was sent and the authorization has expired: released, nothing moves, a retry is refused', async () => {
    const payer = await funded();
    const validBefore = String(Math.floor(Date.now() / 1000) + 10);
    const header = await signedFor(payer, { expression: '9-3' }, { validBefore });
    crashIn('before_send');
    expect((await post({ expression: '9-3' }, { 'X-PAYMENT': header })).status).toBe(500);
    await stale(payer.address);
    // The chain's clock decides: moved past validBefore (a few seconds; later payments are valid for 60).
    await chain.testClient.increaseTime({ seconds: 15 });
    await chain.mine();
    expect((await reconcilePayments(deps())).outcomes).toEqual({ released: 1 });
    expect(await rowsOf(payer.address)).toMatchObject([{ status: 'failed', error: 'reconcile: released, the authorization expired before it was settled' }]);
    expect(await ledgerOf(payer.address)).toEqual([]);
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n);
    const again = await post({ expression: '9-3' }, { 'X-PAYMENT': header });
    expect(again.status).toBe(402);
    expect(await again.json()).toMatchObject({ code: 'payment_already_used' });
  });

  it('with a payment identifier (v2): the retry under the same id gets the answer and PAYMENT-RESPONSE', async () => {
    const payer = await funded();
    const id = `pay_${crypto.randomUUID().replaceAll('-', '')}`;
    const sent: string[] = [];
    const client = new x402Client().register('eip155:*', new ExactEvmScheme(payer.account));
    client.onBeforePaymentCreation(async ({ paymentRequired }) => {
      const ext = paymentRequired.extensions?.['payment-identifier'] as { info?: { id?: string } } | undefined;
      if (ext?.info) ext.info.id = id;
    });
    const recording: typeof fetch = async (input, init) => {
      const signature = new Headers((input as Request).headers ?? init?.headers).get('payment-signature');
      if (signature) sent.push(signature);
      return fetch(input, init);
    };
    crashIn('after_mined');
    const first = await wrapFetchWithPayment(recording, client)(`${base}/tools/compute`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ expression: '3*11' }),
    });
    expect(first.status).toBe(500);
    x402.settler = real;
    expect(sent).toHaveLength(1);
    expect((await post({ expression: '3*11' }, { 'PAYMENT-SIGNATURE': sent[0]! })).status).toBe(409);
    await stale(payer.address);
    expect((await reconcilePayments(deps())).outcomes).toEqual({ settled: 1 });
    const [row] = await rowsOf(payer.address);
    const again = await post({ expression: '3*11' }, { 'PAYMENT-SIGNATURE': sent[0]! });
    expect(again.status).toBe(200);
    expect(((await again.json()) as { result: { value: number } }).result.value).toBe(33);
    expect(decodePaymentResponseHeader(again.headers.get('PAYMENT-RESPONSE')!)).toMatchObject({
      success: true,
      transaction: row!.tx_hash,
      network: 'eip155:84532',
    });
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);
  });
});

/** A payment admitted through the flow itself (the route's own steps, without its HTTP). */
async function admitted(payer: Wallet, expression: string) {
  const call: PaidCall = { tool: 'compute', priceCents: 2, resource: `${base}/tools/compute`, description: 'compute' };
  const header = toHeader(await signPayment(paymentRequirements(h.config, call), { privateKey: payer.privateKey }));
  return { call, admitted: await admitPayment(x402, header, call), expression };
}

describe('settlement never started', () => {
  it('the call had not finished when the API died: released, nothing charged; the late API cannot settle it', async () => {
    const payer = await funded();
    const { admitted: a } = await admitted(payer, '1+1');
    await stale(payer.address);
    expect((await reconcilePayments(deps())).outcomes).toEqual({ released: 1 });
    expect(await rowsOf(payer.address)).toMatchObject([
      { status: 'failed', tx_hash: null, error: 'reconcile: released, the call never reached settlement (its API process stopped)' },
    ]);
    // A request still alive past the grace period loses the compare-and-set and settles nothing.
    await expect(completePayment(x402, a, { answer: { status: 200, headers: {}, body: {} } })).rejects.toMatchObject({
      code: 'payment_invalid',
      details: { reason: 'payment_released' },
    });
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n);
    expect(await ledgerOf(payer.address)).toEqual([]);
  });

  it('a live request that started settlement first wins over the pass: the row is not released', async () => {
    const payer = await funded();
    const { admitted: a } = await admitted(payer, '1+2');
    const [row] = await listStaleReserved(h.container.pool, 0).then((rows) => rows.filter((r) => r.id === a.id));
    expect(row?.settling).toBe(false);
    expect(await markSettling(h.container.pool, a.id, { answer: { status: 200, headers: {}, body: { result: 3 } }, fingerprint: 'f' })).toBe(true);
    // The pass decides on what it read (not settling), but its release is a compare-and-set that now fails.
    expect(await reconcilePayment(deps({ lookup: undefined, settler: new DeferredSettler() }), row!)).toBe('raced');
    expect((await getPayment(h.container.pool, a.id))?.status).toBe('reserved');
  });
});

describe('other settlement modes', () => {
  it('deferred: a payment whose settlement started waits for the operator, with its ledger entry', async () => {
    const payer = await funded();
    const { admitted: a } = await admitted(payer, '2*3');
    await markSettling(h.container.pool, a.id, { answer: { status: 200, headers: {}, body: { result: 6 } }, fingerprint: 'f', jobId: 'core-x' });
    const row = await getPayment(h.container.pool, a.id);
    expect(await reconcilePayment(deps({ settler: new DeferredSettler(), lookup: undefined }), row!)).toBe('awaiting_settlement');
    expect(await rowsOf(payer.address)).toMatchObject([{ status: 'awaiting_settlement' }]);
    expect(await ledgerOf(payer.address)).toEqual([{ entry_key: `x402:${a.id}:core-x`, delta_cents: -2, kind: 'payment' }]);
  });

  it('a facilitator without a lookup: submitted again; success settles it, a refusal is left for an operator and taken out of later passes', async () => {
    const viaFacilitator = deps({ settler: new FacilitatorSettler(facilitator.url), lookup: undefined });
    const payer = await funded();
    const ok = (await admitted(payer, '1')).admitted;
    const refused = (await admitted(payer, '2')).admitted;
    for (const id of [ok.id, refused.id]) await markSettling(h.container.pool, id, { answer: { status: 200, headers: {}, body: {} }, fingerprint: 'f' });
    const okRow = (await getPayment(h.container.pool, ok.id))!;
    expect(await reconcilePayment(viaFacilitator, okRow)).toBe('settled_now');
    expect(await getPayment(h.container.pool, ok.id)).toMatchObject({ status: 'settled', tx_hash: fakeTxHash(ok.payment.payload.authorization.nonce) });

    facilitator.script('/settle', {
      status: 400,
      body: { success: false, errorReason: 'invalid_exact_evm_payload_authorization_nonce', transaction: '', network: 'base-sepolia' },
    });
    expect(await reconcilePayment(viaFacilitator, (await getPayment(h.container.pool, refused.id))!)).toBe('operator');
    expect(await getPayment(h.container.pool, refused.id)).toMatchObject({ status: 'reserved' });
    const note = await h.container.pool.oneFirst(sql.type(z.object({ error: z.string() }))`SELECT error FROM x402_payments WHERE id = ${refused.id}`);
    expect(note).toMatch(/^reconcile: the facilitator refused to settle it again \(invalid_exact_evm_payload_authorization_nonce\)/);
    await stale(payer.address);
    expect((await listStaleReserved(h.container.pool, 60)).map((r) => r.id)).not.toContain(refused.id);
    expect(h.logs.some((l) => l.includes('left reserved for an operator') && l.includes(refused.id))).toBe(true);
  });
});
