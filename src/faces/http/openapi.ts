import type { FastifyInstance, RouteOptions } from 'fastify';
import cors from '@fastify/cors';
import type { ZodTypeAny, ZodTypeDef } from 'zod';
import { ignoreOverride, zodToJsonSchema } from 'zod-to-json-schema';
import type { Config } from '../../config.js';
import { TOOLS } from '../../tools/index.js';
import type { AnyTool } from '../../tools/types.js';
import { API_VERSION, inputJsonSchema, outputJsonSchema } from '../../calls/catalogue.js';
import { baseUrl } from './meta.js';
import { HEADERS, EVENT_STREAM, parameters, responses, securitySchemes } from './openapi-components.js';
import {
  ERROR_RESPONSES,
  HEADER_NAMES,
  TAGS,
  namedSchemas,
  type JsonSchema,
  type ResponseDoc,
  type ResponseRef,
  type RouteSchema,
  type Security,
} from './route-schema.js';

/**
 * GET /openapi.json, generated from the routes: every route Fastify registers states its schema
 * (route-schema.ts), and this walks them. Tools' per-tool paths (/tools/compute, ...) come from the
 * registry: each tool's input and output schemas, examples and price. Routes that third-party plugins
 * register (the reference page, the queue dashboard) get their description here, by method and path.
 */

type Json = Record<string, unknown>;

/** Routes registered by plugins that take no schema of ours: described here, or left out with the reason. */
const THIRD_PARTY: Record<string, Omit<RouteSchema, 'response'> & { response?: RouteSchema['response'] }> = {
  'GET /docs': {
    operationId: 'reference',
    tags: ['Discovery'],
    summary: 'The interactive API reference (this document, rendered)',
    security: 'none',
    response: { '200': { description: 'HTML page.', content: { 'text/html': { schema: { type: 'string' } } } } },
  },
  'GET /docs/': { operationId: 'referenceSlash', tags: ['Discovery'], summary: 'The reference page', hide: 'the same page as GET /docs' },
  'GET /docs/js/scalar.js': {
    operationId: 'referenceScript',
    tags: ['Discovery'],
    summary: 'The reference page script',
    hide: "the reference page's own script",
  },
  'GET /docs/openapi.json': {
    operationId: 'referenceDocument',
    tags: ['Discovery'],
    summary: 'The document',
    hide: "the reference plugin's copy of GET /openapi.json",
  },
  'GET /docs/openapi.yaml': {
    operationId: 'referenceDocumentYaml',
    tags: ['Discovery'],
    summary: 'The document',
    hide: "the reference plugin's YAML copy of GET /openapi.json",
  },
  'OPTIONS *': { operationId: 'preflight', tags: ['Discovery'], summary: 'CORS preflight', hide: 'CORS preflight for every route (see CORS_ALLOWED_HEADERS)' },
};
const DASHBOARD_PREFIX = '/admin/queues';

const routeTables = new WeakMap<object, RouteOptions[]>();

/**
 * Records every route registered on `app` from now on (call it before registering any). A route
 * without a schema is registered anyway and fails the document's test.
 */
export function recordRoutes(app: FastifyInstance): void {
  const table: RouteOptions[] = [];
  routeTables.set(app.server, table);
  // Input is parsed in handlers, after authentication (route-schema.ts); answers are sent as they are.
  app.setValidatorCompiler(() => (data) => ({ value: data }));
  app.setSerializerCompiler(() => (data) => JSON.stringify(data));
  app.addHook('onRoute', (route) => {
    const methods = ([] as string[]).concat(route.method);
    if (methods.every((m) => m === 'HEAD')) return; // Fastify's HEAD twin of each GET
    const key = `${methods[0]} ${route.url}`;
    // Plugins' own routes come without a schema of ours (some with `{ hide: true }` for other generators).
    if (!(route.schema as RouteSchema | undefined)?.operationId) {
      const known = THIRD_PARTY[key];
      if (known) route.schema = { response: {}, ...known } as RouteSchema;
      else if (route.url.startsWith(DASHBOARD_PREFIX))
        route.schema = (
          route.url === `${DASHBOARD_PREFIX}/`
            ? {
                operationId: 'queueDashboard',
                tags: ['Operators'],
                summary: 'The queue dashboard (Bull Board), with ADMIN_TOKEN',
                security: 'admin',
                response: { '200': { description: 'HTML page.', content: { 'text/html': { schema: { type: 'string' } } } } },
              }
            : {
                operationId: `dashboard${table.length}`,
                tags: ['Operators'],
                summary: 'Queue dashboard internals',
                response: {},
                hide: "the dashboard page's own API and assets",
              }
        ) as RouteSchema;
    }
    table.push(route);
  });
}

/** The routes recorded for `app` (every route of the server it belongs to). */
export function recordedRoutes(app: FastifyInstance): readonly RouteOptions[] {
  return routeTables.get(app.server) ?? [];
}

const AUTH = [{ bearerAuth: [] }];

function securityFor(security: Security | undefined, x402: boolean): Json[] {
  switch (security ?? 'key') {
    case 'none':
      return [];
    case 'key-or-x402':
      return x402 ? [...AUTH, { x402Payment: [] }, { x402PaymentV1: [] }] : AUTH;
    case 'key-and-x402':
      return x402
        ? [
            { bearerAuth: [], x402Payment: [] },
            { bearerAuth: [], x402PaymentV1: [] },
          ]
        : AUTH;
    case 'metrics':
      return [{ metricsToken: [] }];
    case 'admin':
      return [{ adminToken: [] }];
    default:
      return AUTH;
  }
}

/**
 * Converts zod to JSON Schema. A schema named in route-schema.ts becomes a `$ref` to
 * components.schemas wherever it appears; everything else is written inline (a schema used twice is
 * written twice, so no pointer ever leads into another schema's insides).
 */
function converter() {
  const byDef = new Map<ZodTypeDef, string>([...namedSchemas()].map(([name, schema]) => [schema._def, name]));
  const toJson = (schema: ZodTypeAny, self?: string): Json => {
    const { $schema: _s, ...rest } = zodToJsonSchema(schema, {
      target: 'jsonSchema7',
      $refStrategy: 'none',
      override: (def, refs) => {
        const name = byDef.get(def);
        // A named schema is a reference, except at the top of its own definition.
        if (name && !(name === self && refs.currentPath.length <= 1)) return { $ref: `#/components/schemas/${name}` };
        return ignoreOverride;
      },
    }) as Json;
    return rest;
  };
  const convert = (schema: ZodTypeAny | JsonSchema): Json => (isZod(schema) ? toJson(schema) : schema);
  const components = () => Object.fromEntries([...namedSchemas()].map(([name, schema]) => [name, toJson(schema, name)]));
  return { convert, components };
}

function isZod(s: unknown): s is ZodTypeAny {
  return typeof s === 'object' && s !== null && typeof (s as { safeParse?: unknown }).safeParse === 'function';
}

function parametersOf(schema: ZodTypeAny | undefined, where: 'path' | 'query', convert: (s: ZodTypeAny) => Json): Json[] {
  if (!schema) return [];
  const json = convert(schema);
  const props = (json.properties ?? {}) as Record<string, Json>;
  const required = new Set((json.required ?? []) as string[]);
  return Object.entries(props).map(([name, s]) => {
    const { description, ...rest } = s;
    return { name, in: where, required: where === 'path' || required.has(name), ...(description ? { description } : {}), schema: rest };
  });
}

function responsesOf(response: Record<string, ResponseDoc | ResponseRef>, convert: (s: ZodTypeAny | JsonSchema) => Json): Json {
  const out: Json = {};
  for (const [status, r] of Object.entries(response)) {
    if ('$ref' in r) {
      out[status] = r;
      continue;
    }
    const headers = Object.fromEntries(['X-Request-Id', ...(r.headers ?? [])].map((h) => [h, { $ref: `#/components/headers/${h}` }]));
    out[status] = {
      description: r.description,
      headers,
      ...(r.content
        ? {
            content: Object.fromEntries(
              Object.entries(r.content).map(([type, c]) => [type, { schema: convert(c.schema), ...(c.examples ? { examples: c.examples } : {}) }]),
            ),
          }
        : {}),
    };
  }
  return out;
}

/**
 * A sample value of a JSON Schema, for the reference's response samples: a schema's own example,
 * default, const or first enum value where it has one, else a value of its type.
 */
export function sampleOf(schema: unknown, depth = 0): unknown {
  if (!schema || typeof schema !== 'object' || depth > 6) return null;
  const s = schema as Json;
  if (Array.isArray(s.examples) && s.examples.length) return s.examples[0];
  if ('default' in s) return s.default;
  if ('const' in s) return s.const;
  if (Array.isArray(s.enum) && s.enum.length) return s.enum[0];
  for (const k of ['anyOf', 'oneOf'] as const) {
    const options = s[k] as Json[] | undefined;
    if (options?.length) return sampleOf(options.find((o) => o.type !== 'null') ?? options[0], depth + 1);
  }
  if (Array.isArray(s.allOf)) return Object.assign({}, ...s.allOf.map((p) => sampleOf(p, depth + 1)).filter((v) => v && typeof v === 'object'));
  const type = Array.isArray(s.type) ? (s.type as string[]).find((t) => t !== 'null') : (s.type as string | undefined);
  switch (type ?? (s.properties ? 'object' : undefined)) {
    case 'object': {
      const props = (s.properties ?? {}) as Record<string, unknown>;
      return Object.fromEntries(Object.entries(props).map(([k, v]) => [k, sampleOf(v, depth + 1)]));
    }
    case 'array':
      return s.items ? [sampleOf(s.items, depth + 1)] : [];
    case 'integer':
    case 'number':
      return typeof s.minimum === 'number' ? s.minimum : typeof s.exclusiveMinimum === 'number' ? s.exclusiveMinimum + 1 : 0;
    case 'boolean':
      return true;
    case 'string':
      return s.format === 'date-time'
        ? '2026-01-01T00:00:00.000Z'
        : s.format === 'uri'
          ? 'https://example.com/'
          : s.format === 'uuid'
            ? '00000000-0000-4000-8000-000000000000'
            : s.format === 'date'
              ? '2026-01-01'
              : 'string';
    default:
      return null;
  }
}

const openApiPath = (url: string) => url.replace(/:([A-Za-z0-9_]+)/g, '{$1}');

/** One operation per tool: its input schema and examples, its result's schema, its price. */
function toolOperation(tool: AnyTool, x402: boolean): Json {
  const examples = Object.fromEntries(tool.examples.map((value, i) => [`example${i + 1}`, { value }]));
  // Tools with side effects are never sold per call (src/faces/http/paid-calls.ts): a key only.
  const payable = x402 && tool.priceCents > 0 && !tool.sideEffects;
  const output = outputJsonSchema(tool);
  const result = output
    ? { allOf: [{ $ref: '#/components/schemas/CallResult' }, { type: 'object', properties: { result: output } }] }
    : { $ref: '#/components/schemas/CallResult' };
  const headers = Object.fromEntries(
    [
      'X-Request-Id',
      'X-RateLimit-Limit',
      'X-RateLimit-Remaining',
      'X-RateLimit-Reset',
      'X-Job-Id',
      'Idempotent-Replayed',
      ...(payable ? ['PAYMENT-RESPONSE', 'X-Payment-Response'] : []),
    ].map((h) => [h, { $ref: `#/components/headers/${h}` }]),
  );
  return {
    operationId: `callTool_${tool.name}`,
    tags: ['Tools'],
    summary: `${tool.name} (${(tool.priceCents / 100).toFixed(2)} USD, ${tool.tier} plan)`,
    description:
      `${tool.description}\n\nTier: ${tool.tier}. Price: ${tool.priceCents} cents per successful call. Family: ${tool.family}. ` +
      `Result: ${tool.output}.` +
      (tool.sideEffects ? ' Changes things outside the service (sandbox keys get a dry run).' : '') +
      (tool.needsEdgeToken ? ' Needs the caller\u2019s edge-network token in X-Edge-Token (or `edge_token` in the body).' : '') +
      ` The root protocol's \`q\` fills \`${tool.qField}\`. Without Prefer the call waits for its answer; ` +
      '`Prefer: respond-async` answers 202 at once.',
    security: payable ? [...AUTH, { x402Payment: [] }, { x402PaymentV1: [] }] : AUTH,
    parameters: [
      { $ref: '#/components/parameters/Idempotency-Key' },
      { $ref: '#/components/parameters/Prefer' },
      { $ref: '#/components/parameters/Callback-Url' },
      ...(tool.needsEdgeToken ? [{ $ref: '#/components/parameters/X-Edge-Token' }] : []),
    ],
    requestBody: { required: true, content: { 'application/json': { schema: inputJsonSchema(tool), examples } } },
    responses: {
      '200': {
        description: 'The call ran and was charged.',
        headers,
        content: {
          'application/json': {
            schema: result,
            // The answer of a synchronous call with a key (no Prefer): the tool's price, the result's shape.
            examples: {
              sync: {
                summary: "The shape of a synchronous call's answer (no Prefer header): the tool's price, values from its result schema",
                value: { result: output ? sampleOf(output) : null, cost_cents: tool.priceCents, remaining_credits: 4998 },
              },
            },
          },
          'text/event-stream': { schema: { $ref: '#/components/schemas/EventStream' } },
        },
      },
      '202': { $ref: '#/components/responses/Accepted' },
      ...Object.fromEntries(
        (['400', '401', '402', '403', '404', '409', '413', '415', '422', '429', '500', '502', '503', '504'] as const).map((c) => [
          c,
          { $ref: `#/components/responses/${ERROR_RESPONSES[c]}` },
        ]),
      ),
    },
  };
}

/** The whole document for `base`, from the routes recorded on `app`. */
export function openApiDocument(app: FastifyInstance, base: string, config: Config): Json {
  const x402 = config.X402_ENABLED;
  const { convert, components } = converter();
  const paths: Record<string, Json> = {};
  for (const route of recordedRoutes(app)) {
    const schema = route.schema as RouteSchema | undefined;
    if (!schema || schema.hide) continue;
    const path = openApiPath(route.url);
    for (const method of ([] as string[]).concat(route.method)) {
      if (method === 'HEAD') continue;
      const body = schema.body
        ? {
            requestBody: {
              required: true,
              content: {
                [schema.bodyMediaType ?? 'application/json']: {
                  schema: convert(schema.body),
                  ...(schema.bodyExamples ? { examples: schema.bodyExamples } : {}),
                },
              },
            },
          }
        : {};
      (paths[path] ??= {})[method.toLowerCase()] = {
        operationId: schema.operationId,
        tags: schema.tags,
        summary: schema.summary,
        ...(schema.description ? { description: schema.description } : {}),
        security: securityFor(schema.security, x402),
        parameters: [
          ...parametersOf(schema.params, 'path', convert),
          ...parametersOf(schema.querystring, 'query', convert),
          ...(schema.parameters ?? []).map((p) => ({ $ref: `#/components/parameters/${p}` })),
        ],
        ...body,
        responses: responsesOf(schema.response, convert),
      };
    }
  }
  for (const tool of TOOLS) paths[`/tools/${tool.name}`] = { post: toolOperation(tool, x402) };

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
    tags: TAGS.map((name) => ({ name })),
    components: {
      securitySchemes: securitySchemes(config),
      headers: HEADERS,
      parameters: parameters(),
      schemas: { ...components(), EventStream: EVENT_STREAM },
      responses: responses(),
    },
    paths,
  };
}

/** GET /openapi.json: the OpenAPI 3.1 document (no key needed), rebuilt when the base URL changes. */
export async function openApiRoutes(app: FastifyInstance): Promise<void> {
  const { config } = app.container;
  let cached: { key: string; doc: object } | null = null;
  app.get(
    '/openapi.json',
    {
      schema: {
        operationId: 'openApiDocument',
        tags: ['Discovery'],
        summary: 'This document',
        security: 'none',
        response: { '200': { description: 'The OpenAPI 3.1 document.', content: { 'application/json': { schema: { type: 'object' } } } } },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const base = baseUrl(app, req);
      if (cached?.key !== base) cached = { key: base, doc: openApiDocument(app, base, config) };
      return reply.header('cache-control', 'public, max-age=60').send(cached.doc);
    },
  );
}

/** Response headers a browser caller may read: every header the reference describes. */
export const CORS_EXPOSED_HEADERS: string[] = [...HEADER_NAMES];

/** Request headers a browser caller may send. */
export const CORS_ALLOWED_HEADERS = [
  'authorization',
  'content-type',
  'accept',
  'idempotency-key',
  'prefer',
  'x-request-id',
  'x-edge-token',
  'x-payment',
  'payment-signature',
  // @x402/fetch sets it on the paid retry (asking for PAYMENT-RESPONSE); a browser preflights it.
  'access-control-expose-headers',
  'last-event-id',
  'mcp-protocol-version',
  'mcp-session-id',
];

/**
 * CORS for every route but /mcp, which keeps its own origin check (DNS-rebinding protection), CORS
 * headers and OPTIONS route (src/faces/mcp/routes.ts). Keys are bearer tokens, never cookies: no credentials.
 * Register on the root instance (the plugin is not encapsulated).
 */
export async function installCors(app: FastifyInstance, config: Config): Promise<void> {
  const origins = config.CORS_ORIGINS;
  const options = {
    origin: origins.includes('*') ? '*' : origins,
    methods: ['GET', 'HEAD', 'POST', 'DELETE'],
    allowedHeaders: CORS_ALLOWED_HEADERS,
    exposedHeaders: CORS_EXPOSED_HEADERS,
    credentials: false,
    maxAge: 600,
    // An OPTIONS without Origin is answered like a preflight instead of a bare 400.
    strictPreflight: false,
  };
  const isMcp = (url: string | undefined) => url === '/mcp';
  // Fixed options, normalised once (a delegator's are normalised again on every request); the /mcp
  // routes opt out with `config: { cors: false }` (src/faces/mcp/routes.ts).
  await app.register(cors, options);
  // Some answers name their own exposed headers (x402's X-Payment-*): keep the whole list beside them.
  const ours = CORS_EXPOSED_HEADERS.join(', ');
  const known = new Set(CORS_EXPOSED_HEADERS.map((h) => h.toLowerCase()));
  app.addHook('onSend', async (req, reply) => {
    if (isMcp(req.routeOptions.url)) return;
    const current = reply.getHeader('access-control-expose-headers');
    if (current === undefined || current === ours) return;
    const extra = String(current)
      .split(',')
      .map((h) => h.trim())
      .filter((h) => h && !known.has(h.toLowerCase()));
    reply.header('access-control-expose-headers', [ours, ...extra].join(', '));
  });
}
