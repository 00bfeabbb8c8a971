import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, beforeEach, describe, expect, inject, it } from 'vitest';
import { createPool } from 'slonik';
import { z } from 'zod';
import { SettleRequestSchema, settleResponseFromHeader } from 'x402/types';
import { createPaymentHeader } from 'x402/client';
import { AppError } from '../../../src/errors.js';
import { migrate } from '../../../src/db/migrate.js';
import { ensureDatabase, openPool, sql, type DatabasePool } from '../../../src/db/pool.js';
import { encodePaymentHeader } from '../../../src/pay/x402/payload.js';
import { paymentErrorBody, paymentRequirements } from '../../../src/pay/x402/requirements.js';
import { FacilitatorSettler, DeferredSettler } from '../../../src/pay/x402/settler.js';
import type { PaymentSettler } from '../../../src/pay/x402/settle-types.js';
import { exportAwaitingSettlement, listAwaitingSettlement, markFailed, reserveNonce } from '../../../src/pay/x402/store.js';
import { verifyPayment } from '../../../src/pay/x402/verify.js';
import { abandonPayment, admitPayment, completePayment, settleAwaitingPayments, type PaidCall, type X402Deps } from '../../../src/pay/x402/flow.js';
import { fakeTxHash, startFakeFacilitator, type FakeFacilitator } from '../../helpers/fake-facilitator.js';
import { PAYER, signPayment, x402Config } from '../../helpers/x402-sign.js';

// A throwaway database per run, migrated with the real migrations (001 + 002...), on the test server.
const baseUrl = inject('databaseUrl');
const dbName = `x402_test_${process.pid}_${randomBytes(4).toString('hex')}`;
const dbUrl = (() => {
  const u = new URL(baseUrl);
  u.pathname = `/${dbName}`;
  return u.toString();
})();
let pool: DatabasePool;

beforeAll(async () => {
  await ensureDatabase(dbUrl);
  await migrate(dbUrl);
  pool = await openPool(dbUrl, { maximumPoolSize: 12 });
});

afterAll(async () => {
  await pool?.end();
  const u = new URL(baseUrl);
  u.pathname = '/postgres';
  const admin = await createPool(u.toString(), { maximumPoolSize: 1 });
  await admin.query(sql.unsafe`DROP DATABASE IF EXISTS ${sql.identifier([dbName])} WITH (FORCE)`);
  await admin.end();
});

beforeEach(async () => {
  await pool.query(sql.unsafe`TRUNCATE x402_payments`);
});

const config = x402Config();
const call: PaidCall = { priceCents: 5, resource: 'https://api.example.com/tools/page_fetch', description: 'page_fetch', tool: 'page_fetch' };
const requirements = paymentRequirements(config, call);

const Row = z.object({
  id: z.string(),
  status: z.string(),
  payer: z.string(),
  tx_hash: z.string().nullable(),
  error: z.string().nullable(),
  value_atomic: z.string(),
});
async function rows() {
  return pool.any(sql.type(Row)`SELECT id, status, payer, tx_hash, error, value_atomic::text AS value_atomic FROM x402_payments ORDER BY created_at`);
}

const deps = (settler: PaymentSettler = new DeferredSettler()): X402Deps => ({ config, db: pool, settler });

async function refusal(p: Promise<unknown>): Promise<AppError> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(AppError);
    return e as AppError;
  }
  throw new Error('expected a refusal');
}

describe('reserveNonce', () => {
  it('records the payment once and refuses the same nonce again', async () => {
    const payment = await signPayment(requirements);
    const verified = await verifyPayment(config, payment, requirements);
    const id = await reserveNonce(pool, { payment, requirements, verified, tool: 'page_fetch' });
    expect(await rows()).toEqual([{ id, status: 'reserved', payer: PAYER.address.toLowerCase(), tx_hash: null, error: null, value_atomic: '50000' }]);
    const err = await refusal(reserveNonce(pool, { payment, requirements, verified, tool: 'page_fetch' }));
    expect(err.code).toBe('payment_already_used');
    expect(err.status).toBe(402);
  });

  it('lets exactly one of many concurrent reservations of one nonce win', async () => {
    const payment = await signPayment(requirements);
    const verified = await verifyPayment(config, payment, requirements);
    const results = await Promise.allSettled(Array.from({ length: 10 }, () => reserveNonce(pool, { payment, requirements, verified, tool: 'page_fetch' })));
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    const losers = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
    expect(losers).toHaveLength(9);
    for (const l of losers) expect((l.reason as AppError).code).toBe('payment_already_used');
    expect(await rows()).toHaveLength(1);
  });
});

describe('admitPayment / completePayment without a facilitator', () => {
  it('admits a valid payment, then records it as awaiting settlement', async () => {
    const payment = await signPayment(requirements);
    const admitted = await admitPayment(deps(), encodePaymentHeader(payment), call);
    expect(admitted.payer).toBe(PAYER.address.toLowerCase());
    expect((await rows())[0]!.status).toBe('reserved');

    const { settlement, headers } = await completePayment(deps(), admitted);
    expect(settlement).toEqual({ success: true, transaction: '', network: 'base-sepolia', payer: PAYER.address });
    expect(settleResponseFromHeader(headers['X-Payment-Response']!)).toEqual(settlement);
    expect(await rows()).toMatchObject([{ id: admitted.id, status: 'awaiting_settlement', tx_hash: null }]);
  });

  it('refuses a replayed token with payment_already_used and fresh requirements', async () => {
    const header = encodePaymentHeader(await signPayment(requirements));
    await completePayment(deps(), await admitPayment(deps(), header, call));
    const err = await refusal(admitPayment(deps(), header, call));
    expect(err.code).toBe('payment_already_used');
    expect(err.headers['X-Payment-Required']).toBe('true');
    expect(paymentErrorBody(err, 'r1')).toMatchObject({ x402Version: 1, accepts: [requirements], code: 'payment_already_used' });
    expect(await rows()).toHaveLength(1);
  });

  it('treats a re-cased nonce or payer as the same token', async () => {
    // The signature covers the bytes, not their spelling, so a re-cased copy still verifies.
    const payment = await signPayment(requirements);
    await admitPayment(deps(), encodePaymentHeader(payment), call);
    const auth = payment.payload.authorization;
    const recased = {
      ...payment,
      payload: { ...payment.payload, authorization: { ...auth, nonce: `0x${auth.nonce.slice(2).toUpperCase()}`, from: auth.from.toLowerCase() } },
    };
    expect((await refusal(admitPayment(deps(), encodePaymentHeader(recased), call))).code).toBe('payment_already_used');
  });

  it('admits exactly one of concurrent uses of one token', async () => {
    const header = encodePaymentHeader(await signPayment(requirements));
    const results = await Promise.allSettled(Array.from({ length: 8 }, () => admitPayment(deps(), header, call)));
    const winners = results.filter((r) => r.status === 'fulfilled');
    expect(winners).toHaveLength(1);
    for (const r of results) if (r.status === 'rejected') expect((r.reason as AppError).code).toBe('payment_already_used');
  });

  it('refuses an invalid payment before touching the database', async () => {
    const header = encodePaymentHeader(await signPayment(requirements, { authorization: { value: '10000' } }));
    const err = await refusal(admitPayment(deps(), header, call));
    expect(err.details).toMatchObject({ reason: 'invalid_amount', accepts: [requirements] });
    expect(err.headers['X-Payment-Amount']).toBe('0.05');
    expect(await rows()).toEqual([]);
  });

  it('marks a failed call and keeps its nonce spent', async () => {
    const header = encodePaymentHeader(await signPayment(requirements));
    const admitted = await admitPayment(deps(), header, call);
    await abandonPayment(deps(), admitted, 'tool_failed');
    expect(await rows()).toMatchObject([{ status: 'failed', error: 'call: tool_failed' }]);
    expect((await refusal(admitPayment(deps(), header, call))).code).toBe('payment_already_used');
  });

  it('accepts the header a standard x402 client builds', async () => {
    const header = await createPaymentHeader(PAYER, 1, requirements);
    const admitted = await admitPayment(deps(), header, call);
    await completePayment(deps(), admitted);
    expect(await rows()).toMatchObject([{ status: 'awaiting_settlement' }]);
  });
});

describe('the operator export of payments awaiting settlement', () => {
  it('lists each with the exact body a facilitator settles', async () => {
    const p1 = await signPayment(requirements);
    const p2 = await signPayment(requirements);
    for (const p of [p1, p2]) await completePayment(deps(), await admitPayment(deps(), encodePaymentHeader(p), call));
    const failed = await admitPayment(deps(), encodePaymentHeader(await signPayment(requirements)), call);
    await abandonPayment(deps(), failed, 'tool_failed');

    const listed = await listAwaitingSettlement(pool);
    expect(listed.map((r) => r.payment_payload)).toEqual([p1, p2]);

    const lines = (await exportAwaitingSettlement(pool))
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines).toHaveLength(2);
    for (const [i, line] of lines.entries()) {
      expect(line).toMatchObject({ tool: 'page_fetch', payer: PAYER.address.toLowerCase(), value_atomic: '50000', expired: false });
      expect(line.created_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      expect(line.settle_request).toEqual({ x402Version: 1, paymentPayload: [p1, p2][i], paymentRequirements: requirements });
      expect(SettleRequestSchema.safeParse(line.settle_request).success).toBe(true);
    }
  });
});

describe('with a facilitator', () => {
  let fake: FakeFacilitator;
  beforeAll(async () => {
    fake = await startFakeFacilitator();
  });
  afterAll(async () => {
    await fake.close();
  });
  const facilitated = () => deps(new FacilitatorSettler(fake.url));

  it('verifies, settles and records the transaction', async () => {
    const payment = await signPayment(requirements);
    const admitted = await admitPayment(facilitated(), encodePaymentHeader(payment), call);
    const { settlement, headers } = await completePayment(facilitated(), admitted);
    const tx = fakeTxHash(payment.payload.authorization.nonce);
    expect(settlement).toEqual({ success: true, transaction: tx, network: 'base-sepolia', payer: PAYER.address });
    expect(settleResponseFromHeader(headers['X-Payment-Response']!)).toEqual(settlement);
    expect(await rows()).toMatchObject([{ status: 'settled', tx_hash: tx }]);
  });

  it('withholds the result when settlement fails, and charges nothing', async () => {
    const payment = await signPayment(requirements);
    const admitted = await admitPayment(facilitated(), encodePaymentHeader(payment), call);
    fake.script('/settle', {
      status: 400,
      body: { success: false, errorReason: 'insufficient_funds', transaction: '', network: 'base-sepolia', payer: PAYER.address },
    });
    const err = await refusal(completePayment(facilitated(), admitted));
    expect(err).toMatchObject({ code: 'payment_invalid', status: 402 });
    expect(err.details).toMatchObject({ reason: 'settlement_failed', settlement_error: 'insufficient_funds', accepts: [requirements] });
    expect(settleResponseFromHeader(err.headers['X-Payment-Response']!)).toMatchObject({ success: false, errorReason: 'insufficient_funds' });
    expect(await rows()).toMatchObject([{ status: 'failed', error: 'settle: insufficient_funds', tx_hash: null }]);
  });

  it('refuses a payment the facilitator rejects at verification', async () => {
    fake.script('/verify', { status: 400, body: { isValid: false, invalidReason: 'insufficient_funds', payer: PAYER.address } });
    const err = await refusal(admitPayment(facilitated(), encodePaymentHeader(await signPayment(requirements)), call));
    expect(err.details).toMatchObject({ reason: 'insufficient_funds', facilitator_reason: 'insufficient_funds' });
    expect(await rows()).toMatchObject([{ status: 'failed', error: 'verify: insufficient_funds' }]);
  });

  it('answers 502 when the facilitator cannot be reached, and charges nothing', async () => {
    const admitted = await admitPayment(facilitated(), encodePaymentHeader(await signPayment(requirements)), call);
    const gone = await startFakeFacilitator();
    await gone.close();
    const err = await refusal(completePayment(deps(new FacilitatorSettler(gone.url)), admitted));
    expect(err).toMatchObject({ code: 'upstream_error', status: 502 });
    expect(err.details.reason).toBe('facilitator_unreachable');
    expect(await rows()).toMatchObject([{ status: 'failed', error: 'settle: facilitator_unreachable' }]);
  });

  it('never asks the facilitator about a replayed token', async () => {
    const header = encodePaymentHeader(await signPayment(requirements));
    await completePayment(facilitated(), await admitPayment(facilitated(), header, call));
    const before = fake.requests.length;
    expect((await refusal(admitPayment(facilitated(), header, call))).code).toBe('payment_already_used');
    expect(fake.requests.length).toBe(before);
  });

  it('settles payments that waited, and fails the ones that expired', async () => {
    const fresh = await signPayment(requirements);
    const stale = await signPayment(requirements);
    for (const p of [fresh, stale]) await completePayment(deps(), await admitPayment(deps(), encodePaymentHeader(p), call));
    // Make one of them expired as of now.
    await pool.query(
      sql.unsafe`UPDATE x402_payments SET valid_before = 1 WHERE payment_payload->'payload'->'authorization'->>'nonce' = ${stale.payload.authorization.nonce}`,
    );
    const summary = await settleAwaitingPayments(pool, new FacilitatorSettler(fake.url));
    expect(summary).toEqual({ settled: 1, failed: 0, expired: 1, retry: 0 });
    const byStatus = Object.fromEntries((await rows()).map((r) => [r.status, r]));
    expect(byStatus.settled?.tx_hash).toBe(fakeTxHash(fresh.payload.authorization.nonce));
    expect(byStatus.failed?.error).toMatch(/expired/);
    expect(await listAwaitingSettlement(pool)).toEqual([]);
  });

  it('does not overwrite a final status', async () => {
    const admitted = await admitPayment(deps(), encodePaymentHeader(await signPayment(requirements)), call);
    await completePayment(deps(), admitted);
    await markFailed(pool, admitted.id, 'operator: transfer reverted');
    expect(await markFailed(pool, admitted.id, 'again')).toBe(false);
    expect(await rows()).toMatchObject([{ status: 'failed', error: 'operator: transfer reverted' }]);
  });
});
