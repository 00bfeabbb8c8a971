import { createHash } from 'node:crypto';
import { AppError } from '../../errors.js';
import type { PaymentPayloadV2 } from './payload.js';

/**
 * x402's `payment-identifier` extension (specs/extensions/payment_identifier.md): the server declares
 * it in PaymentRequired.extensions, the client echoes the declaration in its PaymentPayload's
 * `extensions` with `info.id` added, and the server uses that id as an idempotency key. Same id and
 * same payment for the same request: the first answer again, nothing settled twice; same id with
 * another payment or request: 409. Version 2 only (version 1 payloads have no extensions).
 */
export const PAYMENT_IDENTIFIER = 'payment-identifier';

/** The id's format, as the specification and the reference implementation define it. */
export const PAYMENT_ID_MIN_LENGTH = 16;
export const PAYMENT_ID_MAX_LENGTH = 128;
const PAYMENT_ID_PATTERN = /^[a-zA-Z0-9_-]+$/;

const PAYMENT_IDENTIFIER_SCHEMA = {
  $schema: 'https://json-schema.org/draft/2020-12/schema',
  type: 'object',
  properties: {
    required: { type: 'boolean' },
    id: { type: 'string', minLength: PAYMENT_ID_MIN_LENGTH, maxLength: PAYMENT_ID_MAX_LENGTH, pattern: '^[a-zA-Z0-9_-]+$' },
  },
  required: ['required'],
} as const;

/** What PaymentRequired.extensions carries: support declared, an id optional. */
export function paymentIdentifierDeclaration(): Record<string, unknown> {
  return { [PAYMENT_IDENTIFIER]: { info: { required: false }, schema: PAYMENT_IDENTIFIER_SCHEMA } };
}

/** A payment's identifier and what a retry must repeat exactly to be answered from the first. */
export interface PaymentIdentifier {
  id: string;
  /** The claimed payer (authorization.from, lower case): ids are scoped to it. */
  payer: string;
  /** SHA-256 of the payment as decoded (known fields only): the same payment, whatever its encoding. */
  paymentDigest: string;
}

/**
 * The payment's identifier, or undefined when it carries none. An id that breaks the format is a 400:
 * the client asked for idempotency and would silently lose it if the id were ignored.
 */
export function paymentIdentifierOf(v2: PaymentPayloadV2 | undefined): PaymentIdentifier | undefined {
  const ext = v2?.extensions?.[PAYMENT_IDENTIFIER];
  if (ext === undefined) return undefined;
  const info = (ext as { info?: unknown } | null)?.info as { id?: unknown } | undefined;
  if (typeof info !== 'object' || info === null) throw malformed('has no `info` object');
  if (info.id === undefined) return undefined;
  const id = info.id;
  if (typeof id !== 'string' || id.length < PAYMENT_ID_MIN_LENGTH || id.length > PAYMENT_ID_MAX_LENGTH || !PAYMENT_ID_PATTERN.test(id)) {
    throw malformed(
      `id must be ${PAYMENT_ID_MIN_LENGTH} to ${PAYMENT_ID_MAX_LENGTH} characters of letters, digits, hyphens and underscores ` +
        '(e.g. pay_ followed by a UUID without hyphens)',
    );
  }
  return {
    id,
    payer: v2!.payload.authorization.from.toLowerCase(),
    paymentDigest: createHash('sha256').update(JSON.stringify(v2)).digest('hex'),
  };
}

function malformed(what: string): AppError {
  return new AppError('invalid_input', `The payment's ${PAYMENT_IDENTIFIER} extension ${what}.`, { extension: PAYMENT_IDENTIFIER });
}
