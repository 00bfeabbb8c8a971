import type { CommonQueryMethods } from 'slonik';
import type { Config } from '../../config.js';
import { AppError } from '../../errors.js';
import { decodePayment, paymentInvalid, type PaymentHeaders, type PaymentPayload, type PaymentPayloadV2 } from './payload.js';
import {
  ATOMIC_UNITS_PER_CENT,
  networkProfile,
  paymentError,
  paymentRequirements,
  withRequirements,
  type PaymentRequirements,
  type PriceSpec,
} from './requirements.js';
import { paymentResponseHeaders } from './settler.js';
import {
  FACILITATOR_BAD_RESPONSE,
  FACILITATOR_UNREACHABLE,
  INSUFFICIENT_FUNDS,
  NONCE_USED_ON_CHAIN,
  RPC_UNREACHABLE,
  SETTLEMENT_UNCONFIRMED,
  type PaymentSettler,
  type SettleResult,
} from './settle-types.js';
import {
  findPayment,
  listAwaitingSettlement,
  markAwaitingSettlement,
  markFailed,
  markSettled,
  markSettling,
  recordSubmitted,
  reserveNonce,
  type PaidAnswer,
  type SettlingInput,
  type StoredPayment,
} from './store.js';
import { verifyPayment } from './verify.js';

/**
 * A paid call's payment, in three steps the route takes around running the tool:
 *   admitPayment    decode (v1 or v2), verify offline, reserve the nonce, check funds (facilitator
 *                   /verify or the chain; deferred: the per-payer cap instead)
 *   completePayment after the tool succeeded: keep the answer, settle, then return the payment response headers
 *   abandonPayment  after the tool failed: record it, charge nothing
 * Every refusal is an AppError; payment refusals carry fresh requirements and the payment headers.
 * A payment left 'reserved' by a crash is completed or released by the payment reconciler (reconcile.ts).
 */

export interface X402Deps {
  config: Config;
  db: CommonQueryMethods;
  settler: PaymentSettler;
  log?: { error(obj: object, msg: string): void };
}

export interface PaidCall extends PriceSpec {
  /** Tool name for the payment record (a root chain/parallel call can pass e.g. "chain:a,b"). */
  tool: string;
}

export interface AdmittedPayment {
  id: string;
  /** Lower-case payer address: the ledger entry's `payer`. */
  payer: string;
  call: PaidCall;
  /** v1 form on our network name: what is recorded and settled. */
  payment: PaymentPayload;
  /** As a v2 client sent it (v2 facilitators take it as is). */
  v2?: PaymentPayloadV2;
  requirements: PaymentRequirements;
}

/** Answers we could not get, as opposed to refusals of the payment. */
function isOurFault(reason: string | undefined): boolean {
  return reason === FACILITATOR_UNREACHABLE || reason === FACILITATOR_BAD_RESPONSE || reason === RPC_UNREACHABLE;
}

function checker(deps: X402Deps): string {
  return deps.settler.mode === 'self' ? 'The chain (X402_RPC_URL)' : 'The payment facilitator';
}

/** Seconds a client may take between reading the 402 and its payment arriving (signing, transit, clock skew). */
export const DEFERRED_ARRIVAL_ALLOWANCE_SECONDS = 120;

/** How long a deferred authorization must still be valid on arrival (X402_DEFERRED_MIN_VALID_SECONDS). */
export function deferredMinValidSeconds(config: Config): number {
  return config.X402_DEFERRED_MIN_VALID_SECONDS || Math.max(60, config.X402_DEFERRED_TIMEOUT_SECONDS - DEFERRED_ARRIVAL_ALLOWANCE_SECONDS);
}

/**
 * A deferred payment is collected later (`payments settle`): an authorization that expires before
 * the operator can collect it would be a call served for free. Refused (402) before anything runs.
 */
function assertCollectable(config: Config, validBefore: bigint, now: Date): void {
  const min = deferredMinValidSeconds(config);
  const nowSeconds = BigInt(Math.floor(now.getTime() / 1000));
  if (validBefore >= nowSeconds + BigInt(min)) return;
  throw paymentInvalid(
    'expires_before_collection',
    `The payment authorization expires at ${new Date(Number(validBefore) * 1000).toISOString()} (validBefore); payments here are ` +
      `collected later, so it must stay valid for at least ${min} seconds from now. Sign a new one valid for maxTimeoutSeconds.`,
    { min_valid_seconds: min },
  );
}

export async function admitPayment(
  deps: X402Deps,
  headers: PaymentHeaders | string | string[] | undefined,
  call: PaidCall,
  now: Date = new Date(),
): Promise<AdmittedPayment> {
  const out = await admitOrReplay(deps, headers, call, undefined, now);
  if ('replay' in out) throw new Error('admitPayment: no replay without a request fingerprint');
  return out;
}

/**
 * admitPayment for a request that can be answered again: a payment already used for this same
 * request (`fingerprint`) whose settlement went through (the API died before answering, and the
 * reconciler completed it) is answered with its stored answer and its settlement's payment response
 * headers, instead of 402 payment_already_used. While that settlement is still open: 409, retry.
 */
export async function admitOrReplay(
  deps: X402Deps,
  headers: PaymentHeaders | string | string[] | undefined,
  call: PaidCall,
  fingerprint: string | undefined,
  now: Date = new Date(),
): Promise<AdmittedPayment | { replay: PaidAnswer }> {
  const requirements = paymentRequirements(deps.config, call);
  try {
    const decoded = decodePayment(typeof headers === 'object' && !Array.isArray(headers) ? headers : { xPayment: headers });
    const verified = await verifyPayment(deps.config, decoded, requirements, now);
    if (deps.settler.mode === 'deferred') assertCollectable(deps.config, verified.validBefore, now);
    const payment = verified.canonical;
    // Reserve before checking funds: a replayed token is then always "already used", and two
    // concurrent copies never both reach the facilitator or the chain. Deferred payments are capped
    // per payer in the same statement, since nothing checks their funds.
    const deferredCapAtomic = deps.settler.mode === 'deferred' ? BigInt(deps.config.X402_DEFERRED_MAX_CENTS) * ATOMIC_UNITS_PER_CENT : undefined;
    let id: string;
    try {
      id = await reserveNonce(deps.db, { payment, requirements, verified, tool: call.tool, version: decoded.version, deferredCapAtomic });
    } catch (e) {
      if (fingerprint === undefined || !(e instanceof AppError) || e.code !== 'payment_already_used') throw e;
      const prior = await findPayment(deps.db, {
        chainId: verified.profile.chainId,
        asset: verified.profile.asset,
        payer: verified.payer,
        nonce: verified.nonce,
      });
      const replay = prior && replayOf(deps, prior, fingerprint);
      if (replay) return { replay };
      throw e;
    }
    const check = await deps.settler.verify(payment, requirements, decoded.v2);
    if (!check.isValid) {
      await markFailed(deps.db, id, `verify: ${check.invalidReason ?? 'refused'}`);
      if (isOurFault(check.invalidReason)) {
        throw new AppError(
          'upstream_error',
          `${checker(deps)} could not be reached to verify this payment. Nothing was charged; sign a new payment and retry.`,
          { reason: check.invalidReason },
          { retryable: false },
        );
      }
      if (check.invalidReason === NONCE_USED_ON_CHAIN) {
        throw new AppError(
          'payment_already_used',
          `This payment authorization (nonce ${verified.nonce}) has already been used on chain. Sign a new payment with a fresh nonce.`,
          {
            reason: 'nonce_already_used',
          },
        );
      }
      if (check.invalidReason === INSUFFICIENT_FUNDS) {
        throw paymentInvalid(
          'insufficient_funds',
          `${verified.payer} does not hold the ${requirements.maxAmountRequired} atomic units this payment authorizes. Nothing ran and nothing was charged.`,
          {
            facilitator_reason: check.invalidReason,
          },
        );
      }
      throw paymentInvalid('payment_rejected', `${checker(deps)} refused this payment (${check.invalidReason ?? 'no reason given'}).`, {
        facilitator_reason: check.invalidReason ?? null,
      });
    }
    return { id, payer: verified.payer, call, payment, v2: decoded.v2, requirements };
  } catch (e) {
    if (e instanceof AppError) throw withRequirements(deps.config, call, e);
    throw e;
  }
}

/**
 * The answer for a retry of a used payment, when it is the same request and its settlement went
 * through; throws 409 while that settlement is still open; undefined otherwise (the payment is used).
 */
function replayOf(deps: X402Deps, prior: StoredPayment, fingerprint: string): PaidAnswer | undefined {
  if (!prior.answer || prior.request_fingerprint !== fingerprint) return undefined;
  if (prior.status === 'reserved' && prior.settling) {
    throw new AppError(
      'idempotency_in_progress',
      'The call this payment paid for ran and its settlement is not confirmed yet; retry with the same payment shortly for its answer. ' +
        'It is charged only if the settlement goes through.',
      { retry_after: 5 },
      { headers: { 'retry-after': '5' } },
    );
  }
  if (prior.status !== 'settled' && prior.status !== 'awaiting_settlement') return undefined;
  const settlement: SettleResult = {
    success: true,
    transaction: prior.tx_hash ?? '',
    network: prior.network,
    payer: prior.payment_payload.payload.authorization.from,
  };
  const { status, body, headers } = prior.answer;
  return { status, body, headers: { ...headers, ...paymentResponseHeaders(settlement, networkProfile(deps.config).caip2) } };
}

/**
 * Settles an admitted payment once the tool has produced its result. First the answer is kept with
 * the payment (`settling`): from the moment the settlement is attempted, a crash leaves a row the
 * reconciler can complete and a retry can be answered from. On failure the result must not be
 * returned: the error says so and nothing is charged.
 */
export async function completePayment(
  deps: X402Deps,
  admitted: AdmittedPayment,
  settling: SettlingInput = {},
): Promise<{ settlement: SettleResult; headers: Record<string, string> }> {
  if (!(await markSettling(deps.db, admitted.id, settling))) {
    // The reconciler released it (a call that outlived X402_RECONCILE_GRACE_SECONDS): never settle it now.
    throw paymentError(
      deps.config,
      admitted.call,
      'payment_invalid',
      'This payment was released before its call finished, so the result is withheld and nothing was charged. Sign a new payment and retry.',
      { reason: 'payment_released' },
    );
  }
  const result = await deps.settler.settle(admitted.payment, admitted.requirements, admitted.v2, {
    submitted: (tx) =>
      recordSubmitted(deps.db, admitted.id, tx).catch((e: unknown) => {
        deps.log?.error({ err: e, paymentId: admitted.id }, 'x402: recording a sent settlement failed; the reconciler will find it by its nonce');
      }),
  });
  const caip2 = networkProfile(deps.config).caip2;
  if (!result.success && result.errorReason === SETTLEMENT_UNCONFIRMED) {
    // Sent, not confirmed in time: it may still be mined. The row stays reserved (with its
    // transaction) for the reconciler, which completes it if the transfer went through.
    throw new AppError(
      'upstream_error',
      `The settlement transaction ${result.transaction} was sent but not confirmed in time, so the result is withheld for now. ` +
        'Retry with the same payment in a minute: once the transfer is confirmed that retry gets the result; if it never goes through, nothing is charged.',
      { reason: SETTLEMENT_UNCONFIRMED, transaction: result.transaction },
      { retryable: false, headers: paymentResponseHeaders(result, caip2) },
    );
  }
  if (!result.success) {
    const tx = result.transaction ? ` (transaction ${result.transaction})` : '';
    await markFailed(deps.db, admitted.id, `settle: ${result.errorReason ?? 'failed'}${tx}`, result.transaction || undefined);
    // x402 puts the failed SettlementResponse in the payment response headers as well.
    const responseHeaders = paymentResponseHeaders(result, caip2);
    if (isOurFault(result.errorReason)) {
      throw new AppError(
        'upstream_error',
        `${checker(deps)} could not be reached to settle this payment, so the result is withheld and nothing was charged. Sign a new payment and retry.`,
        { reason: result.errorReason },
        { retryable: false, headers: responseHeaders },
      );
    }
    throw paymentError(
      deps.config,
      admitted.call,
      'payment_invalid',
      `Settling the payment failed (${result.errorReason ?? 'no reason given'}), so the result is withheld and nothing was charged.`,
      { reason: 'settlement_failed', settlement_error: result.errorReason ?? null, ...(result.transaction ? { transaction: result.transaction } : {}) },
      responseHeaders,
    );
  }
  try {
    if (deps.settler.mode === 'deferred') await markAwaitingSettlement(deps.db, admitted.id);
    else await markSettled(deps.db, admitted.id, result.transaction);
  } catch (e) {
    // The money has moved (or is promised): the caller gets the result even if recording it failed.
    // The row stays 'reserved' with its answer, and the reconciler completes it.
    deps.log?.error({ err: e, paymentId: admitted.id }, 'x402: recording a settled payment failed');
  }
  return { settlement: result, headers: paymentResponseHeaders(result, caip2) };
}

/** The tool failed: no settlement, no charge. The nonce stays spent (see store.ts). */
export async function abandonPayment(deps: X402Deps, admitted: AdmittedPayment, error: string): Promise<void> {
  await markFailed(deps.db, admitted.id, `call: ${error}`);
}

export interface SettleAwaitingSummary {
  settled: number;
  failed: number;
  expired: number;
  /** Left awaiting because the facilitator did not answer; try again later. */
  retry: number;
}

/**
 * Operator command: submits locally verified payments to a facilitator. Authorizations past their
 * validBefore can no longer move money and are marked failed.
 */
export async function settleAwaitingPayments(db: CommonQueryMethods, settler: PaymentSettler, now: Date = new Date()): Promise<SettleAwaitingSummary> {
  if (settler.mode === 'deferred') {
    throw new Error('settling deferred payments needs a facilitator (X402_FACILITATOR_URL) or self-settlement (X402_RPC_URL + X402_SETTLER_PRIVATE_KEY)');
  }
  const summary: SettleAwaitingSummary = { settled: 0, failed: 0, expired: 0, retry: 0 };
  const nowSeconds = BigInt(Math.floor(now.getTime() / 1000));
  for (const p of await listAwaitingSettlement(db)) {
    if (BigInt(p.valid_before) <= nowSeconds) {
      await markFailed(db, p.id, 'settle: authorization expired before settlement');
      summary.expired++;
      continue;
    }
    const result = await settler.settle(p.payment_payload, p.payment_requirements);
    if (result.success) {
      await markSettled(db, p.id, result.transaction);
      summary.settled++;
    } else if (isOurFault(result.errorReason)) {
      summary.retry++;
    } else {
      await markFailed(db, p.id, `settle: ${result.errorReason ?? 'failed'}`);
      summary.failed++;
    }
  }
  return summary;
}
