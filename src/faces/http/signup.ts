import type { FastifyInstance, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { AdminService } from '../../ops/admin.js';
import { PLAN_RPM } from '../../access/rate-limit.js';
import { PLANS, type Plan } from '../../tools/types.js';
import { findPartnerByCode, PartnerCode } from '../../money/partners.js';
import { PAID_PLANS, planCredits, pricedPlans } from '../../pay/card/client.js';
import { baseUrl } from './meta.js';
import { escapeHtml, throttlePerAddress } from './browser-pages.js';
import { errors, input, named, ok, type RouteSchema } from './route-schema.js';

/**
 * GET /subscribe (the page a partner links to, with ?attribution_code=CODE) and POST /signup (a free
 * account with a production key, only with SIGNUP_ENABLED). Neither takes a key. Both are throttled
 * per client address (SUBSCRIBE_PER_MINUTE, SIGNUP_PER_HOUR: 429 with Retry-After) and neither tells
 * a stranger anything about other accounts or partners: the page says whether a code will be
 * recorded, never whose it is, and a sign-up answers the same way whether or not its email was used
 * before (every sign-up is a new account; an email is a contact, unverified, not an identity).
 */

const PLAN_TEXT: Record<Plan, string> = {
  free: 'Free tools and a starting tier; top up credits to call paid tools.',
  starter: 'More tools and requests per minute.',
  pro: 'Every standard tool, higher rate limit.',
  enterprise: 'Custom rate limits, sub-keys with monthly caps, VIP keys.',
};

const SignupBody = named(
  'SignupRequest',
  z
    .object({
      email: z.string().trim().max(254).email('must be an email address').describe('A contact, unverified; an email used before is not refused.'),
      attribution_code: PartnerCode.optional().describe("A partner's code (from its /subscribe link); an unknown code is refused (400)."),
    })
    .strict(),
);

const SignupSchema = named(
  'Signup',
  z.object({
    account_id: z.string().uuid(),
    api_key: z.string().describe('The production key (cv_), shown only in this answer.'),
    key_id: z.string().uuid(),
    plan: z.literal('free'),
    credits: z.number().int().describe('0: top up (POST /credits/topup) to call paid tools.'),
    email: z.string().describe('As sent, trimmed.'),
    attribution_code: z.string().nullable().describe('The partner code recorded with the sign-up, or null.'),
  }),
);

const SubscribeQuery = z.object({ attribution_code: z.string().max(100).optional().describe("A partner's code.") }).passthrough();

const SubscribePageSchema = named(
  'SubscribePage',
  z.object({
    plans: z.array(z.object({ plan: z.enum(PLANS), requests_per_minute: z.number().int(), description: z.string() })),
    signup: z.object({
      enabled: z.boolean().describe('SIGNUP_ENABLED.'),
      how: z.string(),
      example: z.string().optional().describe('A curl command, when sign-up is enabled.'),
    }),
    attribution: z
      .object({ code: z.string(), known: z.boolean(), message: z.string() })
      .nullable()
      .describe('Whether the attribution_code will be recorded (never whose it is); null without a code.'),
    topup: z.string().describe('How to buy credits.'),
    card: z
      .object({
        enabled: z.boolean().describe('Whether card payments are configured (STRIPE_SECRET_KEY).'),
        plans: z
          .array(z.object({ plan: z.enum(PAID_PLANS), monthly_credits: z.number().int().describe('Credits (cents) granted with each paid invoice.') }))
          .describe('The paid plans sold by subscription (those with a STRIPE_PRICE_<PLAN>).'),
        how: z.string(),
      })
      .describe('Card payments: top-ups and plan subscriptions through Stripe Checkout.'),
  }),
);

function wantsJson(req: FastifyRequest): boolean {
  const accept = String(req.headers.accept ?? '');
  return /application\/json/i.test(accept) && !/text\/html/i.test(accept.split(',')[0] ?? '');
}

export async function signupRoutes(app: FastifyInstance): Promise<void> {
  const { config, pool, redis, accounts, credits } = app.container;
  const admin = new AdminService({ accounts, credits, redis, prefix: config.REDIS_PREFIX, pool, sharePct: config.PARTNER_SHARE_PCT });

  const throttle = (req: FastifyRequest, what: 'signup' | 'subscribe', limit: number, windowSeconds: number, says: string) =>
    throttlePerAddress(redis, config.REDIS_PREFIX, req, { what, limit, windowSeconds, says });

  app.get(
    '/subscribe',
    {
      schema: {
        operationId: 'subscribe',
        tags: ['Account'],
        summary: "Plans and how to sign up, with a partner's attribution_code (HTML, or JSON on Accept: application/json)",
        description:
          'The page a partner links to (no key). It says whether a code will be recorded, never whose it is; an unknown code still answers 200, saying so. ' +
          'JSON when Accept names application/json and does not start with text/html, HTML otherwise. Limited per client address (SUBSCRIBE_PER_MINUTE: 429 with Retry-After).',
        security: 'none',
        querystring: SubscribeQuery,
        response: {
          '200': {
            description: 'The plans and how to sign up.',
            content: { 'text/html': { schema: { type: 'string' } }, 'application/json': { schema: SubscribePageSchema } },
          },
          ...errors(['400', '429'], { keyed: false }),
        },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      // Counted before anything is looked up: partner codes cannot be tried faster than this.
      await throttle(
        req,
        'subscribe',
        config.SUBSCRIBE_PER_MINUTE,
        60,
        `At most ${config.SUBSCRIBE_PER_MINUTE} requests to /subscribe per minute from one address`,
      );
      const q = input<typeof SubscribeQuery>(req, 'querystring', 'Query is invalid');
      const code = q.attribution_code?.trim() || undefined;
      const partner = code ? await findPartnerByCode(pool, code) : null;
      const base = baseUrl(app, req);
      const plans = PLANS.map((p) => ({
        plan: p,
        requests_per_minute: p === 'enterprise' ? config.ENTERPRISE_DEFAULT_RPM : PLAN_RPM[p],
        description: PLAN_TEXT[p],
      }));
      const body = { email: 'you@example.com', ...(partner ? { attribution_code: partner.code } : {}) };
      const signup: { enabled: boolean; how: string; example?: string } = config.SIGNUP_ENABLED
        ? {
            enabled: true,
            how: `POST ${base}/signup with a JSON body: your email${partner ? ' and this attribution code' : ''}. You get a free account and its API key, shown once.`,
            example: `curl -X POST ${base}/signup -H 'content-type: application/json' -d '${JSON.stringify(body)}'`,
          }
        : {
            enabled: false,
            how:
              'Self-service sign-up is not open on this service: ask the operator for an account' + (partner ? ` and mention the code ${partner.code}.` : '.'),
          };
      // Whether the code will be recorded, never whose it is: the page names no partner.
      const attribution = code
        ? {
            code,
            known: Boolean(partner),
            message: partner ? 'This referral code will be recorded with your sign-up.' : `The code '${code}' is unknown; you can still sign up without it.`,
          }
        : null;
      const topup = `Then top up credits with POST ${base}/credits/topup {"cents": n} (${config.TOPUP_MIN_CENTS} to ${config.TOPUP_MAX_CENTS}), paid with x402 (USDC).`;
      const cardOn = Boolean(config.STRIPE_SECRET_KEY);
      // The example names a plan that is sold by card here, if any is.
      const card0 = cardOn ? pricedPlans(config)[0] : undefined;
      const card = {
        enabled: cardOn,
        plans: cardOn ? pricedPlans(config).map((p) => ({ plan: p, monthly_credits: planCredits(config, p) })) : [],
        how: cardOn
          ? `With your key: ${card0 ? `POST ${base}/billing/subscribe {"plan": "${card0}"} opens a Stripe Checkout page for a plan; ` : ''}POST ${base}/credits/checkout {"cents": n} ` +
            `(${config.CHECKOUT_MIN_CENTS} to ${config.CHECKOUT_MAX_CENTS}) for credits by card; POST ${base}/billing/portal manages card, invoices and plan. ` +
            'An upgrade applies at once; a downgrade or cancellation at the end of the paid period.'
          : 'Card payments are not offered on this service.',
      };
      if (wantsJson(req)) return { plans, signup, attribution, topup, card };
      const e = escapeHtml;
      // Without Stripe the page is as it was: card payments are not mentioned.
      const cardHtml = card.enabled
        ? `<h2>Pay by card</h2>
${card.plans.length ? `<ul>\n${card.plans.map((p) => `<li><strong>${e(p.plan)}</strong> by subscription: ${p.monthly_credits} credits (cents) with each paid invoice</li>`).join('\n')}\n</ul>\n` : ''}<p>${e(card.how)}</p>
`
        : '';
      const html = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Subscribe to Tollgate</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body style="font-family: system-ui, sans-serif; max-width: 42rem; margin: 2rem auto; line-height: 1.5">
<h1>Subscribe to Tollgate</h1>
${attribution ? (attribution.known ? `<p>Referral code <code>${e(partner!.code)}</code>: it will be recorded with your sign-up.</p>` : `<p><strong>The code <code>${e(code!)}</code> is unknown.</strong> You can still sign up without it.</p>`) : ''}
<h2>Plans</h2>
<ul>
${plans.map((p) => `<li><strong>${e(p.plan)}</strong> (${p.requests_per_minute} requests per minute): ${e(p.description)}</li>`).join('\n')}
</ul>
<h2>Sign up</h2>
<p>${e(signup.how)}</p>
${signup.example ? `<pre>${e(signup.example)}</pre>` : ''}
<p>${e(topup)}</p>
${cardHtml}</body></html>
`;
      return reply.type('text/html; charset=utf-8').send(html);
    },
  );

  app.post(
    '/signup',
    {
      schema: {
        operationId: 'signUp',
        tags: ['Account'],
        summary: 'Create a free account and its key (SIGNUP_ENABLED; rate-limited per address)',
        description:
          'Creates a free account with its production key (shown once), recording the partner referral. Every sign-up is a new account: an email used before ' +
          'is not refused, so the answer tells nothing about other accounts. Only with SIGNUP_ENABLED (else 404); limited per client address, every attempt ' +
          'counted before the body is read (SIGNUP_PER_HOUR, 429 with Retry-After). An unknown attribution_code: 400.',
        security: 'none',
        body: SignupBody,
        bodyExamples: { email: { summary: 'A free account for this address', value: { email: 'ada@example.com' } } },
        response: { '201': ok(SignupSchema, 'The new account and its key.'), ...errors(['400', '404', '413', '415', '429'], { keyed: false }) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      if (!config.SIGNUP_ENABLED) throw new AppError('not_found', 'Self-service sign-up is not enabled on this service (SIGNUP_ENABLED)');
      // Counted before validation: every attempt from an address uses up its allowance.
      await throttle(req, 'signup', config.SIGNUP_PER_HOUR, 3600, `At most ${config.SIGNUP_PER_HOUR} sign-ups per hour from one address`);
      const body = input<typeof SignupBody>(req, 'body', 'Sign-up request is invalid');
      let partnerId: string | null = null;
      if (body.attribution_code !== undefined) {
        const partner = await findPartnerByCode(pool, body.attribution_code);
        if (!partner)
          throw new AppError('invalid_input', `Unknown attribution code '${body.attribution_code}'; sign up without it or check the link you followed`, {
            reason: 'unknown_attribution_code',
          });
        partnerId = partner.id;
      }
      // A new account every time, whether or not the email was used before: the answer cannot tell.
      const r = await admin.signUp(body.email, partnerId, req.ip);
      return reply.status(201).send({
        account_id: r.account_id,
        api_key: r.api_key,
        key_id: r.key_id,
        plan: r.plan,
        credits: r.credits,
        email: body.email,
        attribution_code: body.attribution_code ?? null,
      });
    },
  );
}
