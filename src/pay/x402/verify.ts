import { getAddress, isAddressEqual, verifyTypedData } from 'viem';
import type { Config } from '../../config.js';
import { networkProfile, type NetworkProfile, type PaymentRequirements } from './requirements.js';
import { paymentInvalid, type DecodedPayment, type PaymentPayload } from './payload.js';

/** EIP-3009 `TransferWithAuthorization`, the typed data a payer signs for scheme `exact`. */
export const TRANSFER_WITH_AUTHORIZATION_TYPES = {
  TransferWithAuthorization: [
    { name: 'from', type: 'address' },
    { name: 'to', type: 'address' },
    { name: 'value', type: 'uint256' },
    { name: 'validAfter', type: 'uint256' },
    { name: 'validBefore', type: 'uint256' },
    { name: 'nonce', type: 'bytes32' },
  ],
} as const;

/**
 * An authorization must stay valid this long after we accept it, so that settling it (a block or
 * two on Base) can still succeed. The x402 reference facilitator uses the same margin.
 */
export const VALID_BEFORE_MARGIN_SECONDS = 6;

export function eip712Domain(p: NetworkProfile) {
  return { name: p.name, version: p.version, chainId: p.chainId, verifyingContract: p.asset } as const;
}

export interface VerifiedPayment {
  /** Lower-case payer address: the ledger's `payer` and part of the replay key. */
  payer: string;
  nonce: string;
  valueAtomic: bigint;
  validBefore: bigint;
  profile: NetworkProfile;
  /** The payment in v1 form on our network name: what is recorded and settled. */
  canonical: PaymentPayload;
}

function when(seconds: bigint): string {
  return seconds < 8_640_000_000_000n ? new Date(Number(seconds) * 1000).toISOString() : `unix ${seconds}`;
}

/**
 * Checks a decoded payment against what this call costs, entirely offline. The EIP-712 domain
 * (token name, version, chain, contract) comes from our configuration, never from the payload or
 * the client, so a signature made for another token or chain cannot pass.
 * Throws AppError('payment_invalid', ..., {reason}) naming the first problem found.
 */
export async function verifyPayment(
  config: Config,
  received: DecodedPayment | PaymentPayload,
  requirements: PaymentRequirements,
  now: Date = new Date(),
): Promise<VerifiedPayment> {
  const decoded: DecodedPayment = 'version' in received ? received : { version: 1, payload: received };
  const payment = decoded.payload;
  const profile = networkProfile(config);
  const auth = payment.payload.authorization;
  const nowSeconds = BigInt(Math.floor(now.getTime() / 1000));

  if (payment.scheme !== 'exact' || requirements.scheme !== 'exact') {
    throw paymentInvalid('invalid_scheme', `Payment scheme "${payment.scheme}" is not accepted; use "exact".`);
  }
  const ourNetwork = decoded.version === 2 ? profile.caip2 : profile.network;
  if (payment.network !== ourNetwork || requirements.network !== profile.network) {
    throw paymentInvalid('invalid_network', `The payment is for network "${payment.network}"; this service accepts "${ourNetwork}".`);
  }
  if (decoded.v2) {
    // v2 names what it accepted: it must be what we offered (the authorization is checked below as well).
    const accepted = decoded.v2.accepted;
    if (!isAddressEqual(accepted.asset as `0x${string}`, profile.asset)) {
      throw paymentInvalid('invalid_asset', `The payment accepted asset ${accepted.asset}; this service takes ${profile.asset}.`);
    }
    if (!isAddressEqual(accepted.payTo as `0x${string}`, profile.payTo)) {
      throw paymentInvalid('invalid_payee', `The payment accepted payTo ${accepted.payTo}; pay ${profile.payTo} instead.`);
    }
    if (accepted.amount !== requirements.maxAmountRequired) {
      throw paymentInvalid('invalid_amount', `The payment accepted amount ${accepted.amount}; this call costs exactly ${requirements.maxAmountRequired}.`, {
        expected: requirements.maxAmountRequired,
        received: accepted.amount,
      });
    }
  }
  if (!isAddressEqual(auth.to as `0x${string}`, profile.payTo)) {
    throw paymentInvalid('invalid_payee', `The payment is addressed to ${auth.to}; pay ${profile.payTo} instead.`);
  }
  const price = BigInt(requirements.maxAmountRequired);
  const value = BigInt(auth.value);
  if (value !== price) {
    throw paymentInvalid('invalid_amount', `The payment authorizes ${value} atomic units; this call costs exactly ${price} (maxAmountRequired).`, {
      expected: price.toString(),
      received: value.toString(),
    });
  }
  const validAfter = BigInt(auth.validAfter);
  const validBefore = BigInt(auth.validBefore);
  if (validAfter > nowSeconds) {
    throw paymentInvalid('payment_not_yet_valid', `The payment authorization is not valid until ${when(validAfter)} (validAfter).`);
  }
  if (validBefore < nowSeconds + BigInt(VALID_BEFORE_MARGIN_SECONDS)) {
    throw paymentInvalid(
      'payment_expired',
      `The payment authorization expires at ${when(validBefore)} (validBefore); it must stay valid for at least ` +
        `${VALID_BEFORE_MARGIN_SECONDS} more seconds. Sign a new one.`,
    );
  }

  // Checksum casing is presentation, not content: a payload with a lower-case or mis-cased address
  // signs the same 20 bytes, so normalise rather than refuse.
  const from = getAddress(auth.from.toLowerCase());
  let valid = false;
  try {
    valid = await verifyTypedData({
      address: from,
      domain: eip712Domain(profile),
      types: TRANSFER_WITH_AUTHORIZATION_TYPES,
      primaryType: 'TransferWithAuthorization',
      message: {
        from,
        to: getAddress(auth.to.toLowerCase()),
        value,
        validAfter,
        validBefore,
        nonce: auth.nonce as `0x${string}`,
      },
      signature: payment.payload.signature as `0x${string}`,
    });
  } catch {
    // An unparseable signature (bad length, bad recovery byte) is just as invalid as a wrong one.
    valid = false;
  }
  if (!valid) {
    throw paymentInvalid(
      'invalid_signature',
      `The signature is not ${auth.from}'s TransferWithAuthorization for ${profile.name} v${profile.version} ` +
        `at ${profile.asset} on chain ${profile.chainId}.`,
    );
  }

  return {
    payer: auth.from.toLowerCase(),
    nonce: auth.nonce.toLowerCase(),
    valueAtomic: value,
    validBefore,
    profile,
    canonical: { ...payment, network: profile.network },
  };
}
