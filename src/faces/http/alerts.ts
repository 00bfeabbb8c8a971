import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { requireKeyOwner } from '../../access/keys.js';
import { CAP_PERCENTS_MAX, EVENTS_DEFAULT, EVENTS_MAX, type Alerts } from '../../calls/alerts.js';
import type { Webhooks } from '../../calls/webhooks.js';
import { ENDPOINTS } from '../../calls/catalogue.js';
import { RATE_LIMIT } from './openapi-components.js';
import { errors, input, named, ok, type RouteSchema } from './route-schema.js';

const percent = z
  .number({ invalid_type_error: 'a percent is a whole number from 1 to 100' })
  .int('a percent is a whole number from 1 to 100')
  .min(1, 'a percent is a whole number from 1 to 100')
  .max(100, 'a percent is a whole number from 1 to 100');

const PutAlerts = named(
  'AlertSettingsInput',
  z
    .object({
      cap_percents: z
        .array(percent)
        .max(CAP_PERCENTS_MAX, `at most ${CAP_PERCENTS_MAX} percents`)
        .default([])
        .transform((ps) => [...new Set(ps)].sort((a, b) => a - b))
        .describe("Percents (1 to 100) of each sub-key's or OAuth grant's monthly cap; each sends spend.threshold_crossed once a month per key."),
      balance_below_cents: z
        .number()
        .int('a whole number of cents')
        .positive('a positive number of cents')
        .max(100_000_000_000)
        .nullable()
        .default(null)
        .describe('Send balance.low once when the balance falls under this many cents, again only after it has risen back to it.'),
      url: z.string().max(2048).describe('Where events are POSTed: https, public addresses only (checked like Callback-Url).'),
    })
    .strict()
    .refine((b) => b.cap_percents.length > 0 || b.balance_below_cents !== null, {
      message: 'name cap_percents, balance_below_cents or both',
      path: ['cap_percents'],
    }),
);

const AlertSettingsSchema = named(
  'AlertSettings',
  z.object({
    cap_percents: z.array(z.number().int()).describe('Ascending, each once.'),
    balance_below_cents: z.number().int().nullable(),
    url: z.string(),
    created_at: z.string().datetime(),
    updated_at: z.string().datetime(),
  }),
);

const AlertEventSchema = named(
  'AlertEvent',
  z.object({
    id: z.string().describe("The event's id: the webhook-id of its delivery, the same on every retry."),
    type: z.enum(['spend.threshold_crossed', 'balance.low']),
    data: z
      .record(z.unknown())
      .describe(
        'What was sent as `data`. spend.threshold_crossed: key_id, key_type (sub or grant), key_name, percent, used_cents, cap_cents, period (YYYY-MM, UTC). ' +
          'balance.low: balance_cents, threshold_cents.',
      ),
    created_at: z.string().datetime(),
    webhook: z.object({
      url: z.string(),
      deliveries: z.array(z.object({ at: z.string().datetime(), status: z.number().int().nullable(), ok: z.boolean(), error: z.string().optional() })),
      delivered_at: z.string().datetime().nullable(),
    }),
  }),
);

const AlertsViewSchema = named(
  'Alerts',
  z.object({
    settings: AlertSettingsSchema.nullable().describe('null: the account has no alerts set.'),
    events: z.array(AlertEventSchema).describe('Every event sent, newest first, a page at a time.'),
    next_cursor: z.string().nullable().describe('Pass as `cursor` for the next (older) page; null on the last page.'),
  }),
);

const AlertsQuery = z
  .object({
    limit: z.coerce
      .number({ invalid_type_error: 'limit must be a number' })
      .int('limit must be a whole number')
      .min(1, 'limit must be at least 1')
      .max(EVENTS_MAX, `limit must be at most ${EVENTS_MAX}`)
      .default(EVENTS_DEFAULT)
      .describe(`Events per page (1 to ${EVENTS_MAX}).`),
    cursor: z.string().min(1).max(200).optional().describe("The previous page's next_cursor, unchanged."),
  })
  .strict();

const RemovedSchema = z.object({ removed: z.boolean().describe('False when the account had no alerts set.') });

const WHO =
  "The account's current production key only (other keys: 403 forbidden; a rotated key in its grace: 403 key_in_grace). " +
  'Events are signed with the webhook secret (GET /webhooks/secret), as Standard Webhooks says.';

function servicesOf(app: FastifyInstance): { alerts: Alerts; webhooks: Webhooks } {
  const { alerts, webhooks } = app.container;
  if (!alerts || !webhooks) throw new AppError('service_unavailable', 'Spend alerts are not available in this process');
  return { alerts, webhooks };
}

export async function alertRoutes(app: FastifyInstance): Promise<void> {
  app.put(
    '/alerts',
    {
      schema: {
        operationId: 'putAlerts',
        tags: ['Account'],
        summary: 'Set spend alerts: percents of sub-key and grant caps, a low balance, and where to send them',
        description:
          `${ENDPOINTS['PUT /alerts']}. Replaces the account's alerts and checks them at once: a threshold already passed is sent now. ` +
          `Each threshold sends one event per period (a calendar month for caps; for the balance, until it rises back), across every replica. ${WHO}`,
        body: PutAlerts,
        bodyExamples: {
          caps: {
            summary: 'Told at 50, 80 and 100% of every capped key, and under $5',
            value: { cap_percents: [50, 80, 100], balance_below_cents: 500, url: 'https://hooks.example.com/tollgate' },
          },
        },
        response: { '200': ok(AlertSettingsSchema, 'The alerts as saved.', { headers: RATE_LIMIT }), ...errors(['400', '403', '413', '415']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      requireKeyOwner(caller, 'set spend alerts');
      const body = input<typeof PutAlerts>(req, 'body', 'Alerts are invalid');
      const { alerts, webhooks } = servicesOf(app);
      const url = await webhooks.vet(body.url, 'url');
      return alerts.put(caller.accountId, { cap_percents: body.cap_percents, balance_below_cents: body.balance_below_cents, url });
    },
  );

  app.get(
    '/alerts',
    {
      schema: {
        operationId: 'getAlerts',
        tags: ['Account'],
        summary: "The account's spend alerts and every event they sent",
        description: `${ENDPOINTS['GET /alerts']}: the settings, then the events newest first with each delivery's attempts. ${WHO}`,
        querystring: AlertsQuery,
        response: { '200': ok(AlertsViewSchema, 'Settings and events.', { headers: RATE_LIMIT }), ...errors(['400', '403']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      requireKeyOwner(caller, 'read spend alerts');
      const q = input<typeof AlertsQuery>(req, 'querystring', 'Alerts query is invalid');
      const { alerts } = servicesOf(app);
      const [settings, page] = await Promise.all([alerts.get(caller.accountId), alerts.events(caller.accountId, q)]);
      return { settings, ...page };
    },
  );

  app.delete(
    '/alerts',
    {
      schema: {
        operationId: 'deleteAlerts',
        tags: ['Account'],
        summary: "Remove the account's spend alerts",
        description: `No more events are sent; those sent stay listed by GET /alerts. ${WHO}`,
        response: { '200': ok(RemovedSchema, 'Removed.', { headers: RATE_LIMIT }), ...errors(['403']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      requireKeyOwner(caller, 'remove spend alerts');
      return { removed: await servicesOf(app).alerts.remove(caller.accountId) };
    },
  );
}
