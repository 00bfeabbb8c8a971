import { createHmac } from 'node:crypto';

/**
 * The `Stripe-Signature` header Stripe puts on a webhook delivery: `t=<unix seconds>,v1=<hex>`, where
 * v1 is HMAC-SHA256 keyed with the endpoint's signing secret (the whole `whsec_...` string) over
 * `<t>.<raw payload>`. Written from Stripe's documentation; a test cross-checks it against the
 * `stripe` package's generateTestHeaderString.
 */
export function signPayload(payload: string, secret: string, timestamp = Math.floor(Date.now() / 1000)): string {
  const v1 = createHmac('sha256', secret).update(`${timestamp}.${payload}`, 'utf8').digest('hex');
  return `t=${timestamp},v1=${v1}`;
}
