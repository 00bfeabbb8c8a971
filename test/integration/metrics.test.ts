import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createServer } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, json, type Harness } from '../helpers/harness.js';

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** The samples of a Prometheus text exposition. */
function parse(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!;
    out.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return out;
}

/** Samples named `name` whose labels include `labels`. */
function find(samples: Sample[], name: string, labels: Record<string, string> = {}): Sample[] {
  return samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
}

function value(samples: Sample[], name: string, labels: Record<string, string> = {}): number {
  return find(samples, name, labels).reduce((sum, s) => sum + s.value, 0);
}

async function freePort(): Promise<number> {
  const srv = createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const port = (srv.address() as { port: number }).port;
  srv.close();
  await once(srv, 'close');
  return port;
}

/** Metrics include revenue per tool: on the API's port they need METRICS_TOKEN (404 without one). */
const TOKEN = 'metrics-test-token-0123456789';
const bearer = { authorization: `Bearer ${TOKEN}` };

describe('GET /metrics on the API', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ METRICS_TOKEN: TOKEN });
  });
  afterAll(async () => {
    await h.close();
  });

  const scrape = async () => {
    const res = await h.request({ method: 'GET', url: '/metrics', headers: bearer });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toMatch(/^text\/plain/);
    return parse(res.body);
  };

  it('counts tool calls, settlement, queue depth per family, live workers and requests by route pattern', async () => {
    const a = await h.account('pro', 100);
    for (let i = 0; i < 3; i++) expect((await h.call('compute', { expression: `${i} + 1` }, a.apiKey)).statusCode).toBe(200);
    const s = await scrape();
    expect(value(s, 'tollgate_tool_calls_total', { tool: 'compute', family: 'core', outcome: 'ok' })).toBeGreaterThanOrEqual(3);
    expect(value(s, 'tollgate_tool_run_seconds_count', { tool: 'compute', family: 'core' })).toBeGreaterThanOrEqual(3);
    expect(value(s, 'tollgate_tool_queue_wait_seconds_count', { family: 'core' })).toBeGreaterThanOrEqual(3);
    expect(value(s, 'tollgate_cents_charged_total', { tool: 'compute' })).toBe(6);
    expect(value(s, 'tollgate_settlement_batches_total')).toBeGreaterThanOrEqual(1);
    expect(value(s, 'tollgate_settlement_batch_size_sum')).toBeGreaterThanOrEqual(3);
    expect(value(s, 'tollgate_settlement_seconds_count')).toBeGreaterThanOrEqual(1);
    for (const family of ['core', 'web', 'llm', 'edge']) {
      for (const state of ['waiting', 'active', 'delayed', 'failed', 'completed']) {
        expect(find(s, 'tollgate_queue_jobs', { family, state })).toHaveLength(1);
      }
    }
    expect(value(s, 'tollgate_queue_jobs', { family: 'core', state: 'completed' })).toBeGreaterThanOrEqual(3);
    expect(value(s, 'tollgate_workers_live', { family: 'core' })).toBeGreaterThanOrEqual(1);
    // By route pattern, never the raw URL.
    expect(value(s, 'tollgate_http_requests_total', { route: '/tools/:name', method: 'POST', status: '200' })).toBeGreaterThanOrEqual(3);
    expect(find(s, 'tollgate_http_requests_total').some((x) => x.labels.route === '/tools/compute')).toBe(false);
    expect(value(s, 'tollgate_http_request_duration_seconds_count', { route: '/tools/:name', method: 'POST' })).toBeGreaterThanOrEqual(3);
    // Default Node process metrics in the same registry.
    expect(find(s, 'process_cpu_user_seconds_total')).toHaveLength(1);
    expect(find(s, 'nodejs_eventloop_lag_seconds')).toHaveLength(1);
  });

  it("follows Prometheus's naming rules (what promtool check metrics lints): HELP and TYPE for each, _total on counters only", async () => {
    const res = await h.request({ method: 'GET', url: '/metrics', headers: bearer });
    const types = new Map<string, string>();
    const helps = new Set<string>();
    for (const line of res.body.split('\n')) {
      const t = /^# TYPE (\S+) (\S+)$/.exec(line);
      if (t) types.set(t[1]!, t[2]!);
      const h = /^# HELP (\S+) \S/.exec(line);
      if (h) helps.add(h[1]!);
    }
    expect(types.size).toBeGreaterThan(20);
    expect(types.has('nodejs_active_handles')).toBe(true);
    const wrong: string[] = [];
    for (const [name, type] of types) {
      if (!helps.has(name)) wrong.push(`${name}: no HELP`);
      if (type === 'counter' && !name.endsWith('_total')) wrong.push(`${name}: counter without _total`);
      if (type !== 'counter' && name.endsWith('_total')) wrong.push(`${name}: ${type} named _total`);
      if (!/^[a-zA-Z_:][a-zA-Z0-9_:]*$/.test(name)) wrong.push(`${name}: invalid name`);
    }
    expect(wrong).toEqual([]);
  });

  it('counts a failed call by its error code, and unmatched URLs under one route label', async () => {
    const a = await h.account('pro', 100);
    expect((await h.call('compute', { expression: '1 +' }, a.apiKey)).statusCode).toBe(400);
    expect((await h.request({ method: 'GET', url: '/no/such/path/123' })).statusCode).toBe(404);
    const s = await scrape();
    expect(value(s, 'tollgate_http_requests_total', { route: '(unmatched)', method: 'GET', status: '404' })).toBeGreaterThanOrEqual(1);
    expect(find(s, 'tollgate_http_requests_total').some((x) => x.labels.route?.includes('123'))).toBe(false);
    expect(value(s, 'tollgate_http_requests_total', { route: '/tools/:name', method: 'POST', status: '400' })).toBeGreaterThanOrEqual(1);
  });

  it('counts refusals by reason', async () => {
    const before = value(await scrape(), 'tollgate_refusals_total', { reason: 'rate_limited' });
    const a = await h.account('enterprise', 100, { rpm: 1 });
    expect((await h.call('compute', { expression: '1' }, a.apiKey)).statusCode).toBe(200);
    const refused = await h.call('compute', { expression: '1' }, a.apiKey);
    expect(refused.statusCode).toBe(429);
    expect(json(refused).error.code).toBe('rate_limited');
    const s = await scrape();
    expect(value(s, 'tollgate_refusals_total', { reason: 'rate_limited' })).toBe(before + 1);
    // Not counted: an error that is not a refusal.
    expect(find(s, 'tollgate_refusals_total', { reason: 'invalid_input' })).toHaveLength(0);
  });

  it('needs no API key (its own bearer) and is not rate limited', async () => {
    for (let i = 0; i < 5; i++) {
      const res = await h.request({ method: 'GET', url: '/metrics', headers: bearer });
      expect(res.statusCode).toBe(200);
      expect(res.headers['x-ratelimit-limit']).toBeUndefined();
    }
  });

  it('keeps separate counts per container in one process', async () => {
    const other = await startHarness({ METRICS_TOKEN: TOKEN }, { workers: [] });
    try {
      const s = parse((await other.request({ method: 'GET', url: '/metrics', headers: bearer })).body);
      expect(value(s, 'tollgate_tool_calls_total')).toBe(0);
      expect(value(s, 'tollgate_http_requests_total', { route: '/tools/:name' })).toBe(0);
    } finally {
      await other.close();
    }
  });
});

describe('GET /metrics with METRICS_TOKEN', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ METRICS_TOKEN: 'metrics-secret-0123456789' }, { workers: [] });
  });
  afterAll(async () => {
    await h.close();
  });

  it('is 401 in the error envelope without the bearer or with a wrong one, 200 with it', async () => {
    const none = await h.request({ method: 'GET', url: '/metrics' });
    expect(none.statusCode).toBe(401);
    expect(json(none).error).toMatchObject({ code: 'unauthorized', request_id: expect.any(String) });
    const wrong = await h.request({ method: 'GET', url: '/metrics', headers: { authorization: 'Bearer metrics-secret-012345678' } });
    expect(wrong.statusCode).toBe(401);
    const ok = await h.request({ method: 'GET', url: '/metrics', headers: { authorization: 'Bearer metrics-secret-0123456789' } });
    expect(ok.statusCode).toBe(200);
    expect(ok.body).toContain('tollgate_http_requests_total');
  });
});

describe('GET /metrics without METRICS_TOKEN', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({}, { workers: [] });
  });
  afterAll(async () => {
    await h.close();
  });

  it('is 404 on the API port, with or without a bearer', async () => {
    for (const headers of [{}, { authorization: 'Bearer anything' }]) {
      const res = await h.request({ method: 'GET', url: '/metrics', headers });
      expect(res.statusCode).toBe(404);
      expect(json(res).error).toMatchObject({ code: 'not_found', request_id: expect.any(String) });
      expect(res.body).not.toContain('tollgate_');
    }
  });
});

describe('a worker process with METRICS_PORT', () => {
  let h: Harness;
  let child: ChildProcess | null = null;
  beforeAll(async () => {
    h = await startHarness({ METRICS_TOKEN: TOKEN }, { workers: [] });
  });
  afterAll(async () => {
    if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await h.close();
  });

  it('serves its own /metrics (with its token), counting the calls it ran', async () => {
    const port = await freePort();
    const token = 'worker-metrics-token-42';
    child = spawn(process.execPath, ['--import', 'tsx', 'workers/index.ts', '--family', 'core'], {
      env: {
        ...process.env,
        REDIS_URL: h.config.REDIS_URL,
        DATABASE_URL: h.config.DATABASE_URL,
        REDIS_PREFIX: h.config.REDIS_PREFIX,
        HOST: '127.0.0.1',
        METRICS_PORT: String(port),
        METRICS_TOKEN: token,
        LOG_LEVEL: 'warn',
      },
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    const url = `http://127.0.0.1:${port}/metrics`;
    const auth = { authorization: `Bearer ${token}` };
    // Listening once its workers have started.
    const end = Date.now() + 30_000;
    for (;;) {
      const res = await fetch(url, { headers: auth }).catch(() => null);
      if (res?.status === 200) break;
      if (Date.now() > end) throw new Error('worker metrics listener did not come up');
      await new Promise((r) => setTimeout(r, 100));
    }
    const a = await h.account('pro', 100);
    expect((await h.call('compute', { expression: '2 * 21' }, a.apiKey)).statusCode).toBe(200);

    const unauth = await fetch(url);
    expect(unauth.status).toBe(401);
    expect(((await unauth.json()) as { error: { code: string } }).error.code).toBe('unauthorized');
    expect((await fetch(`http://127.0.0.1:${port}/other`, { headers: auth })).status).toBe(404);

    const res = await fetch(url, { headers: auth });
    expect(res.status).toBe(200);
    const s = parse(await res.text());
    expect(value(s, 'tollgate_tool_calls_total', { tool: 'compute', family: 'core', outcome: 'ok' })).toBe(1);
    expect(value(s, 'tollgate_cents_charged_total', { tool: 'compute' })).toBe(2);
    expect(value(s, 'tollgate_settlement_batches_total')).toBeGreaterThanOrEqual(1);
    expect(find(s, 'process_cpu_user_seconds_total')).toHaveLength(1);
    // The deployment's gauges come from the API, not from every worker process.
    expect(find(s, 'tollgate_queue_jobs')).toHaveLength(0);
    // The API process ran no tool itself.
    expect(value(parse((await h.request({ method: 'GET', url: '/metrics', headers: bearer })).body), 'tollgate_tool_calls_total')).toBe(0);

    child.kill('SIGTERM');
    const [code] = (await once(child, 'exit')) as [number | null];
    expect(code).toBe(0);
  }, 60_000);
});
