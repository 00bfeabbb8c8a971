import { readFile } from 'node:fs/promises';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { sql } from '../db/pool.js';
import { catalogue, rootDocument, toolDetail, manifest } from '../services/catalogue.js';
import { getTool } from '../tools/index.js';

/** The public base URL: PUBLIC_BASE_URL, else what the request was addressed to. */
export function baseUrl(app: FastifyInstance, req: FastifyRequest): string {
  const configured = app.container.config.PUBLIC_BASE_URL;
  if (configured) return configured.replace(/\/+$/, '');
  return `${req.protocol}://${req.host}`;
}

export async function metaRoutes(app: FastifyInstance): Promise<void> {
  const { config } = app.container;

  app.get('/', async (req) => rootDocument(baseUrl(app, req), config));

  app.get('/health', async (_req, reply) => {
    // A dependency that does not answer within 2 s counts as down.
    const check = async (f: () => Promise<unknown>) => {
      let timer: NodeJS.Timeout | undefined;
      try {
        await Promise.race([f(), new Promise((_, rej) => (timer = setTimeout(() => rej(new Error('timeout')), 2000)))]);
        return 'ok';
      } catch {
        return 'down';
      } finally {
        clearTimeout(timer);
      }
    };
    const [redis, postgres] = await Promise.all([
      check(() => app.container.redis.ping()),
      check(() => app.container.pool.query(sql.unsafe`SELECT 1`)),
    ]);
    const ok = redis === 'ok' && postgres === 'ok';
    return reply.status(ok ? 200 : 503).send({
      status: ok ? 'ok' : 'degraded',
      checks: { redis, postgres },
      workers: app.container.workers ? 'inline' : 'off',
      time: new Date().toISOString(),
    });
  });

  app.get('/tools', async () => ({ tools: catalogue() }));

  app.get<{ Params: { name: string } }>('/tools/:name', async (req) => toolDetail(getTool(req.params.name)));

  app.get('/v1/manifest', async (req) => manifest(baseUrl(app, req)));

  let readme: string | null = null;
  app.get('/docs', async (_req, reply) => {
    readme ??= await readFile(new URL('../../README.md', import.meta.url), 'utf8');
    return reply.type('text/markdown; charset=utf-8').send(readme);
  });
}
