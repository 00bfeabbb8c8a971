import type { FastifyInstance } from 'fastify';
import { metricsAuthorized, metricsUnauthorized } from '../ops/metrics.js';

/**
 * GET /metrics: this process's Prometheus metrics (src/ops/metrics.ts). No API key and no rate limit;
 * with METRICS_TOKEN set, `Authorization: Bearer <METRICS_TOKEN>` is required (401 otherwise).
 */
export async function metricsRoutes(app: FastifyInstance): Promise<void> {
  const { config, metrics } = app.container;
  app.get('/metrics', async (req, reply) => {
    if (!metricsAuthorized(config.METRICS_TOKEN, req.headers.authorization)) throw metricsUnauthorized();
    const { contentType, body } = await metrics.scrape();
    return reply.header('cache-control', 'no-store').type(contentType).send(body);
  });
}
