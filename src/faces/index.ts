/**
 * faces/: the ways in. HTTP routes (http/), the MCP server (mcp/), the OpenAI-compatible chat API
 * (openai.ts) and Server-Sent Events (sse.ts). Adapters that only translate: a request becomes a call
 * for calls/, an answer or an error becomes the face's own shape. Every route states its schema
 * (http/route-schema.ts) and GET /openapi.json is generated from them (http/openapi.ts).
 *
 * This file installs the HTTP plugins and registers every route, in order.
 */
import type { FastifyInstance } from 'fastify';
import { installErrorHandling } from './http/plugins/errors.js';
import { installJsonBodyParser } from './http/plugins/json-body.js';
import { installInputGuard } from './http/plugins/input-guard.js';
import { installTracing } from './http/plugins/tracing.js';
import { metaRoutes } from './http/meta.js';
import { metricsRoutes } from './http/metrics.js';
import { dashboardRoutes } from '../ops/dashboard.js';
import { callRoutes } from './http/calls.js';
import { rootRoutes } from './http/root.js';
import { streamRoutes } from './http/stream.js';
import { subkeyRoutes } from './http/subkeys.js';
import { usageRoutes } from './http/usage.js';
import { keyRoutes } from './http/keys.js';
import { toolSetRoutes } from './http/toolsets.js';
import { mcpRoutes } from './mcp/routes.js';
import { paidMcpRoutes } from './mcp/paid.js';
import { openAiRoutes } from './openai.js';
import { installCors, openApiRoutes, recordRoutes } from './http/openapi.js';
import { webhookRoutes } from './http/webhooks.js';
import { alertRoutes } from './http/alerts.js';
import { creditRoutes } from './http/credits.js';
import { cardPaymentRoutes } from './http/card-payments.js';
import { signupRoutes } from './http/signup.js';
import { oauthRoutes } from './http/oauth.js';
import { adminApiRoutes } from './http/admin-api.js';

export async function registerFaces(app: FastifyInstance): Promise<void> {
  const { config } = app.container;
  // Every route from here on states its schema; GET /openapi.json is generated from them.
  recordRoutes(app);
  // A span per request and the W3C traceparent in and out, while tracing is on (src/tracing.ts).
  installTracing(app);
  installErrorHandling(app);
  installJsonBodyParser(app, config.MAX_JSON_DEPTH);
  // U+0000 and unpaired surrogates in a path, query or header: 400 at the door (bodies: the parser above).
  installInputGuard(app);
  // CORS for every route but /mcp (which has its own origin check): before the routes, so it covers them.
  await installCors(app, config);
  await app.register(metaRoutes);
  await app.register(metricsRoutes);
  // The queue dashboard at /admin/queues, only with ADMIN_TOKEN (its own auth, no API key, no rate limit).
  await app.register(dashboardRoutes);
  // The admin API under /admin/v1 (ADMIN_TOKEN as a bearer; 404 without it), the admin CLI's service over HTTP.
  await app.register(adminApiRoutes);
  await app.register(callRoutes);
  await app.register(rootRoutes);
  await app.register(streamRoutes);
  await app.register(subkeyRoutes);
  await app.register(usageRoutes);
  await app.register(keyRoutes);
  await app.register(toolSetRoutes);
  await app.register(mcpRoutes);
  // x402 pay-per-call over MCP: its own plugin (no key, so none of /mcp's authentication hook).
  await app.register(paidMcpRoutes);
  await app.register(openAiRoutes);
  await app.register(openApiRoutes);
  await app.register(webhookRoutes);
  await app.register(alertRoutes);
  await app.register(creditRoutes);
  await app.register(cardPaymentRoutes);
  await app.register(signupRoutes);
  await app.register(oauthRoutes);
}
