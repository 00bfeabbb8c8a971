import { zodToJsonSchema } from 'zod-to-json-schema';
import type { ZodTypeAny } from 'zod';
import type { Config } from '../../config.js';
import { ERROR_STATUS } from '../../errors.js';
import { TOOLS } from '../../tools/index.js';
import { llmChatModels } from '../../tools/llm/index.js';
import { PLANS, type AnyTool } from '../../tools/types.js';
import { JobListQuery } from '../../money/results.js';
import { EntriesQuery, UsageQuery } from './usage.js';
import { ChatCompletionRequestSchema, CHAT_REQUEST_EXAMPLES } from '../openai.js';
import { PaymentRequirementsSchema } from '../../pay/x402/requirements.js';
import { API_VERSION, ENDPOINTS, inputJsonSchema, outputJsonSchema } from '../../calls/catalogue.js';
import { ChainRequestSchema, DirectRequestSchema, MAX_STEPS, ParallelRequestSchema, PROTOCOL_MODES } from '../../calls/protocol.js';

/**
 * The OpenAPI 3.1 description of the HTTP API, built from the sources the routes use: the tool
 * registry's zod input schemas (through catalogue.ts's JSON Schema conversion), the root protocol's
 * schemas, the chat request schema, the x402 requirements schema and the error codes of errors.ts.
 */

type Json = Record<string, unknown>;

/** A zod schema as a JSON Schema object fit for an OpenAPI 3.1 document (no $schema, refs inlined). */
function fromZod(schema: ZodTypeAny): Json {
  const { $schema: _drop, ...rest } = zodToJsonSchema(schema, { target: 'jsonSchema7', $refStrategy: 'none' }) as Json;
  return rest;
}

const ref = (kind: 'schemas' | 'responses' | 'headers' | 'parameters', name: string) => ({ $ref: `#/components/${kind}/${name}` });
const json = (schema: Json, extra: Json = {}) => ({ 'application/json': { schema, ...extra } });

/** Response headers every authenticated route sends (the key's rate limit). */
const RATE_LIMIT_HEADERS = {
  'X-RateLimit-Limit': ref('headers', 'X-RateLimit-Limit'),
  'X-RateLimit-Remaining': ref('headers', 'X-RateLimit-Remaining'),
  'X-RateLimit-Reset': ref('headers', 'X-RateLimit-Reset'),
};
const REQUEST_ID_HEADER = { 'X-Request-Id': ref('headers', 'X-Request-Id') };

function ok(description: string, schema: Json, opts: { headers?: Json; auth?: boolean; examples?: Json } = {}) {
  return {
    description,
    headers: { ...REQUEST_ID_HEADER, ...(opts.auth === false ? {} : RATE_LIMIT_HEADERS), ...(opts.headers ?? {}) },
    content: json(schema, opts.examples ? { examples: opts.examples } : {}),
  };
}

/** The error responses of an authenticated route, plus `extra` ones ('402', '404', ...). */
function errors(...extra: string[]): Json {
  const all: Record<string, string> = {
    '400': 'BadRequest',
    '401': 'Unauthorized',
    '402': 'PaymentRequired',
    '403': 'Forbidden',
    '404': 'NotFound',
    '409': 'Conflict',
    '413': 'PayloadTooLarge',
    '415': 'UnsupportedMediaType',
    '422': 'Unprocessable',
    '429': 'TooManyRequests',
    '500': 'InternalError',
    '502': 'UpstreamError',
    '503': 'ServiceUnavailable',
    '504': 'Timeout',
  };
  const codes = new Set(['401', '429', '500', '503', ...extra]);
  return Object.fromEntries(Object.entries(all).filter(([c]) => codes.has(c)).map(([c, name]) => [c, ref('responses', name)]));
}

const CALL_ERRORS = ['400', '402', '403', '404', '409', '413', '415', '422', '502', '504'];

/** Codes of errors.ts answering with `status`. */
function codesFor(status: number): string[] {
  return Object.entries(ERROR_STATUS).filter(([, s]) => s === status).map(([c]) => c);
}

function errorResponse(status: number, description: string, headers: Json = {}): Json {
  const codes = codesFor(status);
  return {
    description: `${description} Codes: ${codes.join(', ')}.`,
    headers: { ...REQUEST_ID_HEADER, ...headers },
    content: json({ $ref: '#/components/schemas/Error' }),
  };
}

const AUTH = [{ bearerAuth: [] }];

function toolCallOperation(tool: AnyTool, x402: boolean): Json {
  const examples = Object.fromEntries(tool.examples.map((value, i) => [`example${i + 1}`, { value }]));
  // Tools with side effects are never sold per call (src/faces/http/paid-calls.ts): a key only.
  const payable = x402 && tool.priceCents > 0 && !tool.sideEffects;
  return {
    operationId: `callTool_${tool.name}`,
    tags: ['Tools'],
    summary: `${tool.name} (${(tool.priceCents / 100).toFixed(2)} USD, ${tool.tier} plan)`,
    description:
      `${tool.description}\n\nTier: ${tool.tier}. Price: ${tool.priceCents} cents per successful call. Family: ${tool.family}. ` +
      `Result: ${tool.output}.` +
      (tool.sideEffects ? ' Changes things outside the service (sandbox keys get a dry run).' : '') +
      (tool.needsEdgeToken ? ' Needs the caller\u2019s edge-network token in X-Edge-Token (or `edge_token` in the body).' : '') +
      ` The root protocol's \`q\` fills \`${tool.qField}\`.`,
    security: payable ? [...AUTH, { x402Payment: [] }, { x402PaymentV1: [] }] : AUTH,
    parameters: [
      ref('parameters', 'Idempotency-Key'),
      ref('parameters', 'Prefer'),
      ref('parameters', 'Callback-Url'),
      ...(tool.needsEdgeToken ? [ref('parameters', 'X-Edge-Token')] : []),
    ],
    requestBody: { required: true, content: json(inputJsonSchema(tool) as Json, { examples }) },
    responses: {
      '200': {
        ...ok('The call ran and was charged.', resultSchema(tool), { headers: callHeaders(payable) }),
        content: { ...json(resultSchema(tool)), 'text/event-stream': { schema: ref('schemas', 'EventStream') } },
      },
      '202': ref('responses', 'Accepted'),
      ...errors(...CALL_ERRORS),
    },
  };
}

/** CallResult, with `result` narrowed to the tool's output schema when it declares one. */
function resultSchema(tool: AnyTool): Json {
  const output = outputJsonSchema(tool);
  if (!output) return ref('schemas', 'CallResult');
  return { allOf: [ref('schemas', 'CallResult'), { type: 'object', properties: { result: output as Json } }] };
}

function callHeaders(payable: boolean): Json {
  return {
    'X-Job-Id': ref('headers', 'X-Job-Id'),
    'Idempotent-Replayed': ref('headers', 'Idempotent-Replayed'),
    ...(payable ? { 'PAYMENT-RESPONSE': ref('headers', 'PAYMENT-RESPONSE'), 'X-Payment-Response': ref('headers', 'X-Payment-Response') } : {}),
  };
}

const header = (description: string, schema: Json = { type: 'string' }) => ({ description, schema });

function components(config: Config): Json {
  const errorCodes = Object.keys(ERROR_STATUS);
  return {
    securitySchemes: {
      bearerAuth: {
        type: 'http',
        scheme: 'bearer',
        description: 'An API key (cv_live_…, cv_test_… sandbox, cv_sub_… sub-key): Authorization: Bearer <key>.',
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
    },
    headers: {
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
      'PAYMENT-REQUIRED': header('x402 v2: base64 JSON PaymentRequired (x402Version 2, resource, accepts with CAIP-2 networks and amount) on a 402 that asks for payment.'),
      'PAYMENT-RESPONSE': header('x402 v2: base64 JSON settlement response (success, transaction, CAIP-2 network, payer) of a paid call.'),
    },
    parameters: {
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
        description: 'respond-async: answer 202 with the job id at once instead of waiting for the result.',
        schema: { type: 'string', examples: ['respond-async'] },
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
      ToolName: { name: 'name', in: 'path', required: true, description: 'A tool name (GET /tools lists them).', schema: { type: 'string', enum: TOOLS.map((t) => t.name) } },
      JobId: { name: 'id', in: 'path', required: true, description: 'A job id (X-Job-Id, job_id).', schema: { type: 'string' } },
    },
    schemas: {
      ErrorCode: { type: 'string', enum: errorCodes, description: `Every error code and its HTTP status: ${errorCodes.map((c) => `${c} ${ERROR_STATUS[c as keyof typeof ERROR_STATUS]}`).join(', ')}.` },
      Error: {
        type: 'object',
        description: 'The one error envelope. Extra details (required_plan, retry_after, issues, job_id…) sit inside `error`.',
        required: ['error'],
        properties: {
          error: {
            type: 'object',
            required: ['code', 'message', 'request_id'],
            properties: {
              code: ref('schemas', 'ErrorCode'),
              message: { type: 'string' },
              request_id: { type: 'string' },
            },
            additionalProperties: true,
          },
        },
      },
      OpenAiError: {
        type: 'object',
        description: 'Errors of /v1/chat/completions and /v1/models, in the shape OpenAI SDKs parse; `code` is the service\u2019s own.',
        required: ['error'],
        properties: {
          error: {
            type: 'object',
            required: ['message', 'type', 'code'],
            properties: {
              message: { type: 'string' },
              type: { type: 'string' },
              param: { type: ['string', 'null'] },
              code: ref('schemas', 'ErrorCode'),
              request_id: { type: 'string' },
            },
            additionalProperties: true,
          },
        },
      },
      PaymentRequirements: fromZod(PaymentRequirementsSchema),
      PaymentRequired: {
        type: 'object',
        description: 'x402 402 body: what to pay (accepts) and how (x402Version 1, scheme exact).',
        required: ['x402Version', 'error', 'accepts', 'code', 'request_id'],
        properties: {
          x402Version: { type: 'integer', const: 1 },
          error: { type: 'string' },
          accepts: { type: 'array', items: ref('schemas', 'PaymentRequirements') },
          code: { type: 'string', enum: ['payment_required', 'payment_invalid', 'payment_already_used'] },
          request_id: { type: 'string' },
        },
        additionalProperties: true,
      },
      CallResult: {
        type: 'object',
        required: ['result', 'cost_cents', 'remaining_credits'],
        properties: {
          result: { description: "The tool's output (GET /tools/{name} documents each tool's)." },
          cost_cents: { type: 'integer' },
          remaining_credits: { type: ['integer', 'null'], description: 'null for calls paid per call (x402).' },
          sandbox: { type: 'boolean', description: 'true for sandbox (cv_test_) keys.' },
        },
        additionalProperties: true,
      },
      JobAccepted: {
        type: 'object',
        required: ['job_id', 'status', 'status_url'],
        properties: { job_id: { type: 'string' }, status: { type: 'string' }, status_url: { type: 'string' } },
      },
      JobStatus: {
        type: 'object',
        description: 'While running: {job_id, status, progress}. Done: the body the sync call would have had (or its error).',
        properties: {
          job_id: { type: 'string' },
          status: { type: 'string', enum: ['queued', 'running', 'completed', 'failed'] },
          progress: {},
          webhook: ref('schemas', 'WebhookStatus'),
        },
        additionalProperties: true,
      },
      WebhookStatus: {
        type: 'object',
        description: 'Only for a job sent with a Callback-Url, once it ended: where its outcome goes and every delivery attempt (also under `error` for a failed job).',
        required: ['url', 'deliveries', 'delivered_at'],
        properties: {
          url: { type: 'string', format: 'uri' },
          deliveries: {
            type: 'array',
            items: {
              type: 'object',
              required: ['at', 'status', 'ok'],
              properties: {
                at: { type: 'string', format: 'date-time' },
                status: { type: ['integer', 'null'], description: 'HTTP status the receiver answered; null when none (refused, timeout)' },
                ok: { type: 'boolean' },
                error: { type: 'string' },
              },
            },
          },
          delivered_at: { type: ['string', 'null'], format: 'date-time' },
        },
      },
      WebhookSecret: {
        type: 'object',
        required: ['secret'],
        properties: { secret: { type: 'string', pattern: '^whsec_', description: 'HMAC-SHA256 key of Tollgate-Signature' } },
      },
      JobList: {
        type: 'object',
        required: ['jobs', 'next_cursor'],
        properties: {
          jobs: {
            type: 'array',
            items: {
              type: 'object',
              properties: {
                job_id: { type: 'string' },
                tool: { type: 'string' },
                status: { type: 'string', enum: ['completed', 'failed', 'cancelled'] },
                cost_cents: { type: 'integer' },
                created_at: { type: 'string', format: 'date-time' },
                finished_at: { type: ['string', 'null'], format: 'date-time' },
              },
              additionalProperties: true,
            },
          },
          next_cursor: { type: ['string', 'null'] },
        },
      },
      EventStream: { type: 'string', description: 'Server-Sent Events: queued, progress, result or error (id: lines resume with Last-Event-ID).' },
      Balance: {
        type: 'object',
        required: ['credits', 'plan', 'used_this_month', 'key_type'],
        properties: {
          credits: { type: 'integer' },
          plan: { type: 'string', enum: [...PLANS] },
          used_this_month: { type: 'integer' },
          key_type: { type: 'string' },
          monthly_limit: { type: 'integer' },
          sandbox: { type: 'boolean' },
        },
        additionalProperties: true,
      },
      ProtocolRequest: {
        description: `The root protocol: one of chain, parallel or direct (m); stream: true for Server-Sent Events. Up to ${MAX_STEPS} tools.`,
        oneOf: [
          { title: 'chain', ...fromZod(ChainRequestSchema) },
          { title: 'parallel', ...fromZod(ParallelRequestSchema) },
          { title: 'direct', ...fromZod(DirectRequestSchema) },
        ],
      },
      ChatCompletionRequest: fromZod(ChatCompletionRequestSchema),
      CreateSubKey: {
        type: 'object',
        required: ['name', 'monthly_limit', 'allowed_tools'],
        additionalProperties: false,
        properties: {
          name: { type: 'string', minLength: 1, maxLength: 100 },
          monthly_limit: { type: 'integer', exclusiveMinimum: 0, maximum: 1_000_000_000, description: 'Cents per calendar month.' },
          allowed_tools: { type: 'array', minItems: 1, maxItems: 500, items: { type: 'string', enum: TOOLS.map((t) => t.name) } },
        },
      },
      Usage: {
        type: 'object',
        description: "A month of the ledger in the caller's scope. Charges are positive cents here; `balance` moves are signed (start + opening + top-ups + charges = end). `balance` is null for a sub-key or sandbox key, which see their own lines only.",
        required: ['month', 'from', 'to', 'scope', 'unit', 'total', 'by_tool', 'by_key', 'by_day', 'topups', 'balance'],
        properties: {
          month: { type: 'string', pattern: '^\\d{4}-\\d{2}$' },
          from: { type: 'string', format: 'date-time' },
          to: { type: 'string', format: 'date-time', description: 'Exclusive.' },
          scope: { type: 'string', enum: ['account', 'key'] },
          key_id: { type: 'string', format: 'uuid', description: 'With scope key: the calling key.' },
          unit: { const: 'cents' },
          total: { $ref: '#/components/schemas/UsageTotal' },
          by_tool: { type: 'array', items: { allOf: [{ $ref: '#/components/schemas/UsageTotal' }, { type: 'object', properties: { tool: { type: ['string', 'null'] } } }] } },
          by_key: {
            type: 'array',
            items: {
              allOf: [
                { $ref: '#/components/schemas/UsageTotal' },
                { type: 'object', properties: { key_id: { type: ['string', 'null'] }, type: { type: ['string', 'null'] }, name: { type: ['string', 'null'] }, display_prefix: { type: ['string', 'null'] } } },
              ],
            },
          },
          by_day: { type: 'array', items: { allOf: [{ $ref: '#/components/schemas/UsageTotal' }, { type: 'object', properties: { day: { type: 'string', format: 'date' } } }] } },
          topups: { type: 'object', properties: { cents: { type: 'integer' }, count: { type: 'integer' } } },
          balance: {
            type: ['object', 'null'],
            properties: {
              start_cents: { type: 'integer' },
              opening_cents: { type: 'integer' },
              topups_cents: { type: 'integer' },
              charges_cents: { type: 'integer', description: 'Negative: what the charges took.' },
              payments_cents: { type: 'integer' },
              end_cents: { type: 'integer' },
            },
          },
        },
      },
      UsageTotal: { type: 'object', required: ['cents', 'calls'], properties: { cents: { type: 'integer' }, calls: { type: 'integer' } } },
      LedgerEntryList: {
        type: 'object',
        required: ['entries', 'next_cursor'],
        properties: {
          entries: {
            type: 'array',
            items: {
              type: 'object',
              required: ['id', 'kind', 'amount_cents', 'created_at'],
              properties: {
                id: { type: 'string' },
                kind: { type: 'string', enum: ['charge', 'topup', 'opening', 'payment'] },
                tool: { type: ['string', 'null'] },
                key_id: { type: ['string', 'null'] },
                amount_cents: { type: 'integer', description: 'Signed move of the balance (a charge is negative).' },
                job_id: { type: 'string', description: 'Charges only: the call that was charged.' },
                agent_name: { type: ['string', 'null'] },
                created_at: { type: 'string', format: 'date-time' },
              },
            },
          },
          next_cursor: { type: ['string', 'null'], description: 'Pass as `cursor` for the next (older) page; null on the last page.' },
        },
      },
      ApiKeyInfo: {
        type: 'object',
        properties: {
          key_id: { type: 'string', format: 'uuid' },
          type: { type: 'string', enum: ['production', 'sub', 'test', 'agent', 'vip'] },
          display_prefix: { type: 'string' },
          name: { type: ['string', 'null'] },
          created_at: { type: 'string', format: 'date-time' },
          last_used_at: { type: ['string', 'null'], format: 'date-time', description: 'Updated at most once a minute.' },
          revoked_at: { type: ['string', 'null'], format: 'date-time' },
          expires_at: { type: ['string', 'null'], format: 'date-time', description: 'A rotated key stops working then.' },
          replaced_by_key_id: { type: ['string', 'null'], format: 'uuid' },
        },
      },
      RotatedKey: {
        type: 'object',
        required: ['key_id', 'api_key', 'type', 'display_prefix', 'created_at', 'replaces'],
        properties: {
          key_id: { type: 'string', format: 'uuid' },
          api_key: { type: 'string', description: 'The new key, shown only in this answer.' },
          type: { type: 'string', enum: ['production', 'agent', 'vip', 'test'] },
          name: { type: ['string', 'null'] },
          display_prefix: { type: 'string' },
          created_at: { type: 'string', format: 'date-time' },
          replaces: {
            type: 'object',
            properties: { key_id: { type: 'string', format: 'uuid' }, expires_at: { type: 'string', format: 'date-time' }, grace_seconds: { type: 'integer' } },
          },
        },
      },
      SubKey: {
        type: 'object',
        properties: {
          key_id: { type: 'string' },
          name: { type: 'string' },
          display_prefix: { type: 'string' },
          api_key: { type: 'string', description: 'Only in the answer to POST /subkeys/create.' },
          monthly_limit: { type: 'integer' },
          allowed_tools: { type: 'array', items: { type: 'string' } },
          used_this_month: { type: 'integer' },
          created_at: { type: 'string' },
        },
        additionalProperties: true,
      },
      // Self-service: top-ups, sign-up, partners
      TopupRequest: {
        type: 'object',
        required: ['cents'],
        additionalProperties: false,
        properties: {
          cents: { type: 'integer', minimum: config.TOPUP_MIN_CENTS, maximum: config.TOPUP_MAX_CENTS, description: 'Credits to buy, in cents (TOPUP_MIN_CENTS to TOPUP_MAX_CENTS); the 402 asks for exactly this many cents of USDC.' },
        },
      },
      Topup: {
        type: 'object',
        required: ['cents', 'credits', 'payment'],
        properties: {
          cents: { type: 'integer', description: 'Credits added.' },
          credits: { type: 'integer', description: 'The account\u2019s balance after the top-up.' },
          payment: {
            type: 'object',
            required: ['transaction', 'network'],
            properties: { transaction: { type: 'string', description: 'The settlement transaction hash.' }, network: { type: 'string' } },
          },
        },
      },
      SignupRequest: {
        type: 'object',
        required: ['email'],
        additionalProperties: false,
        properties: {
          email: { type: 'string', format: 'email', maxLength: 254 },
          attribution_code: { type: 'string', pattern: '^[A-Za-z0-9_-]{3,32}$', description: 'A partner\u2019s code (from its /subscribe link); unknown codes are refused.' },
        },
      },
      Signup: {
        type: 'object',
        required: ['account_id', 'api_key', 'key_id', 'plan', 'credits', 'email'],
        properties: {
          account_id: { type: 'string', format: 'uuid' },
          api_key: { type: 'string', description: 'The production key, shown only in this answer.' },
          key_id: { type: 'string', format: 'uuid' },
          plan: { type: 'string', const: 'free' },
          credits: { type: 'integer' },
          email: { type: 'string' },
          attribution_code: { type: ['string', 'null'] },
        },
      },
      SubscribePage: {
        type: 'object',
        required: ['plans', 'signup', 'attribution', 'topup'],
        properties: {
          plans: {
            type: 'array',
            items: { type: 'object', properties: { plan: { type: 'string', enum: [...PLANS] }, requests_per_minute: { type: 'integer' }, description: { type: 'string' } } },
          },
          signup: { type: 'object', properties: { enabled: { type: 'boolean' }, how: { type: 'string' }, example: { type: 'string' } } },
          attribution: {
            type: ['object', 'null'],
            properties: { code: { type: 'string' }, known: { type: 'boolean' }, message: { type: 'string' } },
          },
          topup: { type: 'string' },
        },
      },
      JsonRpc: {
        description: 'A JSON-RPC 2.0 message or batch (MCP Streamable HTTP, stateless).',
        oneOf: [{ type: 'object', additionalProperties: true }, { type: 'array', items: { type: 'object', additionalProperties: true } }],
      },
      Model: {
        type: 'object',
        properties: {
          id: { type: 'string', enum: [...llmChatModels.keys()] },
          object: { type: 'string', const: 'model' },
          created: { type: 'integer' },
          owned_by: { type: 'string' },
          description: { type: 'string' },
          tool: { type: 'string' },
          cost: { type: 'string' },
          price_cents: { type: 'integer' },
          tier: { type: 'string', enum: [...PLANS] },
        },
      },
      ChatCompletion: {
        type: 'object',
        properties: {
          id: { type: 'string' },
          object: { type: 'string', const: 'chat.completion' },
          created: { type: 'integer' },
          model: { type: 'string' },
          choices: { type: 'array', items: { type: 'object', additionalProperties: true } },
          usage: { type: 'object', additionalProperties: true },
          tollgate: { type: 'object', description: 'Job id and charge of the call.', additionalProperties: true },
        },
        additionalProperties: true,
      },
      Open: { type: 'object', additionalProperties: true },
    },
    responses: {
      Accepted: {
        description: 'Accepted: the job runs on (Prefer: respond-async, or longer than SYNC_TIMEOUT_MS). GET the status_url.',
        headers: { ...REQUEST_ID_HEADER, ...RATE_LIMIT_HEADERS, 'X-Job-Id': ref('headers', 'X-Job-Id'), Location: ref('headers', 'Location') },
        content: json(ref('schemas', 'JobAccepted')),
      },
      BadRequest: errorResponse(400, 'The body or parameters are invalid (issues lists them).'),
      Unauthorized: errorResponse(401, 'No key, a malformed key or an unknown or revoked key.'),
      PaymentRequired: {
        description:
          'Payment required. With a key: insufficient_credits or monthly_limit_exceeded in the error envelope. ' +
          'Without a key on a paid call with x402 enabled: the x402 v1 body, the v2 PAYMENT-REQUIRED header and the X-Payment-* headers.',
        headers: {
          ...REQUEST_ID_HEADER,
          'PAYMENT-REQUIRED': ref('headers', 'PAYMENT-REQUIRED'),
          'X-Payment-Required': ref('headers', 'X-Payment-Required'),
          'X-Payment-Amount': ref('headers', 'X-Payment-Amount'),
          'X-Payment-Currency': ref('headers', 'X-Payment-Currency'),
          'X-Payment-Network': ref('headers', 'X-Payment-Network'),
        },
        content: json({ oneOf: [ref('schemas', 'Error'), ref('schemas', 'PaymentRequired')] }),
      },
      Forbidden: errorResponse(403, 'Not allowed for this key (plan, sub-key or key type).'),
      NotFound: errorResponse(404, 'No such tool, route, job or sub-key.'),
      Conflict: errorResponse(409, 'The Idempotency-Key is in use by a request still running.', { 'Retry-After': ref('headers', 'Retry-After') }),
      PayloadTooLarge: errorResponse(413, 'The body is over BODY_LIMIT.'),
      UnsupportedMediaType: errorResponse(415, 'Send the body as application/json.'),
      Unprocessable: errorResponse(422, 'The tool ran and failed, passed a limit, or the Idempotency-Key was reused with another body.'),
      TooManyRequests: errorResponse(429, 'Rate or concurrency limit reached.', { ...RATE_LIMIT_HEADERS, 'Retry-After': ref('headers', 'Retry-After') }),
      InternalError: errorResponse(500, 'Something went wrong on our side.'),
      UpstreamError: errorResponse(502, 'The edge network failed or is unreachable.'),
      ServiceUnavailable: errorResponse(503, 'A dependency (Redis, Postgres, a tool upstream) is unavailable; nothing was charged.', { 'Retry-After': ref('headers', 'Retry-After') }),
      Timeout: errorResponse(504, 'The call took too long.'),
    },
  };
}

function get(operationId: string, tag: string, summary: string, responses: Json, extra: Json = {}): Json {
  return { operationId, tags: [tag], summary, description: ENDPOINTS[`GET ${summary}`] ?? summary, ...extra, responses };
}

/** The whole document, for `base` (the public base URL). */
export function openApiDocument(base: string, config: Config): Json {
  const x402 = config.X402_ENABLED;
  const open = ref('schemas', 'Open');
  const publicOk = (d: string, s: Json = open) => ok(d, s, { auth: false });
  const toolPaths = Object.fromEntries(TOOLS.map((t) => [`/tools/${t.name}`, { post: toolCallOperation(t, x402) }]));
  const chatErrors = Object.fromEntries(
    Object.entries(errors('400', '402', '403', '404', '409', '422', '502', '504')).map(([status, r]) => [
      status,
      { description: `Error in OpenAI's shape (${(r as { $ref: string }).$ref.split('/').pop()}).`, content: json(ref('schemas', 'OpenAiError')) },
    ]),
  );

  return {
    openapi: '3.1.0',
    info: {
      title: 'Tollgate API',
      version: API_VERSION,
      description:
        `Tools for paying callers over HTTP: REST (POST /tools/{name}), the root protocol (POST /), MCP (POST /mcp), an OpenAI-compatible chat API` +
        `${x402 ? ' and x402 pay-per-call' : ''}. This service has ${TOOLS.length} tools: ${TOOLS.map((t) => t.name).join(', ')}. ` +
        'Every error has the envelope {"error": {"code", "message", "request_id"}}. The README is at /docs/readme.',
      'x-total-tools': TOOLS.length,
    },
    servers: [{ url: base }],
    security: AUTH,
    components: components(config),
    tags: [
      { name: 'Discovery' },
      { name: 'Tools', description: 'One operation per tool, with its input schema and examples.' },
      { name: 'Protocol', description: 'The root protocol: chain, parallel, direct, stream.' },
      { name: 'Jobs' },
      { name: 'Account' },
      { name: 'Sub-keys' },
      { name: 'MCP' },
      { name: 'OpenAI' },
    ],
    paths: {
      '/': {
        get: get('rootDocument', 'Discovery', '/', { '200': publicOk('Tools by tier, endpoints, protocol, links.') }, { security: [] }),
        post: {
          operationId: 'rootProtocol',
          tags: ['Protocol'],
          summary: 'Root protocol',
          description: `${ENDPOINTS['POST /']}. ${Object.values(PROTOCOL_MODES).map((m) => m.description).join('. ')}.`,
          security: x402 ? [...AUTH, { x402Payment: [] }, { x402PaymentV1: [] }] : AUTH,
          parameters: [
            ref('parameters', 'Idempotency-Key'),
            ref('parameters', 'Prefer'),
            ref('parameters', 'Callback-Url'),
            ref('parameters', 'X-Edge-Token'),
            ref('parameters', 'Last-Event-ID'),
          ],
          requestBody: {
            required: true,
            content: json(ref('schemas', 'ProtocolRequest'), {
              examples: Object.fromEntries(Object.entries(PROTOCOL_MODES).map(([k, m]) => [k, { summary: m.description, value: m.example }])),
            }),
          },
          responses: {
            '200': {
              ...ok('The request ran: a call result (direct), steps and result (chain), or results by tool (parallel).', open, { headers: callHeaders(x402) }),
              content: { ...json(open), 'text/event-stream': { schema: ref('schemas', 'EventStream') } },
            },
            '202': ref('responses', 'Accepted'),
            '204': { description: 'A resumed event stream (Last-Event-ID) that had already ended.' },
            ...errors(...CALL_ERRORS),
          },
        },
      },
      '/health': {
        get: get('health', 'Discovery', '/health', {
          '200': publicOk('Healthy.'),
          '503': { description: 'Degraded: a dependency or a worker family is down (`down` lists them).', content: json(open) },
        }, { security: [] }),
      },
      '/openapi.json': {
        get: { operationId: 'openApi', tags: ['Discovery'], summary: 'This OpenAPI document', security: [], responses: { '200': publicOk('OpenAPI 3.1 document.') } },
      },
      '/docs': {
        get: {
          operationId: 'docs',
          tags: ['Discovery'],
          summary: 'Interactive API reference (HTML)',
          security: [],
          responses: { '200': { description: 'HTML page.', content: { 'text/html': { schema: { type: 'string' } } } } },
        },
      },
      '/docs/readme': {
        get: {
          operationId: 'readme',
          tags: ['Discovery'],
          summary: 'The README: full API documentation (Markdown)',
          security: [],
          responses: { '200': { description: 'Markdown.', content: { 'text/markdown': { schema: { type: 'string' } } } } },
        },
      },
      '/metrics': {
        get: {
          operationId: 'metrics',
          tags: ['Discovery'],
          summary: 'Prometheus metrics (text format): needs the operator\u2019s METRICS_TOKEN as a bearer; 404 when none is set',
          security: [],
          responses: {
            '200': { description: 'Prometheus text exposition.', content: { 'text/plain': { schema: { type: 'string' } } } },
            '401': ref('responses', 'Unauthorized'),
            '404': ref('responses', 'NotFound'),
          },
        },
      },
      '/client/tollgate-mcp.tgz': {
        get: {
          operationId: 'mcpClientPackage',
          tags: ['Discovery'],
          summary: 'The stdio MCP client as an npm tarball (npx -y <base>/client/tollgate-mcp.tgz)',
          security: [],
          responses: { '200': { description: 'npm package tarball.', content: { 'application/gzip': { schema: { type: 'string', format: 'binary' } } } } },
        },
      },
      '/tools': { get: get('listTools', 'Discovery', '/tools', { '200': publicOk('Every tool with its price.') }, { security: [] }) },
      '/tools/{name}': {
        parameters: [ref('parameters', 'ToolName')],
        get: get('getTool', 'Discovery', '/tools/{name}', { '200': publicOk("The tool's input JSON Schema, examples, price and tier."), '404': ref('responses', 'NotFound') }, { security: [] }),
        post: {
          operationId: 'callTool',
          tags: ['Tools'],
          summary: 'Run a tool by name',
          description: `${ENDPOINTS['POST /tools/{name}']}. The per-tool paths (/tools/<tool>) carry each tool's input schema.`,
          security: x402 ? [...AUTH, { x402Payment: [] }, { x402PaymentV1: [] }] : AUTH,
          parameters: [ref('parameters', 'Idempotency-Key'), ref('parameters', 'Prefer'), ref('parameters', 'X-Edge-Token'), ref('parameters', 'Last-Event-ID')],
          requestBody: { required: true, content: json({ type: 'object', additionalProperties: true }) },
          responses: {
            '200': {
              ...ok('The call ran and was charged.', ref('schemas', 'CallResult'), { headers: callHeaders(x402) }),
              content: { ...json(ref('schemas', 'CallResult')), 'text/event-stream': { schema: ref('schemas', 'EventStream') } },
            },
            '202': ref('responses', 'Accepted'),
            ...errors(...CALL_ERRORS),
          },
        },
      },
      ...toolPaths,
      '/v1/manifest': { get: get('manifest', 'Discovery', '/v1/manifest', { '200': publicOk('Tiers and prices.') }, { security: [] }) },
      '/jobs': {
        get: get('listJobs', 'Jobs', '/jobs', { '200': ok("The key's calls, newest first.", ref('schemas', 'JobList')), ...errors('400') }, {
          description: "The calling key's stored calls, newest first (kept JOB_RESULT_DAYS).",
          parameters: Object.entries((fromZod(JobListQuery).properties ?? {}) as Record<string, Json>).map(([name, schema]) => ({ name, in: 'query', required: false, schema })),
        }),
      },
      '/jobs/{id}': {
        parameters: [ref('parameters', 'JobId')],
        get: get('getJob', 'Jobs', '/jobs/{id}', { '200': ok('Status, or the finished body.', ref('schemas', 'JobStatus')), ...errors('404') }),
        delete: {
          operationId: 'cancelJob',
          tags: ['Jobs'],
          summary: '/jobs/{id}',
          description: ENDPOINTS['DELETE /jobs/{id}'],
          responses: {
            '200': ok('Cancelled: {job_id, status: "cancelled", cancelled: true}; a chain or parallel root also gives mode, steps (each completed, failed or cancelled, with cost_cents) and cost_cents (what its finished steps were charged).', open),
            ...errors('404'),
            '409': errorResponse(409, 'job_finished: the job had already completed (charged; details: status, cost_cents) or failed, so nothing was cancelled. (cancelled is what GET /jobs/{id} and a waiting caller get for a cancelled job.)'),
          },
        },
      },
      '/jobs/{id}/events': {
        parameters: [ref('parameters', 'JobId')],
        get: get(
          'jobEvents',
          'Jobs',
          '/jobs/{id}/events',
          {
            '200': { description: 'Server-Sent Events.', headers: { ...REQUEST_ID_HEADER, 'X-Job-Id': ref('headers', 'X-Job-Id') }, content: { 'text/event-stream': { schema: ref('schemas', 'EventStream') } } },
            '204': { description: 'The stream had already ended (Last-Event-ID at its end).' },
            ...errors('404'),
          },
          { parameters: [ref('parameters', 'Last-Event-ID')] },
        ),
      },
      '/balance': { get: get('balance', 'Account', '/balance', { '200': ok('Credits, plan and use.', ref('schemas', 'Balance')) }) },
      '/webhooks/secret': {
        get: get('getWebhookSecret', 'Account', '/webhooks/secret', { '200': ok('The secret (created on first use).', ref('schemas', 'WebhookSecret')), ...errors('403') }, {
          description: "The account's webhook signing secret, created on first use. The account's production key only: sub-keys and sandbox keys get 403.",
        }),
        post: {
          ...get('rollWebhookSecret', 'Account', '/webhooks/secret', { '200': ok('The new secret.', ref('schemas', 'WebhookSecret')), ...errors('403') }),
          description: 'Replaces the secret; deliveries from now on (retries too) are signed with the new one. Production key only.',
        },
      },
      '/subkeys': {
        get: get('listSubKeys', 'Sub-keys', '/subkeys', {
          '200': ok('Sub-keys with this month\u2019s use.', { type: 'object', properties: { subkeys: { type: 'array', items: ref('schemas', 'SubKey') } } }),
          ...errors('403'),
        }),
      },
      '/subkeys/create': {
        post: {
          operationId: 'createSubKey',
          tags: ['Sub-keys'],
          summary: ENDPOINTS['POST /subkeys/create'],
          requestBody: { required: true, content: json(ref('schemas', 'CreateSubKey')) },
          responses: { '201': ok('The new sub-key (api_key shown once).', ref('schemas', 'SubKey')), ...errors('400', '403') },
        },
      },
      '/subkeys/{key_id}': {
        delete: {
          operationId: 'revokeSubKey',
          tags: ['Sub-keys'],
          summary: ENDPOINTS['DELETE /subkeys/{key_id}'],
          parameters: [{ name: 'key_id', in: 'path', required: true, schema: { type: 'string', format: 'uuid' } }],
          responses: {
            '200': ok('Revoked.', { type: 'object', properties: { key_id: { type: 'string' }, revoked: { type: 'boolean', const: true } } }),
            ...errors('403', '404'),
          },
        },
      },
      '/usage': {
        get: get('getUsage', 'Account', '/usage', { '200': ok("The month's usage from the ledger.", ref('schemas', 'Usage')), ...errors('400') }, {
          parameters: Object.entries((fromZod(UsageQuery).properties ?? {}) as Record<string, Json>).map(([name, schema]) => ({ name, in: 'query', required: false, schema })),
        }),
      },
      '/usage/entries': {
        get: get('listUsageEntries', 'Account', '/usage/entries', { '200': ok('Ledger lines, newest first.', ref('schemas', 'LedgerEntryList')), ...errors('400') }, {
          parameters: Object.entries((fromZod(EntriesQuery).properties ?? {}) as Record<string, Json>).map(([name, schema]) => ({ name, in: 'query', required: false, schema })),
        }),
      },
      '/keys': {
        get: get('listKeys', 'Keys', '/keys', {
          '200': ok("The account's keys (no secrets).", { type: 'object', properties: { keys: { type: 'array', items: ref('schemas', 'ApiKeyInfo') } } }),
          ...errors('403'),
        }),
      },
      '/keys/{key_id}/rotate': {
        post: {
          operationId: 'rotateKey',
          tags: ['Keys'],
          summary: ENDPOINTS['POST /keys/{key_id}/rotate'],
          description:
            'Only the production key rotates (agent, VIP, sandbox and sub-keys: 403 forbidden; a rotated key in its grace: 403 key_in_grace). ' +
            'Production, agent, VIP and sandbox keys of the account can be rotated (a sub-key: 403, replace it through /subkeys). ' +
            'The new key has the same type and name and is shown once; the old one stops at `replaces.expires_at` on every replica, ' +
            'and until then only calls tools and reads its own jobs. A key of another account: 404. A key already rotated, revoked or expired: 409 key_not_active.',
          parameters: [{ name: 'key_id', in: 'path', required: true, schema: { type: 'string', format: 'uuid' } }],
          responses: { '201': ok('The replacement (api_key shown once).', ref('schemas', 'RotatedKey')), ...errors('400', '403', '404', '409') },
        },
      },
      '/keys/{key_id}': {
        delete: {
          operationId: 'revokeKey',
          tags: ['Keys'],
          summary: ENDPOINTS['DELETE /keys/{key_id}'],
          description:
            'Revokes any key of the account at once, a rotated key in its grace included; every replica refuses it within milliseconds. ' +
            'After a leak: rotate the key, then revoke the old one with its replacement. A key cannot revoke itself (403). ' +
            'Revoking a revoked key answers its first revocation. A key of another account: 404.',
          parameters: [{ name: 'key_id', in: 'path', required: true, schema: { type: 'string', format: 'uuid' } }],
          responses: {
            '200': ok('The key is revoked.', {
              type: 'object',
              required: ['key_id', 'type', 'revoked', 'revoked_at'],
              properties: {
                key_id: { type: 'string', format: 'uuid' },
                type: { type: 'string', enum: ['production', 'sub', 'test', 'agent', 'vip'] },
                revoked: { type: 'boolean', const: true },
                revoked_at: { type: 'string', format: 'date-time' },
              },
            }),
            ...errors('400', '403', '404'),
          },
        },
      },
      '/credits/topup': {
        post: {
          operationId: 'topUp',
          tags: ['Account'],
          summary: ENDPOINTS['POST /credits/topup'],
          description:
            'Buys credits with an x402 payment (USDC, scheme exact). With a production or agent key (sub-keys and sandbox keys: 403). ' +
            'Without a payment header the answer is 402 with the exact amount (v1 body, v2 PAYMENT-REQUIRED header); repeat the request ' +
            'with the signed payment in PAYMENT-SIGNATURE (v2) or X-Payment (v1). Credits are added only once the payment has settled, once per payment. ' +
            '503 `topup_unavailable` when x402 is not configured with a facilitator or self-settlement.',
          security: x402 ? [...AUTH, { x402Payment: [] }, { x402PaymentV1: [] }] : AUTH,
          requestBody: { required: true, content: json(ref('schemas', 'TopupRequest')) },
          responses: {
            '200': ok('Settled and credited.', ref('schemas', 'Topup'), {
              headers: { 'PAYMENT-RESPONSE': ref('headers', 'PAYMENT-RESPONSE'), 'X-Payment-Response': ref('headers', 'X-Payment-Response') },
            }),
            ...errors('400', '402', '403'),
          },
        },
      },
      '/subscribe': {
        get: get(
          'subscribe',
          'Account',
          '/subscribe',
          {
            '200': {
              description: 'The plans and how to sign up (HTML unless Accept asks for application/json). A known code is said to be recorded, without naming its partner; an unknown code still answers 200, saying so.',
              headers: REQUEST_ID_HEADER,
              content: { 'text/html': { schema: { type: 'string' } }, ...json(ref('schemas', 'SubscribePage')) },
            },
            '400': ref('responses', 'BadRequest'),
            '429': ref('responses', 'TooManyRequests'),
          },
          { security: [], parameters: [{ name: 'attribution_code', in: 'query', required: false, schema: { type: 'string', maxLength: 100 }, description: 'A partner\u2019s code.' }] },
        ),
      },
      '/signup': {
        post: {
          operationId: 'signUp',
          tags: ['Account'],
          summary: ENDPOINTS['POST /signup'],
          description: 'Creates a free account with its production key (shown once), recording the partner referral. Every sign-up is a new account: an email used before is not refused, so the answer tells nothing about other accounts. Only with SIGNUP_ENABLED (else 404); limited per client address (SIGNUP_PER_HOUR, 429 with Retry-After).',
          security: [],
          requestBody: { required: true, content: json(ref('schemas', 'SignupRequest')) },
          responses: {
            '201': ok('The new account and its key.', ref('schemas', 'Signup'), { auth: false }),
            ...Object.fromEntries(Object.entries(errors('400', '404')).filter(([s]) => s !== '401')),
          },
        },
      },
      '/mcp': {
        post: {
          operationId: 'mcp',
          tags: ['MCP'],
          summary: 'Model Context Protocol (Streamable HTTP, stateless)',
          description: `${ENDPOINTS['POST /mcp']}. Browser origins must be the service's own or listed in MCP_ALLOWED_ORIGINS.`,
          parameters: [
            ref('parameters', 'Idempotency-Key'),
            ref('parameters', 'X-Edge-Token'),
            { name: 'Mcp-Protocol-Version', in: 'header', required: false, schema: { type: 'string' } },
          ],
          requestBody: { required: true, content: json(ref('schemas', 'JsonRpc')) },
          responses: {
            '200': {
              ...ok('JSON-RPC answer (JSON, or SSE when a tools/call asks for progress).', ref('schemas', 'JsonRpc')),
              content: { ...json(ref('schemas', 'JsonRpc')), 'text/event-stream': { schema: ref('schemas', 'EventStream') } },
            },
            '400': { description: 'JSON-RPC parse error or invalid request.', content: json(ref('schemas', 'JsonRpc')) },
            ...errors('403'),
          },
        },
      },
      '/v1/models': {
        get: get('listModels', 'OpenAI', '/v1/models', {
          '200': ok('Models your plan may call.', { type: 'object', properties: { object: { const: 'list' }, data: { type: 'array', items: ref('schemas', 'Model') } } }),
          ...chatErrors,
        }),
      },
      '/v1/models/{model}': {
        get: get('getModel', 'OpenAI', '/v1/models/{model}', { '200': ok('One model.', ref('schemas', 'Model')), ...chatErrors }, {
          parameters: [{ name: 'model', in: 'path', required: true, schema: { type: 'string', enum: [...llmChatModels.keys()] } }],
        }),
      },
      '/v1/chat/completions': {
        post: {
          operationId: 'chatCompletions',
          tags: ['OpenAI'],
          summary: 'OpenAI-compatible chat completions',
          description: ENDPOINTS['POST /v1/chat/completions'],
          parameters: [ref('parameters', 'Idempotency-Key')],
          requestBody: {
            required: true,
            content: json(ref('schemas', 'ChatCompletionRequest'), { examples: Object.fromEntries(CHAT_REQUEST_EXAMPLES.map((value, i) => [`example${i + 1}`, { value }])) }),
          },
          responses: {
            '200': {
              ...ok('chat.completion, or chat.completion.chunk events with stream: true.', ref('schemas', 'ChatCompletion'), { headers: { 'X-Job-Id': ref('headers', 'X-Job-Id') } }),
              content: { ...json(ref('schemas', 'ChatCompletion')), 'text/event-stream': { schema: ref('schemas', 'EventStream') } },
            },
            ...chatErrors,
          },
        },
      },
    },
  };
}
