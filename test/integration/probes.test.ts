import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { FAMILIES } from '../../src/config.js';
import { readiness, startDraining } from '../../src/ops/readiness.js';
import { startHarness, json, type Harness } from '../helpers/harness.js';
import { closedPort, startHttpTarget, type HttpTarget } from '../helpers/http-targets.js';

/**
 * Probes by purpose, with the service run as its own processes: an API (WORKERS=off) on a fresh Redis
 * prefix where no worker ever ran, whose Postgres is reached through a TCP proxy this test stops and
 * stalls (the machine's Postgres is never touched), and a worker process whose METRICS_PORT serves the
 * same /livez and /readyz and is checked with the compose file's own health check.
 */

/** A TCP proxy to Postgres that can be stopped (connections cut, port closed) and stalled (bytes go nowhere). */
class PgProxy {
  private server: net.Server | null = null;
  private readonly pairs = new Set<[net.Socket, net.Socket]>();
  private stalled = false;
  port = 0;

  constructor(private readonly target: { host: string; port: number }) {}

  async start(): Promise<void> {
    this.stalled = false;
    this.server = net.createServer((client) => {
      const upstream = net.connect(this.target.port, this.target.host);
      const pair: [net.Socket, net.Socket] = [client, upstream];
      this.pairs.add(pair);
      const drop = () => {
        client.destroy();
        upstream.destroy();
        this.pairs.delete(pair);
      };
      client.on('error', drop).on('close', drop);
      upstream.on('error', drop).on('close', drop);
      if (!this.stalled) client.pipe(upstream).pipe(client);
    });
    this.server.listen(this.port, '127.0.0.1');
    await once(this.server, 'listening');
    this.port = (this.server.address() as net.AddressInfo).port;
  }

  /** Postgres stopped: every connection cut, nothing listening. */
  async stop(): Promise<void> {
    const closed = new Promise((r) => this.server!.close(r));
    for (const [a, b] of this.pairs) a.destroy(), b.destroy();
    this.pairs.clear();
    await closed;
  }

  /** Postgres hangs: connections stay open (new ones too), and no byte is carried either way. */
  stall(): void {
    this.stalled = true;
    for (const [client, upstream] of this.pairs) {
      client.unpipe(upstream);
      upstream.unpipe(client);
      client.pause();
      upstream.pause();
    }
  }
}

let h: Harness; // seeds accounts and makes calls on the same Redis prefix and database
let proxy: PgProxy;
let target: HttpTarget;
const children: ChildProcess[] = [];
let apiPort = 0;
let apiMetricsPort = 0;

const COMPOSE = parse(readFileSync(new URL('../../docker-compose.yml', import.meta.url), 'utf8'), { merge: true }) as {
  services: Record<string, { healthcheck: { test: string[] } }>;
};

function start(args: string[], env: Record<string, string>): ChildProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', ...args], {
    env: {
      ...process.env,
      REDIS_URL: h.config.REDIS_URL,
      REDIS_PREFIX: h.config.REDIS_PREFIX,
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      ...env,
    },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  children.push(child);
  return child;
}

async function get(port: number, path: string): Promise<{ status: number; body: any; ms: number }> {
  const t0 = Date.now();
  const res = await fetch(`http://127.0.0.1:${port}${path}`);
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null, ms: Date.now() - t0 };
}

async function until(what: string, ok: () => Promise<boolean>, ms = 90_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await ok().catch(() => false))) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Runs a compose health check's `node -e` script with `env` (as Docker runs it in the container): its exit code. */
async function healthcheck(service: string, env: Record<string, string>): Promise<number> {
  const test = COMPOSE.services[service]!.healthcheck.test;
  expect(test.slice(0, 3)).toEqual(['CMD', 'node', '-e']);
  const child = spawn(process.execPath, ['-e', test[3]!], { env: { PATH: process.env.PATH!, ...env }, stdio: 'ignore' });
  const [code] = await once(child, 'exit');
  return code as number;
}

beforeAll(async () => {
  target = await startHttpTarget((_req, res) => {
    setTimeout(() => res.writeHead(200, { 'content-type': 'text/html' }).end('<title>slow</title><p>done</p>'), 3_000);
  });
  h = await startHarness({}, { workers: [] });
  const db = new URL(h.config.DATABASE_URL);
  proxy = new PgProxy({ host: db.hostname, port: Number(db.port || 5432) });
  await proxy.start();
  db.host = `127.0.0.1:${proxy.port}`;
  [apiPort, apiMetricsPort] = [await closedPort(), await closedPort()];
  start(['src/server.ts'], { WORKERS: 'off', PORT: String(apiPort), METRICS_PORT: String(apiMetricsPort), DATABASE_URL: db.toString() });
  await until('the API', async () => (await get(apiPort, '/livez')).status === 200);
}, 120_000);

afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await proxy?.stop().catch(() => {});
  await h?.close();
  await target?.close();
});

describe('an API process with no worker anywhere', () => {
  it('is live and ready, and /health says no family has a worker without calling that a failure', async () => {
    const live = await get(apiPort, '/livez');
    expect(live).toMatchObject({ status: 200, body: { status: 'ok' } });
    const ready = await get(apiPort, '/readyz');
    expect(ready.status).toBe(200);
    expect(ready.body).toMatchObject({ status: 'ready', checks: { redis: 'ok', postgres: 'ok', migrations: 'ok' }, draining: false });
    expect(ready.body.pending_migrations).toBeUndefined();

    const health = await get(apiPort, '/health');
    expect(health.status).toBe(200);
    expect(health.body).toMatchObject({ status: 'ok', workers: 'off', families_expected: [], without_workers: [...FAMILIES] });
    expect(health.body.down).toBeUndefined();
    expect(health.body.warnings).toEqual([expect.stringMatching(/^no worker has run in the last day/)]);

    // The same probes on its METRICS_PORT listener; its metrics keep their token rule (none set: open).
    expect((await get(apiMetricsPort, '/livez')).status).toBe(200);
    expect((await get(apiMetricsPort, '/readyz')).body).toMatchObject({ status: 'ready' });
    // And the compose file's API health check passes against it.
    expect(await healthcheck('api', { PORT: String(apiPort) })).toBe(0);
  });

  it('answers probes without a key, whatever it is sent, and only GET/HEAD', async () => {
    const res = await fetch(`http://127.0.0.1:${apiPort}/readyz?x=${'a'.repeat(2000)}`, { headers: { authorization: 'Bearer nonsense' } });
    expect(res.status).toBe(200);
    expect((await fetch(`http://127.0.0.1:${apiPort}/livez`, { method: 'HEAD' })).status).toBe(200);
    expect((await fetch(`http://127.0.0.1:${apiPort}/readyz`, { method: 'POST', body: '{}' })).status).toBe(404);
    expect((await fetch(`http://127.0.0.1:${apiMetricsPort}/readyz`, { method: 'POST' })).status).toBe(404);
  });
});

describe('Postgres stopped, then hanging', () => {
  it('makes /readyz 503 within 2 s while /livez stays 200, and ready again once it is back', async () => {
    await proxy.stop();
    const down = await get(apiPort, '/readyz');
    expect(down.ms).toBeLessThan(2_000);
    expect(down.status).toBe(503);
    expect(down.body).toMatchObject({ status: 'not_ready', checks: { redis: 'ok', postgres: 'down', migrations: 'unknown' }, draining: false });
    expect((await get(apiPort, '/livez')).status).toBe(200);
    const health = await get(apiPort, '/health');
    expect(health.status).toBe(503);
    expect(health.body.down).toEqual(['postgres']);
    expect(await healthcheck('api', { PORT: String(apiPort) })).toBe(1);

    await proxy.start();
    await until('ready again', async () => (await get(apiPort, '/readyz')).status === 200, 15_000);

    // Hanging: connections accepted, nothing answers. Each check gives up; the probe still answers in time.
    proxy.stall();
    for (let i = 0; i < 3; i++) {
      const hung = await get(apiPort, '/readyz');
      expect(hung.ms).toBeLessThan(2_000);
      expect(hung.status).toBe(503);
      expect(hung.body.checks).toMatchObject({ redis: 'ok', postgres: 'down' });
      const live = await get(apiPort, '/livez');
      expect(live.status).toBe(200);
      expect(live.ms).toBeLessThan(500);
    }
    const metricsPort = await get(apiMetricsPort, '/readyz');
    expect(metricsPort.ms).toBeLessThan(2_000);
    expect(metricsPort.status).toBe(503);

    await proxy.stop();
    await proxy.start();
    await until('ready after the hang', async () => (await get(apiPort, '/readyz')).status === 200, 15_000);
  }, 60_000);
});

describe('a worker process', () => {
  it('serves /livez and /readyz on METRICS_PORT, passes the compose health check, and drains on SIGTERM', async () => {
    const port = await closedPort();
    const worker = start(['workers/index.ts', '--family', 'web'], {
      DATABASE_URL: h.config.DATABASE_URL,
      METRICS_PORT: String(port),
      FETCH_ALLOWED_HOSTS: target.hostPort,
    });
    await until('the worker', async () => (await get(port, '/livez')).status === 200);
    expect(await get(port, '/livez')).toMatchObject({ status: 200, body: { status: 'ok' } });
    expect(await get(port, '/readyz')).toMatchObject({
      status: 200,
      body: { status: 'ready', checks: { redis: 'ok', postgres: 'ok', migrations: 'ok' }, draining: false },
    });
    expect((await get(port, '/elsewhere')).body.error.code).toBe('not_found');
    expect(await healthcheck('worker-web', { METRICS_PORT: String(port) })).toBe(0);

    // The API now expects web (it ran) and says which families still have no worker.
    const health = await get(apiPort, '/health');
    expect(health.body).toMatchObject({ status: 'ok', families_expected: ['web'], without_workers: FAMILIES.filter((f) => f !== 'web') });
    expect(health.body.warnings).toBeUndefined();

    // A call in hand (the page answers after 3 s), then SIGTERM: draining, still live, the call answered.
    const acct = await h.account('pro', 100);
    const call = h.call('page_fetch', { url: target.url('/slow') }, acct.apiKey);
    await until('the page to be asked for', async () => target.requests.length > 0, 15_000);
    const exited = once(worker, 'exit');
    worker.kill('SIGTERM');
    await until('draining', async () => (await get(port, '/readyz')).body.draining === true, 2_000);
    const draining = await get(port, '/readyz');
    expect(draining).toMatchObject({ status: 503, body: { status: 'not_ready', draining: true, checks: { redis: 'ok', postgres: 'ok' } } });
    expect((await get(port, '/livez')).status).toBe(200);
    expect(await healthcheck('worker-web', { METRICS_PORT: String(port) })).toBe(1);
    const answer = await call;
    expect(answer.statusCode).toBe(200);
    expect(json(answer).result.title).toBe('slow');
    expect((await exited)[0]).toBe(0);

    // Its heartbeat is withdrawn: web is expected and missing, so /health (not /readyz) says degraded.
    const after = await get(apiPort, '/health');
    expect(after).toMatchObject({ status: 503, body: { status: 'degraded', down: ['workers:web'] } });
    expect((await get(apiPort, '/readyz')).status).toBe(200);
  }, 120_000);
});

describe('a flood of probes', () => {
  it('shares one check among the probes that arrive while it runs', async () => {
    // The harness's own pool, counted on its way through (the queries are real).
    const { pool, redis } = h.container;
    let queries = 0;
    const counted = new Proxy(pool, {
      get: (target, key, receiver) =>
        key === 'anyFirst'
          ? (...args: unknown[]) => (queries++, (target.anyFirst as (...a: unknown[]) => unknown).apply(target, args))
          : Reflect.get(target, key, receiver),
    });
    const deps = { redis, pool: counted };
    const answers = await Promise.all(Array.from({ length: 200 }, () => readiness(deps)));
    expect(queries).toBe(1);
    expect(new Set(answers.map((a) => a.status))).toEqual(new Set(['ready']));
    // The next one checks again.
    await readiness(deps);
    expect(queries).toBe(2);

    // Over HTTP, 200 at once all answer, in time.
    const t0 = Date.now();
    const statuses = await Promise.all(Array.from({ length: 200 }, () => get(apiPort, '/readyz').then((r) => r.status)));
    expect(statuses.filter((s) => s !== 200)).toEqual([]);
    expect(Date.now() - t0).toBeLessThan(2_000);
  });
});

describe('draining in this process', () => {
  it('makes the API route answer 503 with draining: true', async () => {
    expect((await h.request({ method: 'GET', url: '/readyz' })).statusCode).toBe(200);
    startDraining(); // what the first SIGTERM does (src/server.ts); this test file's process only
    const res = await h.request({ method: 'GET', url: '/readyz' });
    expect(res.statusCode).toBe(503);
    expect(json(res)).toMatchObject({ status: 'not_ready', draining: true, checks: { redis: 'ok', postgres: 'ok', migrations: 'ok' } });
    expect((await h.request({ method: 'GET', url: '/livez' })).statusCode).toBe(200);
  });
});
