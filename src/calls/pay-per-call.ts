import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import type { DatabasePool } from '../db/pool.js';
import { AppError, isAppError } from '../errors.js';
import type { PayerCaller } from '../access/auth.js';
import type { Idempotency, StoredResponse } from './idempotency.js';
import type { RateLimiter } from '../access/rate-limit.js';
import {
  abandonPayment,
  admitOrReplay,
  completePayment,
  decodePayment,
  hasPayment,
  paymentIdentifierDeclaration,
  paymentIdentifierOf,
  paymentRequiredError,
  recordPaidCall,
  withRequirements,
  type AdmittedPayment,
  type PaidCall,
  type PaymentHeaders,
  type PaymentIdentifier,
  type X402Deps,
} from '../pay/x402/index.js';

/**
 * Runs the call(s) a pay-per-call request pays for. `track` receives every job id (pass it as
 * CallOptions.onJobId); the payment's ledger entry names the first. Answer with the result (status 200), or throw the call's error. A chain or parallel call that
 * stops part-way must throw: an x402 `exact` payment is settled whole or not at all, so partial
 * results would be either overcharged or free. A 202 means the result did not arrive in time.
 */
export type PaidExec = (caller: PayerCaller, track: (jobId: string) => void) => Promise<StoredResponse>;

export interface PaidRun {
  /** PAYMENT-SIGNATURE (v2) / X-Payment (v1); neither answers the 402 that asks for one. */
  payment: PaymentHeaders;
  call: PaidCall;
  /**
   * What the request asks for (its Idempotency.fingerprint) and its Idempotency-Key when it has one.
   * A payment carrying an x402 payment identifier is bound to this fingerprint.
   */
  idempotency?: { key?: string; fingerprint: string };
  /**
   * Tool calls the request makes (a chain or parallel request makes one per step): each counts
   * against the payer's X402_RPM as the same call made alone would. Default 1.
   */
  calls?: number;
}

export interface PayPerCallDeps {
  x402: X402Deps;
  pool: DatabasePool;
  idempotency: Idempotency;
  log: Logger;
}

/**
 * x402 around a call made without a key: admit the payment (verify, reserve its nonce) before any
 * tool runs, run the call as the payer, settle before the result is returned. A call that fails,
 * times out or cannot be settled charges nothing.
 *
 * The ledger entry (kind 'payment', under the payer's address) is written only once the payment is
 * settled (or recorded for the operator to settle), so a call that fails, times out or is not paid
 * leaves no entry at all.
 */
export class PayPerCall {
  private payerLimit: { limiter: RateLimiter; rpm: number } | undefined;

  constructor(readonly deps: PayPerCallDeps) {}

  /** Requests per minute per payer address (X402_RPM), on the same sliding window as keys. */
  limitPayers(limiter: RateLimiter, rpm: number): void {
    this.payerLimit = { limiter, rpm };
  }

  async run(input: PaidRun, exec: PaidExec): Promise<StoredResponse & { replayed: boolean }> {
    const { x402 } = this.deps;
    // Every offer declares the payment-identifier extension: this service honours it on every transport.
    const call: PaidCall = { ...input.call, extensions: { ...input.call.extensions, ...paymentIdentifierDeclaration() } };
    if (!hasPayment(input.payment)) throw paymentRequiredError(x402.config, call);
    const identifier = this.identifierOf(input.payment, call);
    if (identifier) return this.runIdentified(input, call, identifier, exec);
    const admission = await this.admit(input, call);
    // This payment already paid for this request, and settled: its answer again (a retry after a crash).
    if ('replay' in admission) return { ...admission.replay, replayed: true };
    const admitted = admission;
    let settled = false;
    const paid = () =>
      this.runPaid(admitted, input, exec, () => {
        settled = true;
      });

    const key = input.idempotency?.key;
    if (key === undefined) return { ...(await paid()), replayed: false };
    // Scoped to the payer: only whoever can sign for that address can replay its responses, and a
    // replay costs them nothing (the new payment is released below, unsettled).
    try {
      const out = await this.deps.idempotency.run(`x402:${admitted.payer}`, key, input.idempotency!.fingerprint, paid);
      if (out.replayed) await abandonPayment(x402, admitted, 'idempotent_replay');
      return out;
    } catch (e) {
      // 409/422 from the idempotency check: nothing ran. (After a failed run this is a no-op.)
      if (!settled) await abandonPayment(x402, admitted, isAppError(e) ? e.code : 'internal_error');
      throw e;
    }
  }

  /** The payment's payment-identifier, if it carries one; a payment that does not decode is refused with the offer. */
  private identifierOf(payment: PaymentHeaders, call: PaidCall): PaymentIdentifier | undefined {
    try {
      return paymentIdentifierOf(decodePayment(payment).v2);
    } catch (e) {
      if (e instanceof AppError) throw withRequirements(this.deps.x402.config, call, e);
      throw e;
    }
  }

  /**
   * A payment with an x402 payment identifier: the id is the idempotency key, scoped to the payer the
   * payment names, and bound to the payment (as decoded) and the request. A retry with the same
   * payment for the same request gets the first answer and is neither admitted nor settled again; the
   * same id with another payment or request is 409 payment_identifier_reused; while the first runs,
   * 409 idempotency_in_progress. A payment refused before anything ran frees the id (nothing was
   * charged, and a forged payment naming someone else's address cannot hold their id); an answer
   * after the call ran is kept (Idempotency's retention), whatever it was.
   */
  private async runIdentified(input: PaidRun, call: PaidCall, identifier: PaymentIdentifier, exec: PaidExec): Promise<StoredResponse & { replayed: boolean }> {
    const fingerprint = createHash('sha256')
      .update(`${identifier.paymentDigest}\n${input.idempotency?.fingerprint ?? ''}`)
      .digest('hex');
    let ran = false;
    let replayed = false;
    try {
      const out = await this.deps.idempotency.run(
        `x402-pid:${identifier.payer}`,
        identifier.id,
        fingerprint,
        async () => {
          const admission = await this.admit(input, call);
          // The first request's owner died after settling (its claim was taken over): the payment's stored answer.
          if ('replay' in admission) {
            replayed = true;
            return admission.replay;
          }
          ran = true;
          return this.runPaid(admission, input, exec);
        },
        undefined,
        () => !ran,
      );
      return replayed ? { ...out, replayed } : out;
    } catch (e) {
      if (isAppError(e) && e.code === 'idempotency_key_reused') {
        throw new AppError(
          'payment_identifier_reused',
          `Payment identifier ${identifier.id} was already used with another payment or another request. Nothing ran and nothing ` +
            'was charged; a retry must resend the same payment for the same request, and a new payment needs a new id.',
          { payment_identifier: identifier.id },
        );
      }
      if (isAppError(e) && e.code === 'idempotency_in_progress') {
        throw new AppError(
          'idempotency_in_progress',
          `The call paid with payment identifier ${identifier.id} is still running; retry shortly for its answer.`,
          { ...e.details, payment_identifier: identifier.id },
          { headers: e.headers },
        );
      }
      throw e;
    }
  }

  /**
   * Verifies and reserves the payment (nothing runs before), then counts the payer against X402_RPM.
   * A payer is known only once its payment is verified; past its limit nothing runs and the
   * payment is released unsettled, so a refused call costs the payer nothing. A payment that already
   * paid for this same request and settled comes back as its stored answer (`replay`).
   */
  private async admit(input: PaidRun, call: PaidCall): Promise<AdmittedPayment | { replay: StoredResponse }> {
    const { x402 } = this.deps;
    const admitted = await admitOrReplay(x402, input.payment, call, input.idempotency?.fingerprint ?? '');
    if ('replay' in admitted) return admitted;
    if (this.payerLimit) {
      try {
        await this.payerLimit.limiter.hit(`payer:${admitted.payer.toLowerCase()}`, this.payerLimit.rpm, input.calls ?? 1);
      } catch (e) {
        await abandonPayment(x402, admitted, isAppError(e) ? e.code : 'internal_error');
        throw e;
      }
    }
    return admitted;
  }

  /**
   * Runs the call as the payer and settles before the result is returned; a failure settles nothing.
   * The answer is kept with the payment before settling, so a crash during settlement loses neither.
   */
  private async runPaid(admitted: AdmittedPayment, input: PaidRun, exec: PaidExec, onSettled: () => void = () => {}): Promise<StoredResponse> {
    const { x402 } = this.deps;
    const jobIds: string[] = [];
    let res: StoredResponse;
    try {
      res = await exec({ kind: 'payer', payer: admitted.payer }, (id) => jobIds.push(id));
      if (res.status === 202) {
        throw new AppError(
          'timeout',
          `The call did not finish within ${Math.round(x402.config.SYNC_TIMEOUT_MS / 1000)} s, so its result cannot be delivered ` +
            'for this payment. The payment was not settled and nothing was charged; retry with a new payment.',
          res.headers['x-job-id'] ? { job_id: res.headers['x-job-id'] } : {},
        );
      }
    } catch (e) {
      await this.unpaid(admitted, jobIds, isAppError(e) ? e.code : 'internal_error');
      throw e;
    }
    // On failure completePayment has marked the payment failed and throws; nothing reaches the ledger.
    const { headers } = await completePayment(x402, admitted, {
      answer: { status: res.status, headers: res.headers, body: res.body },
      fingerprint: input.idempotency?.fingerprint ?? '',
      jobId: jobIds[0],
    });
    onSettled();
    await this.record(admitted, jobIds);
    return { ...res, headers: { ...res.headers, ...headers } };
  }

  private async unpaid(admitted: AdmittedPayment, _jobIds: string[], reason: string): Promise<void> {
    await abandonPayment(this.deps.x402, admitted, reason);
  }

  /** The paid call in the ledger under the payer's address; keyed by payment, so it is written once (the reconciler uses the same key). */
  private async record(admitted: AdmittedPayment, jobIds: string[]): Promise<void> {
    await recordPaidCall(this.deps.pool, {
      paymentId: admitted.id,
      jobId: jobIds[0],
      tool: admitted.call.tool,
      priceCents: admitted.call.priceCents,
      payer: admitted.payer,
    });
  }
}
