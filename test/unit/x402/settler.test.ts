import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { settleResponseFromHeader } from 'x402/types';
import { paymentRequirements } from '../../../src/pay/x402/requirements.js';
import { FacilitatorSettler, DeferredSettler, createSettler, encodePaymentResponse } from '../../../src/pay/x402/settler.js';
import { FACILITATOR_BAD_RESPONSE, FACILITATOR_UNREACHABLE } from '../../../src/pay/x402/settle-types.js';
import { fakeTxHash, startFakeFacilitator, type FakeFacilitator } from '../../helpers/fake-facilitator.js';
import { PAYER, signPayment, x402Config } from '../../helpers/x402-sign.js';

const config = x402Config();
const requirements = paymentRequirements(config, { priceCents: 5, resource: 'https://api.example.com/tools/page_fetch', description: 'page_fetch' });

/** A port with nothing listening on it. */
async function deadUrl(): Promise<string> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address() as AddressInfo;
  await new Promise<void>((r) => s.close(() => r()));
  return `http://127.0.0.1:${port}`;
}

describe('FacilitatorSettler', () => {
  let fake: FakeFacilitator;
  beforeEach(async () => {
    fake = await startFakeFacilitator();
  });
  afterEach(async () => {
    await fake.close();
  });

  it('verifies and settles with the x402 v1 request bodies', async () => {
    const payment = await signPayment(requirements);
    const settler = new FacilitatorSettler(`${fake.url}/`);
    await expect(settler.verify(payment, requirements)).resolves.toEqual({ isValid: true, payer: PAYER.address });
    await expect(settler.settle(payment, requirements)).resolves.toEqual({
      success: true,
      transaction: fakeTxHash(payment.payload.authorization.nonce),
      network: 'base-sepolia',
      payer: PAYER.address,
    });
    // The fake parsed both bodies with the x402 package's own VerifyRequest/SettleRequest schemas.
    expect(fake.requests.map((r) => r.path)).toEqual(['/verify', '/settle']);
    for (const r of fake.requests) {
      expect(r.body).toEqual({ x402Version: 1, paymentPayload: payment, paymentRequirements: requirements });
    }
  });

  it('passes on a refusal with its reason, whatever the status', async () => {
    const payment = await signPayment(requirements);
    fake.script('/verify', { status: 400, body: { isValid: false, invalidReason: 'insufficient_funds', payer: PAYER.address } });
    await expect(new FacilitatorSettler(fake.url).verify(payment, requirements)).resolves.toEqual({
      isValid: false,
      invalidReason: 'insufficient_funds',
      payer: PAYER.address,
    });
  });

  it('reports a failed settlement', async () => {
    const payment = await signPayment(requirements);
    fake.script('/settle', {
      status: 400,
      body: { success: false, errorReason: 'invalid_transaction_state', transaction: '', network: 'base-sepolia', payer: PAYER.address },
    });
    await expect(new FacilitatorSettler(fake.url).settle(payment, requirements)).resolves.toEqual({
      success: false,
      errorReason: 'invalid_transaction_state',
      transaction: '',
      network: 'base-sepolia',
      payer: PAYER.address,
    });
  });

  it.each([
    ['an HTML error page', { raw: '<html>502 Bad Gateway</html>', status: 502 }],
    ['JSON of another shape', { status: 200, body: { ok: true } }],
    ['success without a transaction', { status: 200, body: { success: true, transaction: '', network: 'base-sepolia' } }],
    ['success with an error status', { status: 500, body: { success: true, transaction: '0xabc', network: 'base-sepolia' } }],
  ] as const)('treats %s as a failed settlement', async (_name, answer) => {
    const payment = await signPayment(requirements);
    fake.script('/settle', answer);
    const result = await new FacilitatorSettler(fake.url).settle(payment, requirements);
    expect(result).toMatchObject({ success: false, errorReason: FACILITATOR_BAD_RESPONSE, transaction: '' });
  });

  it('treats a facilitator that does not answer in time as a failed settlement', async () => {
    const payment = await signPayment(requirements);
    fake.script('/settle', 'hang');
    fake.script('/verify', 'hang');
    const settler = new FacilitatorSettler(fake.url, { timeoutMs: 200 });
    await expect(settler.settle(payment, requirements)).resolves.toMatchObject({ success: false, errorReason: FACILITATOR_UNREACHABLE });
    await expect(settler.verify(payment, requirements)).resolves.toEqual({ isValid: false, invalidReason: FACILITATOR_UNREACHABLE });
  });

  it('treats an unreachable facilitator as a failed settlement', async () => {
    const payment = await signPayment(requirements);
    const settler = new FacilitatorSettler(await deadUrl());
    await expect(settler.settle(payment, requirements)).resolves.toEqual({
      success: false,
      errorReason: FACILITATOR_UNREACHABLE,
      transaction: '',
      network: 'base-sepolia',
      payer: PAYER.address,
    });
    await expect(settler.verify(payment, requirements)).resolves.toEqual({ isValid: false, invalidReason: FACILITATOR_UNREACHABLE });
  });

  it('sends configured credentials', async () => {
    const payment = await signPayment(requirements);
    const seen: string[] = [];
    const s = createServer((req, res) => {
      seen.push(String(req.headers.authorization));
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ isValid: true }));
    });
    await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
    const { port } = s.address() as AddressInfo;
    await new FacilitatorSettler(`http://127.0.0.1:${port}`, { headers: { authorization: 'Bearer f-key' } }).verify(payment, requirements);
    s.close();
    expect(seen).toEqual(['Bearer f-key']);
  });
});

describe('DeferredSettler and createSettler', () => {
  it('vouches for a locally verified payment without a transaction', async () => {
    const payment = await signPayment(requirements);
    const local = new DeferredSettler();
    await expect(local.verify(payment)).resolves.toEqual({ isValid: true, payer: PAYER.address });
    await expect(local.settle(payment)).resolves.toEqual({ success: true, transaction: '', network: 'base-sepolia', payer: PAYER.address });
  });

  it('is the configured mode', async () => {
    expect((await createSettler(config)).mode).toBe('deferred');
    expect((await createSettler(x402Config({ X402_FACILITATOR_URL: 'http://127.0.0.1:9/' }))).mode).toBe('facilitator');
    const self = x402Config({ X402_RPC_URL: 'http://127.0.0.1:9/', X402_SETTLER_PRIVATE_KEY: `0x${'11'.repeat(32)}` });
    expect((await createSettler(self)).mode).toBe('self');
  });
});

describe('encodePaymentResponse', () => {
  it('is the base64 SettlementResponse the x402 client decodes', () => {
    const result = { success: true, transaction: `0x${'12'.repeat(32)}`, network: 'base-sepolia', payer: PAYER.address };
    expect(settleResponseFromHeader(encodePaymentResponse(result))).toEqual(result);
  });

  it('carries the reason of a failure', () => {
    const result = { success: false, transaction: '', network: 'base-sepolia', errorReason: 'insufficient_funds' };
    expect(settleResponseFromHeader(encodePaymentResponse(result))).toEqual(result);
  });
});
