import type { FastifyInstance } from 'fastify';
import cors from '@fastify/cors';
import type { Config } from '../../config.js';
import { TOOLS } from '../../tools/index.js';
import { openApiDocument } from './openapi-document.js';
import { baseUrl } from './meta.js';

/** GET /openapi.json: the OpenAPI 3.1 document (no key needed), rebuilt when the base URL or the registry changes. */
export async function openApiRoutes(app: FastifyInstance): Promise<void> {
  const { config } = app.container;
  let cached: { key: string; doc: object } | null = null;
  app.get('/openapi.json', async (req, reply) => {
    const base = baseUrl(app, req);
    const key = `${base}\n${TOOLS.length}`;
    if (cached?.key !== key) cached = { key, doc: openApiDocument(base, config) };
    return reply.header('cache-control', 'public, max-age=60').send(cached.doc);
  });
}

/** Response headers a browser caller may read. */
export const CORS_EXPOSED_HEADERS = [
  'X-RateLimit-Limit',
  'X-RateLimit-Remaining',
  'X-RateLimit-Reset',
  'Retry-After',
  'X-Job-Id',
  'X-Request-Id',
  'Idempotent-Replayed',
  'Location',
  'X-Payment-Required',
  'X-Payment-Amount',
  'X-Payment-Currency',
  'X-Payment-Network',
  'X-Payment-Response',
  'PAYMENT-REQUIRED',
  'PAYMENT-RESPONSE',
];

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
