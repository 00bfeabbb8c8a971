/**
 * One error model. Services throw AppError with a code from this closed set; the single Fastify
 * error handler (src/faces/http/plugins/errors.ts) turns it into the envelope
 * {"error": {"code", "message", "request_id", ...details}}.
 */
import type { ZodError, ZodTypeAny, z } from 'zod';

export const ERROR_STATUS = {
  invalid_input: 400,
  unauthorized: 401,
  invalid_api_key: 401,
  key_not_found: 401,
  payment_required: 402,
  insufficient_credits: 402,
  monthly_limit_exceeded: 402,
  payment_invalid: 402,
  payment_already_used: 402,
  plan_required: 403,
  tool_not_allowed: 403,
  forbidden: 403,
  edge_token_rejected: 403,
  /** A rotated key in its grace period calls tools and reads its own jobs, nothing else: the account's current key manages keys. */
  key_in_grace: 403,
  tool_not_found: 404,
  not_found: 404,
  /** A grabr_* tool's target disallows the path in robots.txt for GRABR_USER_AGENT: nothing was fetched there. */
  robots_disallowed: 403,
  /** grabr_transcript / grabr_video_intel: the video has no caption track in the languages asked for. */
  no_captions: 404,
  method_not_allowed: 405,
  idempotency_in_progress: 409,
  /** An x402 payment-identifier already used with another payment or another request: nothing ran, nothing was charged. */
  payment_identifier_reused: 409,
  /** The job was cancelled (DELETE /jobs/{id}) before it finished: not charged. GET /jobs/{id} and a waiting caller get this. */
  cancelled: 409,
  /** DELETE /jobs/{id} of a job that already finished (completed or failed): nothing was cancelled. */
  job_finished: 409,
  /** cvi_loop: another round of the same loop kept running past the wait; this round did not run and was not charged (retry it). */
  loop_busy: 409,
  /**
   * The job was accepted (its id was given out) but the queue lost it before it ran (Redis lost its
   * data): not charged, and it will never run. The caller sends the request again (with the same
   * Idempotency-Key if it had one). GET /jobs/{id} and a waiting caller get this, never a 404.
   */
  job_lost: 410,
  payload_too_large: 413,
  unsupported_media_type: 415,
  idempotency_key_reused: 422,
  tool_failed: 422,
  /** A call passed its tool's time, memory or size limit (`limit`, `limit_value`): not charged, not retried. */
  limit_exceeded: 422,
  rate_limited: 429,
  /** The account already has its plan's number of jobs in flight. */
  concurrency_limited: 429,
  internal_error: 500,
  upstream_error: 502,
  /** A web tool could not read its target (refused, reset, TLS error, timeout, malformed answer): not charged. */
  fetch_failed: 502,
  tool_unavailable: 503,
  service_unavailable: 503,
  timeout: 504,
  /** The key was revoked, has expired, or was already rotated (POST /keys/{key_id}/rotate). */
  key_not_active: 409,
  /** POST /toolsets with a name the account already uses for a tool set. */
  tool_set_exists: 409,
  /** DELETE /toolsets/{name} of a set that live keys name as their default (`key_ids`). */
  tool_set_in_use: 409,
  /** POST /credits/topup while x402 (with a settlement that moves money now) is not configured. */
  topup_unavailable: 503,
  /** A card route (checkout, plans, portal, the Stripe webhook) while STRIPE_SECRET_KEY is not set. */
  payments_unavailable: 503,
  /** POST /billing/subscribe while the account already has a live subscription: change it in the portal. */
  subscription_exists: 409,
} as const;

export type ErrorCode = keyof typeof ERROR_STATUS;

/** What each code means, one line each: docs/reference/error-table.md is generated from this (`npm run docs`). */
export const ERROR_MEANINGS: Record<ErrorCode, string> = {
  invalid_input: 'The body, a parameter or a header failed validation, or the JSON is malformed; `issues` names each failing field.',
  unauthorized: 'No credentials where they are needed: no API key (and the call cannot be paid per call), or no METRICS_TOKEN or ADMIN_TOKEN.',
  invalid_api_key: 'The Authorization header is not `Bearer <key>`, or the key is malformed (unknown prefix, short secret).',
  key_not_found: 'A well-formed key that does not exist, was revoked, or was rotated and its grace period is over.',
  payment_required: 'A paid call without a key, with x402 on: the body and PAYMENT-REQUIRED header say what to pay.',
  insufficient_credits: 'The balance is below the price of the call: top up to continue.',
  monthly_limit_exceeded: 'The call would take a sub-key past its monthly limit.',
  payment_invalid: 'The x402 payment is malformed, does not match what was asked, or was refused or failed to settle (`reason`): not charged.',
  payment_already_used: 'The x402 payment authorization (its nonce) was already used: sign a new payment.',
  plan_required: "The account's plan is below what the tool or feature needs (`required_plan`).",
  tool_not_allowed: "The sub-key may not call this tool (`allowed_tools`), or the key's default tool set does not include it (`tool_set`).",
  forbidden: 'This caller may not do this: a non-production key managing keys or topping up, a key revoking itself, an /mcp origin not allowed.',
  edge_token_rejected: 'Cloudflare rejected the edge token, or it lacks the permission the call needs; not retried.',
  key_in_grace: 'A rotated key in its grace period may only call tools and read its own jobs: use its replacement.',
  tool_not_found: 'No tool (or chat model) by that name; `did_you_mean` suggests near names.',
  not_found: 'No such route, job, key, sub-key or account, or the job is no longer stored.',
  robots_disallowed: "The target's robots.txt disallows the path for GRABR_USER_AGENT: nothing was fetched there.",
  no_captions: 'The video has no caption track in the languages asked for (`available_languages`).',
  method_not_allowed: 'The endpoint does not take this method: /mcp takes only POST.',
  idempotency_in_progress: 'The first request with this Idempotency-Key is still running: retry shortly (`Retry-After`).',
  payment_identifier_reused: 'This x402 payment identifier was used with another payment or request: use a new id for a new payment.',
  cancelled: 'The job was cancelled (DELETE /jobs/{id}) before it finished: not charged.',
  job_finished: 'DELETE /jobs/{id} of a job that already completed or failed: nothing was cancelled.',
  loop_busy:
    'cvi_loop: another round of the same loop ran past the wait (`loop_id`): this round did not run and was not charged; send it again (`Retry-After`).',
  job_lost:
    'The job was accepted but the queue lost it before it ran (`job_id`, `status: lost`): not charged; send the request again, with the same Idempotency-Key if it had one.',
  payload_too_large: 'The request body is over BODY_LIMIT.',
  unsupported_media_type: 'The body is not application/json.',
  idempotency_key_reused: 'This Idempotency-Key was used with a different request body: use a new key for a new request.',
  tool_failed: 'The tool ran but its target failed (page unreachable, no such domain or zone, Cloudflare refused the change).',
  limit_exceeded: 'The call passed a time, memory or size limit (`limit`, `limit_value`), or a passport cap: not charged.',
  rate_limited: "Too many requests (the key's or payer's rate, the edge network's, per-address caps) or webhooks pending (`Retry-After`).",
  concurrency_limited: 'The account already has its cap of jobs in flight (`max_in_flight`, `Retry-After`).',
  internal_error: 'Something unexpected failed; the message carries no internals.',
  upstream_error: 'An upstream (Cloudflare, the x402 facilitator or chain) failed or could not be reached: not charged.',
  fetch_failed: 'A web or media tool could not read its target (refused, reset, TLS error, timeout, malformed answer): not charged.',
  tool_unavailable: "The tool cannot run here: its upstream (model, search, archive, video site, DNS) is unset or down, or a model's reply stayed invalid.",
  service_unavailable: 'The service cannot take the call now (Redis or Postgres unreachable, shutting down): not charged; retry.',
  timeout: 'The call was stopped before it or its upstream finished, or a paid-per-call call did not finish within SYNC_TIMEOUT_MS.',
  key_not_active: 'The key cannot be rotated (or given a tool set): it was revoked, has expired, or was already rotated (`state`).',
  tool_set_exists: 'The account already has a tool set of that name: pick another, or replace it with PUT /toolsets/{name}.',
  tool_set_in_use: 'Live keys name this tool set as their default (`key_ids`): give them another set or none first.',
  topup_unavailable: 'POST /credits/topup while x402 with a settlement that moves money at once is not configured.',
  payments_unavailable: 'A card payment route (/credits/checkout, /billing/subscribe, /billing/portal, /stripe/webhook) while STRIPE_SECRET_KEY is not set.',
  subscription_exists: 'The account already has a live subscription (`subscription_id`, `plan`): change or cancel it through POST /billing/portal.',
};

/** Codes whose cause may pass on its own: a worker retries these, everything else is final. */
const RETRYABLE: ReadonlySet<ErrorCode> = new Set(['upstream_error', 'timeout', 'service_unavailable']);

export type ErrorDetails = Record<string, unknown>;

export interface AppErrorOptions {
  headers?: Record<string, string>;
  retryable?: boolean;
}

export class AppError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly details: ErrorDetails;
  /** Extra response headers (Retry-After, X-Payment-*...). */
  readonly headers: Record<string, string>;
  private readonly retryOverride: boolean | undefined;

  constructor(code: ErrorCode, message: string, details: ErrorDetails = {}, opts: AppErrorOptions = {}) {
    super(message);
    this.name = 'AppError';
    this.code = code;
    this.status = ERROR_STATUS[code];
    this.details = details;
    this.headers = opts.headers ?? {};
    this.retryOverride = opts.retryable;
  }

  /** Whether a worker may run the job again. Writes to outside systems pass `retryable: false`. */
  get retryable(): boolean {
    return this.retryOverride ?? RETRYABLE.has(this.code);
  }

  /** The serialisable form carried through job data and job failure reasons. */
  toJSON(): SerializedError {
    return { code: this.code, message: this.message, ...(Object.keys(this.details).length ? { details: this.details } : {}) };
  }

  static fromJSON(e: SerializedError): AppError {
    const code = e.code in ERROR_STATUS ? (e.code as ErrorCode) : 'internal_error';
    const details = e.details ?? {};
    // Headers do not travel through job data; the one that matters to clients is rebuilt here.
    const retryAfter = details.retry_after;
    const headers: Record<string, string> = typeof retryAfter === 'number' ? { 'retry-after': String(retryAfter) } : {};
    return new AppError(code, e.message, details, { headers });
  }
}

export interface SerializedError {
  code: string;
  message: string;
  details?: ErrorDetails;
}

export function isAppError(e: unknown): e is AppError {
  return e instanceof AppError;
}

export function envelope(err: AppError, requestId: string) {
  return { error: { code: err.code, message: err.message, request_id: requestId, ...err.details } };
}

/** A zod failure as the envelope's `invalid_input`, naming each failing field. */
export function invalidInput(error: ZodError, what = 'Request is invalid'): AppError {
  const issues = error.issues.map((i) => ({ path: i.path, message: i.message }));
  const first = issues[0];
  const where = first && first.path.length ? `${first.path.join('.')}: ` : '';
  return new AppError('invalid_input', `${what}: ${where}${first?.message ?? 'invalid'}`, { issues });
}

export function parseOrThrow<S extends ZodTypeAny>(schema: S, value: unknown, what?: string): z.output<S> {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw invalidInput(parsed.error, what);
  return parsed.data;
}
