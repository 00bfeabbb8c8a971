/**
 * x402 pay-per-call (issue 7): a caller without a key pays each call with a signed USDC transfer
 * authorization (x402 v1, scheme exact, EIP-3009). HTTP-free; the routes call admitPayment /
 * completePayment / abandonPayment and the error handler uses paymentErrorBody for payment errors.
 */
export * from './requirements.js';
export * from './payload.js';
export * from './verify.js';
export * from './settler.js';
export * from './store.js';
export * from './flow.js';
