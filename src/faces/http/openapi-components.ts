/**
 * The vocabulary the routes' declarations share: the error envelope and its responses by status, the
 * call's answer and job shapes, the headers and request parameters described once, and the security
 * schemes. Route-specific bodies are declared beside their routes (route-schema.ts's `named`).
 */
import { z } from 'zod';
import type { Config } from '../../config.js';
import { ERROR_STATUS, type ErrorCode as Code } from '../../errors.js';
import { PaymentRequirementsSchema } from '../../pay/x402/requirements.js';
import { named, type HeaderName, type JsonSchema } from './route-schema.js';

const codes = Object.keys(ERROR_STATUS) as [Code, ...Code[]];

export const ErrorCodeSchema = named(
  'ErrorCode',
  z.enum(codes).describe(`Every error code and its HTTP status: ${codes.map((c) => `${c} ${ERROR_STATUS[c]}`).join(', ')}.`),
);

export const ErrorSchema = named(
  'Error',
  z
    .object({
      error: z.object({ code: ErrorCodeSchema, message: z.string(), request_id: z.string() }).passthrough(),
    })
    .describe('The one error envelope. Extra details (required_plan, retry_after, issues, job_id…) sit inside `error`.'),
);

export const OpenAiErrorSchema = named(
  'OpenAiError',
  z
    .object({
      error: z
        .object({ message: z.string(), type: z.string(), param: z.string().nullable().optional(), code: ErrorCodeSchema, request_id: z.string().optional() })
        .passthrough(),
    })
    .describe("Errors of every path under /v1, in the shape OpenAI SDKs parse; `code` is the service's own."),
);

export const PaymentRequirementsComponent = named('PaymentRequirements', PaymentRequirementsSchema);

export const PaymentRequiredSchema = named(
  'PaymentRequired',
  z
    .object({
      x402Version: z.literal(1),
      error: z.string(),
      accepts: z.array(PaymentRequirementsComponent),
      code: z.enum(['payment_required', 'payment_invalid', 'payment_already_used']),
      request_id: z.string(),
    })
    .passthrough()
    .describe('x402 402 body: what to pay (accepts) and how (x402Version 1, scheme exact).'),
);

export const CallResultSchema = named(
  'CallResult',
  z
    .object({
      result: z.unknown().describe("The tool's output (each tool's path documents its own)."),
      cost_cents: z.number().int(),
      remaining_credits: z.number().int().nullable().describe('null for calls paid per call (x402).'),
      sandbox: z.literal(true).optional().describe('Present, true, for sandbox (cv_test_) keys.'),
    })
    .passthrough(),
);

export const JobAcceptedSchema = named('JobAccepted', z.object({ job_id: z.string(), status: z.string(), status_url: z.string() }).passthrough());

export const WebhookStatusSchema = named(
  'WebhookStatus',
  z
    .object({
      url: z.string().url(),
      deliveries: z.array(
        z.object({
          at: z.string().datetime(),
          status: z.number().int().nullable().describe('HTTP status the receiver answered; null when none (refused, timeout)'),
          ok: z.boolean(),
          error: z.string().optional(),
        }),
      ),
      delivered_at: z.string().datetime().nullable(),
    })
    .describe(
      'Only for a job sent with a Callback-Url, once it ended: where its outcome goes and every delivery attempt (also under `error` for a failed job).',
    ),
);

export const JobStatusSchema = named(
  'JobStatus',
  z
    .object({
      job_id: z.string(),
      status: z.enum(['queued', 'running', 'completed']).describe('A failed or cancelled job answers with its error envelope instead (with job_id).'),
      progress: z.unknown().optional(),
      webhook: WebhookStatusSchema.optional(),
    })
    .passthrough()
    .describe('While running: {job_id, status, progress}. Done: the body the sync call would have had (or its error).'),
);

/** Any JSON object (answers whose shape is documented in prose: the root document, the manifest). */
export const OpenSchema = named('Open', z.record(z.unknown()));

/** JSON Schemas with no zod counterpart (non-JSON media). */
export const EVENT_STREAM: JsonSchema = {
  type: 'string',
  description:
    'Server-Sent Events: queued, progress, step (each step of a chain or parallel request), then result or error (id: lines resume with Last-Event-ID).',
};

const header = (description: string, schema: JsonSchema = { type: 'string' }) => ({ description, schema });

export const HEADERS: Record<HeaderName, { description: string; schema: JsonSchema }> = {
  'X-RateLimit-Limit': header("Requests per minute the key's plan (or account) allows.", { type: 'integer' }),
  'X-RateLimit-Remaining': header('Requests left in the current window.', { type: 'integer' }),
  'X-RateLimit-Reset': header('Seconds until the window resets.', { type: 'integer' }),
  'Retry-After': header('Seconds to wait before retrying.', { type: 'integer' }),
  'X-Request-Id': header('The request id (yours, when you sent a valid X-Request-Id); also in error bodies as request_id.'),
  'X-Job-Id': header("The call's job id; GET /jobs/{id} answers with its status and result."),
  Location: header('The status URL of an accepted job (/jobs/{id}).'),
  'Idempotent-Replayed': header('true when the response is the stored answer to an earlier request with the same Idempotency-Key.'),
  'X-Payment-Required': header('x402: true on a 402 that asks for payment.'),
  'X-Payment-Amount': header('x402: the price in USD(C), e.g. 0.02.'),
  'X-Payment-Currency': header('x402: USDC.'),
  'X-Payment-Network': header('x402: the network the payment is made on (base-sepolia or base).'),
  'X-Payment-Response': header('x402 v1: base64 JSON settlement response (success, transaction, network by name, payer) of a paid call.'),
  'PAYMENT-REQUIRED': header(
    'x402 v2: base64 JSON PaymentRequired (x402Version 2, resource, accepts with CAIP-2 networks and amount) on a 402 that asks for payment.',
  ),
  'PAYMENT-RESPONSE': header('x402 v2: base64 JSON settlement response (success, transaction, CAIP-2 network, payer) of a paid call.'),
};

export const RATE_LIMIT: HeaderName[] = ['X-RateLimit-Limit', 'X-RateLimit-Remaining', 'X-RateLimit-Reset'];

export function parameters(): Record<string, JsonSchema> {
  return {
    'Idempotency-Key': {
      name: 'Idempotency-Key',
      in: 'header',
      required: false,
      description:
        'Any 1-255 printable characters. The same key and body within 24 h answers with the first response (Idempotent-Replayed: true) and runs nothing.',
      schema: { type: 'string', minLength: 1, maxLength: 255 },
    },
    Prefer: {
      name: 'Prefer',
      in: 'header',
      required: false,
      description: 'Leave it out to wait for the answer (up to SYNC_TIMEOUT_MS, then 202). `respond-async` answers 202 with the job id at once.',
      // No enum or example: a reference page would put it in every sample request, and the default is to wait.
      schema: { type: 'string' },
    },
    'Callback-Url': {
      name: 'Callback-Url',
      in: 'header',
      required: false,
      description:
        'https URL that gets the outcome when the job ends (completed or failed): a POST of the body GET /jobs/{id} answers, ' +
        'signed as Standard Webhooks says (webhook-id, webhook-timestamp, webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<raw body>"> ' +
        'keyed with the bytes of the whsec_ secret of GET /webhooks/secret), with Tollgate-Job-Id. Retried with exponential backoff for about 24 h until a 2xx; redirects are not followed. ' +
        'Refused (400 invalid_input) on a call that costs nothing (free tool, sandbox key) and unless https and every address of its host is public; ' +
        '429 rate_limited while the account has WEBHOOK_MAX_PENDING deliveries outstanding. On POST / also `callback_url`; a chain or parallel request is delivered once, when all its steps have ended.',
      schema: { type: 'string', format: 'uri', maxLength: 2048 },
    },
    'X-Edge-Token': {
      name: 'X-Edge-Token',
      in: 'header',
      required: false,
      description: "The caller's edge-network (Cloudflare) API token for cf_* tools; never stored.",
      schema: { type: 'string' },
    },
    'Last-Event-ID': {
      name: 'Last-Event-ID',
      in: 'header',
      required: false,
      description: 'Resumes a Server-Sent Events stream after the event with this id.',
      schema: { type: 'string' },
    },
  };
}

export function securitySchemes(config: Config): Record<string, JsonSchema> {
  return {
    bearerAuth: {
      type: 'http',
      scheme: 'bearer',
      description:
        'An API key in Authorization: Bearer <key>. Prefixes: cv_ (production), cv_test_ (sandbox: runs tools, charges nothing), cv_sub_ (a sub-key with its own cap and tools), cv_agent_ (agent), titan_vip_ (VIP).',
    },
    ...(config.X402_ENABLED
      ? {
          x402Payment: {
            type: 'apiKey',
            in: 'header',
            name: 'PAYMENT-SIGNATURE',
            description:
              'x402 pay-per-call (paid tools without side effects and POST / only, no key): a request without Authorization is answered 402 ' +
              'with the price (v2 in the PAYMENT-REQUIRED header, v1 in the body); repeat it with the signed payment, base64 JSON, in ' +
              'PAYMENT-SIGNATURE (x402 v2).',
          },
          x402PaymentV1: {
            type: 'apiKey',
            in: 'header',
            name: 'X-Payment',
            description: 'x402 version 1: the signed payment for the `accepts` of the 402 body, base64 JSON, in X-Payment.',
          },
        }
      : {}),
    metricsToken: { type: 'http', scheme: 'bearer', description: 'METRICS_TOKEN, for GET /metrics on the API port.' },
    adminToken: { type: 'http', scheme: 'bearer', description: 'ADMIN_TOKEN, for the admin API (/admin/v1) and the queue dashboard.' },
  };
}

const ref = (kind: string, name: string) => ({ $ref: `#/components/${kind}/${name}` });
const REQUEST_ID = { 'X-Request-Id': ref('headers', 'X-Request-Id') };
const errorBody = { 'application/json': { schema: ref('schemas', 'Error') } };

function errorResponse(status: number, description: string, headers: Record<string, unknown> = {}) {
  const named = Object.entries(ERROR_STATUS)
    .filter(([, s]) => s === status)
    .map(([c]) => c);
  return { description: `${description} Codes: ${named.join(', ')}.`, headers: { ...REQUEST_ID, ...headers }, content: errorBody };
}

const RATE_HEADERS = Object.fromEntries(RATE_LIMIT.map((h) => [h, ref('headers', h)]));

/** components.responses: the shared answers route-schema.ts's `errors()` and the call routes point at. */
export function responses(): Record<string, unknown> {
  return {
    Accepted: {
      description: 'Accepted: the job runs on (Prefer: respond-async, or longer than SYNC_TIMEOUT_MS). GET the status_url.',
      headers: { ...REQUEST_ID, ...RATE_HEADERS, 'X-Job-Id': ref('headers', 'X-Job-Id'), Location: ref('headers', 'Location') },
      content: { 'application/json': { schema: ref('schemas', 'JobAccepted') } },
    },
    BadRequest: errorResponse(400, 'The body or parameters are invalid (issues lists them).'),
    Unauthorized: errorResponse(401, 'No key, a malformed key or an unknown or revoked key.'),
    PaymentRequired: {
      description:
        'Payment required. With a key: insufficient_credits or monthly_limit_exceeded in the error envelope. ' +
        'Without a key on a paid call with x402 enabled: the x402 v1 body, the v2 PAYMENT-REQUIRED header and the X-Payment-* headers.',
      headers: {
        ...REQUEST_ID,
        'PAYMENT-REQUIRED': ref('headers', 'PAYMENT-REQUIRED'),
        'X-Payment-Required': ref('headers', 'X-Payment-Required'),
        'X-Payment-Amount': ref('headers', 'X-Payment-Amount'),
        'X-Payment-Currency': ref('headers', 'X-Payment-Currency'),
        'X-Payment-Network': ref('headers', 'X-Payment-Network'),
      },
      content: { 'application/json': { schema: { oneOf: [ref('schemas', 'Error'), ref('schemas', 'PaymentRequired')] } } },
    },
    Forbidden: errorResponse(403, 'Not allowed for this key (plan, sub-key or key type).'),
    NotFound: errorResponse(404, 'No such tool, route, job or sub-key.'),
    Conflict: errorResponse(409, 'The Idempotency-Key is in use by a request still running.', { 'Retry-After': ref('headers', 'Retry-After') }),
    Gone: errorResponse(410, 'job_lost: the job was accepted but the queue lost it before it ran; not charged. Send the request again (same Idempotency-Key).'),
    PayloadTooLarge: errorResponse(413, 'The body is over BODY_LIMIT.'),
    UnsupportedMediaType: errorResponse(415, 'Send the body as application/json.'),
    Unprocessable: errorResponse(422, 'The tool ran and failed, passed a limit, or the Idempotency-Key was reused with another body.'),
    TooManyRequests: errorResponse(429, 'Rate or concurrency limit reached.', { ...RATE_HEADERS, 'Retry-After': ref('headers', 'Retry-After') }),
    InternalError: errorResponse(500, 'Something went wrong on our side.'),
    UpstreamError: errorResponse(502, 'The edge network failed or is unreachable.'),
    ServiceUnavailable: errorResponse(503, 'A dependency (Redis, Postgres, a tool upstream) is unavailable; nothing was charged.', {
      'Retry-After': ref('headers', 'Retry-After'),
    }),
    Timeout: errorResponse(504, 'The call took too long.'),
  };
}

/** The path parameter of /tools/{name}. */
export const ToolNameParams = z.object({ name: z.string().describe('A tool name (GET /tools lists them).') });
/** The path parameter of /jobs/{id}. */
export const JobIdParams = z.object({ id: z.string().describe('A job id (X-Job-Id, job_id).') });
