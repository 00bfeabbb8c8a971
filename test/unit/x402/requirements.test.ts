import { decodePaymentRequiredHeader } from '@x402/core/http';
import { describe, expect, it } from 'vitest';
import { PaymentRequirementsSchema as X402RequirementsSchema } from 'x402/types';
import { selectPaymentRequirements } from 'x402/client';
import {
  centsToUsd,
  isPaymentError,
  networkProfile,
  paymentErrorBody,
  paymentRequiredError,
  paymentRequiredResponse,
  paymentRequirements,
  withRequirements,
} from '../../../src/pay/x402/requirements.js';
import { paymentInvalid } from '../../../src/pay/x402/payload.js';
import { PAY_TO, x402Config } from '../../helpers/x402-sign.js';

const spec = { priceCents: 5, resource: 'https://api.example.com/tools/page_fetch', description: 'page_fetch: fetch a web page' };

describe('networkProfile', () => {
  it('defaults to USDC on Base Sepolia', () => {
    expect(networkProfile(x402Config())).toEqual({
      network: 'base-sepolia',
      chainId: 84532,
      caip2: 'eip155:84532',
      asset: '0x036CbD53842c5426634e7929541eC2318f3dCF7e',
      name: 'USDC',
      version: '2',
      payTo: PAY_TO,
    });
  });

  it('knows USDC on Base mainnet', () => {
    expect(networkProfile(x402Config({ X402_NETWORK: 'base' }))).toMatchObject({
      chainId: 8453,
      asset: '0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913',
      name: 'USD Coin',
      version: '2',
    });
  });

  it('lets configuration override the chain and token domain', () => {
    const p = networkProfile(
      x402Config({
        X402_CHAIN_ID: '31337',
        X402_ASSET_ADDRESS: '0x5fbdb2315678afecb367f032d93f642f64180aa3',
        X402_ASSET_NAME: 'Test USD',
        X402_ASSET_VERSION: '1',
      }),
    );
    expect(p).toMatchObject({ chainId: 31337, asset: '0x5FbDB2315678afecb367f032d93F642f64180aa3', name: 'Test USD', version: '1' });
  });

  it('refuses to run without a receiving address', () => {
    expect(() => networkProfile(x402Config({ X402_ENABLED: 'false', X402_PAY_TO: '' }))).toThrow(/X402_PAY_TO/);
  });
});

describe('paymentRequirements', () => {
  it('builds x402 v1 PaymentRequirements in atomic units', () => {
    const req = paymentRequirements(x402Config({ X402_FACILITATOR_URL: 'http://127.0.0.1:9', X402_MAX_TIMEOUT_SECONDS: '120' }), spec);
    expect(req).toEqual({
      scheme: 'exact',
      network: 'base-sepolia',
      maxAmountRequired: '50000',
      resource: 'https://api.example.com/tools/page_fetch',
      description: 'page_fetch: fetch a web page',
      mimeType: 'application/json',
      payTo: PAY_TO,
      maxTimeoutSeconds: 120,
      asset: '0x036CbD53842c5426634e7929541eC2318f3dCF7e',
      extra: { name: 'USDC', version: '2' },
    });
  });

  it('is accepted by the x402 package schema and chosen by its client selector', () => {
    const req = paymentRequirements(x402Config(), spec);
    expect(X402RequirementsSchema.parse(req)).toEqual(req);
    expect(selectPaymentRequirements([req], 'base-sepolia', 'exact')).toEqual(req);
  });

  it.each([
    [1, '10000', '0.01'],
    [5, '50000', '0.05'],
    [100, '1000000', '1.00'],
    [1234, '12340000', '12.34'],
  ])('%i cents = %s atomic units = $%s', (cents, atomic, usd) => {
    expect(paymentRequirements(x402Config(), { ...spec, priceCents: cents }).maxAmountRequired).toBe(atomic);
    expect(centsToUsd(cents)).toBe(usd);
  });

  it('refuses free or fractional prices and relative resources', () => {
    expect(() => paymentRequirements(x402Config(), { ...spec, priceCents: 0 })).toThrow(/positive integer/);
    expect(() => paymentRequirements(x402Config(), { ...spec, priceCents: 1.5 })).toThrow(/positive integer/);
    expect(() => paymentRequirements(x402Config(), { ...spec, resource: '/tools/page_fetch' })).toThrow();
  });
});

describe('the 402', () => {
  it('carries the X-Payment-* headers and the x402 body', () => {
    const config = x402Config();
    const res = paymentRequiredResponse(config, spec, 'req_1');
    expect(res.status).toBe(402);
    expect(res.headers).toEqual({
      'X-Payment-Required': 'true',
      'X-Payment-Amount': '0.05',
      'X-Payment-Currency': 'USDC',
      'X-Payment-Network': 'base-sepolia',
      'Cache-Control': 'no-store',
      'Access-Control-Expose-Headers':
        'PAYMENT-REQUIRED, PAYMENT-RESPONSE, X-Payment-Required, X-Payment-Amount, X-Payment-Currency, X-Payment-Network, X-Payment-Response',
      'PAYMENT-REQUIRED': expect.any(String),
    });
    // x402 v2: the same offer as base64 JSON in PAYMENT-REQUIRED, decoded by the v2 client's own function.
    expect(decodePaymentRequiredHeader(res.headers['PAYMENT-REQUIRED']!)).toEqual({
      x402Version: 2,
      error: expect.stringContaining('0.05 USDC'),
      resource: { url: 'https://api.example.com/tools/page_fetch', description: 'page_fetch: fetch a web page', mimeType: 'application/json' },
      accepts: [
        {
          scheme: 'exact',
          network: 'eip155:84532',
          asset: '0x036CbD53842c5426634e7929541eC2318f3dCF7e',
          amount: '50000',
          payTo: PAY_TO,
          // Deferred settlement asks for authorizations that stay valid long enough to collect.
          maxTimeoutSeconds: 3600,
          extra: { name: 'USDC', version: '2' },
        },
      ],
    });
    expect(res.body).toEqual({
      x402Version: 1,
      error: expect.stringContaining('0.05 USDC'),
      accepts: [paymentRequirements(config, spec)],
      code: 'payment_required',
      request_id: 'req_1',
    });
  });

  it('turns a verification failure into a 402 with its reason and fresh requirements', () => {
    const config = x402Config();
    const err = withRequirements(config, spec, paymentInvalid('invalid_amount', 'wrong amount'));
    expect(err.status).toBe(402);
    expect(isPaymentError(err)).toBe(true);
    expect(err.headers['X-Payment-Required']).toBe('true');
    expect(paymentErrorBody(err, 'req_2')).toEqual({
      x402Version: 1,
      error: 'wrong amount',
      accepts: [paymentRequirements(config, spec)],
      code: 'payment_invalid',
      reason: 'invalid_amount',
      request_id: 'req_2',
    });
    expect(paymentRequiredError(config, spec).code).toBe('payment_required');
  });
});
