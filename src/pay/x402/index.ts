/**
 * pay/: money from outside. x402 pay-per-call and stablecoin top-ups: requirements, payloads,
 * verification, settlement (facilitator, self, deferred) and the payment store. It turns a payment
 * into a right to run a call or into credits; money/ takes it from there.
 */
/**
 * x402 pay-per-call: a caller without a key pays each call with a signed USDC transfer
 * authorization (x402 v1, scheme exact, EIP-3009). HTTP-free; the routes call admitPayment /
 * completePayment / abandonPayment and the error handler uses paymentErrorBody for payment errors.
 */
export * from './requirements.js';
export * from './payload.js';
export * from './verify.js';
export * from './settle-types.js';
export * from './settler.js';
export * from './store.js';
export * from './flow.js';
export * from './payment-identifier.js';
export * from './reconcile.js';
