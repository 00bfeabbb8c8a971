import type { Server } from 'node:http';
import type { FastifyInstance } from 'fastify';
import { AppError } from '../../errors.js';
import { metricsAuthorized, metricsUnauthorized, serveMetrics } from '../../ops/metrics.js';
import { readinessProbe } from '../../ops/readiness.js';
import { errors, media, type RouteSchema } from './route-schema.js';

/**
 * GET /metrics: this process's Prometheus metrics (src/ops/metrics.ts), which include revenue per
 * tool, so they are never public. On the API's port they need METRICS_TOKEN: with it set,
 * `Authorization: Bearer <METRICS_TOKEN>` (401 otherwise); without it, 404. With METRICS_PORT set,
 * this process also serves them on a listener of their own on that port (the token, when set, there
 * too), with GET /livez and GET /readyz, started once the API listens: a port the operator keeps off
 * the public network.
 */
export async function metricsRoutes(app: FastifyInstance): Promise<void> {
  const { config, metrics } = app.container;
  app.get(
    '/metrics',
    {
      schema: {
        operationId: 'metrics',
        tags: ['Operators'],
        summary: 'Prometheus metrics (METRICS_TOKEN as a bearer; 404 when the operator set none)',
        description:
          "This process's Prometheus metrics, revenue per tool included, so never public: `Authorization: Bearer <METRICS_TOKEN>` (401 without it). " +
          'Without METRICS_TOKEN this port answers 404; with METRICS_PORT the process also serves them on a listener of its own, meant to stay off the public network.',
        security: 'metrics',
        response: { '200': media('text/plain', 'Prometheus text exposition format (version 0.0.4).'), ...errors(['401', '404'], { keyed: false }) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      if (!config.METRICS_TOKEN) {
        throw new AppError(
          'not_found',
          `No route GET /metrics on this port: metrics are served ${config.METRICS_PORT ? 'on METRICS_PORT' : 'only with METRICS_TOKEN or on METRICS_PORT'}`,
        );
      }
      if (!metricsAuthorized(config.METRICS_TOKEN, req.headers.authorization)) throw metricsUnauthorized();
      const { contentType, body } = await metrics.scrape();
      return reply.header('cache-control', 'no-store').type(contentType).send(body);
    },
  );

  if (!config.METRICS_PORT) return;
  let server: Server | undefined;
  app.addHook('onListen', async () => {
    try {
      server = await serveMetrics(metrics, {
        port: config.METRICS_PORT,
        host: config.HOST,
        token: config.METRICS_TOKEN,
        ready: readinessProbe(app.container),
      });
      app.log.info({ port: config.METRICS_PORT }, 'metrics listening');
    } catch (e) {
      app.log.error({ err: (e as Error).message, port: config.METRICS_PORT }, 'metrics listener could not start (METRICS_PORT)');
    }
  });
  app.addHook('onClose', async () => {
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server!.close(() => resolve()));
  });
}
