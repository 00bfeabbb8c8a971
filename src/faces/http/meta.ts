import { readFile } from 'node:fs/promises';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import scalarReference from '@scalar/fastify-api-reference';
import { DEFERRED_WARNING } from '../../pay/x402/settler.js';
import { catalogue, rootDocument, toolDetail, manifest } from '../../calls/catalogue.js';
import { getTool } from '../../tools/index.js';
import { PLANS } from '../../tools/types.js';
import { workerCounts } from '../../queue/heartbeat.js';
import { buildClientPackage } from '../../ops/client-package.js';
import { within } from '../../ops/metrics.js';
import { READY_CHECK_MS, readiness } from '../../ops/readiness.js';
import { FAMILIES } from '../../config.js';
import { OpenSchema, ToolNameParams } from './openapi-components.js';
import { errors, input, media, named, ok, type RouteSchema } from './route-schema.js';
import { z } from 'zod';

const HealthSchema = named(
  'Health',
  z
    .object({
      status: z.enum(['ok', 'degraded']),
      checks: z.object({ redis: z.enum(['ok', 'down']), postgres: z.enum(['ok', 'down']) }),
      workers: z.enum(['inline', 'off']).describe("Whether this process runs worker pools ('inline') or none ('off')."),
      worker_counts: z
        .record(z.enum(FAMILIES), z.number().int())
        .nullable()
        .describe('Live worker processes per family, across the deployment (null while Redis is down).'),
      families_expected: z
        .array(z.enum(FAMILIES))
        .nullable()
        .describe('Families this deployment runs: those that had a live worker within the last day (null while Redis is down).'),
      without_workers: z
        .array(z.enum(FAMILIES))
        .nullable()
        .describe('Families with no live worker now, expected or not: their calls wait in the queue (null while Redis is down).'),
      down: z.array(z.string()).optional().describe('What is missing: redis, postgres, or workers:<family> for an expected family.'),
      warnings: z.array(z.string()).optional(),
      time: z.string().datetime(),
    })
    .describe(
      'The service, its dependencies and its worker families, for people and dashboards (never a readiness probe); 503 with `down` when something is missing.',
    ),
);

const LivenessSchema = named('Liveness', z.object({ status: z.literal('ok') }).describe('The process runs; nothing else is checked.'));

const ReadinessSchema = named(
  'Readiness',
  z
    .object({
      status: z.enum(['ready', 'not_ready']),
      checks: z.object({
        redis: z.enum(['ok', 'down']),
        postgres: z.enum(['ok', 'down']),
        migrations: z.enum(['ok', 'pending', 'unknown']).describe('Every migration file this build ships is applied (`unknown` while Postgres is down).'),
      }),
      pending_migrations: z.array(z.string()).optional().describe('The migration files not applied yet.'),
      draining: z.boolean().describe('The process got SIGTERM or SIGINT: it finishes what it holds and should get nothing new.'),
      time: z.string().datetime(),
    })
    .describe(`Whether this process can serve: each check gives up after ${READY_CHECK_MS} ms. Worker families are not part of it (see GET /health).`),
);

/** No worker for any family in the last day: nothing runs the calls this API queues. */
const NO_WORKERS_WARNING = 'no worker has run in the last day: calls are queued until one starts (npm run start:worker -- --family <family>)';

const ToolListSchema = named(
  'ToolList',
  z.object({
    tools: z.array(
      z.object({
        name: z.string(),
        cost: z.string().describe('The price in dollars, e.g. $0.02.'),
        endpoint: z.string().describe('POST /tools/<name>'),
        price_cents: z.number().int(),
        tier: z.enum(PLANS).describe('The lowest plan that may call it.'),
        description: z.string(),
      }),
    ),
  }),
);

const LOOPBACK_HOSTS = new Set(['localhost', '127.0.0.1', '[::1]']);

/**
 * The public base URL (links, /subscribe, the x402 `resource`): PUBLIC_BASE_URL; else the request's
 * scheme and Host only when that host is one the service knows as its own (listed in PUBLIC_HOSTS as
 * `host` or `host:port`, or a loopback name), so a Host header anyone can write is never reflected;
 * else the first PUBLIC_HOSTS entry, or http://localhost:PORT. Production requires PUBLIC_BASE_URL or
 * PUBLIC_HOSTS (src/bootstrap.ts).
 */
export function baseUrl(app: FastifyInstance, req: FastifyRequest): string {
  const { PUBLIC_BASE_URL, PUBLIC_HOSTS, PORT } = app.container.config;
  if (PUBLIC_BASE_URL) return PUBLIC_BASE_URL.replace(/\/+$/, '');
  const host = String(req.host ?? '').toLowerCase();
  // Only a bare host[:port]: anything else in the header (a path, credentials, spaces) is not a host.
  const hostname = /^(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(:\d{1,5})?$/.exec(host)?.[1] ?? null;
  if (hostname !== null && (PUBLIC_HOSTS.includes(host) || PUBLIC_HOSTS.includes(hostname) || LOOPBACK_HOSTS.has(hostname))) return `${req.protocol}://${host}`;
  return PUBLIC_HOSTS.length ? `${req.protocol}://${PUBLIC_HOSTS[0]}` : `http://localhost:${PORT}`;
}

export async function metaRoutes(app: FastifyInstance): Promise<void> {
  const { config } = app.container;

  app.get(
    '/',
    {
      schema: {
        operationId: 'rootDocument',
        tags: ['Discovery'],
        summary: 'The root document: tools by tier, endpoints, protocol, links',
        security: 'none',
        response: { '200': ok(OpenSchema, 'Tools by tier, endpoints, the root protocol, links.'), ...errors([], { keyed: false }) },
      } satisfies RouteSchema,
    },
    async (req) => rootDocument(baseUrl(app, req), config),
  );

  // Probes answer on every request without a key or a rate limit, and log only trouble: an
  // orchestrator polls them every few seconds.
  app.get(
    '/livez',
    {
      logLevel: 'warn',
      schema: {
        operationId: 'livez',
        tags: ['Operators'],
        summary: 'Liveness: the process runs (no dependency is checked)',
        security: 'none',
        response: { '200': ok(LivenessSchema, 'The process runs.') },
      } satisfies RouteSchema,
    },
    async (_req, reply) => reply.header('cache-control', 'no-store').send({ status: 'ok' }),
  );

  /**
   * Readiness (src/ops/readiness.ts): Redis and Postgres answer, migrations are applied, no SIGTERM
   * yet. 200 `ready` or 503 `not_ready`, within about READY_CHECK_MS even when a dependency hangs.
   */
  app.get(
    '/readyz',
    {
      logLevel: 'warn',
      schema: {
        operationId: 'readyz',
        tags: ['Operators'],
        summary: 'Readiness: this process can serve (Redis, Postgres, migrations, not draining)',
        security: 'none',
        response: { '200': ok(ReadinessSchema, 'Ready.'), '503': ok(ReadinessSchema, 'Not ready: `checks` and `draining` say why.') },
      } satisfies RouteSchema,
    },
    async (_req, reply) => {
      const body = await readiness(app.container);
      return reply
        .status(body.status === 'ready' ? 200 : 503)
        .header('cache-control', 'no-store')
        .send(body);
    },
  );

  /**
   * Each dependency (Redis, Postgres: `ok` or `down`, as GET /readyz checks them) and the live workers per family from
   * their heartbeats (src/queue/heartbeat.ts), for people and dashboards; readiness is GET /readyz.
   * 200 `ok`, or 503 `degraded` with `down` naming what is missing: a dependency, or an expected family
   * (one that had a worker within the last day) with no live worker (`workers:<family>`).
   * `without_workers` lists every family with no live worker, expected or not, so an API started
   * before any worker is `ok` and says that nothing runs its calls.
   */
  app.get(
    '/health',
    {
      // Polled by dashboards: a line only when it is degraded, like the probes.
      logLevel: 'warn',
      schema: {
        operationId: 'health',
        tags: ['Discovery'],
        summary: 'Health of the service, its dependencies and worker families (for people; probes are /livez and /readyz)',
        security: 'none',
        response: { '200': ok(HealthSchema, 'Everything answers.'), '503': ok(HealthSchema, 'Degraded: `down` names what is missing.') },
      } satisfies RouteSchema,
    },
    async (_req, reply) => {
      // Redis and Postgres as /readyz sees them (one shared check), the workers from their heartbeats.
      const [ready, workers] = await Promise.all([
        readiness(app.container),
        within(READY_CHECK_MS, () => workerCounts(app.container.redis, config.REDIS_PREFIX)),
      ]);
      const checks = { redis: ready.checks.redis, postgres: ready.checks.postgres };
      const down: string[] = [];
      if (checks.redis === 'down') down.push('redis');
      if (checks.postgres === 'down') down.push('postgres');
      if (workers) for (const f of workers.expected) if (!workers.counts[f]) down.push(`workers:${f}`);
      const ok = down.length === 0;
      const warnings = app.container.api?.payPerCall?.deps.x402.settler.mode === 'deferred' ? [DEFERRED_WARNING] : [];
      if (workers && !workers.expected.length) warnings.push(NO_WORKERS_WARNING);
      return reply.status(ok ? 200 : 503).send({
        status: ok ? 'ok' : 'degraded',
        checks,
        // Families whose worker pools run in this process ('inline') or none ('off').
        workers: app.container.workers ? 'inline' : 'off',
        // Live worker processes per family, across the deployment (null while Redis is down).
        worker_counts: workers ? workers.counts : null,
        families_expected: workers ? workers.expected : null,
        without_workers: workers ? FAMILIES.filter((f) => !workers.counts[f]) : null,
        ...(ok ? {} : { down }),
        // Healthy but worth an operator's attention (deferred x402 settlement, no worker at all).
        ...(warnings.length ? { warnings } : {}),
        time: new Date().toISOString(),
      });
    },
  );

  // The stdio MCP client as an npm tarball, for `npx -y <base>/client/tollgate-mcp.tgz` (the root
  // document's `npm`). Packed once, in memory, while the app starts; no key needed.
  const clientPackage = buildClientPackage();
  clientPackage.catch((e: unknown) => app.log.error({ err: e }, 'cannot pack the stdio MCP client'));
  const clientSchema: RouteSchema = {
    operationId: 'mcpClientPackage',
    tags: ['Discovery'],
    summary: 'The stdio MCP client as an npm tarball (npx -y <base>/client/tollgate-mcp.tgz)',
    security: 'none',
    response: {
      '200': media('application/gzip', 'npm package tarball.', { type: 'string', format: 'binary' }),
      '304': { description: 'Not modified (If-None-Match).' },
    },
  };
  app.get('/client/tollgate-mcp.tgz', { schema: clientSchema }, async (req, reply) => {
    const { tarball, integrity } = await clientPackage;
    const etag = `"${integrity}"`;
    reply.header('etag', etag).header('cache-control', 'public, max-age=300');
    if (req.headers['if-none-match'] === etag) return reply.status(304).send();
    return reply.type('application/gzip').header('content-disposition', 'attachment; filename="tollgate-mcp.tgz"').send(tarball);
  });

  app.get(
    '/tools',
    {
      schema: {
        operationId: 'listTools',
        tags: ['Discovery'],
        summary: 'Every tool with its price',
        security: 'none',
        response: { '200': ok(ToolListSchema, 'Every tool with its price.'), ...errors([], { keyed: false }) },
      } satisfies RouteSchema,
    },
    async () => ({ tools: catalogue() }),
  );

  app.get(
    '/tools/:name',
    {
      schema: {
        operationId: 'getTool',
        tags: ['Discovery'],
        summary: 'One tool: its input and output JSON Schemas, examples, price and tier',
        security: 'none',
        params: ToolNameParams,
        response: { '200': ok(OpenSchema, "The tool's input JSON Schema, examples, price and tier."), ...errors(['404'], { keyed: false }) },
      } satisfies RouteSchema,
    },
    async (req) => toolDetail(getTool(input<typeof ToolNameParams>(req, 'params').name)),
  );

  app.get(
    '/v1/manifest',
    {
      schema: {
        operationId: 'manifest',
        tags: ['Discovery'],
        summary: 'Tiers and prices',
        security: 'none',
        response: { '200': ok(OpenSchema, 'Tiers and prices.') },
      } satisfies RouteSchema,
    },
    async (req) => manifest(baseUrl(app, req)),
  );

  // The README (full API documentation) as Markdown.
  let readme: string | null = null;
  const readmeSchema: RouteSchema = {
    operationId: 'readme',
    tags: ['Discovery'],
    summary: 'The README, as Markdown',
    security: 'none',
    response: { '200': media('text/markdown', 'The README.') },
  };
  app.get('/docs/readme', { schema: readmeSchema }, async (_req, reply) => {
    readme ??= await readFile(new URL('../../../README.md', import.meta.url), 'utf8');
    return reply.type('text/markdown; charset=utf-8').send(readme);
  });

  // The interactive reference (Scalar) of GET /openapi.json at /docs/ (its script at /docs/js/scalar.js).
  // The plugin answers /docs with a redirect to /docs/; the hook answers it with the same page instead,
  // which works there too since the page's URLs are absolute.
  let page: string | null = null;
  await app.register(scalarReference, {
    routePrefix: '/docs',
    configuration: { url: '/openapi.json', cdn: '/docs/js/scalar.js', pageTitle: 'Tollgate API reference' },
    hooks: {
      onRequest: async (req, reply) => {
        if (req.routeOptions.url !== '/docs') return;
        page ??= (await app.inject({ method: 'GET', url: '/docs/' })).body;
        return reply.type('text/html; charset=utf-8').send(page);
      },
    },
  });
}
