import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import { createServer, type AddressInfo } from 'node:net';
import { gunzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, json, type Harness, type TestAccount } from '../helpers/harness.js';
import { routes, startHttpTarget, type HttpTarget } from '../helpers/http-targets.js';

/**
 * OpenTelemetry tracing end to end: the API and a worker as separate processes (as deployed), both
 * exporting OTLP/HTTP JSON to a receiver in this test, which decodes what the real exporter sends.
 */

interface Span {
  service: string;
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  /** OTLP's numbering: 1 internal, 2 server, 3 client, 4 producer, 5 consumer. */
  kind: number;
  attributes: Record<string, unknown>;
  /** Every string in the span as sent (attributes, events, status), for leak checks. */
  raw: string;
}

const KIND = { internal: 1, server: 2, client: 3, producer: 4, consumer: 5 };

/** OTLP/JSON ids are hex; protobuf-style JSON would send base64. */
const hexId = (v: unknown): string => {
  const s = typeof v === 'string' ? v : '';
  return /^[0-9a-f]*$/.test(s) ? s : Buffer.from(s, 'base64').toString('hex');
};

function anyValue(v: Record<string, unknown> | undefined): unknown {
  if (!v) return undefined;
  if ('stringValue' in v) return v.stringValue;
  if ('intValue' in v) return Number(v.intValue);
  if ('doubleValue' in v) return v.doubleValue;
  if ('boolValue' in v) return v.boolValue;
  if ('arrayValue' in v) return ((v.arrayValue as { values?: Record<string, unknown>[] }).values ?? []).map(anyValue);
  return JSON.stringify(v);
}

const attrs = (list: Array<{ key: string; value: Record<string, unknown> }> = []) => Object.fromEntries(list.map((a) => [a.key, anyValue(a.value)]));

/** A tiny OTLP/HTTP receiver: POST /v1/traces with the JSON encoding of ExportTraceServiceRequest. */
async function startReceiver(): Promise<{ url: string; spans: Span[]; requests: number; close(): Promise<void> }> {
  const state = { spans: [] as Span[], requests: 0 };
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      let body = Buffer.concat(chunks);
      if (req.headers['content-encoding'] === 'gzip') body = gunzipSync(body);
      if (req.method !== 'POST' || req.url !== '/v1/traces' || !String(req.headers['content-type']).startsWith('application/json')) {
        res.writeHead(415).end();
        return;
      }
      state.requests++;
      const doc = JSON.parse(body.toString('utf8')) as { resourceSpans?: any[] };
      for (const rs of doc.resourceSpans ?? []) {
        const service = String(attrs(rs.resource?.attributes)['service.name']);
        for (const ss of rs.scopeSpans ?? []) {
          for (const s of ss.spans ?? []) {
            state.spans.push({
              service,
              traceId: hexId(s.traceId),
              spanId: hexId(s.spanId),
              parentSpanId: hexId(s.parentSpanId ?? ''),
              name: s.name,
              kind: s.kind,
              attributes: attrs(s.attributes),
              raw: JSON.stringify(s),
            });
          }
        }
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    spans: state.spans,
    get requests() {
      return state.requests;
    },
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

async function freePort(): Promise<number> {
  const srv = createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const port = (srv.address() as AddressInfo).port;
  srv.close();
  await once(srv, 'close');
  return port;
}

const hex = (bytes: number) => randomBytes(bytes).toString('hex');

let h: Harness;
let receiver: Awaited<ReturnType<typeof startReceiver>>;
let site: HttpTarget;
let base: string;
let acct: TestAccount;
const children: ChildProcess[] = [];

function start(args: string[], env: Record<string, string>): ChildProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  children.push(child);
  return child;
}

async function post(path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${base}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, body: (await res.json()) as Record<string, any> };
}

/** The trace's spans once `done` holds for them (the processes export every 100 ms). */
async function traceOf(traceId: string, done: (spans: Span[]) => boolean): Promise<Span[]> {
  const end = Date.now() + 20_000;
  for (;;) {
    const spans = receiver.spans.filter((s) => s.traceId === traceId);
    if (done(spans)) return spans;
    if (Date.now() > end) throw new Error(`trace ${traceId} incomplete: ${spans.map((s) => `${s.service}:${s.name}`).join(', ')}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const named = (spans: Span[], name: string | RegExp) => spans.filter((s) => (typeof name === 'string' ? s.name === name : name.test(s.name)));
const one = (spans: Span[], name: string | RegExp) => {
  const found = named(spans, name);
  expect(
    found.map((s) => s.name),
    `one span named ${name}`,
  ).toHaveLength(1);
  return found[0]!;
};
const parentOf = (spans: Span[], s: Span) => spans.find((p) => p.spanId === s.parentSpanId);
/** Whether `s` descends from `ancestor` within the trace. */
function descends(spans: Span[], s: Span, ancestor: Span): boolean {
  for (let p = parentOf(spans, s); p; p = parentOf(spans, p)) if (p.spanId === ancestor.spanId) return true;
  return false;
}

/** What must never reach a span: the key, its bearer header, any input, the URL a tool was asked to read. */
function assertNoSecrets(spans: Span[], inputs: string[]) {
  const secrets = [acct.apiKey, `Bearer ${acct.apiKey}`, acct.apiKey.slice(-24), ...inputs];
  for (const s of spans) for (const secret of secrets) expect(s.raw, `${s.service}:${s.name}`).not.toContain(secret);
}

beforeAll(async () => {
  receiver = await startReceiver();
  site = await startHttpTarget(routes({ '/expr': [200, { 'content-type': 'text/plain; charset=utf-8' }, '6 * 7'] }));
  // Accounts and keys are written through this process; it has no tracing and runs no worker.
  h = await startHarness({ FETCH_ALLOWED_HOSTS: site.hostPort }, { workers: [] });
  acct = await h.account('pro', 1_000);
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  const env = {
    REDIS_URL: h.config.REDIS_URL,
    DATABASE_URL: h.config.DATABASE_URL,
    REDIS_PREFIX: h.config.REDIS_PREFIX,
    FETCH_ALLOWED_HOSTS: site.hostPort,
    HOST: '127.0.0.1',
    LOG_LEVEL: 'warn',
    OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
    OTEL_BSP_SCHEDULE_DELAY: '100',
  };
  start(['src/server.ts'], { ...env, PORT: String(port), WORKERS: 'off' });
  start(['workers/index.ts', '--family', 'core', '--family', 'web'], env);
  const end = Date.now() + 60_000;
  for (;;) {
    const res = await fetch(`${base}/health`).catch(() => null);
    if (res) break;
    if (Date.now() > end) throw new Error('the API did not come up');
    await new Promise((r) => setTimeout(r, 200));
  }
}, 90_000);

afterAll(async () => {
  for (const c of children) {
    if (c.exitCode !== null || c.signalCode !== null) continue;
    c.kill('SIGTERM');
    await Promise.race([once(c, 'exit'), new Promise((r) => setTimeout(r, 10_000))]);
    if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  }
  await h?.close();
  await site?.close();
  await receiver?.close();
}, 30_000);

describe('tracing with an OTLP endpoint set', () => {
  it("follows a sync call from the caller's traceparent through the worker's sandbox to settlement", async () => {
    const traceId = hex(16);
    const callerSpan = hex(8);
    const res = await post('/tools/compute', { expression: '19 + 23' }, { traceparent: `00-${traceId}-${callerSpan}-01` });
    expect(res.status).toBe(200);
    expect(res.body.result.value).toBe(42);
    // The answer names the trace: the caller's trace id and the API's server span.
    const traceresponse = res.headers.get('traceresponse');
    expect(traceresponse).toMatch(new RegExp(`^00-${traceId}-[0-9a-f]{16}-01$`));

    const spans = await traceOf(traceId, (s) => named(s, 'settlement').length === 1 && named(s, 'tool run').length === 1 && named(s, /^POST /).length === 1);
    const server = one(spans, 'POST /tools/:name');
    expect(server).toMatchObject({ service: 'tollgate-api', kind: KIND.server, parentSpanId: callerSpan });
    expect(traceresponse!.split('-')[2]).toBe(server.spanId);
    expect(server.attributes).toMatchObject({
      'http.route': '/tools/:name',
      'http.response.status_code': 200,
      'tollgate.tool': 'compute',
      'tollgate.family': 'core',
    });
    expect(server.attributes['tollgate.account']).toMatch(/^[0-9a-f]{16}$/);
    expect(server.attributes['tollgate.account']).not.toBe(acct.accountId);

    for (const name of ['authenticate', 'admission']) expect(parentOf(spans, one(spans, name))?.spanId, name).toBe(server.spanId);
    // BullMQ's own producer span is the enqueue; the worker continues from the context it stored with the job.
    const enqueue = one(spans, /^add tools-core\./);
    expect(enqueue).toMatchObject({ service: 'tollgate-api', kind: KIND.producer, parentSpanId: server.spanId });
    const wait = one(spans, 'queue wait');
    const run = one(spans, 'tool run');
    expect(wait).toMatchObject({ service: 'tollgate-worker', parentSpanId: enqueue.spanId });
    expect(run).toMatchObject({ service: 'tollgate-worker', kind: KIND.consumer, parentSpanId: enqueue.spanId });
    expect(run.attributes).toMatchObject({ 'tollgate.tool': 'compute', 'tollgate.family': 'core', 'tollgate.outcome': 'ok', 'tollgate.cost_cents': 2 });
    expect(run.attributes['tollgate.account']).toBe(server.attributes['tollgate.account']);
    expect(one(spans, 'sandbox')).toMatchObject({ service: 'tollgate-worker', parentSpanId: run.spanId });
    const settlement = one(spans, 'settlement');
    expect(settlement).toMatchObject({ parentSpanId: run.spanId });
    expect(settlement.attributes).toMatchObject({ 'tollgate.outcome': 'completed', 'tollgate.cost_cents': 2 });
    assertNoSecrets(spans, ['19 + 23']);
  }, 60_000);

  it('makes a chain of three one trace, each step under the request, the upstream fetch under its step', async () => {
    const url = site.url('/expr');
    const res = await post('/', { chain: ['page_fetch', 'compute', 'compute'], q: url });
    expect(res.status).toBe(200);
    expect(res.body.result.value).toBe(42);
    // No traceparent sent: the API starts the trace.
    const traceId = res.headers.get('traceresponse')!.split('-')[1]!;
    expect(traceId).toMatch(/^[0-9a-f]{32}$/);

    const spans = await traceOf(traceId, (s) => named(s, 'tool run').length === 3 && named(s, 'settlement').length === 3 && named(s, /^POST /).length === 1);
    const server = one(spans, 'POST /');
    expect(server.parentSpanId).toBe('');
    one(spans, 'authenticate');
    // One admission for the whole request.
    expect(parentOf(spans, one(spans, 'admission'))?.spanId).toBe(server.spanId);
    const runs = named(spans, 'tool run');
    expect(runs.map((r) => r.attributes['tollgate.tool']).sort()).toEqual(['compute', 'compute', 'page_fetch']);
    for (const r of runs) {
      expect(r.service).toBe('tollgate-worker');
      expect(descends(spans, r, server), 'a step descends from the request').toBe(true);
      expect(parentOf(spans, r)?.kind, "a step's parent is its enqueue").toBe(KIND.producer);
    }
    const fetchRun = runs.find((r) => r.attributes['tollgate.tool'] === 'page_fetch')!;
    expect(fetchRun.attributes['tollgate.family']).toBe('web');
    const upstream = one(spans, 'HTTP GET');
    expect(upstream).toMatchObject({ kind: KIND.client, parentSpanId: fetchRun.spanId });
    expect(upstream.attributes).toMatchObject({ 'http.request.method': 'GET', 'http.response.status_code': 200 });
    expect(named(spans, 'sandbox').map((s) => parentOf(spans, s)?.attributes['tollgate.tool'])).toEqual(['compute', 'compute']);
    expect(named(spans, 'queue wait')).toHaveLength(3);
    assertNoSecrets(spans, [url, site.hostPort, '6 * 7']);
  }, 60_000);

  it('makes a parallel request one trace, every tool run under the request', async () => {
    const res = await post('/', { parallel: ['compute', 'compute'], q: '5 * 5' });
    expect(res.status).toBe(200);
    const traceId = res.headers.get('traceresponse')!.split('-')[1]!;
    const spans = await traceOf(traceId, (s) => named(s, 'tool run').length === 2 && named(s, 'settlement').length === 2 && named(s, /^POST /).length === 1);
    const server = one(spans, 'POST /');
    for (const r of named(spans, 'tool run')) {
      expect(r.attributes['tollgate.tool']).toBe('compute');
      expect(descends(spans, r, server)).toBe(true);
    }
    assertNoSecrets(spans, ['5 * 5']);
  }, 60_000);

  it("continues an async call's trace in the worker after the 202", async () => {
    const traceId = hex(16);
    const url = site.url('/expr');
    const res = await post('/tools/page_fetch', { url }, { traceparent: `00-${traceId}-${hex(8)}-01`, prefer: 'respond-async' });
    expect(res.status).toBe(202);
    expect(res.headers.get('traceresponse')).toMatch(new RegExp(`^00-${traceId}-`));
    const spans = await traceOf(traceId, (s) => named(s, 'settlement').length === 1 && named(s, /^POST /).length === 1);
    const server = one(spans, 'POST /tools/:name');
    expect(server.attributes['http.response.status_code']).toBe(202);
    const run = one(spans, 'tool run');
    expect(descends(spans, run, server)).toBe(true);
    expect(run.attributes).toMatchObject({ 'tollgate.tool': 'page_fetch', 'tollgate.outcome': 'ok' });
    expect(one(spans, 'HTTP GET').parentSpanId).toBe(run.spanId);
    expect(one(spans, 'settlement').parentSpanId).toBe(run.spanId);
    assertNoSecrets(spans, [url, site.hostPort]);
  }, 60_000);

  it('starts a new trace for a malformed traceparent, and marks a refused call with its error code', async () => {
    const bad = `00-${'0'.repeat(32)}-${hex(8)}-01`;
    const res = await post('/tools/compute', { expression: '1 +' }, { traceparent: bad, baggage: `secret=${acct.apiKey}` });
    expect(res.status).toBe(400);
    const traceId = res.headers.get('traceresponse')!.split('-')[1]!;
    expect(traceId).toMatch(/^[0-9a-f]{32}$/);
    expect(traceId).not.toBe('0'.repeat(32));
    const spans = await traceOf(traceId, (s) => named(s, /^POST /).length === 1 && named(s, 'settlement').length === 1);
    const server = one(spans, 'POST /tools/:name');
    expect(server.parentSpanId).toBe('');
    expect(server.attributes['http.response.status_code']).toBe(400);
    // The tool refused the expression in the worker: its run says why, and nothing was charged.
    expect(one(spans, 'tool run').attributes['tollgate.outcome']).toBe('invalid_input');
    expect(one(spans, 'settlement').attributes).toMatchObject({ 'tollgate.outcome': 'failed', 'tollgate.cost_cents': 0 });
    // The context stored with the job is the trace's and nothing else: the caller's baggage stays out.
    const job = await h.container.queues.getJob(res.body.error.job_id);
    const carried = JSON.parse(job!.opts.telemetry!.metadata!) as Record<string, string>;
    expect(Object.keys(carried)).toEqual(['traceparent']);
    expect(carried.traceparent).toMatch(new RegExp(`^00-${traceId}-[0-9a-f]{16}-01$`));
    expect(JSON.stringify(receiver.spans)).not.toContain('secret=');
    assertNoSecrets(receiver.spans, ['1 +']);
  }, 30_000);

  it('does nothing while off: no traceresponse from a process without an endpoint', async () => {
    const res = await h.request({
      method: 'GET',
      url: '/balance',
      headers: { authorization: `Bearer ${acct.apiKey}`, traceparent: `00-${hex(16)}-${hex(8)}-01` },
    });
    expect(res.statusCode).toBe(200);
    expect(json(res).credits).toBeTypeOf('number');
    expect(res.headers.traceresponse).toBeUndefined();
  });
});
