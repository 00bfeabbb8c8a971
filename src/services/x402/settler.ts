import { z } from 'zod';
import type { Config } from '../../config.js';
import { X402_VERSION, type PaymentRequirements } from './requirements.js';
import type { PaymentPayload } from './payload.js';

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
 * Where a verified payment turns into money. `facilitator` settles on chain before the result is
 * returned; `local` only vouches for the signature, and the payment waits for an operator.
 */
export interface PaymentSettler {
  readonly mode: 'facilitator' | 'local';
  verify(payment: PaymentPayload, requirements: PaymentRequirements): Promise<VerifyResult>;
  settle(payment: PaymentPayload, requirements: PaymentRequirements): Promise<SettleResult>;
}

/** errorReason / invalidReason values of our own, for answers the facilitator never gave. */
export const FACILITATOR_UNREACHABLE = 'facilitator_unreachable';
export const FACILITATOR_BAD_RESPONSE = 'facilitator_bad_response';

const VerifyResponseSchema = z.object({
  isValid: z.boolean(),
  invalidReason: z.string().optional(),
  payer: z.string().optional(),
});
const SettleResponseSchema = z.object({
  success: z.boolean(),
  errorReason: z.string().optional(),
  payer: z.string().optional(),
  transaction: z.string().default(''),
  network: z.string(),
});

export interface FacilitatorOptions {
  /** Settling waits for the transaction to be mined; 30 s covers Base with room to spare. */
  timeoutMs?: number;
  /** Extra request headers, e.g. a hosted facilitator's API credentials. */
  headers?: Record<string, string>;
}

type Outcome = { kind: 'answer'; ok: boolean; body: unknown } | { kind: 'unreachable'; detail: string };

/**
 * Talks to an x402 facilitator: POST {url}/verify and {url}/settle with
 * {x402Version: 1, paymentPayload, paymentRequirements}, as the x402 reference client does.
 */
export class FacilitatorSettler implements PaymentSettler {
  readonly mode = 'facilitator' as const;
  private readonly base: string;
  private readonly timeoutMs: number;
  private readonly headers: Record<string, string>;

  constructor(url: string, opts: FacilitatorOptions = {}) {
    this.base = url.replace(/\/+$/, '');
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.headers = opts.headers ?? {};
  }

  private async post(path: '/verify' | '/settle', payment: PaymentPayload, requirements: PaymentRequirements): Promise<Outcome> {
    let res: Response;
    try {
      res = await fetch(`${this.base}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: 'application/json', ...this.headers },
        body: JSON.stringify({ x402Version: X402_VERSION, paymentPayload: payment, paymentRequirements: requirements }),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (e) {
      const name = (e as Error).name;
      return { kind: 'unreachable', detail: name === 'TimeoutError' ? `no answer within ${this.timeoutMs} ms` : 'connection failed' };
    }
    let body: unknown;
    try {
      body = await res.json();
    } catch {
      return { kind: 'answer', ok: false, body: undefined };
    }
    return { kind: 'answer', ok: res.ok, body };
  }

  async verify(payment: PaymentPayload, requirements: PaymentRequirements): Promise<VerifyResult> {
    const out = await this.post('/verify', payment, requirements);
    if (out.kind === 'unreachable') return { isValid: false, invalidReason: FACILITATOR_UNREACHABLE };
    const parsed = VerifyResponseSchema.safeParse(out.body);
    // A refusal may come with a 4xx status; an acceptance must come with a 2xx.
    if (!parsed.success || (parsed.data.isValid && !out.ok)) return { isValid: false, invalidReason: FACILITATOR_BAD_RESPONSE };
    return parsed.data;
  }

  async settle(payment: PaymentPayload, requirements: PaymentRequirements): Promise<SettleResult> {
    const out = await this.post('/settle', payment, requirements);
    const failed = (errorReason: string): SettleResult => ({
      success: false,
      transaction: '',
      network: payment.network,
      payer: payment.payload.authorization.from,
      errorReason,
    });
    // A timeout is ambiguous: the facilitator may still have submitted the transfer. The payment row
    // records the failure, and the nonce's on-chain state (authorizationState) settles the question.
    if (out.kind === 'unreachable') return failed(FACILITATOR_UNREACHABLE);
    const parsed = SettleResponseSchema.safeParse(out.body);
    if (!parsed.success) return failed(FACILITATOR_BAD_RESPONSE);
    if (parsed.data.success && (!out.ok || !parsed.data.transaction)) return failed(FACILITATOR_BAD_RESPONSE);
    if (!parsed.data.success) return failed(parsed.data.errorReason ?? 'settlement_failed');
    return { ...parsed.data, payer: parsed.data.payer ?? payment.payload.authorization.from };
  }
}

/**
 * No facilitator configured: verifyPayment has already checked the signature, payee, amount and
 * time window offline, and the nonce is reserved. Settling means recording the authorization as
 * awaiting settlement (the caller does that for `mode: 'local'`); there is no transaction yet.
 */
export class LocalSettler implements PaymentSettler {
  readonly mode = 'local' as const;

  async verify(payment: PaymentPayload): Promise<VerifyResult> {
    return { isValid: true, payer: payment.payload.authorization.from };
  }

  async settle(payment: PaymentPayload): Promise<SettleResult> {
    return { success: true, transaction: '', network: payment.network, payer: payment.payload.authorization.from };
  }
}

export function createSettler(config: Config, opts: FacilitatorOptions = {}): PaymentSettler {
  return config.X402_FACILITATOR_URL ? new FacilitatorSettler(config.X402_FACILITATOR_URL, opts) : new LocalSettler();
}

/** The X-Payment-Response header value: base64 JSON of the SettlementResponse. */
export function encodePaymentResponse(result: SettleResult): string {
  const body: SettleResult = {
    success: result.success,
    transaction: result.transaction,
    network: result.network,
    ...(result.payer ? { payer: result.payer } : {}),
    ...(result.errorReason ? { errorReason: result.errorReason } : {}),
  };
  return Buffer.from(JSON.stringify(body), 'utf8').toString('base64');
}

export function paymentResponseHeaders(result: SettleResult): Record<string, string> {
  return { 'X-Payment-Response': encodePaymentResponse(result), 'Access-Control-Expose-Headers': 'X-Payment-Response' };
}
