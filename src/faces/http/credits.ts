import type { FastifyInstance } from 'fastify';
import { requireNotInGrace } from '../../access/keys.js';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { parseOrThrow } from '../../errors.js';
import { creditSettledTopups, topUp, topupUnavailable, type TopupDeps } from '../../pay/topup.js';
import { paymentHeaders } from './paid-calls.js';
import { baseUrl } from './meta.js';

/**
 * POST /credits/topup: an account buys credits with an x402 payment (src/pay/topup.ts). The key
 * identifies the account; the payment pays. Sub-keys and sandbox keys cannot top up: a sub-key
 * spends its parent's credits under a cap, and sandbox keys never touch real money.
 */
export async function creditRoutes(app: FastifyInstance): Promise<void> {
  const { config, pool, credits, log } = app.container;
  const deps: TopupDeps = { config, pool, credits, x402: app.container.api?.payPerCall?.deps.x402, log };
  const Body = z
    .object({
      cents: z
        .number({ required_error: 'is required', invalid_type_error: 'must be a whole number of cents' })
        .int('must be a whole number of cents')
        .min(config.TOPUP_MIN_CENTS, `must be at least ${config.TOPUP_MIN_CENTS} (TOPUP_MIN_CENTS)`)
        .max(config.TOPUP_MAX_CENTS, `must be at most ${config.TOPUP_MAX_CENTS} (TOPUP_MAX_CENTS)`),
    })
    .strict();

  app.post('/credits/topup', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    requireNotInGrace(caller, 'top up');
    if (caller.keyType === 'sub') throw new AppError('forbidden', 'A sub-key cannot top up; use the account\u2019s production key');
    if (caller.keyType === 'test') throw new AppError('forbidden', 'Sandbox keys cannot top up (they never spend real credits); use a production key');
    // Bad input is refused before any money is asked for.
    const { cents } = parseOrThrow(Body, req.body, 'Top-up request is invalid');
    const unavailable = topupUnavailable(deps);
    if (unavailable) throw unavailable;
    const out = await topUp(deps, caller.accountId, cents, `${baseUrl(app, req)}/credits/topup`, paymentHeaders(req));
    reply.headers(out.headers);
    return { cents: out.cents, credits: out.credits, payment: out.payment };
  });

  // Repairs top-ups settled but not credited (a crash in between): at start-up, then on the
  // reconciler's interval. Idempotent, so every replica may run it.
  if (!deps.x402 || deps.x402.settler.mode === 'deferred') return;
  const recover = () =>
    creditSettledTopups(deps).catch((err: Error) => log.warn({ err: err.message }, 'top-up recovery pass failed'));
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
