/**
 * How a route states what it takes and answers. Every route passes `schema` (a RouteSchema): zod
 * schemas for its params, query, headers and body, and its responses. GET /openapi.json is generated
 * from these declarations (openapi.ts), the handler reads its input through `input()`, which parses
 * with the very schema the route declared, and the type provider types `req.params`, `req.query` and
 * `req.body` from them. One place for the three.
 *
 * Input is parsed in the handler, not by Fastify before it: a request is authenticated first (401
 * whatever its body, and the key's rate-limit hit is counted once, by admission), then its input is
 * checked (400 invalid_input naming each failing field). Responses are sent as JSON.stringify makes
 * them; their schemas describe, they never strip.
 */
import type { FastifyInstance, FastifyRequest, FastifySchema } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import type { ZodTypeAny, z } from 'zod';
import { parseOrThrow } from '../../errors.js';

/**
 * Who may call: an API key (the default), anyone, a key or an x402 payment, a key and an x402 payment
 * (top-ups), the metrics or the admin token.
 */
export type Security = 'key' | 'none' | 'key-or-x402' | 'key-and-x402' | 'metrics' | 'admin';

/** Tags of the reference, in its order. */
export const TAGS = ['Discovery', 'Tools', 'Protocol', 'Jobs', 'Account', 'Keys', 'Sub-keys', 'MCP', 'OpenAI', 'Operators'] as const;
export type Tag = (typeof TAGS)[number];

/** Response headers the reference defines once (components.headers). */
export const HEADER_NAMES = [
  'X-RateLimit-Limit',
  'X-RateLimit-Remaining',
  'X-RateLimit-Reset',
  'Retry-After',
  'X-Request-Id',
  'X-Job-Id',
  'Location',
  'Idempotent-Replayed',
  'X-Payment-Required',
  'X-Payment-Amount',
  'X-Payment-Currency',
  'X-Payment-Network',
  'X-Payment-Response',
  'PAYMENT-REQUIRED',
  'PAYMENT-RESPONSE',
] as const;
export type HeaderName = (typeof HEADER_NAMES)[number];

/** Request headers the reference defines once (components.parameters). */
export type ParameterName = 'Idempotency-Key' | 'Prefer' | 'Callback-Url' | 'X-Edge-Token' | 'Last-Event-ID';

/** Shared error responses (components.responses), by status. */
export const ERROR_RESPONSES = {
  '400': 'BadRequest',
  '401': 'Unauthorized',
  '402': 'PaymentRequired',
  '403': 'Forbidden',
  '404': 'NotFound',
  '409': 'Conflict',
  '410': 'Gone',
  '413': 'PayloadTooLarge',
  '415': 'UnsupportedMediaType',
  '422': 'Unprocessable',
  '429': 'TooManyRequests',
  '500': 'InternalError',
  '502': 'UpstreamError',
  '503': 'ServiceUnavailable',
  '504': 'Timeout',
} as const;
export type ErrorStatus = keyof typeof ERROR_RESPONSES;

export interface Example {
  summary?: string;
  value: unknown;
}

/** One response: OpenAPI's shape, with zod schemas (or a JSON Schema, for non-JSON media) as content. */
export interface ResponseDoc {
  description: string;
  /** Component headers this response sends (X-Request-Id always, rate-limit headers on keyed routes). */
  headers?: HeaderName[];
  content?: Record<string, { schema: ZodTypeAny | JsonSchema; examples?: Record<string, Example> }>;
}
export interface ResponseRef {
  $ref: string;
}
export type JsonSchema = { [k: string]: unknown };

export interface RouteSchema extends FastifySchema {
  operationId: string;
  tags: [Tag];
  summary: string;
  description?: string;
  /** Default 'key'. */
  security?: Security;
  /** Shared request headers this route reads. */
  parameters?: ParameterName[];
  params?: ZodTypeAny;
  querystring?: ZodTypeAny;
  body?: ZodTypeAny;
  /** Media type of the body, when not application/json. */
  bodyMediaType?: string;
  bodyExamples?: Record<string, Example>;
  response: Record<string, ResponseDoc | ResponseRef>;
  /** Left out of the reference, with the reason (third-party assets, CORS preflight). */
  hide?: string;
}

/** Named schemas: a response or body that is one of these is a `$ref` to components.schemas. */
const names = new Map<string, ZodTypeAny>();

/** Registers `schema` as components.schemas[name]; returns it unchanged. */
export function named<S extends ZodTypeAny>(name: string, schema: S): S {
  const had = names.get(name);
  if (had && had !== schema) throw new Error(`two schemas are named ${name}`);
  names.set(name, schema);
  return schema;
}

export function namedSchemas(): ReadonlyMap<string, ZodTypeAny> {
  return names;
}

/** A JSON response. */
export function ok(
  schema: ZodTypeAny | JsonSchema,
  description: string,
  opts: { headers?: HeaderName[]; examples?: Record<string, Example>; eventStream?: boolean } = {},
): ResponseDoc {
  return {
    description,
    ...(opts.headers ? { headers: opts.headers } : {}),
    content: {
      'application/json': { schema, ...(opts.examples ? { examples: opts.examples } : {}) },
      ...(opts.eventStream ? { 'text/event-stream': { schema: { $ref: '#/components/schemas/EventStream' } } } : {}),
    },
  };
}

/** A response of another media type (text/html, text/markdown, application/gzip, ...). */
export function media(type: string, description: string, schema: JsonSchema = { type: 'string' }): ResponseDoc {
  return { description, content: { [type]: { schema } } };
}

/** A response without a body. */
export function empty(description: string, headers?: HeaderName[]): ResponseDoc {
  return { description, ...(headers ? { headers } : {}) };
}

/**
 * The shared error responses a route can answer: 401, 429, 500 and 503 on every keyed route, and
 * `extra`. A public route passes `{ keyed: false }`.
 */
export function errors(extra: ErrorStatus[] = [], opts: { keyed?: boolean } = {}): Record<string, ResponseRef> {
  const codes = new Set<ErrorStatus>([...(opts.keyed === false ? [] : (['401', '429'] as const)), '500', '503', ...extra]);
  return Object.fromEntries(
    (Object.keys(ERROR_RESPONSES) as ErrorStatus[]).filter((c) => codes.has(c)).map((c) => [c, { $ref: `#/components/responses/${ERROR_RESPONSES[c]}` }]),
  );
}

type Part = 'params' | 'querystring' | 'body';

/**
 * The request's `part`, parsed with the schema its route declared (400 invalid_input naming each
 * failing field, prefixed with `what`). Call it after authenticating.
 */
export function input<S extends ZodTypeAny>(req: FastifyRequest, part: Part, what?: string): z.output<S> {
  const schema = (req.routeOptions.schema as RouteSchema | undefined)?.[part];
  if (!schema) throw new Error(`${req.method} ${req.routeOptions.url} declares no ${part} schema`);
  const value = part === 'querystring' ? (req.query ?? {}) : part === 'params' ? req.params : req.body;
  return parseOrThrow(schema as S, value, what);
}

/** The app as routes use it: request parts typed from the route's zod schemas. */
export function typed(app: FastifyInstance) {
  return app.withTypeProvider<ZodTypeProvider>();
}
