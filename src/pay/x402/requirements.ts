import { z } from 'zod';
import { getAddress } from 'viem';
import type { Config } from '../../config.js';
import { AppError, type ErrorCode, type ErrorDetails } from '../../errors.js';

/**
 * What the 402 offers and the headers around it: scheme `exact` (EIP-3009 `transferWithAuthorization`
 * of USDC on an EVM network), in both protocol versions at once. Version 1 is the body (`x402Version: 1`,
 * `accepts` with network names, `maxAmountRequired`); version 2 is the `PAYMENT-REQUIRED` header (base64
 * JSON with `x402Version: 2`, a `resource` object, `accepts` with CAIP-2 networks and `amount`). The
 * same signed authorization answers either.
 */
export const X402_VERSION = 1;
export const X402_VERSION_2 = 2;

/** USDC has 6 decimals, so one cent is 10,000 atomic units. */
export const ATOMIC_UNITS_PER_CENT = 10_000n;

export type X402Network = Config['X402_NETWORK'];

export interface NetworkProfile {
  network: X402Network;
  chainId: number;
  /** The USDC contract, checksummed: the EIP-712 `verifyingContract` and the requirements' `asset`. */
  asset: `0x${string}`;
  /** EIP-712 domain name and version of that contract (they differ between networks). */
  name: string;
  version: string;
  payTo: `0x${string}`;
  /** The network as x402 v2 names it (CAIP-2), e.g. `eip155:84532`. */
  caip2: `eip155:${number}`;
}

// Circle's USDC deployments, with the EIP-712 domain each contract reports (`name()`, `version()`).
// The same table ships in the `x402` package, which is what standard clients sign against.
const KNOWN_NETWORKS: Record<X402Network, Omit<NetworkProfile, 'network' | 'payTo' | 'caip2'>> = {
  'base-sepolia': { chainId: 84532, asset: '0x036CbD53842c5426634e7929541eC2318f3dCF7e', name: 'USDC', version: '2' },
  base: { chainId: 8453, asset: '0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913', name: 'USD Coin', version: '2' },
};

/**
 * The network, token and EIP-712 domain this service accepts, from configuration only. The
 * X402_ASSET_* overrides reach standard clients through `asset` and `extra` in the requirements.
 * X402_CHAIN_ID does not: x402 clients derive the chain id from the network name, so overriding it
 * only makes sense for a client of our own (a local test chain, say).
 */
export function networkProfile(config: Config): NetworkProfile {
  if (!config.X402_PAY_TO) throw new Error('X402_PAY_TO is not configured');
  const known = KNOWN_NETWORKS[config.X402_NETWORK];
  const chainId = config.X402_CHAIN_ID ?? known.chainId;
  return {
    network: config.X402_NETWORK,
    chainId,
    caip2: `eip155:${chainId}`,
    asset: getAddress(config.X402_ASSET_ADDRESS ?? known.asset),
    name: config.X402_ASSET_NAME ?? known.name,
    version: config.X402_ASSET_VERSION ?? known.version,
    payTo: getAddress(config.X402_PAY_TO),
  };
}

const uintString = z.string().regex(/^(0|[1-9]\d*)$/);

/** x402 v1 PaymentRequirements, as the 402 body's `accepts` entries and the facilitator bodies carry them. */
export const PaymentRequirementsSchema = z.object({
  scheme: z.literal('exact').describe('Payment scheme: an exact amount, EIP-3009 on EVM networks'),
  network: z.enum(['base-sepolia', 'base']).describe('x402 network name'),
  maxAmountRequired: uintString.describe("Price in the asset's atomic units (USDC: 10,000 per cent)"),
  resource: z.string().url().describe('Absolute URL of the paid resource'),
  description: z.string().describe('What the payment buys'),
  mimeType: z.string().describe('Media type of the paid response'),
  outputSchema: z.record(z.unknown()).optional().describe('Optional description of the input and output'),
  payTo: z
    .string()
    .regex(/^0x[0-9a-fA-F]{40}$/)
    .describe('Address that receives the payment'),
  maxTimeoutSeconds: z.number().int().positive().describe('How long a signed payment may take to arrive'),
  asset: z
    .string()
    .regex(/^0x[0-9a-fA-F]{40}$/)
    .describe('Token contract address'),
  extra: z.object({ name: z.string(), version: z.string() }).passthrough().describe('EIP-712 domain name and version of the token'),
});
export type PaymentRequirements = z.infer<typeof PaymentRequirementsSchema>;

export interface PriceSpec {
  /** Price of the call in integer cents (> 0; free tools need no payment). */
  priceCents: number;
  /** Absolute URL of what is being paid for, e.g. https://api.example.com/tools/page_fetch. */
  resource: string;
  description: string;
  /** Optional x402 discovery hint (the tool's input and output). */
  outputSchema?: Record<string, unknown>;
  /** x402 v2 extensions this resource supports (PaymentRequired.extensions), e.g. payment-identifier. */
  extensions?: Record<string, unknown>;
}

export function centsToAtomic(cents: number): bigint {
  if (!Number.isSafeInteger(cents) || cents <= 0) throw new Error(`price must be a positive integer of cents, got ${cents}`);
  return BigInt(cents) * ATOMIC_UNITS_PER_CENT;
}

/** "0.05" for 5 cents: the dollar string the spec uses for prices. */
export function centsToUsd(cents: number): string {
  return `${Math.floor(cents / 100)}.${String(cents % 100).padStart(2, '0')}`;
}

/**
 * How long a signed payment may take to arrive (the authorization's validity the client signs for).
 * Deferred settlement asks for much longer, so an operator has time to collect.
 */
export function paymentTimeoutSeconds(config: Config): number {
  return config.X402_SETTLEMENT === 'deferred' ? config.X402_DEFERRED_TIMEOUT_SECONDS : config.X402_MAX_TIMEOUT_SECONDS;
}

export function paymentRequirements(config: Config, spec: PriceSpec): PaymentRequirements {
  const p = networkProfile(config);
  const resource = new URL(spec.resource); // throws on a relative URL: x402 clients require absolute ones
  return {
    scheme: 'exact',
    network: p.network,
    maxAmountRequired: centsToAtomic(spec.priceCents).toString(),
    resource: resource.toString(),
    description: spec.description,
    mimeType: 'application/json',
    ...(spec.outputSchema ? { outputSchema: spec.outputSchema } : {}),
    payTo: p.payTo,
    maxTimeoutSeconds: paymentTimeoutSeconds(config),
    asset: p.asset,
    extra: { name: p.name, version: p.version },
  };
}

/** x402 v2 PaymentRequirements (what `@x402/core` calls PaymentRequirements): CAIP-2 network, `amount`. */
export const PaymentRequirementsV2Schema = z.object({
  scheme: z.literal('exact'),
  network: z
    .string()
    .regex(/^eip155:\d{1,12}$/)
    .describe('CAIP-2 network, e.g. eip155:84532'),
  asset: z.string().regex(/^0x[0-9a-fA-F]{40}$/),
  amount: uintString.describe("Price in the asset's atomic units"),
  payTo: z.string().regex(/^0x[0-9a-fA-F]{40}$/),
  maxTimeoutSeconds: z.number().int().positive(),
  extra: z.object({ name: z.string(), version: z.string() }).passthrough(),
});
export type PaymentRequirementsV2 = z.infer<typeof PaymentRequirementsV2Schema>;

export interface ResourceInfo {
  url: string;
  description?: string;
  mimeType?: string;
}

/** The same offer as `requirements` (v1), in v2's shape. */
export function toV2Requirements(requirements: PaymentRequirements, profile: NetworkProfile): PaymentRequirementsV2 {
  return {
    scheme: 'exact',
    network: profile.caip2,
    asset: requirements.asset,
    amount: requirements.maxAmountRequired,
    payTo: requirements.payTo,
    maxTimeoutSeconds: requirements.maxTimeoutSeconds,
    extra: requirements.extra,
  };
}

export function resourceInfo(requirements: PaymentRequirements): ResourceInfo {
  return { url: requirements.resource, description: requirements.description, mimeType: requirements.mimeType };
}

/** The v2 PaymentRequired object: base64 JSON in the `PAYMENT-REQUIRED` header of every 402 asking for payment. */
export function paymentRequiredV2(config: Config, spec: PriceSpec, error: string) {
  const requirements = paymentRequirements(config, spec);
  return {
    x402Version: X402_VERSION_2,
    error,
    resource: resourceInfo(requirements),
    accepts: [toV2Requirements(requirements, networkProfile(config))],
    ...(spec.extensions ? { extensions: spec.extensions } : {}),
  };
}

export function base64Json(value: unknown): string {
  return Buffer.from(JSON.stringify(value), 'utf8').toString('base64');
}

const EXPOSED = [
  'PAYMENT-REQUIRED',
  'PAYMENT-RESPONSE',
  'X-Payment-Required',
  'X-Payment-Amount',
  'X-Payment-Currency',
  'X-Payment-Network',
  'X-Payment-Response',
];

/** Headers of every 402 that asks for payment (the spec's X-Payment-* set). */
export function paymentRequiredHeaders(config: Config, priceCents: number): Record<string, string> {
  return {
    'X-Payment-Required': 'true',
    'X-Payment-Amount': centsToUsd(priceCents),
    'X-Payment-Currency': 'USDC',
    'X-Payment-Network': config.X402_NETWORK,
    // Requirements carry a fresh price and time window; a cached 402 would be stale.
    'Cache-Control': 'no-store',
    'Access-Control-Expose-Headers': EXPOSED.join(', '),
  };
}

type PaymentErrorCode = Extract<ErrorCode, 'payment_required' | 'payment_invalid' | 'payment_already_used'>;

/**
 * An AppError that tells an x402 client what to pay: the X-Payment-* headers, and `x402Version` +
 * `accepts` in its details so the error handler can answer with the x402 body (paymentErrorBody).
 */
export function paymentError(
  config: Config,
  spec: PriceSpec,
  code: PaymentErrorCode,
  message: string,
  details: ErrorDetails = {},
  extraHeaders: Record<string, string> = {},
): AppError {
  return new AppError(
    code,
    message,
    { ...details, x402Version: X402_VERSION, accepts: [paymentRequirements(config, spec)] },
    {
      headers: {
        ...paymentRequiredHeaders(config, spec.priceCents),
        'PAYMENT-REQUIRED': base64Json(paymentRequiredV2(config, spec, message)),
        ...extraHeaders,
      },
    },
  );
}

/** The first answer to a paid call made without a key. */
export function paymentRequiredError(config: Config, spec: PriceSpec): AppError {
  return paymentError(
    config,
    spec,
    'payment_required',
    `This call costs ${centsToUsd(spec.priceCents)} USDC on ${config.X402_NETWORK}. Send an API key, or pay per call with x402: ` +
      'sign the payment described in the PAYMENT-REQUIRED header (version 2) and repeat the request with it in PAYMENT-SIGNATURE, ' +
      'or the one in `accepts` (version 1) and repeat it with X-Payment.',
  );
}

/** Re-issues a payment error from verification or replay checks with fresh requirements attached. */
export function withRequirements(config: Config, spec: PriceSpec, err: AppError): AppError {
  if (err.code !== 'payment_invalid' && err.code !== 'payment_already_used' && err.code !== 'payment_required') return err;
  return paymentError(config, spec, err.code, err.message, err.details, err.headers);
}

export function isPaymentError(err: AppError): boolean {
  return Array.isArray(err.details.accepts) && err.details.x402Version === X402_VERSION;
}

/**
 * The 402 body for a payment error. x402 clients read `x402Version` and `accepts` at the top level,
 * and the official Python client's model requires `error` to be a string, so the house envelope
 * (`error: {code, message, request_id}`) cannot be used unchanged here: the message goes in `error`,
 * and `code`, `request_id` and the other details (`reason`...) sit beside it.
 */
export function paymentErrorBody(err: AppError, requestId: string): Record<string, unknown> {
  const { x402Version, accepts, ...rest } = err.details;
  return { x402Version, error: err.message, accepts, code: err.code, request_id: requestId, ...rest };
}

/** Status, headers and body of a 402 for routes that reply directly instead of throwing. */
export function paymentRequiredResponse(
  config: Config,
  spec: PriceSpec,
  requestId: string,
  err: AppError = paymentRequiredError(config, spec),
): { status: number; headers: Record<string, string>; body: Record<string, unknown> } {
  const e = isPaymentError(err) ? err : withRequirements(config, spec, err);
  return { status: e.status, headers: e.headers, body: paymentErrorBody(e, requestId) };
}
