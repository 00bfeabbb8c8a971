/** What every settlement mode answers (settler.ts picks one; chain-settler.ts is the `self` mode). */
import type { X402Settlement } from '../../config.js';
import type { PaymentPayload, PaymentPayloadV2 } from './payload.js';
import type { PaymentRequirements } from './requirements.js';

/** A facilitator's answer to POST /verify (x402 v1). */
export interface VerifyResult {
  isValid: boolean;
  invalidReason?: string;
  payer?: string;
}

/** A facilitator's answer to POST /settle, and the X-Payment-Response content (x402 v1 SettlementResponse). */
export interface SettleResult {
  success: boolean;
  /** Transaction hash; '' when nothing was submitted on chain. */
  transaction: string;
  network: string;
  payer?: string;
  errorReason?: string;
}

/**
 * Where a verified payment turns into money (one per deployment, see x402Settlement in config.ts):
 * - `facilitator`: an x402 facilitator's /verify (funds, authorization on chain) before the tool runs,
 *   its /settle before the result is returned;
 * - `self`: this service reads the chain before, and submits the transfer itself after (chain-settler.ts);
 * - `deferred`: the signature is checked offline only, and the payment waits for an operator.
 * `payment` is the v1 form on our network; `v2` the payload as a v2 client sent it, when it did.
 */
export interface PaymentSettler {
  readonly mode: X402Settlement;
  /** Start-up checks (the facilitator's /supported, the chain's id); throws SettlerStartupError. */
  start(): Promise<void>;
  verify(payment: PaymentPayload, requirements: PaymentRequirements, v2?: PaymentPayloadV2): Promise<VerifyResult>;
  settle(payment: PaymentPayload, requirements: PaymentRequirements, v2?: PaymentPayloadV2): Promise<SettleResult>;
  close?(): Promise<void>;
}

/** A settlement configuration that cannot work (reported as a one-line start-up error). */
export class SettlerStartupError extends Error {}

/** errorReason / invalidReason values of our own, for answers the facilitator (or chain) never gave. */
export const FACILITATOR_UNREACHABLE = 'facilitator_unreachable';
export const FACILITATOR_BAD_RESPONSE = 'facilitator_bad_response';
/** The nonce is already used on chain (someone submitted this authorization): a replay. */
export const NONCE_USED_ON_CHAIN = 'nonce_already_used';
export const INSUFFICIENT_FUNDS = 'insufficient_funds';
