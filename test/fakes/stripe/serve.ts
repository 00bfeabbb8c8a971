/**
 * The fake Stripe (fake-stripe.ts) on its own, to try card payments by hand without a Stripe account:
 *
 *   npm run fake:stripe -- --forward-to http://127.0.0.1:3000/stripe/webhook
 *
 * It prints the variables to start Tollgate with, and forwards every event it produces to the URL,
 * signed, as `stripe listen --forward-to` does. Drive it with its control endpoints (POST
 * /_fake/checkout/{id}/pay, /_fake/charges/{id}/refund, ...; docs/guides/card-payments.md).
 * Options: --port N (default 12111), --secret-key, --webhook-secret (default: random).
 */
import { parseArgs } from 'node:util';
import { startFakeStripe } from './fake-stripe.js';

const { values } = parseArgs({
  options: {
    port: { type: 'string', default: '12111' },
    'forward-to': { type: 'string' },
    'secret-key': { type: 'string' },
    'webhook-secret': { type: 'string' },
  },
});

const fake = await startFakeStripe({
  port: Number(values.port),
  ...(values['secret-key'] ? { secretKey: values['secret-key'] } : {}),
  ...(values['webhook-secret'] ? { webhookSecret: values['webhook-secret'] } : {}),
});
process.stdout.write(
  `fake Stripe on ${fake.url}\nstart Tollgate with:\n  STRIPE_API_URL=${fake.url} STRIPE_SECRET_KEY=${fake.secretKey} STRIPE_WEBHOOK_SECRET=${fake.webhookSecret}\n`,
);

const target = values['forward-to'];
if (target) {
  process.stdout.write(`forwarding events to ${target}\n`);
  let sent = 0;
  let busy = false;
  // Events in the order they were produced, one at a time; a refused delivery is tried again, as Stripe does.
  setInterval(() => {
    if (busy || sent >= fake.events.length) return;
    busy = true;
    const e = fake.events[sent]!;
    fetch(target, {
      method: 'POST',
      headers: {
        'content-type': 'application/json; charset=utf-8',
        'stripe-signature': e.signature,
        'user-agent': 'Stripe/1.0 (+https://stripe.com/docs/webhooks)',
      },
      body: e.payload,
    })
      .then(async (res) => {
        process.stdout.write(`${e.type} ${e.id} -> ${res.status} ${(await res.text()).slice(0, 200)}\n`);
        if (res.ok || (res.status >= 400 && res.status < 500)) sent++;
      })
      .catch((err: Error) => process.stdout.write(`${e.type} ${e.id} -> ${err.message}; trying again\n`))
      .finally(() => {
        busy = false;
      });
  }, 200);
}

for (const signal of ['SIGINT', 'SIGTERM'] as const) process.once(signal, () => void fake.close().then(() => process.exit(0)));
