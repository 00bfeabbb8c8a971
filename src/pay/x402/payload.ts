import { z } from 'zod';
import { AppError } from '../../errors.js';
import { PaymentRequirementsV2Schema, X402_VERSION, X402_VERSION_2 } from './requirements.js';

/**
 * Why a payment was refused. Each is a distinct `reason` in the 402 so a client (or its developer)
 * can tell a wrong price from an expired or forged authorization.
 */
export const PAYMENT_INVALID_REASONS = [
  'malformed_payment',
  'unsupported_version',
  'invalid_scheme',
  'invalid_network',
  'invalid_payee',
  'invalid_asset',
  'invalid_amount',
  'payment_expired',
  'payment_not_yet_valid',
  'expires_before_collection',
  'invalid_signature',
  'payment_rejected',
  'insufficient_funds',
  'deferred_limit',
  'settlement_failed',
] as const;
export type PaymentInvalidReason = (typeof PAYMENT_INVALID_REASONS)[number];

export function paymentInvalid(reason: PaymentInvalidReason, message: string, extra: Record<string, unknown> = {}): AppError {
  return new AppError('payment_invalid', message, { reason, ...extra });
}

/** Far above a real payload (about 600 bytes once encoded), far below anything that costs us to parse. */
export const MAX_PAYMENT_HEADER_BYTES = 8 * 1024;

const UINT256_MAX = 2n ** 256n - 1n;
const uint256 = z
  .string()
  .regex(/^(0|[1-9]\d{0,77})$/, 'expected a decimal integer string without leading zeros')
  .refine((v) => BigInt(v) <= UINT256_MAX, 'does not fit in uint256');
const address = z.string().regex(/^0x[0-9a-fA-F]{40}$/, 'expected a 0x-prefixed 20-byte hex address');

export const ExactEvmAuthorizationSchema = z.object({
  from: address.describe('Payer: the address that signed and whose USDC moves'),
  to: address.describe("Recipient: must be this service's X402_PAY_TO"),
  value: uint256.describe('Amount in atomic units: must equal maxAmountRequired exactly'),
  validAfter: uint256.describe('Unix seconds after which the authorization may be used'),
  validBefore: uint256.describe('Unix seconds before which it must be used'),
  nonce: z
    .string()
    .regex(/^0x[0-9a-fA-F]{64}$/, 'expected 32 random bytes as 0x-prefixed hex')
    .describe('Unique per authorization; used once'),
});
export type ExactEvmAuthorization = z.infer<typeof ExactEvmAuthorizationSchema>;

export const PaymentPayloadSchema = z
  .object({
    x402Version: z.literal(X402_VERSION).describe('x402 protocol version'),
    scheme: z.literal('exact').describe('Payment scheme'),
    network: z.string().min(1).max(64).describe('x402 network name the payment is for'),
    payload: z.object({
      // 65-byte ECDSA signatures are 132 characters; the cap leaves room for EIP-2098 and wrapped forms.
      signature: z
        .string()
        .regex(/^0x([0-9a-fA-F]{2})+$/, 'expected 0x-prefixed hex')
        .max(4096)
        .describe('EIP-712 signature of TransferWithAuthorization'),
      authorization: ExactEvmAuthorizationSchema,
    }),
  })
  .describe('x402 v1 PaymentPayload for scheme exact on an EVM network, base64 JSON in the X-Payment header');
export type PaymentPayload = z.infer<typeof PaymentPayloadSchema>;

const ExactEvmPayloadSchema = PaymentPayloadSchema.shape.payload;

/** x402 v2 PaymentPayload (scheme exact, EVM): base64 JSON in the PAYMENT-SIGNATURE header. */
export const PaymentPayloadV2Schema = z
  .object({
    x402Version: z.literal(X402_VERSION_2),
    resource: z.object({ url: z.string().max(2048), description: z.string().max(4096).optional(), mimeType: z.string().max(256).optional() }).optional(),
    accepted: PaymentRequirementsV2Schema.describe('The requirements (from PAYMENT-REQUIRED) this payment answers'),
    payload: ExactEvmPayloadSchema,
    // Echoed extension declarations (payment-identifier...); bounded by the payment's size cap.
    extensions: z.record(z.unknown()).optional(),
  })
  .describe('x402 v2 PaymentPayload for scheme exact on an EVM network, base64 JSON in the PAYMENT-SIGNATURE header');
export type PaymentPayloadV2 = z.infer<typeof PaymentPayloadV2Schema>;

/**
 * A payment as received, in either protocol version. `payload` is its v1 form (what verification, the
 * payment record and v1 facilitators take; for v2 its network is the CAIP-2 id the client accepted);
 * `v2` keeps the v2 payload (known fields only) for v2 facilitators and the check of `accepted`.
 */
export interface DecodedPayment {
  version: 1 | 2;
  payload: PaymentPayload;
  v2?: PaymentPayloadV2;
}

/**
 * Where a request's payment travels: the `PAYMENT-SIGNATURE` (x402 v2) and `X-PAYMENT` (v1) headers
 * over HTTP, or MCP's `_meta["x402/payment"]` (the PaymentPayload as a JSON object, not base64).
 */
export interface PaymentHeaders {
  signature?: string | string[];
  xPayment?: string | string[];
  mcpMeta?: unknown;
}

/** The `_meta` key of a paid MCP tools/call (x402 specs/transports-v2/mcp.md). */
export const MCP_PAYMENT_META_KEY = 'x402/payment';

export function hasPayment(h: PaymentHeaders): boolean {
  return h.signature !== undefined || h.xPayment !== undefined || h.mcpMeta !== undefined;
}

/** The shape of a decoded X-Payment, for documentation (after the x402 v1 specification's example; the signature is illustrative). */
export const PAYMENT_PAYLOAD_EXAMPLES: PaymentPayload[] = [
  {
    x402Version: 1,
    scheme: 'exact',
    network: 'base-sepolia',
    payload: {
      signature: '0x2d6a7588d6acca505cbf0d9a4a227e0c52c6c34008c8e8986a1283259764173608a2ce6496642e377d6da8dbbf5836e9bd15092f9ecab05ded3d6293af148b571c',
      authorization: {
        from: '0x857b06519E91e3A54538791bDbb0E22373e36b66',
        to: '0x209693Bc6afc0C5328bA36FaF03C514EF312287C',
        value: '50000',
        validAfter: '1740672089',
        validBefore: '1740672154',
        nonce: '0xf3746613c2d920b5fdabc0856f2aeb2d4f88ee6037b8cc5d04a71a4462f13480',
      },
    },
  },
];

const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;

/**
 * X-Payment header -> PaymentPayload. Standard base64 with padding (what btoa, Python's b64encode and
 * Go's StdEncoding produce), UTF-8 JSON, then the schema. Unknown extra fields are dropped, not
 * refused, so a client that adds fields in a later minor release still works; only known fields
 * are ever used or forwarded.
 */
export function decodePaymentHeader(header: string | string[] | undefined, name = 'X-Payment'): PaymentPayload {
  const decoded = decodeOne(header, name);
  if (decoded.version !== 1) throw paymentInvalid('unsupported_version', `The ${name} header carries x402Version 2; send it in PAYMENT-SIGNATURE.`);
  return decoded.payload;
}

/**
 * The request's payment, from PAYMENT-SIGNATURE (v2) or X-PAYMENT (v1); both at once is refused (which
 * would we charge?). The version inside decides the shape, so a v1 client that happens to use the v2
 * header name still works; both go through the same strict decoding.
 */
export function decodePayment(headers: PaymentHeaders): DecodedPayment {
  if (headers.mcpMeta !== undefined) return decodeMcpMeta(headers.mcpMeta);
  if (headers.signature !== undefined && headers.xPayment !== undefined) {
    throw paymentInvalid('malformed_payment', 'Send one payment: PAYMENT-SIGNATURE (x402 v2) or X-Payment (v1), not both.');
  }
  return headers.signature !== undefined ? decodeOne(headers.signature, 'PAYMENT-SIGNATURE') : decodeOne(headers.xPayment, 'X-Payment');
}

/** MCP's `_meta["x402/payment"]`: already JSON, held to the same size cap and schema as a header. */
function decodeMcpMeta(value: unknown): DecodedPayment {
  const name = `_meta["${MCP_PAYMENT_META_KEY}"]`;
  if (JSON.stringify(value).length > MAX_PAYMENT_HEADER_BYTES) {
    throw paymentInvalid('malformed_payment', `${name} is larger than ${MAX_PAYMENT_HEADER_BYTES} bytes.`);
  }
  return decodeJson(value, name);
}

function decodeOne(header: string | string[] | undefined, name: string): DecodedPayment {
  if (Array.isArray(header)) throw paymentInvalid('malformed_payment', `Send exactly one ${name} header.`);
  const value = (header ?? '').trim();
  if (!value) throw paymentInvalid('malformed_payment', `The ${name} header is empty.`);
  if (value.length > MAX_PAYMENT_HEADER_BYTES) {
    throw paymentInvalid('malformed_payment', `The ${name} header is larger than ${MAX_PAYMENT_HEADER_BYTES} bytes.`);
  }
  const bytes = Buffer.from(value, 'base64');
  // Buffer.from ignores bad characters; re-encoding catches them and non-canonical padding.
  if (value.length % 4 !== 0 || !BASE64.test(value) || bytes.toString('base64') !== value) {
    throw paymentInvalid('malformed_payment', `The ${name} header is not valid base64 (standard alphabet, padded).`);
  }
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes));
  } catch {
    throw paymentInvalid('malformed_payment', `The ${name} header does not decode to JSON.`);
  }
  return decodeJson(json, `The ${name} header`);
}

/** A PaymentPayload as JSON, from either transport; `name` says where it came from in messages. */
function decodeJson(json: unknown, name: string): DecodedPayment {
  if (typeof json !== 'object' || json === null || Array.isArray(json)) {
    throw paymentInvalid('malformed_payment', `${name} must be a JSON object (an x402 PaymentPayload).`);
  }
  // Version and scheme first: a payload for another scheme has another shape, and "wrong scheme"
  // tells the client more than a list of missing fields would.
  const head = json as Record<string, unknown>;
  if (head.x402Version !== X402_VERSION && head.x402Version !== X402_VERSION_2) {
    throw paymentInvalid('unsupported_version', `x402Version ${JSON.stringify(head.x402Version ?? null)} is not supported; use 2 (or 1).`);
  }
  const scheme = head.x402Version === X402_VERSION ? head.scheme : (head.accepted as Record<string, unknown> | undefined)?.scheme;
  if (scheme !== 'exact') {
    throw paymentInvalid('invalid_scheme', `Payment scheme ${JSON.stringify(scheme ?? null)} is not accepted; use "exact".`);
  }
  const issuesOf = (error: z.ZodError) => {
    const issues = error.issues.map((i) => ({ path: i.path.join('.'), message: i.message }));
    const summary = issues.map((i) => `${i.path || '(payload)'}: ${i.message}`).join('; ');
    return paymentInvalid('malformed_payment', `${name} is not a valid x402 exact payment: ${summary}`, { issues });
  };
  if (head.x402Version === X402_VERSION) {
    const parsed = PaymentPayloadSchema.safeParse(json);
    if (!parsed.success) throw issuesOf(parsed.error);
    return { version: 1, payload: parsed.data };
  }
  const parsed = PaymentPayloadV2Schema.safeParse(json);
  if (!parsed.success) throw issuesOf(parsed.error);
  const v2 = parsed.data;
  return { version: 2, v2, payload: { x402Version: X402_VERSION, scheme: 'exact', network: v2.accepted.network, payload: v2.payload } };
}

/** Payload -> X-Payment header value (tests, and the operator export's round trip). */
export function encodePaymentHeader(payload: PaymentPayload): string {
  return Buffer.from(JSON.stringify(payload), 'utf8').toString('base64');
}
