import { readFile } from 'node:fs/promises';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import scalarReference from '@scalar/fastify-api-reference';
import { sql } from '../../db/pool.js';
import { DEFERRED_WARNING } from '../../pay/x402/settler.js';
import { catalogue, rootDocument, toolDetail, manifest } from '../../calls/catalogue.js';
import { getTool } from '../../tools/index.js';
import { workerCounts } from '../../queue/heartbeat.js';
import { buildClientPackage } from '../../ops/client-package.js';

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

  app.get('/', async (req) => rootDocument(baseUrl(app, req), config));

  /**
   * Each dependency (Redis, Postgres: `ok` or `down`, 1 s each) and the live workers per family from
   * their heartbeats (src/queue/heartbeat.ts). 200 `ok`, or 503 `degraded` with `down` naming what is
   * missing: a dependency, or a family this deployment runs that has no live worker (`workers:<family>`).
   * The families a deployment runs are those that had a worker within the last day, or all of them
   * when none ever had one, so an API started with no workers at all is degraded, while a deployment
   * that runs only some families (a core-only worker) is healthy once those have workers.
   */
  app.get('/health', async (_req, reply) => {
    const within = async <T>(f: () => Promise<T>): Promise<T | null> => {
      let timer: NodeJS.Timeout | undefined;
      try {
        return await Promise.race([f(), new Promise<never>((_, rej) => (timer = setTimeout(() => rej(new Error('timeout')), 1000)))]);
      } catch {
        return null;
      } finally {
        clearTimeout(timer);
      }
    };
    const { redis: client, pool } = app.container;
    const [pong, pg, workers] = await Promise.all([
      within(() => client.ping()),
      within(() => pool.query(sql.unsafe`SELECT 1`)),
      within(() => workerCounts(client, config.REDIS_PREFIX)),
    ]);
    const checks = { redis: pong === null ? 'down' : 'ok', postgres: pg === null ? 'down' : 'ok' };
    const down: string[] = [];
    if (checks.redis === 'down') down.push('redis');
    if (checks.postgres === 'down') down.push('postgres');
    if (workers) for (const f of workers.expected) if (!workers.counts[f]) down.push(`workers:${f}`);
    const ok = down.length === 0;
    const warnings = app.container.api?.payPerCall?.deps.x402.settler.mode === 'deferred' ? [DEFERRED_WARNING] : [];
    return reply.status(ok ? 200 : 503).send({
      status: ok ? 'ok' : 'degraded',
      checks,
      // Families whose worker pools run in this process ('inline') or none ('off').
      workers: app.container.workers ? 'inline' : 'off',
      // Live worker processes per family, across the deployment (null while Redis is down).
      worker_counts: workers ? workers.counts : null,
      ...(ok ? {} : { down }),
      // Healthy but worth an operator's attention (deferred x402 settlement).
      ...(warnings.length ? { warnings } : {}),
      time: new Date().toISOString(),
    });
  });

  // The stdio MCP client as an npm tarball, for `npx -y <base>/client/tollgate-mcp.tgz` (the root
  // document's `npm`). Packed once, in memory, while the app starts; no key needed.
  const clientPackage = buildClientPackage();
  clientPackage.catch((e: unknown) => app.log.error({ err: e }, 'cannot pack the stdio MCP client'));
  app.get('/client/tollgate-mcp.tgz', async (req, reply) => {
    const { tarball, integrity } = await clientPackage;
    const etag = `"${integrity}"`;
    reply.header('etag', etag).header('cache-control', 'public, max-age=300');
    if (req.headers['if-none-match'] === etag) return reply.status(304).send();
    return reply.type('application/gzip').header('content-disposition', 'attachment; filename="tollgate-mcp.tgz"').send(tarball);
  });

  app.get('/tools', async () => ({ tools: catalogue() }));

  app.get<{ Params: { name: string } }>('/tools/:name', async (req) => toolDetail(getTool(req.params.name)));

  app.get('/v1/manifest', async (req) => manifest(baseUrl(app, req)));

  // The README (full API documentation) as Markdown.
  let readme: string | null = null;
  app.get('/docs/readme', async (_req, reply) => {
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
