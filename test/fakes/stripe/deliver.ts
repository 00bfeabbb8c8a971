import type { LightMyRequestResponse } from 'fastify';
import type { Harness } from '../../helpers/harness.js';
import type { SignedEvent } from './fake-stripe.js';

/** Delivers one event to POST /stripe/webhook as Stripe does: the raw payload, its signature, JSON. */
export function deliver(h: Harness, e: SignedEvent, signature = e.signature): Promise<LightMyRequestResponse> {
  return h.request({
    method: 'POST',
    url: '/stripe/webhook',
    headers: {
      'content-type': 'application/json; charset=utf-8',
      'stripe-signature': signature,
      'user-agent': 'Stripe/1.0 (+https://stripe.com/docs/webhooks)',
    },
    payload: e.payload,
  });
}

export function only(events: SignedEvent[], type: string): SignedEvent {
  const found = events.filter((e) => e.type === type);
  if (found.length !== 1) throw new Error(`expected one ${type} event, got ${found.length} of ${events.map((e) => e.type).join(', ')}`);
  return found[0]!;
}
