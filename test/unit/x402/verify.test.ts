import { describe, expect, it } from 'vitest';
import { createPaymentHeader, preparePaymentHeader, signPaymentHeader } from 'x402/client';
import { AppError } from '../../../src/errors.js';
import { MAX_PAYMENT_HEADER_BYTES, decodePaymentHeader, encodePaymentHeader, type PaymentPayload } from '../../../src/pay/x402/payload.js';
import { paymentRequirements, type PaymentRequirements } from '../../../src/pay/x402/requirements.js';
import { verifyPayment } from '../../../src/pay/x402/verify.js';
import { OTHER, OTHER_KEY, PAYER, signPayment, tamper, toHeader, x402Config } from '../../helpers/x402-sign.js';

const config = x402Config();
const spec = { priceCents: 5, resource: 'https://api.example.com/tools/page_fetch', description: 'page_fetch' };
const requirements = paymentRequirements(config, spec);
const NOW = new Date('2025-06-01T12:00:00Z');
const nowSeconds = Math.floor(NOW.getTime() / 1000);

const withSignature = (p: PaymentPayload, signature: string): PaymentPayload => ({ ...p, payload: { ...p.payload, signature } });

async function reasonOf(p: Promise<unknown> | (() => unknown)): Promise<string> {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (e) {
    expect(e).toBeInstanceOf(AppError);
    const err = e as AppError;
    expect(err.status).toBe(402);
    expect(err.message.length).toBeGreaterThan(10);
    return `${err.code}:${String(err.details.reason)}`;
  }
  throw new Error('expected a refusal');
}

describe('verifyPayment', () => {
  it('accepts a payment signed for exactly this call', async () => {
    const payment = await signPayment(requirements, { now: NOW });
    const decoded = decodePaymentHeader(encodePaymentHeader(payment));
    const v = await verifyPayment(config, decoded, requirements, NOW);
    expect(v.payer).toBe(PAYER.address.toLowerCase());
    expect(v.valueAtomic).toBe(50_000n);
    expect(v.nonce).toBe(payment.payload.authorization.nonce.toLowerCase());
    expect(v.profile.chainId).toBe(84532);
  });

  it('accepts addresses in any letter case (the signed bytes are the same)', async () => {
    const payment = await signPayment(requirements, { now: NOW });
    const a = payment.payload.authorization;
    const upper = (x: string) => `0x${x.slice(2).toUpperCase()}`;
    const recased = tamper(payment, { from: upper(a.from), to: a.to.toLowerCase(), nonce: upper(a.nonce) });
    const v = await verifyPayment(config, decodePaymentHeader(encodePaymentHeader(recased)), requirements, NOW);
    expect(v.payer).toBe(PAYER.address.toLowerCase());
    expect(v.nonce).toBe(a.nonce.toLowerCase());
  });

  const cases: Array<[string, () => Promise<PaymentPayload>, string]> = [
    ['a different amount', () => signPayment(requirements, { now: NOW, authorization: { value: '40000' } }), 'invalid_amount'],
    ['more than the price', () => signPayment(requirements, { now: NOW, authorization: { value: '50001' } }), 'invalid_amount'],
    ['another payee', () => signPayment(requirements, { now: NOW, authorization: { to: OTHER.address } }), 'invalid_payee'],
    ['an expired authorization', () => signPayment(requirements, { now: NOW, authorization: { validBefore: String(nowSeconds - 1) } }), 'payment_expired'],
    [
      'one expiring within the settlement margin',
      () => signPayment(requirements, { now: NOW, authorization: { validBefore: String(nowSeconds + 3) } }),
      'payment_expired',
    ],
    ['one not valid yet', () => signPayment(requirements, { now: NOW, authorization: { validAfter: String(nowSeconds + 60) } }), 'payment_not_yet_valid'],
    ['another network', () => signPayment(requirements, { now: NOW, network: 'base' }), 'invalid_network'],
    // Signed with OTHER's key over an authorization claiming to come from PAYER.
    [
      'a signature by another key',
      () => signPayment(requirements, { now: NOW, privateKey: OTHER_KEY, authorization: { from: PAYER.address } }),
      'invalid_signature',
    ],
    [
      'a nonce changed after signing',
      async () => tamper(await signPayment(requirements, { now: NOW }), { nonce: `0x${'ab'.repeat(32)}` }),
      'invalid_signature',
    ],
    [
      'a window widened after signing',
      async () => tamper(await signPayment(requirements, { now: NOW }), { validBefore: String(nowSeconds + 86_400) }),
      'invalid_signature',
    ],
    [
      'a signature for another token contract',
      () => signPayment(requirements, { now: NOW, domain: { verifyingContract: '0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913' } }),
      'invalid_signature',
    ],
    ['a signature for another chain', () => signPayment(requirements, { now: NOW, domain: { chainId: 8453 } }), 'invalid_signature'],
    ['a signature with the wrong token name', () => signPayment(requirements, { now: NOW, domain: { name: 'USD Coin' } }), 'invalid_signature'],
    ['a signature that is not one', async () => withSignature(await signPayment(requirements, { now: NOW }), '0x1234'), 'invalid_signature'],
    ['a zeroed signature', async () => withSignature(await signPayment(requirements, { now: NOW }), `0x${'00'.repeat(65)}`), 'invalid_signature'],
  ];

  it.each(cases)('refuses %s', async (_name, make, reason) => {
    const payment = await make();
    // Round trip through the header so the decoder sees exactly what a client would send.
    const run = async () => verifyPayment(config, decodePaymentHeader(encodePaymentHeader(payment)), requirements, NOW);
    expect(await reasonOf(run)).toBe(`payment_invalid:${reason}`);
  });

  it('ignores the domain a client might imply and uses the configured one', async () => {
    const custom = x402Config({ X402_ASSET_NAME: 'Test USD', X402_ASSET_VERSION: '1' });
    const req = paymentRequirements(custom, spec);
    const good = await signPayment(req, { now: NOW });
    await expect(verifyPayment(custom, good, req, NOW)).resolves.toBeTruthy();
    // The same token checked under the default domain (name USDC, version 2) fails.
    expect(await reasonOf(verifyPayment(config, good, requirements, NOW))).toBe('payment_invalid:invalid_signature');
  });
});

describe('decodePaymentHeader', () => {
  const valid = async () => signPayment(requirements, { now: NOW });
  const without = (p: PaymentPayload, path: string[]) => {
    const copy = JSON.parse(JSON.stringify(p)) as Record<string, unknown>;
    let node = copy;
    for (const key of path.slice(0, -1)) node = node[key] as Record<string, unknown>;
    delete node[path.at(-1)!];
    return copy;
  };

  const cases: Array<[string, () => Promise<unknown>, string]> = [
    ['an empty header', async () => '', 'malformed_payment'],
    ['two headers', async () => ['a', 'b'], 'malformed_payment'],
    ['text that is not base64', async () => 'not base64!', 'malformed_payment'],
    ['base64 without its padding', async () => toHeader({ a: 1 }).replace(/=+$/, ''), 'malformed_payment'],
    ['base64url', async () => Buffer.from('{"x402Version":1,"scheme":"exact"}?>?>').toString('base64url'), 'malformed_payment'],
    ['base64 of something that is not JSON', async () => Buffer.from('hello world!').toString('base64'), 'malformed_payment'],
    ['base64 of invalid UTF-8', async () => Buffer.from([0xff, 0xfe, 0x7b, 0x7d]).toString('base64'), 'malformed_payment'],
    ['a JSON array', async () => toHeader([1, 2]), 'malformed_payment'],
    ['an oversized header', async () => 'A'.repeat(MAX_PAYMENT_HEADER_BYTES + 4), 'malformed_payment'],
    ['no signature', async () => toHeader(without(await valid(), ['payload', 'signature'])), 'malformed_payment'],
    ['no nonce', async () => toHeader(without(await valid(), ['payload', 'authorization', 'nonce'])), 'malformed_payment'],
    ['no network', async () => toHeader(without(await valid(), ['network'])), 'malformed_payment'],
    ['a short nonce', async () => toHeader(tamper(await valid(), { nonce: '0x1234' })), 'malformed_payment'],
    ['a numeric value', async () => toHeader(tamper(await valid(), { value: 50000 as unknown as string })), 'malformed_payment'],
    ['a value with a leading zero', async () => toHeader(tamper(await valid(), { value: '050000' })), 'malformed_payment'],
    ['a bad address', async () => toHeader(tamper(await valid(), { from: '0x123' })), 'malformed_payment'],
    ['a value beyond uint256', async () => toHeader(tamper(await valid(), { value: '9'.repeat(78) })), 'malformed_payment'],
    ['x402 version 3', async () => toHeader({ ...(await valid()), x402Version: 3 }), 'unsupported_version'],
    ['x402 version 2 in X-Payment', async () => toHeader({ x402Version: 2, accepted: { scheme: 'exact' } }), 'malformed_payment'],
    ['no version', async () => toHeader(without(await valid(), ['x402Version'])), 'unsupported_version'],
    ['another scheme', async () => toHeader({ ...(await valid()), scheme: 'upto' }), 'invalid_scheme'],
  ];

  it.each(cases)('refuses %s', async (_name, make, reason) => {
    const header = (await make()) as string;
    expect(await reasonOf(() => decodePaymentHeader(header))).toBe(`payment_invalid:${reason}`);
  });

  it('names the missing fields', async () => {
    const header = toHeader(without(await valid(), ['payload', 'authorization', 'nonce']));
    const err = (() => {
      try {
        decodePaymentHeader(header);
      } catch (e) {
        return e as AppError;
      }
      throw new Error('expected a refusal');
    })();
    expect(err.message).toContain('payload.authorization.nonce');
    expect(err.details.issues).toEqual([{ path: 'payload.authorization.nonce', message: 'Required' }]);
  });

  it('drops unknown fields instead of forwarding them', async () => {
    const decoded = decodePaymentHeader(toHeader({ ...(await valid()), extension: { foo: 'bar' } }));
    expect(decoded).not.toHaveProperty('extension');
  });
});

describe('a standard x402 client (the `x402` package)', () => {
  // What `x402-fetch` / `x402-axios` do on a 402: pick requirements, createPaymentHeader, retry.
  it('produces an X-Payment header we decode and verify unchanged', async () => {
    const header = await createPaymentHeader(PAYER, 1, requirements);
    const decoded = decodePaymentHeader(header);
    const v = await verifyPayment(config, decoded, requirements);
    expect(v.payer).toBe(PAYER.address.toLowerCase());
  });

  it('works with overridden token address and domain, which reach it through the requirements', async () => {
    const custom = x402Config({ X402_ASSET_ADDRESS: '0x5fbdb2315678afecb367f032d93f642f64180aa3', X402_ASSET_NAME: 'Test USD', X402_ASSET_VERSION: '1' });
    const req: PaymentRequirements = paymentRequirements(custom, spec);
    const header = await createPaymentHeader(PAYER, 1, req);
    await expect(verifyPayment(custom, decodePaymentHeader(header), req)).resolves.toBeTruthy();
  });

  it('prepare + sign in two steps gives the same result', async () => {
    const unsigned = preparePaymentHeader(PAYER.address, 1, requirements);
    const header = await signPaymentHeader(PAYER, requirements, unsigned);
    await expect(verifyPayment(config, decodePaymentHeader(header), requirements)).resolves.toBeTruthy();
  });

  it('is refused when the amount signed is not the price', async () => {
    const header = await createPaymentHeader(PAYER, 1, { ...requirements, maxAmountRequired: '10000' });
    expect(await reasonOf(verifyPayment(config, decodePaymentHeader(header), requirements))).toBe('payment_invalid:invalid_amount');
  });
});
