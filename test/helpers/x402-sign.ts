import { randomBytes } from 'node:crypto';
import { getAddress, type Hex } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { loadConfig, type Config } from '../../src/config.js';
import type { ExactEvmAuthorization, PaymentPayload } from '../../src/pay/x402/payload.js';
import type { PaymentRequirements } from '../../src/pay/x402/requirements.js';
import { TRANSFER_WITH_AUTHORIZATION_TYPES } from '../../src/pay/x402/verify.js';

/**
 * Offline x402 payments for tests: an EIP-712 TransferWithAuthorization signed with viem, the same
 * way the `x402` client package signs (domain from the requirements' network, asset and extra).
 */

// Well-known development keys (Hardhat/Anvil accounts 1 and 2). Never hold real funds with them.
export const PAYER_KEY: Hex = '0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d';
export const OTHER_KEY: Hex = '0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a';
export const PAYER = privateKeyToAccount(PAYER_KEY);
export const OTHER = privateKeyToAccount(OTHER_KEY);
/** A fresh payer, so a test's payments and ledger lines are its own. */
export function newPayerKey(): Hex {
  return generatePrivateKey();
}

/** The service's receiving address in tests. */
export const PAY_TO = '0x209693Bc6afc0C5328bA36FaF03C514EF312287C';

const CHAIN_IDS: Record<string, number> = { 'base-sepolia': 84532, base: 8453 };

/**
 * An x402-enabled configuration; deferred settlement unless `env` names another mode (a
 * facilitator or self-settlement), since the service refuses to start without exactly one.
 */
export function x402Config(env: Record<string, string> = {}): Config {
  return loadConfig({}, { LOG_LEVEL: 'silent', X402_ENABLED: 'true', X402_PAY_TO: PAY_TO, ...x402ModeEnv(env), ...env });
}

/** `X402_SETTLEMENT=deferred` unless `env` configures a facilitator or self-settlement. */
export function x402ModeEnv(env: Record<string, string | undefined> = {}): Record<string, string> {
  return env.X402_FACILITATOR_URL || env.X402_RPC_URL || env.X402_SETTLEMENT ? {} : { X402_SETTLEMENT: 'deferred' };
}

export interface SignOptions {
  /** Key that signs (default PAYER_KEY). `authorization.from` defaults to its address. */
  privateKey?: Hex;
  now?: Date;
  /** Fields of the authorization, set before signing (so the signature matches them). */
  authorization?: Partial<ExactEvmAuthorization>;
  /** The payload's `network` (default: the requirements'); also picks the signing chain. */
  network?: string;
  /** Overrides of the EIP-712 domain used for signing. */
  domain?: Partial<{ name: string; version: string; chainId: number; verifyingContract: Hex }>;
}

/** A valid payment for the requirements unless options say otherwise. */
export async function signPayment(requirements: PaymentRequirements, opts: SignOptions = {}): Promise<PaymentPayload> {
  const account = privateKeyToAccount(opts.privateKey ?? PAYER_KEY);
  const nowSeconds = Math.floor((opts.now ?? new Date()).getTime() / 1000);
  const network = opts.network ?? requirements.network;
  // Same window the x402 client uses: valid from ten minutes ago until maxTimeoutSeconds from now.
  const authorization: ExactEvmAuthorization = {
    from: account.address,
    to: requirements.payTo,
    value: requirements.maxAmountRequired,
    validAfter: String(nowSeconds - 600),
    validBefore: String(nowSeconds + requirements.maxTimeoutSeconds),
    nonce: `0x${randomBytes(32).toString('hex')}`,
    ...opts.authorization,
  };
  const signature = await account.signTypedData({
    domain: {
      name: requirements.extra.name,
      version: requirements.extra.version,
      chainId: CHAIN_IDS[network] ?? 1,
      verifyingContract: getAddress(requirements.asset),
      ...opts.domain,
    },
    types: TRANSFER_WITH_AUTHORIZATION_TYPES,
    primaryType: 'TransferWithAuthorization',
    message: {
      from: getAddress(authorization.from),
      to: getAddress(authorization.to),
      value: BigInt(authorization.value),
      validAfter: BigInt(authorization.validAfter),
      validBefore: BigInt(authorization.validBefore),
      nonce: authorization.nonce as Hex,
    },
  });
  return { x402Version: 1, scheme: 'exact', network, payload: { signature, authorization } };
}

/** A copy with authorization fields changed after signing (a tampered token). */
export function tamper(payment: PaymentPayload, changes: Partial<ExactEvmAuthorization>): PaymentPayload {
  return { ...payment, payload: { ...payment.payload, authorization: { ...payment.payload.authorization, ...changes } } };
}

/** Any JSON value as an X-Payment header (base64, as x402 clients send it). */
export function toHeader(value: unknown): string {
  return Buffer.from(JSON.stringify(value), 'utf8').toString('base64');
}
