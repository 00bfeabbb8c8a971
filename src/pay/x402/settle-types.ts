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
  settle(payment: PaymentPayload, requirements: PaymentRequirements, v2?: PaymentPayloadV2, hooks?: SettleHooks): Promise<SettleResult>;
  /** Where the chain can be read (self-settlement): what became of a payment, for the payment reconciler. */
  readonly lookup?: SettlementLookup;
  close?(): Promise<void>;
}

export interface SettleHooks {
  /** The transfer was sent (not yet mined): called with its transaction hash before waiting for it. */
  submitted?(transaction: string): Promise<void>;
}

/**
 * What became of a signed authorization on chain:
 * - `settled`: transferred, by the transaction named (ours or anyone's);
 * - `open`: not used yet; `expired` when it never can be any more (the chain's time is past validBefore);
 * - `used`: the nonce is used but no transfer of it was found (cancelled by the payer, or older than
 *   the logs searched): only an operator can tell.
 */
export type SettlementState = { state: 'settled'; transaction: string } | { state: 'open'; expired: boolean } | { state: 'used' };

export interface SettlementLookup {
  /** Throws when the chain cannot be read (try again later). `transaction`: one sent for it, if recorded. */
  settlementOf(payment: PaymentPayload, transaction?: string | null): Promise<SettlementState>;
}

/** A settlement configuration that cannot work (reported as a one-line start-up error). */
export class SettlerStartupError extends Error {}

/** errorReason / invalidReason values of our own, for answers the facilitator (or chain) never gave. */
export const FACILITATOR_UNREACHABLE = 'facilitator_unreachable';
export const FACILITATOR_BAD_RESPONSE = 'facilitator_bad_response';
/** The nonce is already used on chain (someone submitted this authorization): a replay. */
export const NONCE_USED_ON_CHAIN = 'nonce_already_used';
export const INSUFFICIENT_FUNDS = 'insufficient_funds';
/** Self-settlement: the chain did not answer. */
export const RPC_UNREACHABLE = 'rpc_unreachable';
/** Self-settlement: the transfer was sent but not confirmed in time; it may still be mined. */
export const SETTLEMENT_UNCONFIRMED = 'settlement_unconfirmed';
