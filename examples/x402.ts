/**
 * Pay per call with x402, no API key: the 402 and its price, then the same request paid with a
 * signed USDC authorization (x402 v2, `@x402/fetch` + `@x402/evm`), then the paid result.
 * The service needs X402_ENABLED=true and a settlement mode (see docs/guides/pay-per-call.md).
 *   TOLLGATE_URL=http://localhost:8080 X402_PAYER_KEY=0x<64 hex> npx tsx examples/x402.ts
 * X402_PAYER_KEY is the payer's private key: use a test wallet, never one holding real funds.
 */
import { decodePaymentRequiredHeader } from '@x402/core/http';
import { ExactEvmScheme } from '@x402/evm';
import { decodePaymentResponseHeader, wrapFetchWithPaymentFromConfig } from '@x402/fetch';
import type { Hex } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';

const baseUrl = process.env.TOLLGATE_URL;
const payerKey = process.env.X402_PAYER_KEY;
if (!baseUrl || !payerKey || !/^0x[0-9a-fA-F]{64}$/.test(payerKey)) {
  console.error('Set TOLLGATE_URL (e.g. http://localhost:8080) and X402_PAYER_KEY (a test private key, 0x + 64 hex digits).');
  process.exit(2);
}

const url = `${baseUrl.replace(/\/+$/, '')}/tools/compute`;
const init = { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ expression: '6 * 7' }) };

async function main(): Promise<void> {
  const payer = privateKeyToAccount(payerKey as Hex);
  console.log(`payer: ${payer.address}`);

  // 1. Without a key or a payment: 402 Payment Required, with the price in both protocol versions.
  const ask = await fetch(url, init);
  if (ask.status !== 402) throw new Error(`expected 402 without a key, got ${ask.status}: ${await ask.text()}`);
  const v2 = ask.headers.get('payment-required');
  if (!v2) throw new Error('the 402 has no PAYMENT-REQUIRED header (is X402_ENABLED set on the service?)');
  const offer = decodePaymentRequiredHeader(v2).accepts[0];
  await ask.body?.cancel();
  console.log(
    `402: ${ask.headers.get('x-payment-amount')} ${ask.headers.get('x-payment-currency')} on ${ask.headers.get('x-payment-network')}` +
      ` (${offer?.amount} atomic units of ${offer?.asset} to ${offer?.payTo}, network ${offer?.network})`,
  );

  // 2. The same request through a paying fetch: it reads the 402, signs an EIP-3009 authorization
  //    for the exact price with the payer's key, and retries with PAYMENT-SIGNATURE.
  const pay = wrapFetchWithPaymentFromConfig(fetch, { schemes: [{ network: 'eip155:*', client: new ExactEvmScheme(payer) }] });
  const res = await pay(url, init);
  const body = (await res.json()) as { result?: { value: number }; cost_cents?: number; error?: unknown; reason?: string };
  if (res.status !== 200) throw new Error(`the paid call answered ${res.status}: ${JSON.stringify(body)}`);

  // 3. The paid result, and the settlement the service reports (PAYMENT-RESPONSE).
  const header = res.headers.get('payment-response');
  const settlement = header ? decodePaymentResponseHeader(header) : undefined;
  console.log(`paid: 6 * 7 = ${body.result?.value} (cost ${body.cost_cents} cents, paid per call)`);
  console.log(`settlement: success=${settlement?.success} transaction=${settlement?.transaction || '(none yet)'} network=${settlement?.network}`);
}

main().catch((err: unknown) => {
  console.error('FAILED:', err instanceof Error ? err.message : err);
  process.exit(1);
});
