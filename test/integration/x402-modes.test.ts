import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { sql } from '../../src/db/pool.js';
import { DEFERRED_WARNING } from '../../src/pay/x402/settler.js';
import { FAKE_TOKEN, startFakeCloudflare, type FakeCloudflare } from '../helpers/fake-cloudflare.js';
import { startFakeFacilitator, type FakeFacilitator } from '../helpers/fake-facilitator.js';
import { startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import { json, startHarness, testEnv, type Harness } from '../helpers/harness.js';
import { PAY_TO, newPayerKey, signPayment, toHeader } from '../helpers/x402-sign.js';
import type { PaymentRequirements } from '../../src/pay/x402/requirements.js';
import { privateKeyToAccount } from 'viem/accounts';

/**
 * The settlement modes as an operator meets them: the start-up refusals (no mode, two modes, a
 * facilitator that does not support our network or cannot be reached), deferred settlement's warning
 * and per-payer cap, a facilitator's refusal stopping the tool before it runs, and the rule that
 * tools with side effects are never sold per call.
 */

const repo = fileURLToPath(new URL('../..', import.meta.url));

/** Starts the service as an operator would and returns how it ended (it must end by itself). */
function startService(env: Record<string, string>): Promise<{ code: number | null; stderr: string; stdout: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
      cwd: repo,
      env: { PATH: process.env.PATH, HOME: process.env.HOME, ...testEnv({ PORT: '0', WORKERS: 'off', EDGE_TOKEN_KEY: 'a'.repeat(64), ...env }) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`the service did not stop by itself: ${stdout}${stderr}`));
      // A start-up is 10-20 s of tsx on a loaded 2-core machine, and the first test starts four at once.
    }, 60_000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

describe('start-up refusals', () => {
  let fake: FakeFacilitator;
  beforeAll(async () => {
    fake = await startFakeFacilitator({ kinds: [{ x402Version: 2, scheme: 'exact', network: 'eip155:8453' }] });
  });
  afterAll(async () => fake?.close());

  it('X402_ENABLED with no settlement mode, two modes, or a facilitator that cannot serve us: exit 1 with one line', async () => {
    const enabled = { X402_ENABLED: 'true', X402_PAY_TO: PAY_TO };
    const [none, two, unsupported, unreachable] = await Promise.all([
      startService(enabled),
      startService({ ...enabled, X402_FACILITATOR_URL: 'http://127.0.0.1:9', X402_SETTLEMENT: 'deferred' }),
      startService({ ...enabled, X402_FACILITATOR_URL: fake.url }),
      startService({ ...enabled, X402_FACILITATOR_URL: 'http://127.0.0.1:9' }),
    ]);
    for (const r of [none, two, unsupported, unreachable]) {
      expect(r.code).toBe(1);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
    }
    expect(none.stderr).toMatch(
      /^tollgate: Invalid configuration: X402_SETTLEMENT: X402_ENABLED=true needs exactly one settlement mode: set X402_FACILITATOR_URL .*X402_RPC_URL \+ X402_SETTLER_PRIVATE_KEY.*X402_SETTLEMENT=deferred/,
    );
    expect(two.stderr).toMatch(/facilitator and deferred are both configured/);
    expect(unsupported.stderr).toMatch(/does not support scheme exact on eip155:84532 \(base-sepolia\); it lists v2 exact on eip155:8453/);
    expect(unreachable.stderr).toMatch(/cannot reach the x402 facilitator at http:\/\/127\.0\.0\.1:9/);
  }, 120_000);

  it('a private key is never echoed, even when it is malformed', async () => {
    const secret = `0x${'ab'.repeat(31)}zz`;
    const r = await startService({ X402_ENABLED: 'true', X402_PAY_TO: PAY_TO, X402_RPC_URL: 'http://127.0.0.1:9', X402_SETTLER_PRIVATE_KEY: secret });
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/X402_SETTLER_PRIVATE_KEY: expected a 0x-prefixed 32-byte hex private key/);
    expect(r.stderr + r.stdout).not.toContain('abab');
  }, 30_000);
});

const PaymentRow = z.object({ status: z.string(), error: z.string().nullable() });

async function offer(h: Harness, path: string, body: unknown): Promise<PaymentRequirements> {
  const res = await h.app.inject({ method: 'POST', url: path, payload: body as object });
  expect(res.statusCode).toBe(402);
  return json(res).accepts[0];
}

async function pay(h: Harness, path: string, body: unknown, key: `0x${string}`, headers: Record<string, string> = {}) {
  const payment = await signPayment(await offer(h, path, body), { privateKey: key });
  return h.app.inject({ method: 'POST', url: path, payload: body as object, headers: { 'x-payment': toHeader(payment), ...headers } });
}

describe('deferred settlement', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ X402_ENABLED: 'true', X402_PAY_TO: PAY_TO, X402_SETTLEMENT: 'deferred', X402_DEFERRED_MAX_CENTS: '5' }, { workers: ['core'] });
  });
  afterAll(async () => h?.close());

  it('warns at start-up and on /health', async () => {
    expect(h.logs.join('')).toContain(DEFERRED_WARNING);
    const health = await h.app.inject({ method: 'GET', url: '/health' });
    expect(json(health).warnings).toEqual([DEFERRED_WARNING]);
  });

  it('asks for authorizations valid for X402_DEFERRED_TIMEOUT_SECONDS', async () => {
    expect((await offer(h, '/tools/compute', { expression: '1' })).maxTimeoutSeconds).toBe(3600);
  });

  it('caps what one payer has unsettled: past X402_DEFERRED_MAX_CENTS the call is 402 deferred_limit and does not run', async () => {
    const key = newPayerKey();
    const payer = privateKeyToAccount(key).address.toLowerCase();
    // compute costs 2 cents: two fit under 5, the third would make 6.
    expect((await pay(h, '/tools/compute', { expression: '1+1' }, key)).statusCode).toBe(200);
    expect((await pay(h, '/tools/compute', { expression: '1+2' }, key)).statusCode).toBe(200);
    const third = await pay(h, '/tools/compute', { expression: '1+3' }, key);
    expect(third.statusCode).toBe(402);
    expect(json(third)).toMatchObject({ code: 'payment_invalid', reason: 'deferred_limit', open_cents: 4, limit_cents: 5 });
    // Another payer is not held back by this one.
    expect((await pay(h, '/tools/compute', { expression: '2+2' }, newPayerKey())).statusCode).toBe(200);
    // Once the operator settles (or writes off) one, the payer has room again.
    const open = await h.container.pool.any(sql.type(z.object({ id: z.string() }))`
      SELECT id FROM x402_payments WHERE payer = ${payer} AND status = 'awaiting_settlement' ORDER BY created_at LIMIT 1`);
    await h.container.pool.query(sql.unsafe`UPDATE x402_payments SET status = 'settled', tx_hash = ${`0x${'1'.repeat(64)}`} WHERE id = ${open[0]!.id}`);
    expect((await pay(h, '/tools/compute', { expression: '1+4' }, key)).statusCode).toBe(200);
  });

  it('concurrent payments cannot pass the cap together', async () => {
    const key = newPayerKey();
    const answers = await Promise.all(Array.from({ length: 6 }, (_, i) => pay(h, '/tools/compute', { expression: `${i}+1` }, key)));
    expect(answers.filter((r) => r.statusCode === 200)).toHaveLength(2);
    expect(answers.filter((r) => r.statusCode === 402 && json(r).reason === 'deferred_limit')).toHaveLength(4);
  });
});

describe('with a facilitator', () => {
  let h: Harness;
  let fake: FakeFacilitator;
  let model: FakeOpenAI;
  beforeAll(async () => {
    fake = await startFakeFacilitator();
    model = await startFakeOpenAI();
    h = await startHarness({ X402_ENABLED: 'true', X402_PAY_TO: PAY_TO, X402_FACILITATOR_URL: fake.url, LLM_BASE_URL: model.baseURL }, { workers: ['llm'] });
  });
  afterAll(async () => {
    await h?.close();
    await fake?.close();
    await model?.close();
  });

  it('/verify saying isValid: false (insufficient_funds) means the tool never runs and nothing is settled', async () => {
    fake.script('/verify', { status: 400, body: { isValid: false, invalidReason: 'insufficient_funds', invalidMessage: 'balance 0', payer: PAY_TO } });
    const asked = model.requests.length;
    const key = newPayerKey();
    const res = await pay(h, '/tools/genius', { problem: 'What is 2 + 2?' }, key);
    expect(res.statusCode).toBe(402);
    expect(json(res)).toMatchObject({ code: 'payment_invalid', reason: 'insufficient_funds' });
    expect(model.requests.length).toBe(asked);
    expect(fake.requests.at(-1)!.path).toBe('/verify');
    const rows = await h.container.pool.any(sql.type(PaymentRow)`
      SELECT status, error FROM x402_payments WHERE payer = ${privateKeyToAccount(key).address.toLowerCase()}`);
    expect(rows).toEqual([{ status: 'failed', error: 'verify: insufficient_funds' }]);
  });

  it('speaks v1 to a facilitator that lists only v1 on /supported', async () => {
    const v1only = await startFakeFacilitator({ kinds: [{ x402Version: 1, scheme: 'exact', network: 'base-sepolia' }] });
    const h1 = await startHarness({ X402_ENABLED: 'true', X402_PAY_TO: PAY_TO, X402_FACILITATOR_URL: v1only.url }, { workers: ['core'] });
    try {
      const res = await pay(h1, '/tools/compute', { expression: '2*21' }, newPayerKey());
      expect(res.statusCode).toBe(200);
      expect(v1only.requests.map((r) => [r.path, r.body.x402Version])).toEqual([
        ['/verify', 1],
        ['/settle', 1],
      ]);
    } finally {
      await h1.close();
      await v1only.close();
    }
  });
});

describe('tools with side effects are not sold per call', () => {
  let h: Harness;
  let cf: FakeCloudflare;
  let fake: FakeFacilitator;
  beforeAll(async () => {
    cf = await startFakeCloudflare();
    fake = await startFakeFacilitator();
    h = await startHarness(
      { X402_ENABLED: 'true', X402_PAY_TO: PAY_TO, X402_FACILITATOR_URL: fake.url, CF_API_BASE_URL: cf.url },
      { workers: ['core', 'edge'] },
    );
  });
  afterAll(async () => {
    await h?.close();
    await cf?.close();
    await fake?.close();
  });

  const zone = '023e105f4ecef8ad9ca31a8372d0c353';
  const cases: Array<[string, string, unknown]> = [
    ['alone', '/tools/cf_purge_all', { zone_id: zone, edge_token: FAKE_TOKEN }],
    ['alone on the root protocol', '/', { m: 'cf_create_zone', q: 'example.com', edge_token: FAKE_TOKEN }],
    ['in a chain', '/', { chain: ['compute', 'cf_purge_all'], q: '1', edge_token: FAKE_TOKEN }],
    ['in a parallel', '/', { parallel: ['compute', 'cf_purge_all'], q: zone, edge_token: FAKE_TOKEN }],
  ];

  it.each(cases)('%s: 401 before any payment is asked, even with a payment attached; nothing reaches Cloudflare', async (_name, url, body) => {
    const facilitatorCalls = fake.requests.length;
    for (const headers of [
      {},
      { 'x-payment': toHeader(await signPayment(await offer(h, '/tools/compute', { expression: '1' }), { privateKey: newPayerKey() })) },
    ]) {
      const res = await h.app.inject({ method: 'POST', url, payload: body as object, headers });
      expect(res.statusCode).toBe(401);
      expect(json(res).error).toMatchObject({ code: 'unauthorized', message: expect.stringMatching(/not sold per call: send an API key/) });
      expect(res.headers['payment-required']).toBeUndefined();
      expect(res.headers['x-payment-required']).toBeUndefined();
    }
    expect(cf.requests).toHaveLength(0);
    expect(fake.requests.length).toBe(facilitatorCalls);
  });
});
