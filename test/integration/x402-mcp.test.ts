import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import type { Address, Hex } from 'viem';
import { sql } from '../../src/db/pool.js';
import { startChain, type Chain, type Wallet } from '../helpers/chain.js';
import { startHarness, type Harness } from '../helpers/harness.js';
import { X402McpTestClient, paymentRequiredOf } from '../helpers/x402-mcp-client.js';

/**
 * x402 over MCP (x402 specs/transports-v2/mcp.md) on POST /mcp/x402, against anvil with the service
 * settling itself (as x402-chain.test.ts): an MCP client built the way x402's reference MCP client
 * is (the MCP SDK plus @x402/core's x402Client and @x402/evm's exact scheme) pays per call, and the
 * money is read from the chain and from the payment records.
 */

let chain: Chain;
let h: Harness;
let url: string;
let payTo: Address;

beforeAll(async () => {
  chain = await startChain();
  const settler = await chain.newWallet();
  payTo = (await chain.newWallet()).address;
  h = await startHarness(
    { X402_ENABLED: 'true', X402_PAY_TO: payTo, X402_RPC_URL: chain.rpcUrl, X402_SETTLER_PRIVATE_KEY: settler.privateKey },
    { workers: ['core'] },
  );
  await h.app.listen({ port: 0, host: '127.0.0.1' });
  url = `http://127.0.0.1:${(h.app.server.address() as AddressInfo).port}/mcp/x402`;
}, 60_000);

afterAll(async () => {
  await h?.close();
  await chain?.stop();
});

const PaymentRow = z.object({ status: z.string(), tool: z.string(), resource: z.string(), x402_version: z.number() });
const paymentsOf = (payer: Address) =>
  h.container.pool.any(sql.type(PaymentRow)`
    SELECT status, tool, resource, x402_version FROM x402_payments WHERE payer = ${payer.toLowerCase()} ORDER BY created_at`);

async function funded(atomic: bigint): Promise<Wallet> {
  const w = await chain.newWallet();
  await chain.mint(w.address, atomic);
  return w;
}

async function clientFor(w: Wallet, headers: Record<string, string> = {}) {
  return new X402McpTestClient(url, w.account, headers).connect();
}

async function rpc(body: unknown, headers: Record<string, string> = {}) {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
    body: JSON.stringify(body),
  });
}

const meta = (r: { _meta?: Record<string, unknown> }) => r._meta ?? {};

describe('tools/list on /mcp/x402', () => {
  it('lists the tools sold per call, without a key, each with its price in x402 terms', async () => {
    const c = await clientFor(await chain.newWallet());
    const { tools } = await c.mcp.listTools();
    await c.close();
    const compute = tools.find((t) => t.name === 'compute')!;
    expect(compute.description).toMatch(/0\.02 USDC per successful call, paid with x402 on eip155:84532/);
    expect(compute._meta?.['x402/accepts']).toEqual([
      {
        scheme: 'exact',
        network: 'eip155:84532',
        amount: '20000',
        asset: chain.usdc,
        payTo,
        maxTimeoutSeconds: expect.any(Number),
        extra: { name: 'USDC', version: '2' },
      },
    ]);
    // The HTTP rule: no free tools, no tools with side effects (Cloudflare changes).
    const names = tools.map((t) => t.name);
    expect(names).not.toContain('cf_purge_cache');
    expect(tools.every((t) => Number(t._meta?.['tollgate/price_cents']) > 0)).toBe(true);
  });
});

describe('paying per call over MCP', () => {
  it('a call without payment answers the PaymentRequired as the transport specification shapes it', async () => {
    const c = await clientFor(await chain.newWallet());
    const result = await c.raw('compute', { expression: '6*7' });
    await c.close();
    expect(result.isError).toBe(true);
    expect(result.structuredContent).toEqual({
      x402Version: 2,
      error: expect.stringMatching(/costs 0\.02 USDC/),
      resource: { url: 'mcp://tool/compute', description: expect.stringMatching(/^compute: /), mimeType: 'application/json' },
      accepts: [
        {
          scheme: 'exact',
          network: 'eip155:84532',
          amount: '20000',
          asset: chain.usdc,
          payTo,
          maxTimeoutSeconds: expect.any(Number),
          extra: { name: 'USDC', version: '2' },
        },
      ],
      extensions: { 'payment-identifier': { info: { required: false }, schema: expect.objectContaining({ required: ['required'] }) } },
    });
    expect(result.content).toEqual([{ type: 'text', text: JSON.stringify(result.structuredContent) }]);
  });

  it('the reference client flow pays, gets the result with x402/payment-response, and the price moves on chain once', async () => {
    const payer = await funded(1_000_000n);
    const before = await chain.balanceOf(payTo);
    const c = await clientFor(payer);
    const { result, payment } = await c.callTool('compute', { expression: '6*7' });
    await c.close();
    expect(payment).toBeDefined();
    expect(result.isError).toBeFalsy();
    expect((result.structuredContent as { result: { value: number } }).result.value).toBe(42);
    const settlement = meta(result)['x402/payment-response'] as { success: boolean; transaction: Hex; network: string; payer: string };
    expect(settlement).toMatchObject({ success: true, network: 'eip155:84532', payer: payer.address });
    const receipt = await chain.publicClient.getTransactionReceipt({ hash: settlement.transaction });
    expect(receipt.status).toBe('success');
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);
    expect(await chain.balanceOf(payTo)).toBe(before + 20_000n);
    expect(await paymentsOf(payer.address)).toEqual([{ status: 'settled', tool: 'compute', resource: 'mcp://tool/compute', x402_version: 2 }]);
  });

  it('a tool that fails is not settled: the error result, nothing moved', async () => {
    const payer = await funded(1_000_000n);
    const c = await clientFor(payer);
    // Valid input that fails when it runs: an undefined symbol.
    const { result, payment } = await c.callTool('compute', { expression: 'nosuchthing + 1' });
    await c.close();
    expect(payment).toBeDefined();
    expect(result.isError).toBe(true);
    expect(meta(result)).not.toHaveProperty('x402/payment-response');
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n);
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'failed' }]);
  });

  it('a payment that does not verify answers the PaymentRequired again, with the reason beside it', async () => {
    const payer = await funded(1_000_000n);
    const c = await clientFor(payer);
    const required = paymentRequiredOf(await c.raw('compute', { expression: '1+1' }))!;
    const payment = await c.payments.createPaymentPayload(required);
    const forged = { ...payment, payload: { ...payment.payload, signature: `0x${'11'.repeat(65)}` } };
    const result = await c.raw('compute', { expression: '1+1' }, forged);
    const notAnObject = await c.raw('compute', { expression: '1+1' }, 'base64?');
    await c.close();
    expect(paymentRequiredOf(result)).toMatchObject({ x402Version: 2, accepts: [{ amount: '20000' }] });
    expect(meta(result)['tollgate/error']).toMatchObject({ code: 'payment_invalid', reason: 'invalid_signature' });
    expect(meta(notAnObject)['tollgate/error']).toMatchObject({ code: 'payment_invalid', reason: 'malformed_payment' });
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n);
  });

  it('tools with side effects and free tools are not sold here, before any price is quoted', async () => {
    const c = await clientFor(await chain.newWallet());
    const cf = await c.raw('cf_purge_cache', { zone_id: 'z', purge_everything: true });
    await c.close();
    expect(cf.isError).toBe(true);
    expect(paymentRequiredOf(cf)).toBeUndefined();
    expect(cf.structuredContent).toMatchObject({ error: { code: 'unauthorized', side_effect_tools: ['cf_purge_cache'] } });
  });
});

describe('payment-identifier over MCP', () => {
  it('a retry of the same payment gets the first answer, marked replayed, and is settled once', async () => {
    const payer = await funded(1_000_000n);
    const c = await clientFor(payer);
    c.paymentId = `pay_${crypto.randomUUID().replaceAll('-', '')}`;
    const first = await c.callTool('compute', { expression: '2^10' });
    expect(first.payment?.extensions?.['payment-identifier']).toMatchObject({ info: { id: c.paymentId } });
    const again = await c.raw('compute', { expression: '2^10' }, first.payment);
    await c.close();
    expect(again.structuredContent).toEqual(first.result.structuredContent);
    expect(meta(again)['x402/payment-response']).toEqual(meta(first.result)['x402/payment-response']);
    expect(meta(again)['tollgate/replayed']).toBe(true);
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);
    expect(await paymentsOf(payer.address)).toHaveLength(1);
  });

  it('the same id with another payment, or the same payment for other arguments, is refused with a code; nothing moves', async () => {
    const payer = await funded(1_000_000n);
    const c = await clientFor(payer);
    c.paymentId = `pay_${crypto.randomUUID().replaceAll('-', '')}`;
    const first = await c.callTool('compute', { expression: '3*3' });
    expect(first.result.isError).toBeFalsy();
    // The reference client's own retry signs a new payment with the same id.
    const newPayment = await c.callTool('compute', { expression: '3*3' });
    const otherArgs = await c.raw('compute', { expression: '4*4' }, first.payment);
    await c.close();
    for (const r of [newPayment.result, otherArgs]) {
      expect(r.isError).toBe(true);
      expect(r.structuredContent).toMatchObject({ error: { code: 'payment_identifier_reused', payment_identifier: c.paymentId } });
      expect((r.content[0] as { text: string }).text).toMatch(/^payment_identifier_reused: /);
    }
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);
    // Refused before the new payment was admitted: its authorization is not even reserved.
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'settled' }]);
  });

  it('the same payment sent twice at once runs once: the other waits its turn or is told it is in progress', async () => {
    const payer = await funded(1_000_000n);
    const c = await clientFor(payer);
    c.paymentId = `pay_${crypto.randomUUID().replaceAll('-', '')}`;
    const required = paymentRequiredOf(await c.raw('compute', { expression: '7*6' }))!;
    const payment = await c.payments.createPaymentPayload(required);
    const results = await Promise.all([0, 1, 2].map(() => c.raw('compute', { expression: '7*6' }, payment)));
    await c.close();
    const ok = results.filter((r) => !r.isError);
    expect(ok.length).toBeGreaterThanOrEqual(1);
    for (const r of ok) expect((r.structuredContent as { result: { value: number } }).result.value).toBe(42);
    for (const r of results.filter((r) => r.isError)) expect(r.structuredContent).toMatchObject({ error: { code: 'idempotency_in_progress' } });
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n - 20_000n);
    expect(await paymentsOf(payer.address)).toMatchObject([{ status: 'settled' }]);
  });

  it('a forged payment naming the payer cannot take its id: refused, and the id still works for the real payment', async () => {
    const payer = await funded(1_000_000n);
    const c = await clientFor(payer);
    c.paymentId = `pay_${crypto.randomUUID().replaceAll('-', '')}`;
    const required = paymentRequiredOf(await c.raw('compute', { expression: '5+5' }))!;
    const payment = await c.payments.createPaymentPayload(required);
    const forged = { ...payment, payload: { ...payment.payload, signature: `0x${'22'.repeat(65)}` } };
    const refused = await c.raw('compute', { expression: '5+5' }, forged);
    expect(meta(refused)['tollgate/error']).toMatchObject({ code: 'payment_invalid', reason: 'invalid_signature' });
    const real = await c.raw('compute', { expression: '5+5' }, payment);
    await c.close();
    expect((real.structuredContent as { result: { value: number } }).result.value).toBe(10);
  });

  it('an id outside the format (16 to 128 letters, digits, - and _) is refused as bad input', async () => {
    const payer = await funded(1_000_000n);
    const c = await clientFor(payer);
    for (const id of ['short', 'x'.repeat(129), 'pay_with spaces and more']) {
      c.paymentId = undefined;
      const required = paymentRequiredOf(await c.raw('compute', { expression: '1' }))!;
      const payment = await c.payments.createPaymentPayload(required);
      (payment.extensions!['payment-identifier'] as { info: { id: string } }).info.id = id;
      const r = await c.raw('compute', { expression: '1' }, payment);
      expect(r.structuredContent).toMatchObject({ error: { code: 'invalid_input' } });
    }
    await c.close();
    expect(await chain.balanceOf(payer.address)).toBe(1_000_000n);
  });
});

describe('the /mcp/x402 transport', () => {
  it('refuses a request carrying Authorization, pointing to /mcp', async () => {
    const res = await rpc({ jsonrpc: '2.0', id: 1, method: 'tools/list' }, { authorization: 'Bearer cv_live_whatever' });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { code: string; message: string } }).error).toMatchObject({
      code: 'invalid_input',
      message: expect.stringMatching(/send your API key or token to \/mcp/),
    });
  });

  it('keeps /mcp rules: not JSON, a batch with two tools/calls, a foreign origin', async () => {
    const notJson = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: '{',
    });
    expect(notJson.status).toBe(400);
    expect(await notJson.json()).toMatchObject({ error: { code: -32700 } });
    const call = (id: number) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'compute', arguments: { expression: '1' } } });
    const two = await rpc([call(1), call(2)]);
    expect(two.status).toBe(400);
    expect(await two.json()).toMatchObject({ error: { code: -32600, message: expect.stringMatching(/at most one tools\/call/) } });
    const foreign = await rpc({ jsonrpc: '2.0', id: 1, method: 'tools/list' }, { origin: 'https://evil.example' });
    expect(foreign.status).toBe(403);
    const get = await fetch(url);
    expect(get.status).toBe(405);
  });
});
