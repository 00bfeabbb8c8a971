import type { FastifyInstance } from 'fastify';
import { requireNotInGrace } from '../../access/keys.js';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { ENDPOINTS } from '../../calls/catalogue.js';
import { creditSettledTopups, topUp, topupUnavailable, type TopupDeps } from '../../pay/topup.js';
import { paymentHeaders } from './paid-calls.js';
import { baseUrl } from './meta.js';
import { RATE_LIMIT } from './openapi-components.js';
import { errors, input, named, namedSchemas, ok, type RouteSchema } from './route-schema.js';

const TopupSchema = named(
  'Topup',
  z.object({
    cents: z.number().int().describe('Credits added, in cents.'),
    credits: z.number().int().describe('The account\u2019s balance after the top-up.'),
    payment: z.object({ transaction: z.string().describe('The settlement transaction hash.'), network: z.string() }),
  }),
);

/** The body, by its limits (TOPUP_MIN_CENTS, TOPUP_MAX_CENTS): one schema per pair, so every app with the same config shares it. */
const topupBodies = new Map<string, ReturnType<typeof topupBody>>();

function topupBody(min: number, max: number) {
  return z
    .object({
      cents: z
        .number({ required_error: 'is required', invalid_type_error: 'must be a whole number of cents' })
        .int('must be a whole number of cents')
        .min(min, `must be at least ${min} (TOPUP_MIN_CENTS)`)
        .max(max, `must be at most ${max} (TOPUP_MAX_CENTS)`)
        .describe('Credits to buy, in cents (TOPUP_MIN_CENTS to TOPUP_MAX_CENTS); the 402 asks for exactly this many cents of USDC.'),
    })
    .strict();
}

function topupRequest(min: number, max: number) {
  const key = `${min}:${max}`;
  let body = topupBodies.get(key);
  if (!body) {
    body = topupBody(min, max);
    topupBodies.set(key, body);
    // The component is the first pair's; an app with other limits in the same process (tests) has its body inline.
    if (!namedSchemas().has('TopupRequest')) named('TopupRequest', body);
  }
  return body;
}

/**
 * POST /credits/topup: an account buys credits with an x402 payment (src/pay/topup.ts). The key
 * identifies the account; the payment pays. Sub-keys and sandbox keys cannot top up: a sub-key
 * spends its parent's credits under a cap, and sandbox keys never touch real money.
 */
export async function creditRoutes(app: FastifyInstance): Promise<void> {
  const { config, pool, credits, log } = app.container;
  const deps: TopupDeps = { config, pool, credits, x402: app.container.api?.payPerCall?.deps.x402, log };
  const Body = topupRequest(config.TOPUP_MIN_CENTS, config.TOPUP_MAX_CENTS);

  const schema = {
    operationId: 'topUp',
    tags: ['Account'],
    summary: 'Buy credits with an x402 payment',
    description:
      `${ENDPOINTS['POST /credits/topup']}. Needs both a key, which names the account, and the payment (USDC, scheme exact): a production, ` +
      'agent or VIP key (sub-keys and sandbox keys: 403 forbidden; a rotated key in its grace: 403 key_in_grace). ' +
      'Without a payment header the answer is 402 with the exact amount (v1 body, v2 PAYMENT-REQUIRED header); repeat the request ' +
      'with the signed payment in PAYMENT-SIGNATURE (v2) or X-Payment (v1). Credits are added only once the payment has settled, once per payment. ' +
      '503 topup_unavailable when x402 is not configured with a facilitator or self-settlement; 503 service_unavailable when a settled payment ' +
      'could not be credited yet (the recovery pass adds it: do not pay again). 502 upstream_error when the facilitator cannot be reached.',
    security: 'key-and-x402',
    body: Body,
    bodyExamples: { least: { summary: 'The least one top-up buys (TOPUP_MIN_CENTS)', value: { cents: config.TOPUP_MIN_CENTS } } },
    response: {
      '200': ok(TopupSchema, 'Settled and credited.', { headers: [...RATE_LIMIT, 'PAYMENT-RESPONSE', 'X-Payment-Response'] }),
      ...errors(['400', '402', '403', '502']),
    },
  } satisfies RouteSchema;

  app.post('/credits/topup', { schema }, async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    requireNotInGrace(caller, 'top up');
    if (caller.keyType === 'sub') throw new AppError('forbidden', 'A sub-key cannot top up; use the account\u2019s production key');
    if (caller.keyType === 'test') throw new AppError('forbidden', 'Sandbox keys cannot top up (they never spend real credits); use a production key');
    // Bad input is refused before any money is asked for.
    const { cents } = input<typeof Body>(req, 'body', 'Top-up request is invalid');
    const unavailable = topupUnavailable(deps);
    if (unavailable) throw unavailable;
    const out = await topUp(deps, caller.accountId, cents, `${baseUrl(app, req)}/credits/topup`, paymentHeaders(req));
    reply.headers(out.headers);
    return { cents: out.cents, credits: out.credits, payment: out.payment };
  });

  // Repairs top-ups settled but not credited (a crash in between): at start-up, then on the
  // reconciler's interval. Idempotent, so every replica may run it.
  if (!deps.x402 || deps.x402.settler.mode === 'deferred') return;
  const recover = () => creditSettledTopups(deps).catch((err: Error) => log.warn({ err: err.message }, 'top-up recovery pass failed'));
  let timer: NodeJS.Timeout | undefined;
  app.addHook('onReady', async () => {
    await recover();
    if (config.RECONCILE_SECONDS > 0) {
      timer = setInterval(() => void recover(), config.RECONCILE_SECONDS * 1000);
      timer.unref();
    }
  });
  app.addHook('onClose', async () => {
    if (timer) clearInterval(timer);
  });
}
