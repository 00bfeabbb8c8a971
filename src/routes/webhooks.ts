import type { FastifyInstance, FastifyRequest } from 'fastify';
import { AppError } from '../errors.js';
import type { KeyCaller } from '../services/auth.js';
import type { CallbackSource, Webhooks } from '../calls/webhooks.js';

/**
 * Only the account's own production keys read or roll the webhook secret. A sub-key is delegated
 * with a budget and a tool list; the secret would let it forge deliveries the account's receiver
 * trusts. A sandbox key is for trying calls out and is often handed around more freely. Their calls'
 * deliveries are still signed with the account's secret.
 */
function requireOwner(caller: KeyCaller): void {
  if (caller.keyType === 'sub') throw new AppError('forbidden', "A sub-key cannot read or roll the account's webhook secret; use the account's production key");
  if (caller.keyType === 'test') throw new AppError('forbidden', "Sandbox keys cannot read or roll the account's webhook secret; use a production key");
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
    requireOwner(caller);
    reply.header('cache-control', 'no-store');
    return { secret: await webhooksOf(app).secrets.get(caller.accountId) };
  });

  app.post('/webhooks/secret', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    requireOwner(caller);
    reply.header('cache-control', 'no-store');
    return { secret: await webhooksOf(app).secrets.roll(caller.accountId) };
  });
}
