import type { FastifyInstance, FastifyRequest } from 'fastify';
import { AppError } from '../errors.js';
import type { KeyCaller } from '../services/auth.js';
import type { CallbackSource, Webhooks } from '../calls/webhooks.js';
import { requireKeyOwner } from '../access/keys.js';

/**
 * Only the account's current production key reads or rolls the webhook secret (src/access/keys.ts):
 * the secret would let any other key (a sub-key with a budget, an agent's or sandbox key, a rotated
 * key in its grace) forge deliveries the account's receiver trusts. Their calls' deliveries are still
 * signed with the account's secret.
 */
function requireOwner(caller: KeyCaller, action: string): void {
  requireKeyOwner(caller, action);
}

function webhooksOf(app: FastifyInstance): Webhooks {
  const w = app.container.webhooks;
  if (!w) throw new AppError('service_unavailable', 'Webhooks are not available in this process');
  return w;
}

/** The `Callback-Url` header of a request, vetted (400 invalid_input when refused); undefined when absent. */
export async function callbackUrlHeader(req: FastifyRequest): Promise<string | undefined> {
  const v = req.headers['callback-url'];
  if (v === undefined) return undefined;
  return webhooksOf(req.server).vet(Array.isArray(v) ? v.join(',') : v, 'Callback-Url');
}

/** The callback of a root-protocol request: the header, else the body's `callback_url`. */
export async function callbackUrlOf(req: FastifyRequest, bodyValue: unknown): Promise<string | undefined> {
  const header = await callbackUrlHeader(req);
  if (header !== undefined || bodyValue === undefined) return header;
  return webhooksOf(req.server).vet(bodyValue, 'callback_url' satisfies CallbackSource);
}

export async function webhookRoutes(app: FastifyInstance): Promise<void> {
  // The account's signing secret (created on first use), and rolling it.
  app.get('/webhooks/secret', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    requireOwner(caller, "read the account's webhook secret");
    reply.header('cache-control', 'no-store');
    return { secret: await webhooksOf(app).secrets.get(caller.accountId) };
  });

  app.post('/webhooks/secret', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    requireOwner(caller, "roll the account's webhook secret");
    reply.header('cache-control', 'no-store');
    return { secret: await webhooksOf(app).secrets.roll(caller.accountId) };
  });
}
