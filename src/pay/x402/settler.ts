import { z } from 'zod';
import { x402Settlement, type Config } from '../../config.js';
import {
  X402_VERSION,
  X402_VERSION_2,
  base64Json,
  networkProfile,
  resourceInfo,
  toV2Requirements,
  type NetworkProfile,
  type PaymentRequirements,
} from './requirements.js';
import type { PaymentPayload, PaymentPayloadV2 } from './payload.js';
import {
  SettlerStartupError,
  FACILITATOR_UNREACHABLE,
  FACILITATOR_BAD_RESPONSE,
  type PaymentSettler,
  type SettleResult,
  type VerifyResult,
} from './settle-types.js';

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
  /** Our network and token: needed to speak v2 to the facilitator (CAIP-2 network, `amount`). */
  profile?: NetworkProfile;
}

type Outcome = { kind: 'answer'; ok: boolean; body: unknown } | { kind: 'unreachable'; detail: string };

const SupportedResponseSchema = z.object({
  kinds: z.array(z.object({ x402Version: z.number(), scheme: z.string(), network: z.string() }).passthrough()),
});

/**
 * Talks to an x402 facilitator: POST {url}/verify and {url}/settle with {x402Version,
 * paymentPayload, paymentRequirements}. Which version it speaks to the facilitator is chosen once,
 * at start-up, from GET {url}/supported (v2 when it lists `exact` on our CAIP-2 network, else v1 on
 * our network name), whatever version the client paid with: the signed authorization is the same.
 */
export class FacilitatorSettler implements PaymentSettler {
  readonly mode = 'facilitator' as const;
  private readonly base: string;
  private readonly timeoutMs: number;
  private readonly headers: Record<string, string>;
  private readonly profile: NetworkProfile | undefined;
  /** The version spoken to the facilitator (1 until start() finds v2 support). */
  wireVersion: 1 | 2 = X402_VERSION;

  constructor(url: string, opts: FacilitatorOptions = {}) {
    this.base = url.replace(/\/+$/, '');
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.headers = opts.headers ?? {};
    this.profile = opts.profile;
  }

  async start(): Promise<void> {
    const where = `the x402 facilitator at ${this.base}`;
    let body: unknown;
    try {
      const res = await fetch(`${this.base}/supported`, {
        headers: { accept: 'application/json', ...this.headers },
        signal: AbortSignal.timeout(Math.min(this.timeoutMs, 10_000)),
      });
      if (!res.ok) throw new SettlerStartupError(`${where} answered GET /supported with HTTP ${res.status}`);
      body = await res.json().catch(() => undefined);
    } catch (e) {
      if (e instanceof SettlerStartupError) throw e;
      throw new SettlerStartupError(`cannot reach ${where} (GET /supported: ${(e as Error).name === 'TimeoutError' ? 'no answer' : 'connection failed'})`);
    }
    const parsed = SupportedResponseSchema.safeParse(body);
    if (!parsed.success) throw new SettlerStartupError(`${where} answered GET /supported with something that is not an x402 SupportedResponse`);
    const kinds = parsed.data.kinds;
    const p = this.profile;
    if (p && kinds.some((k) => k.x402Version === X402_VERSION_2 && k.scheme === 'exact' && k.network === p.caip2)) {
      this.wireVersion = X402_VERSION_2;
    } else if (p && kinds.some((k) => k.x402Version === X402_VERSION && k.scheme === 'exact' && k.network === p.network)) {
      this.wireVersion = X402_VERSION;
    } else {
      const listed = kinds.map((k) => `v${k.x402Version} ${k.scheme} on ${k.network}`).join(', ') || 'nothing';
      throw new SettlerStartupError(
        `${where} does not support scheme exact on ${p ? `${p.caip2} (${p.network})` : 'our network'}; it lists ${listed}. Use a facilitator for that network or change X402_NETWORK`,
      );
    }
  }

  /** The request body for the version spoken to the facilitator. */
  private body(payment: PaymentPayload, requirements: PaymentRequirements, v2?: PaymentPayloadV2): unknown {
    if (this.wireVersion === X402_VERSION || !this.profile) {
      return { x402Version: X402_VERSION, paymentPayload: payment, paymentRequirements: requirements };
    }
    const accepted = toV2Requirements(requirements, this.profile);
    const paymentPayload: PaymentPayloadV2 = v2 ?? { x402Version: X402_VERSION_2, resource: resourceInfo(requirements), accepted, payload: payment.payload };
    return { x402Version: X402_VERSION_2, paymentPayload, paymentRequirements: accepted };
  }

  private async post(path: '/verify' | '/settle', payment: PaymentPayload, requirements: PaymentRequirements, v2?: PaymentPayloadV2): Promise<Outcome> {
    let res: Response;
    try {
      res = await fetch(`${this.base}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: 'application/json', ...this.headers },
        body: JSON.stringify(this.body(payment, requirements, v2)),
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

  async verify(payment: PaymentPayload, requirements: PaymentRequirements, v2?: PaymentPayloadV2): Promise<VerifyResult> {
    const out = await this.post('/verify', payment, requirements, v2);
    if (out.kind === 'unreachable') return { isValid: false, invalidReason: FACILITATOR_UNREACHABLE };
    const parsed = VerifyResponseSchema.safeParse(out.body);
    // A refusal may come with a 4xx status; an acceptance must come with a 2xx.
    if (!parsed.success || (parsed.data.isValid && !out.ok)) return { isValid: false, invalidReason: FACILITATOR_BAD_RESPONSE };
    return parsed.data;
  }

  async settle(payment: PaymentPayload, requirements: PaymentRequirements, v2?: PaymentPayloadV2): Promise<SettleResult> {
    const out = await this.post('/settle', payment, requirements, v2);
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
    // A v2 facilitator names the network by CAIP-2 id; our records and X-Payment-Response use the name.
    return { ...parsed.data, network: payment.network, payer: parsed.data.payer ?? payment.payload.authorization.from };
  }
}

/**
 * `X402_SETTLEMENT=deferred`: verifyPayment has already checked the signature, payee, amount and
 * time window offline, and the nonce is reserved; nothing checks that the payer holds the money.
 * Settling means recording the authorization as awaiting settlement (the caller does that for this
 * mode); there is no transaction yet. Chosen only by name, capped per payer (X402_DEFERRED_MAX_CENTS).
 */
export class DeferredSettler implements PaymentSettler {
  readonly mode = 'deferred' as const;

  async start(): Promise<void> {}

  async verify(payment: PaymentPayload): Promise<VerifyResult> {
    return { isValid: true, payer: payment.payload.authorization.from };
  }

  async settle(payment: PaymentPayload): Promise<SettleResult> {
    return { success: true, transaction: '', network: payment.network, payer: payment.payload.authorization.from };
  }
}

/** Said at start-up and on /health while deferred settlement is on. */
export const DEFERRED_WARNING =
  'x402 settlement is deferred (X402_SETTLEMENT=deferred): payments are checked offline only, nothing verifies that payers hold ' +
  'the money, and they must be collected with `npm run admin -- payments settle` before they expire; capped at X402_DEFERRED_MAX_CENTS per payer';

/** The settler of the configured mode (self-settlement is loaded only when configured: it brings viem's clients). */
export async function createSettler(config: Config, opts: FacilitatorOptions = {}): Promise<PaymentSettler> {
  const mode = x402Settlement(config);
  if (mode === 'facilitator') return new FacilitatorSettler(config.X402_FACILITATOR_URL!, { profile: networkProfile(config), ...opts });
  if (mode === 'self') {
    const { ChainSettler } = await import('./chain-settler.js');
    return new ChainSettler(config);
  }
  return new DeferredSettler();
}

/** The SettlementResponse object, as both response headers carry it (base64 JSON). */
function settlementBody(result: SettleResult, network: string): SettleResult {
  return {
    success: result.success,
    transaction: result.transaction,
    network,
    ...(result.payer ? { payer: result.payer } : {}),
    ...(result.errorReason ? { errorReason: result.errorReason } : {}),
  };
}

/** The X-Payment-Response header value (v1: the network by name). */
export function encodePaymentResponse(result: SettleResult): string {
  return base64Json(settlementBody(result, result.network));
}

/**
 * Both answer headers: PAYMENT-RESPONSE for v2 clients (CAIP-2 network) and X-PAYMENT-RESPONSE for v1
 * (network name). `result.network` is the network name; `caip2` its v2 id.
 */
export function paymentResponseHeaders(result: SettleResult, caip2?: string): Record<string, string> {
  return {
    'PAYMENT-RESPONSE': base64Json(settlementBody(result, caip2 ?? result.network)),
    'X-Payment-Response': encodePaymentResponse(result),
    'Access-Control-Expose-Headers': 'PAYMENT-RESPONSE, X-Payment-Response',
  };
}
