import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import fs from 'node:fs';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { Webhook, WebhookVerificationError } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { sql } from '../../src/db/pool.js';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { closedPort } from '../helpers/http-targets.js';
import { listening, runToExit } from '../helpers/processes.js';
import { until } from '../helpers/wait.js';

/**
 * Issue 26, points 6 and 7 and the Host reflection of point 8, as an attacker (or an unlucky operator)
 * meets them. Each test failed on the code before the fix:
 * - a restart made every webhook secret unreadable (a per-process random EDGE_TOKEN_KEY): now the keys
 *   are generated once into the data dir and reused, so secrets and passports survive;
 * - production started without the sealing keys: now it stops with one line naming them;
 * - nothing said that stored secrets no longer opened: now one warning line per key;
 * - the signature did not cover the delivery id (a captured delivery replayed under a new id): now
 *   Standard Webhooks, verified here with the official `standardwebhooks` package;
 * - a free call with a Callback-Url made up to 12 POSTs anywhere: now 400;
 * - deliveries per account were unbounded: now WEBHOOK_MAX_PENDING, exact under concurrency;
 * - with PUBLIC_BASE_URL unset the Host header was reflected into /subscribe and the 402's resource.
 */

const repo = path.resolve(import.meta.dirname, '../..');
const hex32 = () => randomBytes(32).toString('hex');

interface Received {
  path: string;
  headers: IncomingHttpHeaders;
  raw: string;
}

/** A receiver: `/never/...` answers 500 (never 2xx), anything else 200. */
async function startReceiver(): Promise<{ server: Server; base: string; hostPort: string; received: Received[] }> {
  const received: Received[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const p = req.url ?? '/';
      received.push({ path: p, headers: req.headers, raw: Buffer.concat(chunks).toString('utf8') });
      res.statusCode = p.startsWith('/never/') ? 500 : 200;
      res.end();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  return { server, base: `http://127.0.0.1:${port}`, hostPort: `127.0.0.1:${port}`, received };
}

const headersOf = (r: Received) => ({
  'webhook-id': String(r.headers['webhook-id']),
  'webhook-timestamp': String(r.headers['webhook-timestamp']),
  'webhook-signature': String(r.headers['webhook-signature']),
});

// ------------------------------------------------------------------------------------ as processes

describe('sealing keys across restarts (the service as a process)', () => {
  let dataDir: string;
  // Its own database: the shared test database holds secrets sealed by every test process's random key.
  const dbName = `tollgate_r3w_${randomBytes(4).toString('hex')}`;
  const dbUrl = (() => {
    const u = new URL(inject('databaseUrl'));
    u.pathname = `/${dbName}`;
    return u.toString();
  })();
  const prefix = `t${randomBytes(5).toString('hex')}`;
  let receiver: Awaited<ReturnType<typeof startReceiver>>;
  let env: NodeJS.ProcessEnv;
  let server: ChildProcess | null = null;
  /** What the first two starts leave for the third. */
  const state: { apiKey?: string; secret?: string; handle?: string } = {};

  beforeAll(async () => {
    dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'tollgate-r3w-'));
    receiver = await startReceiver();
    const { EDGE_TOKEN_KEY: _e, PASSPORT_KEY: _p, PUBLIC_BASE_URL: _b, PUBLIC_HOSTS: _h, ...rest } = process.env;
    env = {
      ...rest,
      REDIS_URL: inject('redisUrl'),
      DATABASE_URL: dbUrl,
      REDIS_PREFIX: prefix,
      TOLLGATE_DATA_DIR: dataDir,
      HOST: '127.0.0.1',
      LOG_LEVEL: 'info',
      WEBHOOK_ALLOWED_HOSTS: receiver.hostPort,
    };
  });

  afterAll(async () => {
    if (server && server.exitCode === null && server.signalCode === null) server.kill('SIGKILL');
    await new Promise((r) => receiver?.server.close(r));
    if (dataDir) fs.rmSync(dataDir, { recursive: true, force: true });
    const u = new URL(inject('databaseUrl'));
    const client = new pg.Client({ connectionString: u.toString() });
    await client.connect();
    await client.query(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`).catch(() => {});
    await client.end();
  });

  async function start(extra: NodeJS.ProcessEnv = {}): Promise<{ port: number; output: () => string; stop: () => Promise<void> }> {
    const port = await closedPort();
    let out = '';
    const child = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
      cwd: repo,
      env: { ...env, ...extra, PORT: String(port) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    server = child;
    child.stdout!.on('data', (d) => (out += d));
    child.stderr!.on('data', (d) => (out += d));
    const exited = once(child, 'exit');
    for (let i = 0; ; i++) {
      const ok = await fetch(`http://127.0.0.1:${port}/health`).then(
        (r) => r.status < 500,
        () => false,
      );
      if (ok) break;
      if (child.exitCode !== null || i > 600) throw new Error(`the service did not start:\n${out}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    return {
      port,
      output: () => out,
      stop: async () => {
        child.kill('SIGTERM');
        const [code] = await exited;
        expect(code, out).toBe(0);
      },
    };
  }

  const api = (port: number, apiKey: string, method: string, url: string, body?: unknown, headers: Record<string, string> = {}) =>
    fetch(`http://127.0.0.1:${port}${url}`, {
      method,
      headers: { authorization: `Bearer ${apiKey}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });

  /** A compute call with a Callback-Url, and the delivery it brings. */
  async function deliveredCall(port: number, apiKey: string, tag: string): Promise<Received> {
    const res = await api(port, apiKey, 'POST', '/tools/compute', { expression: '6 * 7' }, { 'callback-url': `${receiver.base}/restart/${tag}` });
    expect(res.status).toBe(200);
    return until(`the delivery ${tag}`, () => receiver.received.find((r) => r.path === `/restart/${tag}`));
  }

  it('a restart keeps webhook secrets (and passports) working: the keys are generated once into the data dir and reused', async () => {
    const first = await start();
    const file = path.join(dataDir, 'secrets.json');
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    const keys = JSON.parse(fs.readFileSync(file, 'utf8'));
    expect(keys.EDGE_TOKEN_KEY).toMatch(/^[0-9a-f]{64}$/);
    expect(keys.PASSPORT_KEY).toMatch(/^[0-9a-f]{64}$/);
    expect(first.output()).toMatch(/EDGE_TOKEN_KEY and PASSPORT_KEY unset: using the keys generated now in/);
    expect(first.output()).not.toContain(keys.EDGE_TOKEN_KEY);

    // The admin CLI (same environment and data dir) makes the account.
    const { stdout } = await promisify(execFile)(
      'npx',
      ['tsx', 'src/cli/admin.ts', 'account', 'create', '--plan', 'enterprise', '--credits', '100', '--name', 'r3w'],
      { cwd: repo, env },
    );
    const apiKey = JSON.parse(stdout.trim().split('\n').pop()!).api_key as string;
    state.apiKey = apiKey;

    const secretRes = await api(first.port, apiKey, 'GET', '/webhooks/secret');
    expect(secretRes.status).toBe(200);
    const secret = ((await secretRes.json()) as { secret: string }).secret;
    state.secret = secret;
    const one = await deliveredCall(first.port, apiKey, 'one');
    expect(new Webhook(secret).verify(one.raw, headersOf(one))).toMatchObject({ result: { value: 42 } });
    const put = await api(first.port, apiKey, 'POST', '/tools/passport_store', { action: 'put', content: 'survives a restart' });
    expect(put.status).toBe(200);
    state.handle = ((await put.json()) as { result: { handle: string } }).result.handle;
    await first.stop();

    const second = await start();
    expect(second.output()).toMatch(/using the keys generated by an earlier start in/);
    expect(JSON.parse(fs.readFileSync(file, 'utf8'))).toEqual(keys);
    // Before the fix: 503, "cannot be unsealed with this EDGE_TOKEN_KEY", and every delivery failed.
    const again = await api(second.port, apiKey, 'GET', '/webhooks/secret');
    expect(again.status).toBe(200);
    expect(((await again.json()) as { secret: string }).secret).toBe(secret);
    const two = await deliveredCall(second.port, apiKey, 'two');
    expect(new Webhook(secret).verify(two.raw, headersOf(two))).toMatchObject({ result: { value: 42 } });
    const got = await api(second.port, apiKey, 'POST', '/tools/passport_store', { action: 'get', handle: state.handle });
    expect(got.status).toBe(200);
    expect(((await got.json()) as { result: { content: string } }).result.content).toBe('survives a restart');
    expect(second.output()).not.toMatch(/does not open/);
    await second.stop();
  }, 120_000);

  it('a start whose keys do not open what was sealed before says so in one warning line per variable', async () => {
    expect(state.apiKey, 'needs the account and secret of the test before').toBeDefined();
    const third = await start({ EDGE_TOKEN_KEY: hex32(), PASSPORT_KEY: hex32() });
    const lines = third.output().split('\n');
    const edge = lines.filter((l) => l.includes('EDGE_TOKEN_KEY does not open'));
    const pass = lines.filter((l) => l.includes('PASSPORT_KEY does not open'));
    expect(edge, third.output()).toHaveLength(1);
    expect(pass, third.output()).toHaveLength(1);
    expect(JSON.parse(edge[0]!)).toMatchObject({ level: 40, variable: 'EDGE_TOKEN_KEY', unopenable: 1, sampled: 1 });
    expect(JSON.parse(edge[0]!).msg).toMatch(/roll.*POST \/webhooks\/secret/);
    expect(JSON.parse(pass[0]!)).toMatchObject({ level: 40, variable: 'PASSPORT_KEY', unopenable: 1, sampled: 1 });
    // No secret in clear in any line.
    expect(third.output()).not.toContain(state.secret!.slice(6));
    // What the warning announced: the secret does not open under this key.
    const res = await api(third.port, state.apiKey!, 'GET', '/webhooks/secret');
    expect(res.status).toBe(503);
    await third.stop();
  }, 60_000);

  it('production refuses to start without EDGE_TOKEN_KEY, PASSPORT_KEY and PUBLIC_BASE_URL (or PUBLIC_HOSTS), in one line', async () => {
    const dir = path.join(dataDir, 'production-never-created');
    const deadRedis = `redis://127.0.0.1:${await closedPort()}`;
    const deadPg = `postgres://postgres@127.0.0.1:${await closedPort()}/tollgate`;
    const prod: NodeJS.ProcessEnv = { ...env, NODE_ENV: 'production', TOLLGATE_DATA_DIR: dir, REDIS_URL: deadRedis, DATABASE_URL: deadPg };
    const port = await closedPort();

    const api = await runToExit(process.execPath, ['--import', 'tsx', 'src/server.ts'], { cwd: repo, env: { ...prod, PORT: String(port) } });
    expect(api.code).toBe(1);
    expect(api.lines, api.out).toHaveLength(1);
    for (const name of ['EDGE_TOKEN_KEY', 'PASSPORT_KEY', 'PUBLIC_BASE_URL (or PUBLIC_HOSTS)']) expect(api.lines[0]).toContain(name);
    expect(api.lines[0]).toMatch(/^tollgate: production .* does not start without/);
    expect(await listening(port)).toBe(false);
    // Nothing generated: production never writes keys of its own.
    expect(fs.existsSync(dir)).toBe(false);

    // A worker process needs both keys too (it opens webhook secrets and passports), not a public URL.
    const worker = await runToExit(process.execPath, ['--import', 'tsx', 'workers/index.ts', '--family', 'core'], {
      cwd: repo,
      env: { ...prod, EDGE_TOKEN_KEY: hex32() },
    });
    expect(worker.code).toBe(1);
    expect(worker.lines, worker.out).toHaveLength(1);
    expect(worker.lines[0]).toContain('does not start without PASSPORT_KEY.');
    expect(worker.lines[0]).not.toContain('EDGE_TOKEN_KEY,');

    // With the keys and an allow-list of public hosts instead of PUBLIC_BASE_URL, it goes on (to the dead Redis).
    const allowed = await runToExit(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
      cwd: repo,
      env: { ...prod, PORT: String(port), EDGE_TOKEN_KEY: hex32(), PASSPORT_KEY: hex32(), PUBLIC_HOSTS: 'api.example.com' },
    });
    expect(allowed.code).toBe(1);
    expect(allowed.lines).toHaveLength(1);
    expect(allowed.lines[0]).toContain(`cannot reach Redis at ${deadRedis}`);
  }, 60_000);
});

// ------------------------------------------------------------------------------------- in process

describe('webhooks as an attacker meets them', () => {
  let h: Harness;
  let receiver: Awaited<ReturnType<typeof startReceiver>>;
  const auth = (apiKey: string) => ({ authorization: `Bearer ${apiKey}` });

  beforeAll(async () => {
    receiver = await startReceiver();
    h = await startHarness({
      WEBHOOK_ALLOWED_HOSTS: receiver.hostPort,
      WEBHOOK_MAX_PENDING: '3',
      WEBHOOK_ATTEMPTS: '2',
      WEBHOOK_BACKOFF_MS: '300',
      WEBHOOK_TIMEOUT_MS: '1000',
      // x402 for the 402's resource; no PUBLIC_BASE_URL, one public host name.
      X402_ENABLED: 'true',
      X402_PAY_TO: `0x${'ab'.repeat(20)}`,
      X402_SETTLEMENT: 'deferred',
      PUBLIC_HOSTS: 'api.example.com',
    });
  });

  afterAll(async () => {
    await h?.close();
    await new Promise((r) => receiver?.server.close(r));
  });

  const hooked = (apiKey: string, tool: string, body: unknown, url: string) => h.call(tool, body, apiKey, { prefer: 'respond-async', 'callback-url': url });

  it('deliveries verify with the standardwebhooks package, and a captured delivery replayed under another id (or time) does not', async () => {
    const acct = await h.account('pro', 100);
    const secret = json(await h.request({ method: 'GET', url: '/webhooks/secret', headers: auth(acct.apiKey) })).secret as string;
    const p = `/ok/${acct.accountId}`;
    const res = await hooked(acct.apiKey, 'compute', { expression: '2 * 21' }, `${receiver.base}${p}`);
    expect(res.statusCode).toBe(202);
    const got = await until('the delivery', () => receiver.received.find((r) => r.path === p));
    const wh = new Webhook(secret);
    expect(wh.verify(got.raw, headersOf(got))).toMatchObject({ job_id: json(res).job_id, status: 'completed', result: { value: 42 } });

    // The replay: the same body, timestamp and signature under a fresh id (before the fix the id was not signed).
    const replay = { ...headersOf(got), 'webhook-id': `dlv_${randomBytes(8).toString('hex')}` };
    expect(() => wh.verify(got.raw, replay)).toThrow(WebhookVerificationError);
    // Nor under another timestamp, nor with another body.
    expect(() => wh.verify(got.raw, { ...headersOf(got), 'webhook-timestamp': String(Number(got.headers['webhook-timestamp']) - 1) })).toThrow(
      WebhookVerificationError,
    );
    expect(() => wh.verify(got.raw.replace('42', '43'), headersOf(got))).toThrow(WebhookVerificationError);
  });

  it('a Callback-Url on a call that costs nothing (free tool, sandbox key, free parallel request) is 400 before any work', async () => {
    const acct = await h.account('pro', 100);
    const sandbox = await h.key(acct.accountId, 'test');
    const p = `/free/${acct.accountId}`;

    const free = await hooked(acct.apiKey, 'check_balance', {}, `${receiver.base}${p}`);
    expect(free.statusCode).toBe(400);
    expect(json(free).error).toMatchObject({ code: 'invalid_input', reason: 'callback_on_free_call', issues: [{ path: ['Callback-Url'] }] });
    expect(json(free).error.message).toMatch(/^Callback-Url refused: only charged calls get a delivery, and check_balance costs nothing/);

    const sand = await hooked(sandbox.apiKey, 'compute', { expression: '1 + 1' }, `${receiver.base}${p}`);
    expect(sand.statusCode).toBe(400);
    expect(json(sand).error.message).toMatch(/sandbox key/);

    const parallel = await h.request({
      method: 'POST',
      url: '/',
      headers: { ...auth(acct.apiKey), 'content-type': 'application/json', prefer: 'respond-async' },
      payload: { parallel: ['check_balance', 'check_balance'], q: '', callback_url: `${receiver.base}${p}` },
    });
    expect(parallel.statusCode).toBe(400);
    expect(json(parallel).error).toMatchObject({ code: 'invalid_input', issues: [{ path: ['callback_url'] }] });

    // Nothing ran for any of them, and nothing is ever sent.
    expect(json(await h.request({ method: 'GET', url: '/jobs', headers: auth(acct.apiKey) })).jobs).toEqual([]);
    expect(json(await h.request({ method: 'GET', url: '/jobs', headers: auth(sandbox.apiKey) })).jobs).toEqual([]);
    expect(await h.container.webhooks!.pending.count(acct.accountId)).toBe(0);

    // A charged chain (its total is what counts) still takes one.
    const chain = await h.request({
      method: 'POST',
      url: '/',
      headers: { ...auth(acct.apiKey), 'content-type': 'application/json', prefer: 'respond-async' },
      payload: { chain: ['compute', 'compute'], q: '2 * 3', callback_url: `${receiver.base}${p}/chain` },
    });
    expect(chain.statusCode).toBe(202);
    await until('the chain delivery', () => receiver.received.find((r) => r.path === `${p}/chain`));
    expect(receiver.received.filter((r) => r.path === p)).toEqual([]);
  });

  it('WEBHOOK_MAX_PENDING (3) bounds an account\u2019s outstanding deliveries exactly under concurrency; places come back when deliveries give up', async () => {
    const acct = await h.account('pro', 100);
    const pending = h.container.webhooks!.pending;
    const p = `/never/${acct.accountId}`;
    // Ten at once against a receiver that never answers 2xx: three are accepted, seven refused before anything is queued.
    const answers = await Promise.all(Array.from({ length: 10 }, (_, i) => hooked(acct.apiKey, 'compute', { expression: `${i} + 1` }, `${receiver.base}${p}`)));
    const statuses = answers.map((r) => r.statusCode).sort();
    expect(statuses).toEqual([202, 202, 202, 429, 429, 429, 429, 429, 429, 429]);
    for (const r of answers.filter((a) => a.statusCode === 429)) {
      expect(json(r).error).toMatchObject({ code: 'rate_limited', limit: 'webhook_pending', limit_value: 3, pending: 3 });
      expect(json(r).error.message).toMatch(/WEBHOOK_MAX_PENDING/);
    }
    expect(await pending.count(acct.accountId)).toBe(3);
    // Refused calls were not charged: three charges once the accepted ones ran.
    await until('three charges', async () => (await h.ledgerCharges(acct.accountId)) === 3 || undefined);
    expect(json(await h.request({ method: 'GET', url: '/jobs', headers: auth(acct.apiKey) })).jobs).toHaveLength(3);

    // Each gives up after WEBHOOK_ATTEMPTS (2) failed attempts; then the account may hook calls again.
    await until('the places to come back', async () => (await pending.count(acct.accountId)) === 0 || undefined, 30_000);
    expect(receiver.received.filter((r) => r.path === p)).toHaveLength(6);
    const later = await hooked(acct.apiKey, 'compute', { expression: '1' }, `${receiver.base}/ok/${acct.accountId}/later`);
    expect(later.statusCode).toBe(202);
  }, 60_000);

  it('a place whose release was lost (a crash) is found and dropped when the set is full; a place still in use is not', async () => {
    const pending = h.container.webhooks!.pending;
    const stale = await h.account('pro', 100);
    // Three places for jobs that exist nowhere, last touched two minutes ago: what a crash leaves.
    for (let i = 0; i < 3; i++)
      await h.container.redis.zadd(pending.key(stale.accountId), Date.now() - 120_000, `core-00000000-0000-0000-0000-00000000000${i}`);
    const res = await hooked(stale.apiKey, 'compute', { expression: '1 + 1' }, `${receiver.base}/ok/${stale.accountId}`);
    expect(res.statusCode).toBe(202);
    // The dead places are gone; the new call holds one (until its delivery, which may already be done).
    const left = await h.container.redis.zrange(pending.key(stale.accountId), 0, -1);
    expect(left.filter((m) => m.startsWith('core-00000000'))).toEqual([]);
    expect(left.length).toBeLessThanOrEqual(1);

    const busy = await h.account('pro', 100);
    // Three places just taken (calls being admitted right now): they count.
    for (let i = 0; i < 3; i++) await h.container.redis.zadd(pending.key(busy.accountId), Date.now(), `claim:${i}`);
    const refused = await hooked(busy.apiKey, 'compute', { expression: '1 + 1' }, `${receiver.base}/ok/${busy.accountId}`);
    expect(refused.statusCode).toBe(429);

    // Three places last touched long ago whose deliveries wait for their next retry (outbox rows due later): they count too.
    const retrying = await h.account('pro', 100);
    const ids = [0, 1, 2].map((i) => `core-11111111-0000-0000-0000-00000000000${i}`);
    try {
      for (const id of ids) {
        await h.container.pool.query(sql.unsafe`
          INSERT INTO webhook_jobs (job_id, account_id, url, scope, next_at)
          VALUES (${id}, ${retrying.accountId}, 'https://example.invalid/', ${h.config.REDIS_PREFIX}, now() + interval '10 minutes')`);
        await h.container.redis.zadd(pending.key(retrying.accountId), Date.now() - 120_000, id);
      }
      const waiting = await hooked(retrying.apiKey, 'compute', { expression: '1 + 1' }, `${receiver.base}/ok/${retrying.accountId}`);
      expect(waiting.statusCode).toBe(429);
      expect((await h.container.redis.zrange(pending.key(retrying.accountId), 0, -1)).sort()).toEqual(ids);
    } finally {
      await h.container.pool.query(sql.unsafe`DELETE FROM webhook_jobs WHERE job_id = ANY(${sql.array(ids, 'text')})`);
    }
  });

  it('with PUBLIC_BASE_URL unset a Host header is reflected into /subscribe and the 402\u2019s resource only when it is the service\u2019s own', async () => {
    const subscribe = (host: string) => h.request({ method: 'GET', url: '/subscribe', headers: { host, accept: 'text/html' } });
    const resource = async (host: string) => {
      const res = await h.request({
        method: 'POST',
        url: '/tools/compute',
        headers: { host, 'content-type': 'application/json' },
        payload: { expression: '1' },
      });
      expect(res.statusCode).toBe(402);
      return json(res).accepts[0].resource as string;
    };
    const rootResource = async (host: string) => {
      const res = await h.request({ method: 'POST', url: '/', headers: { host, 'content-type': 'application/json' }, payload: { m: 'compute', q: '1' } });
      expect(res.statusCode).toBe(402);
      return json(res).accepts[0].resource as string;
    };

    // An attacker's Host: never reflected; the first PUBLIC_HOSTS name stands in.
    const page = await subscribe('evil.example');
    expect(page.statusCode).toBe(200);
    expect(page.body).not.toContain('evil.example');
    expect(page.body).toContain('http://api.example.com/credits/topup');
    expect(await resource('evil.example')).toBe('http://api.example.com/tools/compute');
    expect(await rootResource('evil.example:8080')).toBe('http://api.example.com/');
    expect(await resource('api.example.com.evil.example')).toBe('http://api.example.com/tools/compute');
    // The service's own names: a listed host (any port) and loopback.
    expect(await resource('api.example.com:8443')).toBe('http://api.example.com:8443/tools/compute');
    expect(await resource('localhost:3000')).toBe('http://localhost:3000/tools/compute');
    expect((await subscribe('api.example.com')).body).toContain('http://api.example.com/credits/topup');
  });
});
