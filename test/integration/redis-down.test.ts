import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';

/**
 * Redis going away under a running service, on a redis-server of this test's own (a free port, no
 * persistence): calls fail fast with 503 service_unavailable and Retry-After, /health says degraded
 * and names Redis, and once Redis is back nothing from the outage runs or is charged, and calls work.
 */
let port = 0;
let server: ChildProcess | null = null;
let h: Harness;
let acct: TestAccount;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const p = (s.address() as { port: number }).port;
      s.close(() => resolve(p));
    });
  });
}

async function startRedis(): Promise<void> {
  server = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  for (let i = 0; i < 100; i++) {
    if (spawnSync('redis-cli', ['-p', String(port), 'ping'], { encoding: 'utf8' }).stdout.trim() === 'PONG') return;
    await sleep(50);
  }
  throw new Error('redis-server did not start');
}

async function stopRedis(): Promise<void> {
  const proc = server;
  spawnSync('redis-cli', ['-p', String(port), 'shutdown', 'nosave']);
  if (proc && proc.exitCode === null) await new Promise((r) => proc.once('exit', r));
  server = null;
}

async function until(f: () => Promise<boolean>, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await f()) return;
    await sleep(100);
  }
  throw new Error('condition not met in time');
}

beforeAll(async () => {
  port = await freePort();
  await startRedis();
  h = await startHarness({ REDIS_URL: `redis://127.0.0.1:${port}`, RECONCILE_SECONDS: '0' }, { workers: ['core'] });
  acct = await h.account('pro', 100);
}, 60_000);

afterAll(async () => {
  if (!server) await startRedis().catch(() => {});
  await h?.close().catch(() => {});
  await stopRedis();
}, 60_000);

describe('Redis down', () => {
  it('fails calls fast with 503 while Redis is gone; nothing from then runs or is charged after it comes back', { timeout: 90_000 }, async () => {
    const first = await h.call('compute', { expression: '2 + 2' }, acct.apiKey);
    expect(first.statusCode).toBe(200);
    expect(await h.credits(acct.accountId)).toBe(98);
    expect((await h.request({ method: 'GET', url: '/health' })).statusCode).toBe(200);

    await stopRedis();
    await until(async () => h.container.redis.status !== 'ready', 5_000);

    for (const headers of [{}, { prefer: 'respond-async' }] as Array<Record<string, string>>) {
      const t0 = Date.now();
      const res = await h.call('compute', { expression: '6 * 7' }, acct.apiKey, headers);
      const took = Date.now() - t0;
      expect(res.statusCode).toBe(503);
      expect(took).toBeLessThan(2_000);
      expect(json(res).error).toMatchObject({ code: 'service_unavailable', retry_after: 1 });
      expect(json(res).error.request_id).toBeTruthy();
      expect(res.headers['retry-after']).toBe('1');
    }

    const t0 = Date.now();
    const health = await h.request({ method: 'GET', url: '/health' });
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect(health.statusCode).toBe(503);
    expect(json(health)).toMatchObject({ status: 'degraded', checks: { redis: 'down', postgres: 'ok' } });
    expect(json(health).down).toContain('redis');

    // Redis comes back (empty: it kept nothing). Whatever was attempted during the outage stays undone.
    await startRedis();
    await until(async () => (await h.request({ method: 'GET', url: '/health' })).statusCode === 200, 30_000);
    await sleep(2_000);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    expect(await h.credits(acct.accountId)).toBe(98);

    // And calls work again, on a balance reloaded from Postgres.
    const after = await h.call('compute', { expression: '6 * 7' }, acct.apiKey);
    expect(after.statusCode).toBe(200);
    expect(json(after)).toMatchObject({ cost_cents: 2, remaining_credits: 96 });
    expect(await h.ledgerCharges(acct.accountId)).toBe(2);
  });
});

describe('GET /health and workers', () => {
  it('counts a family once a worker for it has run: none before, then a missing one is named', async () => {
    const api = await startHarness({ RECONCILE_SECONDS: '0' }, { workers: [] });
    try {
      // A fresh prefix where no worker ever ran: nothing is expected, so nothing is down; it says which have none.
      const res = await api.request({ method: 'GET', url: '/health' });
      expect(res.statusCode).toBe(200);
      const body = json(res);
      expect(body).toMatchObject({ status: 'ok', checks: { redis: 'ok', postgres: 'ok' }, workers: 'off', families_expected: [] });
      expect(body.worker_counts).toEqual({ core: 0, web: 0, llm: 0, edge: 0, text: 0, math: 0, media: 0 });
      expect(body.without_workers).toEqual(['core', 'web', 'llm', 'edge', 'text', 'math', 'media']);
      expect(body.down).toBeUndefined();

      // A core-only worker process on the same Redis prefix (as `npm run start:worker -- --family core`).
      const { createContainer } = await import('../../src/container.js');
      const worker = await createContainer(api.config, api.container.log, { api: false, workerFamilies: ['core'] });
      try {
        const ok = await api.request({ method: 'GET', url: '/health' });
        expect(ok.statusCode).toBe(200);
        expect(json(ok)).toMatchObject({
          status: 'ok',
          families_expected: ['core'],
          worker_counts: { core: 1, web: 0, llm: 0, edge: 0, text: 0, math: 0, media: 0 },
        });
      } finally {
        await worker.close();
      }
      // Its heartbeat is withdrawn on close: core ran within the day, so it is missing now.
      const gone = await api.request({ method: 'GET', url: '/health' });
      expect(gone.statusCode).toBe(503);
      expect(json(gone).down).toEqual(['workers:core']);
      // Readiness is not about workers: this API still serves.
      expect((await api.request({ method: 'GET', url: '/readyz' })).statusCode).toBe(200);
    } finally {
      await api.close();
    }
  }, 60_000);
});
