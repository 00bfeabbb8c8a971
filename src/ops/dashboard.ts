import type { FastifyInstance } from 'fastify';
import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { FastifyAdapter } from '@bull-board/fastify';
import { FAMILIES } from '../config.js';
import { AppError, envelope } from '../errors.js';
import { bearerToken, sameSecret } from './operator-token.js';

export const DASHBOARD_PREFIX = '/admin/queues';
const REALM = 'tollgate-admin';

/** The token a request carries: `Authorization: Bearer <token>`, or HTTP basic auth's password (any user name). */
function presentedToken(authorization: string | undefined): string | null {
  if (!authorization) return null;
  const bearer = bearerToken(authorization);
  if (bearer) return bearer;
  const basic = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(authorization);
  if (!basic) return null;
  const decoded = Buffer.from(basic[1]!, 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  return colon < 0 ? null : decoded.slice(colon + 1);
}

export function dashboardAuthorized(token: string, authorization: string | undefined): boolean {
  return !!token && sameSecret(presentedToken(authorization), token);
}

/**
 * The queue dashboard (Bull Board) at /admin/queues, registered only when ADMIN_TOKEN is set (404 like
 * any unknown route otherwise). Every request under the prefix (page, static assets, the board's own
 * API) needs the token: as HTTP basic auth's password (so a browser can log in) or as a bearer token.
 * No API key and no rate limit: this is an operator's page, not an API-key route.
 */
export async function dashboardRoutes(app: FastifyInstance): Promise<void> {
  const { config, queues } = app.container;
  const token = config.ADMIN_TOKEN;
  if (!token) return;

  const serverAdapter = new FastifyAdapter();
  serverAdapter.setBasePath(DASHBOARD_PREFIX);
  createBullBoard({
    // The JobQueues' own queues: the API's Redis command connection fails fast (no offline queue),
    // and these are the queues the workers consume. Read-only on purpose: every job here charges a
    // caller, so a dashboard button must not retry, promote or clean one without thinking it through
    // (do that with the admin CLI, where the ledger is handled).
    queues: FAMILIES.map((f) => new BullMQAdapter(queues.queue(f), { readOnlyMode: true })),
    serverAdapter,
    options: { uiConfig: { boardTitle: 'Tollgate queues' } },
  });

  // Encapsulated: the hook covers exactly the routes registered under the prefix.
  await app.register(
    async (scope) => {
      scope.addHook('onRequest', async (req, reply) => {
        reply.header('cache-control', 'no-store');
        if (dashboardAuthorized(token, req.headers.authorization)) return;
        // Answered here rather than thrown: a thrown error would reach Bull Board's own error handler
        // (the routes' context), not the service's envelope.
        const err = new AppError(
          'unauthorized',
          'The queue dashboard needs ADMIN_TOKEN: as the basic-auth password (any user name) or as Authorization: Bearer <ADMIN_TOKEN>',
        );
        return reply.code(err.status).header('www-authenticate', `Basic realm="${REALM}"`).type('application/json; charset=utf-8').send(envelope(err, req.id));
      });
      await scope.register(serverAdapter.registerPlugin());
    },
    { prefix: DASHBOARD_PREFIX },
  );
}
