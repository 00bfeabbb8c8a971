import type { FastifyInstance, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { KeyAuthenticator, type KeyCaller } from '../../access/auth.js';
import { requireNotInGrace } from '../../access/keys.js';
import { AppError } from '../../errors.js';
import { PAID_PLANS, paymentsUnavailable, stripeClient } from '../../pay/card/client.js';
import { type CardDeps, openPlanCheckout, openPortal, openTopupCheckout } from '../../pay/card/checkout.js';
import { CardWebhooks, verifyEvent } from '../../pay/card/webhook.js';
import { baseUrl } from './meta.js';
import { RATE_LIMIT } from './openapi-components.js';
import { errors, input, named, namedSchemas, ok, type RouteSchema } from './route-schema.js';

/**
 * Card payments through Stripe (src/pay/card): POST /credits/checkout (a top-up), POST
 * /billing/subscribe (a plan), POST /billing/portal, and POST /stripe/webhook where Stripe reports
 * what was paid. Off unless STRIPE_SECRET_KEY is set: then every one of them answers 503
 * payments_unavailable and nothing else changes. Credits and plans move only on verified webhooks.
 */

const OpenedSchema = named(
  'CheckoutOpened',
  z.object({
    id: z.string().describe('The Stripe Checkout session id (cs_...).'),
    url: z.string().describe("Stripe's hosted payment page: send the customer there."),
  }),
);

const PlanOpenedSchema = named('PlanCheckoutOpened', OpenedSchema.extend({ plan: z.enum(PAID_PLANS) }));

const PortalSchema = named(
  'BillingPortal',
  z.object({
    id: z.string().describe('The Billing Portal session id (bps_...).'),
    url: z.string().describe('Where the customer manages card, invoices and plan.'),
  }),
);

const WebhookAckSchema = named(
  'StripeWebhookAck',
  z.object({
    received: z.literal(true),
    event_id: z.string(),
    type: z.string(),
    outcome: z
      .enum(['processed', 'duplicate', 'ignored'])
      .describe('processed: acted on now; duplicate: already acted on; ignored: not an event this service acts on.'),
  }),
);

const SubscribeBody = named(
  'SubscribeRequest',
  z
    .object({
      plan: z
        .enum(PAID_PLANS, { errorMap: () => ({ message: `must be one of ${PAID_PLANS.join(', ')}` }) })
        .describe('The plan to subscribe to; it must have a Price configured (STRIPE_PRICE_<PLAN>), else 400.'),
    })
    .strict(),
);

/** The body, by its limits (CHECKOUT_MIN_CENTS, CHECKOUT_MAX_CENTS): one schema per pair, so every app with the same config shares it. */
const checkoutBodies = new Map<string, ReturnType<typeof checkoutBody>>();

function checkoutBody(min: number, max: number) {
  return z
    .object({
      cents: z
        .number({ required_error: 'is required', invalid_type_error: 'must be a whole number of cents' })
        .int('must be a whole number of cents')
        .min(min, `must be at least ${min} (CHECKOUT_MIN_CENTS)`)
        .max(max, `must be at most ${max} (CHECKOUT_MAX_CENTS)`)
        .describe('Credits to buy, in cents (CHECKOUT_MIN_CENTS to CHECKOUT_MAX_CENTS); the card is charged exactly this many US cents.'),
    })
    .strict();
}

function checkoutRequest(min: number, max: number) {
  const key = `${min}:${max}`;
  let body = checkoutBodies.get(key);
  if (!body) {
    body = checkoutBody(min, max);
    checkoutBodies.set(key, body);
    // The component is the first pair's; an app with other limits in the same process (tests) has its body inline.
    if (!namedSchemas().has('CheckoutRequest')) named('CheckoutRequest', body);
  }
  return body;
}

/** Only the account's own production-grade keys pay: a sub-key spends its parent's credits, sandbox keys touch no money. */
function payer(caller: KeyCaller, what: string): void {
  requireNotInGrace(caller, what);
  if (caller.keyType === 'sub') throw new AppError('forbidden', `A sub-key cannot ${what}; use the account\u2019s production key`);
  if (caller.keyType === 'test') throw new AppError('forbidden', `Sandbox keys cannot ${what} (they never spend real money); use a production key`);
}

export async function cardPaymentRoutes(app: FastifyInstance): Promise<void> {
  const { config, pool, credits, redis, log } = app.container;
  const stripe = stripeClient(config);
  const deps: CardDeps | undefined = stripe ? { config, pool, stripe } : undefined;
  const webhooks = stripe
    ? new CardWebhooks({
        config,
        pool,
        stripe,
        credits,
        log,
        plansChanged: async () => {
          app.container.api?.auth.clear();
          await KeyAuthenticator.broadcast(redis, config.REDIS_PREFIX);
        },
      })
    : undefined;
  const available = (): CardDeps => {
    if (!deps) throw paymentsUnavailable();
    return deps;
  };
  const Body = checkoutRequest(config.CHECKOUT_MIN_CENTS, config.CHECKOUT_MAX_CENTS);
  const returnBase = (req: FastifyRequest) => baseUrl(app, req);

  app.post(
    '/credits/checkout',
    {
      schema: {
        operationId: 'openCardCheckout',
        tags: ['Account'],
        summary: 'Buy credits by card: opens a Stripe Checkout page',
        description:
          'Opens a Stripe Checkout session (mode payment) for exactly `cents` US cents and answers its URL. Credits are added when Stripe reports the ' +
          'payment (POST /stripe/webhook, checkout.session.completed), exactly once, and show in GET /usage as a top-up. A production, agent or VIP key ' +
          '(sub-keys and sandbox keys: 403). 503 payments_unavailable when STRIPE_SECRET_KEY is not set; 502 upstream_error when Stripe cannot be reached.',
        body: Body,
        bodyExamples: { least: { summary: 'The least one card top-up buys (CHECKOUT_MIN_CENTS)', value: { cents: config.CHECKOUT_MIN_CENTS } } },
        response: { '201': ok(OpenedSchema, 'The Checkout page to send the customer to.', { headers: [...RATE_LIMIT] }), ...errors(['400', '403', '502']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const d = available();
      const caller = await app.authenticate(req, reply);
      payer(caller, 'buy credits');
      const { cents } = input<typeof Body>(req, 'body', 'Checkout request is invalid');
      return reply.status(201).send(await openTopupCheckout(d, caller.accountId, cents, returnBase(req)));
    },
  );

  app.post(
    '/billing/subscribe',
    {
      schema: {
        operationId: 'subscribeToPlan',
        tags: ['Account'],
        summary: 'Subscribe to a paid plan by card: opens a Stripe Checkout page',
        description:
          'Opens a Stripe Checkout session (mode subscription) for the plan\u2019s configured Price (STRIPE_PRICE_<PLAN>; unset or unknown plan: 400). ' +
          'The plan is set, and its monthly credits (PLAN_CREDITS_<PLAN>) granted per paid invoice, when Stripe reports them. An account with a live ' +
          'subscription: 409 subscription_exists (change it in the portal). 503 payments_unavailable when STRIPE_SECRET_KEY is not set.',
        body: SubscribeBody,
        bodyExamples: { pro: { summary: 'The pro plan', value: { plan: 'pro' } } },
        response: {
          '201': ok(PlanOpenedSchema, 'The Checkout page to send the customer to.', { headers: [...RATE_LIMIT] }),
          ...errors(['400', '403', '409', '502']),
        },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const d = available();
      const caller = await app.authenticate(req, reply);
      payer(caller, 'subscribe');
      const { plan } = input<typeof SubscribeBody>(req, 'body', 'Subscribe request is invalid');
      const opened = await openPlanCheckout(d, caller.accountId, plan, returnBase(req));
      return reply.status(201).send({ ...opened, plan });
    },
  );

  app.post(
    '/billing/portal',
    {
      schema: {
        operationId: 'openBillingPortal',
        tags: ['Account'],
        summary: "The Stripe Billing Portal for the account's card, invoices and plan",
        description:
          'Answers a Stripe Billing Portal session URL for the account\u2019s Stripe customer. 404 not_found when the account has never paid by card ' +
          '(it has no customer). 503 payments_unavailable when STRIPE_SECRET_KEY is not set.',
        response: { '200': ok(PortalSchema, 'The portal page.', { headers: [...RATE_LIMIT] }), ...errors(['403', '404', '502']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const d = available();
      const caller = await app.authenticate(req, reply);
      payer(caller, 'manage billing');
      return openPortal(d, caller.accountId, `${returnBase(req)}/subscribe`);
    },
  );

  // The webhook needs the body exactly as Stripe signed it: its own plugin, whose only parser keeps the bytes.
  await app.register(async (hook) => {
    hook.removeAllContentTypeParsers();
    hook.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
    hook.post(
      '/stripe/webhook',
      {
        schema: {
          operationId: 'stripeWebhook',
          tags: ['Account'],
          summary: "Stripe's webhook endpoint: card payments, refunds, disputes, subscriptions and invoices",
          description:
            'Stripe POSTs its events here, signed (Stripe-Signature, checked against STRIPE_WEBHOOK_SECRET over the raw body: a missing or wrong ' +
            'signature is 400 invalid_input and changes nothing). Each event acts once, however often and in whatever order it is delivered, and ' +
            'on any number of replicas at once. Events acted on: checkout.session.completed, charge.refunded, charge.dispute.*, ' +
            'customer.subscription.created/updated/deleted, invoice.paid; others are acknowledged (200) and ignored. 502 when Stripe could not be ' +
            'asked for an object\u2019s current state (Stripe retries). 503 payments_unavailable when STRIPE_SECRET_KEY is not set.',
          security: 'none',
          response: { '200': ok(WebhookAckSchema, 'Received.'), ...errors(['400', '502'], { keyed: false }) },
        } satisfies RouteSchema,
      },
      async (req) => {
        const d = available();
        const signature = req.headers['stripe-signature'];
        const event = verifyEvent(d, Buffer.isBuffer(req.body) ? req.body : undefined, typeof signature === 'string' ? signature : undefined);
        const out = await webhooks!.handle(event);
        return { received: true as const, ...out };
      },
    );
  });
}
