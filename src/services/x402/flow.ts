import type { CommonQueryMethods } from 'slonik';
import type { Config } from '../../config.js';
import { AppError } from '../../errors.js';
import { decodePaymentHeader, paymentInvalid, type PaymentPayload } from './payload.js';
import { paymentError, paymentRequirements, withRequirements, type PaymentRequirements, type PriceSpec } from './requirements.js';
import {
  FACILITATOR_BAD_RESPONSE,
  FACILITATOR_UNREACHABLE,
  encodePaymentResponse,
  paymentResponseHeaders,
  type PaymentSettler,
  type SettleResult,
} from './settler.js';
import { listAwaitingSettlement, markAwaitingSettlement, markFailed, markSettled, reserveNonce } from './store.js';
import { verifyPayment } from './verify.js';

/**
 * A paid call's payment, in three steps the route takes around running the tool:
 *   admitPayment    decode, verify offline, reserve the nonce, ask the facilitator (if any)
 *   completePayment after the tool succeeded: settle, then return the X-Payment-Response header
 *   abandonPayment  after the tool failed: record it, charge nothing
 * Every refusal is an AppError; payment refusals carry fresh requirements and the X-Payment-* headers.
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
  payment: PaymentPayload;
  requirements: PaymentRequirements;
}

function isOurFault(reason: string | undefined): boolean {
  return reason === FACILITATOR_UNREACHABLE || reason === FACILITATOR_BAD_RESPONSE;
}

export async function admitPayment(
  deps: X402Deps,
  header: string | string[] | undefined,
  call: PaidCall,
  now: Date = new Date(),
): Promise<AdmittedPayment> {
  const requirements = paymentRequirements(deps.config, call);
  try {
    const payment = decodePaymentHeader(header);
    const verified = await verifyPayment(deps.config, payment, requirements, now);
    // Reserve before asking the facilitator: a replayed token is then always "already used", and two
    // concurrent copies never both reach the facilitator.
    const id = await reserveNonce(deps.db, { payment, requirements, verified, tool: call.tool });
    const check = await deps.settler.verify(payment, requirements);
    if (!check.isValid) {
      await markFailed(deps.db, id, `verify: ${check.invalidReason ?? 'refused'}`);
      if (isOurFault(check.invalidReason)) {
        throw new AppError(
          'upstream_error',
          'The payment facilitator could not be reached to verify this payment. Nothing was charged; sign a new payment and retry.',
          { reason: check.invalidReason },
          { retryable: false },
        );
      }
      // e.g. insufficient_funds: the signature is fine but the transfer would fail on chain.
      throw paymentInvalid('payment_rejected', `The payment facilitator refused this payment (${check.invalidReason ?? 'no reason given'}).`, {
        facilitator_reason: check.invalidReason ?? null,
      });
    }
    return { id, payer: verified.payer, call, payment, requirements };
  } catch (e) {
    if (e instanceof AppError) throw withRequirements(deps.config, call, e);
    throw e;
  }
}

/**
 * Settles an admitted payment once the tool has produced its result. On failure the result must not
 * be returned: the error says so and nothing is charged.
 */
export async function completePayment(
  deps: X402Deps,
  admitted: AdmittedPayment,
): Promise<{ settlement: SettleResult; headers: Record<string, string> }> {
  const result = await deps.settler.settle(admitted.payment, admitted.requirements);
  if (!result.success) {
    await markFailed(deps.db, admitted.id, `settle: ${result.errorReason ?? 'failed'}`);
    // x402 puts the failed SettlementResponse in X-Payment-Response as well.
    const responseHeader = { 'X-Payment-Response': encodePaymentResponse(result) };
    if (isOurFault(result.errorReason)) {
      throw new AppError(
        'upstream_error',
        'The payment facilitator could not be reached to settle this payment, so the result is withheld and nothing was charged. Sign a new payment and retry.',
        { reason: result.errorReason },
        { retryable: false, headers: { ...responseHeader, 'Access-Control-Expose-Headers': 'X-Payment-Response' } },
      );
    }
    throw paymentError(
      deps.config,
      admitted.call,
      'payment_invalid',
      `Settling the payment failed (${result.errorReason ?? 'no reason given'}), so the result is withheld and nothing was charged.`,
      { reason: 'settlement_failed', settlement_error: result.errorReason ?? null },
      responseHeader,
    );
  }
  try {
    if (deps.settler.mode === 'local') await markAwaitingSettlement(deps.db, admitted.id);
    else await markSettled(deps.db, admitted.id, result.transaction);
  } catch (e) {
    // The money has moved (or is promised): the caller gets the result even if recording it failed.
    // The row stays 'reserved', which an operator can reconcile.
    deps.log?.error({ err: e, paymentId: admitted.id }, 'x402: recording a settled payment failed');
  }
  return { settlement: result, headers: paymentResponseHeaders(result) };
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
export async function settleAwaitingPayments(
  db: CommonQueryMethods,
  settler: PaymentSettler,
  now: Date = new Date(),
): Promise<SettleAwaitingSummary> {
  if (settler.mode !== 'facilitator') throw new Error('settling awaiting payments needs a facilitator (X402_FACILITATOR_URL)');
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
