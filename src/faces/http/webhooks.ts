import type { FastifyInstance, FastifyRequest } from 'fastify';
import { AppError } from '../../errors.js';
import type { KeyCaller } from '../../access/auth.js';
import type { CallbackSource, Webhooks } from '../../calls/webhooks.js';
import { requireKeyOwner } from '../../access/keys.js';
import { z } from 'zod';
import { ENDPOINTS } from '../../calls/catalogue.js';
import { RATE_LIMIT } from './openapi-components.js';
import { errors, named, ok, type RouteSchema } from './route-schema.js';

const WebhookSecretSchema = named(
  'WebhookSecret',
  z.object({
    secret: z
      .string()
      .regex(/^whsec_/)
      .describe(
        'whsec_<base64 of the key>: the HMAC-SHA256 key (the bytes after whsec_) of the webhook-signature header deliveries carry (Standard Webhooks).',
      ),
  }),
);

function webhooksOf(app: FastifyInstance): Webhooks {
  const w = app.container.webhooks;
  if (!w) throw new AppError('service_unavailable', 'Webhooks are not available in this process');
  return w;
}

/** A callback accepted for one request: where it goes, and its place among the account's outstanding deliveries. */
export interface AcceptedCallback {
  url: string;
  /** Wraps the request's onJobId: its first job id (a call's job, a chain or parallel request's root) takes the place over. */
  track(next?: (jobId: string) => unknown): (jobId: string) => Promise<void>;
  /** For a `finally`: gives the place back unless a job took it over (the request was refused, failed before queueing, or replayed). */
  done(): Promise<void>;
}

/**
 * The callback of a request (the Callback-Url header, else on POST / the body's `callback_url`),
 * accepted before anything is reserved or queued, in this order: only on a charged request (400
 * invalid_input for one that costs nothing: a free tool, a sandbox key, a chain or parallel request
 * whose total is 0), to a URL `vetCallbackUrl` allows (400), and while the account has fewer than
 * WEBHOOK_MAX_PENDING deliveries outstanding (429 rate_limited, src/calls/webhooks.ts
 * PendingDeliveries). Undefined when the request names none. `tools` is read only when it does.
 */
export async function acceptCallback(
  req: FastifyRequest,
  caller: KeyCaller,
  tools: () => ReadonlyArray<{ name: string; priceCents: number }>,
  bodyValue?: unknown,
): Promise<AcceptedCallback | undefined> {
  const header = req.headers['callback-url'];
  const source: CallbackSource = header !== undefined ? 'Callback-Url' : 'callback_url';
  const raw = header !== undefined ? (Array.isArray(header) ? header.join(',') : header) : bodyValue;
  if (raw === undefined) return undefined;
  const steps = tools();
  const priceCents = caller.sandbox ? 0 : steps.reduce((sum, t) => sum + t.priceCents, 0);
  if (priceCents <= 0) {
    const what = steps.length === 1 ? steps[0]!.name : `this request (${steps.map((t) => t.name).join(', ')})`;
    const why = caller.sandbox ? 'calls with a sandbox key are not charged' : `${what} costs nothing`;
    const message = `only charged calls get a delivery, and ${why}; send it without ${source} and read its outcome with GET /jobs/{id}`;
    throw new AppError('invalid_input', `${source} refused: ${message}`, { reason: 'callback_on_free_call', issues: [{ path: [source], message }] });
  }
  const webhooks = webhooksOf(req.server);
  const url = await webhooks.vet(raw, source);
  const claim = await webhooks.pending.claim(caller.accountId);
  let bound = false;
  return {
    url,
    track: (next) => async (jobId) => {
      if (!bound) {
        bound = true;
        await webhooks.pending.bind(caller.accountId, claim, jobId);
      }
      await next?.(jobId);
    },
    done: async () => {
      if (!bound) await webhooks.pending.release(caller.accountId, claim).catch(() => {});
    },
  };
}

export async function webhookRoutes(app: FastifyInstance): Promise<void> {
  // The account's signing secret (created on first use), and rolling it. Only the account's current
  // production key (src/access/keys.ts): the secret would let any other key (a sub-key, an agent's or
  // sandbox key, a rotated key in its grace) forge deliveries the account's receiver trusts.
  const who =
    " The account's current production key only: a sub-key or an agent, VIP or sandbox key gets 403 forbidden, a rotated key in its grace 403 key_in_grace. " +
    'Answered with Cache-Control: no-store. 503 service_unavailable when this process has no webhook delivery.';
  const getSchema = {
    operationId: 'getWebhookSecret',
    tags: ['Account'],
    summary: "The account's webhook signing secret",
    description: `${ENDPOINTS['GET /webhooks/secret']}.${who}`,
    response: { '200': ok(WebhookSecretSchema, 'The secret (created on first use).', { headers: RATE_LIMIT }), ...errors(['403']) },
  } satisfies RouteSchema;
  app.get('/webhooks/secret', { schema: getSchema }, async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    requireKeyOwner(caller, "read the account's webhook secret");
    reply.header('cache-control', 'no-store');
    return { secret: await webhooksOf(app).secrets.get(caller.accountId) };
  });

  const rollSchema = {
    operationId: 'rollWebhookSecret',
    tags: ['Account'],
    summary: 'Roll the webhook signing secret',
    description: `Replaces the secret; deliveries from now on (retries too) are signed with the new one.${who}`,
    response: { '200': ok(WebhookSecretSchema, 'The new secret.', { headers: RATE_LIMIT }), ...errors(['403']) },
  } satisfies RouteSchema;
  app.post('/webhooks/secret', { schema: rollSchema }, async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    requireKeyOwner(caller, "roll the account's webhook secret");
    reply.header('cache-control', 'no-store');
    return { secret: await webhooksOf(app).secrets.roll(caller.accountId) };
  });
}
