import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { EventSource } from 'eventsource';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { deferred, startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import { startFakeDns, type FakeDnsServer } from '../helpers/dns-server.js';
import { startFakeCloudflare, type FakeCloudflare } from '../helpers/fake-cloudflare.js';
import { randomBytes } from 'node:crypto';
import { deploymentKeys } from '../../src/queue/redis.js';

let h: Harness;
let llm: FakeOpenAI;
let dns: FakeDnsServer;
let cf: FakeCloudflare;
const EDGE_TOKEN = `edgetok${randomBytes(12).toString('hex')}`;
let base: string;
let pro: TestAccount;

beforeAll(async () => {
  llm = await startFakeOpenAI();
  dns = await startFakeDns({ 'shop.test': { A: ['192.0.2.10'], MX: [{ exchange: 'mx.shop.test', priority: 10 }], TXT: [['v=spf1 -all']] } });
  cf = await startFakeCloudflare({ token: EDGE_TOKEN });
  cf.addZone('example.com');
  // A short heartbeat so the test sees one while a job waits.
  h = await startHarness({ LLM_BASE_URL: llm.baseURL, DNS_SERVERS: dns.address, CF_API_BASE_URL: cf.url, SSE_HEARTBEAT_MS: '200' });
  base = await h.app.listen({ port: 0, host: '127.0.0.1' });
  pro = await h.account('pro', 10_000);
});
afterAll(async () => {
  await h.close();
  await llm.close();
  await dns.close();
  await cf.close();
});
beforeEach(() => {
  llm.requests.length = 0;
});

interface Received {
  type: string;
  id: string;
  data: any;
}

/**
 * An `eventsource` client (POST through its custom fetch, or GET). Collects named events in order and
 * resolves `ended` when the client gives up for good: after the server closed the stream, the client
 * reconnects with Last-Event-ID and the server's 204 stops it.
 */
function open(path: string, apiKey: string, opts: { body?: unknown; headers?: Record<string, string> } = {}) {
  const events: Received[] = [];
  const requests: Array<Record<string, string>> = [];
  const waiters: Array<{ pred: (e: Received) => boolean; resolve: (e: Received) => void }> = [];
  const ended = deferred<{ code?: number }>();
  const es = new EventSource(`${base}${path}`, {
    fetch: (input, init) => {
      const headers = { ...(init?.headers as Record<string, string>), authorization: `Bearer ${apiKey}`, ...opts.headers };
      requests.push(headers);
      return fetch(input, {
        ...init,
        headers: opts.body === undefined ? headers : { ...headers, 'content-type': 'application/json' },
        ...(opts.body === undefined ? {} : { method: 'POST', body: JSON.stringify(opts.body) }),
      });
    },
  });
  for (const type of ['queued', 'progress', 'step', 'result', 'error']) {
    es.addEventListener(type, (ev) => {
      // EventSource also fires `error` for connection trouble; only the server's events carry data.
      if (typeof (ev as MessageEvent).data !== 'string') return;
      const e = { type, id: ev.lastEventId, data: JSON.parse(ev.data) };
      events.push(e);
      for (const w of [...waiters]) {
        if (w.pred(e)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(e);
        }
      }
    });
  }
  es.onerror = (err) => {
    if (es.readyState === es.CLOSED) ended.resolve({ code: (err as { code?: number }).code });
  };
  return {
    es,
    events,
    requests,
    ended: ended.promise,
    next: (pred: (e: Received) => boolean) =>
      new Promise<Received>((resolve) => {
        const hit = events.find(pred);
        if (hit) resolve(hit);
        else waiters.push({ pred, resolve });
      }),
  };
}

const types = (events: Received[]) => events.map((e) => e.type);
const cursorOf = (id: string) => id.slice(id.indexOf(':') + 1);

describe('POST / with stream: true', () => {
  it('streams queued, progress, then the result the sync call returns; a reconnect runs nothing again', async () => {
    const acct = await h.account('pro', 100);
    const gate = deferred();
    llm.enqueue({ type: 'tokens', tokens: ['Try', ' smaller', ' steps.'], beforeToken: (i) => (i === 1 ? gate.promise : undefined) });
    const s = open('/', acct.apiKey, { body: { stream: true, m: 'hints', q: 'How do I split this problem?' } });
    const first = await s.next((e) => e.type === 'progress');
    expect(first.data).toMatchObject({ stage: 'generating', delta: 'Try', done: 1, unit: 'tokens' });
    gate.resolve();
    const ended = await s.ended;
    expect(ended.code).toBe(204);

    expect(types(s.events)).toEqual(['queued', 'progress', 'progress', 'progress', 'result']);
    const jobId = s.events[0]!.data.job_id as string;
    expect(jobId).toMatch(/^llm-/);
    expect(s.events.map((e) => e.id.split(':')[0])).toEqual(Array(5).fill(jobId));
    expect(s.events[0]!.id).toBe(`${jobId}:0`);
    expect(s.events[4]!.id).toBe(`${jobId}:end`);
    expect(s.events.slice(1, 4).map((e) => e.data.delta)).toEqual(['Try', ' smaller', ' steps.']);
    const result = s.events[4]!.data;
    expect(result).toEqual({ result: expect.objectContaining({ text: 'Try smaller steps.' }), cost_cents: 5, remaining_credits: 95 });
    // The reconnect carried the last id and was told the stream is over; the request ran once.
    expect(s.requests).toHaveLength(2);
    expect(s.requests[1]!['Last-Event-ID']).toBe(`${jobId}:end`);
    expect(llm.requests).toHaveLength(1);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    // GET /jobs/{id} has the same body.
    const status = json(await h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: { authorization: `Bearer ${acct.apiKey}` } }));
    expect(status).toEqual({ job_id: jobId, status: 'completed', ...result });
  });

  it('sends the DNS lookups of domain_check as progress before the result', async () => {
    const s = open('/', pro.apiKey, { body: { stream: true, m: 'domain_check', q: 'shop.test' } });
    await s.ended;
    const t = types(s.events);
    expect(t[0]).toBe('queued');
    expect(t.at(-1)).toBe('result');
    const progress = s.events.filter((e) => e.type === 'progress');
    expect(progress.length).toBeGreaterThanOrEqual(2);
    expect(progress.at(-1)!.data).toMatchObject({ stage: 'resolving', done: 5, total: 5, unit: 'lookups' });
    expect(s.events.at(-1)!.data.result).toMatchObject({ domain: 'shop.test', resolves: true, status: 'ok' });
    // Progress ids follow the log order.
    const cursors = progress.map((e) => cursorOf(e.id));
    expect([...cursors].sort(compareStreamIds)).toEqual(cursors);
  });

  it('streams a chain with per-step events and the chain body as the result', async () => {
    llm.enqueue({ type: 'tokens', tokens: ['6', ' * ', '7'] });
    const s = open('/', pro.apiKey, { body: { stream: true, chain: ['compute', 'hints', 'compute'], q: '2 * 3' } });
    await s.ended;
    const queued = s.events[0]!;
    expect(queued.type).toBe('queued');
    expect(queued.data).toMatchObject({
      mode: 'chain',
      steps: [
        { index: 0, tool: 'compute' },
        { index: 1, tool: 'hints' },
        { index: 2, tool: 'compute' },
      ],
    });
    expect(queued.data.job_id).toBe(queued.data.steps[2].job_id);
    const steps = s.events.filter((e) => e.type === 'step');
    expect(steps.map((e) => [e.data.index, e.data.tool, e.data.status])).toEqual([
      [0, 'compute', 'completed'],
      [1, 'hints', 'completed'],
      [2, 'compute', 'completed'],
    ]);
    // The model's tokens are hints' progress: tagged with the step, between step 0 and step 1 finishing.
    expect(JSON.stringify(llm.requests[0]!.body.messages)).toContain('6');
    const t = types(s.events);
    const progress = s.events.filter((e) => e.type === 'progress');
    expect(progress.length).toBeGreaterThan(0);
    expect(progress.map((e) => e.data.delta)).toEqual(['6', ' * ', '7']);
    expect(progress.every((e) => e.data.step.index === 1 && e.data.step.tool === 'hints')).toBe(true);
    expect(t.indexOf('progress')).toBeGreaterThan(s.events.indexOf(steps[0]!));
    expect(t.lastIndexOf('progress')).toBeLessThan(s.events.indexOf(steps[1]!));
    const result = s.events.at(-1)!;
    expect(result.type).toBe('result');
    expect(result.data.steps.map((x: any) => x.tool)).toEqual(['compute', 'hints', 'compute']);
    expect(result.data.result).toMatchObject({ expression: '6 * 7', result: '42' });
    expect(result.data.cost_cents).toBe(9);
  });

  it('streams a failing chain as an error event with the envelope', async () => {
    const s = open('/', pro.apiKey, { body: { stream: true, chain: ['compute', 'compute', 'compute'], q: 'unknown_symbol + 1' } });
    await s.ended;
    expect(types(s.events)).toEqual(['queued', 'step', 'error']);
    expect(s.events[1]!.data).toMatchObject({ index: 0, status: 'failed', error: { code: 'invalid_input' } });
    const { error } = s.events[2]!.data;
    expect(error).toMatchObject({ code: 'invalid_input', failed_step: { index: 0, tool: 'compute' }, steps: [], cost_cents: 0 });
    expect(typeof error.request_id).toBe('string');
  });

  it('streams a parallel request: one step event per tool, then the results', async () => {
    const s = open('/', pro.apiKey, { body: { stream: true, parallel: ['compute', 'domain_check'], q: 'shop.test' } });
    await s.ended;
    const steps = s.events.filter((e) => e.type === 'step');
    expect(steps.map((e) => `${e.data.tool}:${e.data.status}`).sort()).toEqual(['compute:failed', 'domain_check:completed']);
    const result = s.events.at(-1)!;
    expect(result.type).toBe('result');
    expect(result.data.results.compute.error.code).toBe('invalid_input');
    expect(result.data.results.domain_check.result.status).toBe('ok');
    expect(result.data.cost_cents).toBe(0);
  });

  it('admission errors are ordinary JSON errors, before any stream', async () => {
    const poor = await h.account('pro', 1);
    for (const [body, key, status, code] of [
      [{ stream: true, m: 'nope', q: 'x' }, pro.apiKey, 404, 'tool_not_found'],
      [{ stream: true, m: 'hints', q: 'x' }, poor.apiKey, 402, 'insufficient_credits'],
      [{ stream: true, chain: [], q: 'x' }, pro.apiKey, 400, 'invalid_input'],
    ] as const) {
      const res = await fetch(`${base}/`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', accept: 'text/event-stream' },
        body: JSON.stringify(body),
      });
      expect(res.status).toBe(status);
      expect(res.headers.get('content-type')).toMatch(/^application\/json/);
      expect(((await res.json()) as any).error.code).toBe(code);
    }
  });

  it('sends comment heartbeats while a job waits', async () => {
    const gate = deferred();
    llm.enqueue({ type: 'tokens', tokens: ['ok'], beforeToken: () => gate.promise });
    const res = await fetch(`${base}/`, {
      method: 'POST',
      headers: { authorization: `Bearer ${pro.apiKey}`, 'content-type': 'application/json', accept: 'text/event-stream' },
      body: JSON.stringify({ stream: true, m: 'roast', q: 'my plan' }),
    });
    expect(res.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    expect(res.headers.get('cache-control')).toMatch(/no-cache/);
    expect(res.headers.get('x-accel-buffering')).toBe('no');
    // Headers set before the stream started (rate limit, request id) are kept.
    expect(res.headers.get('x-ratelimit-limit')).toBeTruthy();
    expect(res.headers.get('x-request-id')).toBeTruthy();
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let text = '';
    while (!text.includes('\n: ping\n')) text += decoder.decode((await reader.read()).value, { stream: true });
    expect(text).toContain('event: queued');
    expect(text).not.toContain('event: result');
    gate.resolve();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
    expect(text).toMatch(/event: result\ndata: \{"result":\{"text":"ok"/);
  });

  it('Idempotency-Key: a retried stream follows the first job instead of running again', async () => {
    const acct = await h.account('pro', 100);
    const body = { stream: true, m: 'compute', q: '40 + 2' };
    const a = open('/', acct.apiKey, { body, headers: { 'idempotency-key': 'stream-once' } });
    await a.ended;
    const b = open('/', acct.apiKey, { body, headers: { 'idempotency-key': 'stream-once' } });
    await b.ended;
    expect(b.events[0]!.data.job_id).toBe(a.events[0]!.data.job_id);
    expect(b.events.at(-1)!.data).toEqual(a.events.at(-1)!.data);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
  });
});

describe('POST /tools/{name} with Accept: text/event-stream', () => {
  it('streams the call; the job outlives a client that leaves; GET /jobs/{id}/events replays it', async () => {
    const acct = await h.account('pro', 100);
    const gate = deferred();
    llm.enqueue({ type: 'tokens', tokens: ['You', ' call', ' this', ' a plan?'], beforeToken: (i) => (i === 2 ? gate.promise : undefined) });
    const live = open('/tools/roast', acct.apiKey, { body: { text: 'Ship on Friday evening' } });
    await live.next((e) => e.type === 'progress' && e.data.done === 2);
    const jobId = live.events[0]!.data.job_id as string;
    live.es.close();

    // The job carries on without its client.
    const wait = h.container.api!.dispatcher.waitFor(jobId, 20_000);
    gate.resolve();
    expect((await wait.outcome).state).toBe('completed');
    const status = json(await h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: { authorization: `Bearer ${acct.apiKey}` } }));
    expect(status).toMatchObject({ status: 'completed', result: { text: 'You call this a plan?' }, cost_cents: 5 });

    // A new client replays the stored events, gets the result and is done.
    const replay = open(`/jobs/${jobId}/events`, acct.apiKey);
    expect((await replay.ended).code).toBe(204);
    expect(types(replay.events)).toEqual(['queued', 'progress', 'progress', 'progress', 'progress', 'result']);
    expect(replay.events.slice(1, 3).map((e) => e.id)).toEqual(live.events.slice(1, 3).map((e) => e.id));
    expect(replay.events.at(-1)!.data).toEqual({ result: status.result, cost_cents: 5, remaining_credits: 95 });

    // Resuming after the second progress event sends only what came after it.
    const resumed = await fetch(`${base}/jobs/${jobId}/events`, {
      headers: { authorization: `Bearer ${acct.apiKey}`, accept: 'text/event-stream', 'last-event-id': replay.events[2]!.id },
    });
    const text = await resumed.text();
    expect(text).not.toContain('event: queued');
    expect(text.match(/event: progress/g)).toHaveLength(2);
    expect(text).toContain(`id: ${jobId}:end\nevent: result`);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
  });

  it('a reconnect to the POST with Last-Event-ID resumes the same job', async () => {
    const acct = await h.account('pro', 100);
    const first = open('/tools/compute', acct.apiKey, { body: { expression: '6 * 7' } });
    await first.ended;
    const jobId = first.events[0]!.data.job_id;
    const res = await fetch(`${base}/tools/compute`, {
      method: 'POST',
      headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json', accept: 'text/event-stream', 'last-event-id': `${jobId}:0` },
      body: JSON.stringify({ expression: '6 * 7' }),
    });
    const text = await res.text();
    expect(res.headers.get('x-job-id')).toBe(jobId);
    expect(text).toContain(`id: ${jobId}:end\nevent: result\ndata: {"result":{"expression":"6 * 7","result":"42"`);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
  });
});

describe('GET /jobs/{id}/events', () => {
  it('replays a finished chain with its steps and result', async () => {
    const res = await h.request({
      method: 'POST',
      url: '/',
      headers: { authorization: `Bearer ${pro.apiKey}`, 'content-type': 'application/json' },
      // The second lookup gets the first one's JSON output as its domain, which is no domain at all.
      payload: JSON.stringify({ chain: ['domain_check', 'domain_check'], q: 'shop.test' }),
    });
    expect(res.statusCode).toBe(400);
    const rootId = json(res).error.job_id;
    const replay = open(`/jobs/${rootId}/events`, pro.apiKey);
    await replay.ended;
    const t = types(replay.events);
    expect(t[0]).toBe('queued');
    expect(t.slice(-3)).toEqual(['step', 'step', 'error']);
    expect(replay.events.at(-1)!.data.error).toMatchObject({ code: 'invalid_input', failed_step: { index: 1, tool: 'domain_check' } });
    expect(replay.events.filter((e) => e.type === 'progress').every((e) => e.data.step.index === 0)).toBe(true);
  });

  it.each([
    ['another key', async () => (await h.account('pro', 1)).apiKey],
    ['an unknown job', async () => pro.apiKey],
  ])('is 404 for %s', async (label, key) => {
    const done = await h.request({
      method: 'POST',
      url: '/tools/compute',
      headers: { authorization: `Bearer ${pro.apiKey}`, 'content-type': 'application/json' },
      payload: JSON.stringify({ expression: '1' }),
    });
    const id = label === 'an unknown job' ? 'core-00000000-0000-0000-0000-000000000000' : done.headers['x-job-id'];
    const res = await h.request({ method: 'GET', url: `/jobs/${id}/events`, headers: { authorization: `Bearer ${await key()}` } });
    expect(res.statusCode).toBe(404);
    expect(json(res).error.code).toBe('not_found');
  });
});

describe('edge-network tokens in streamed flows', () => {
  it('run cf_* steps with the token, and keep it out of job data, event logs and flow records', async () => {
    const s = open('/', pro.apiKey, {
      body: { stream: true, parallel: ['cf_list_zones', 'cf_get_zone'], q: 'example.com' },
      headers: { 'x-edge-token': EDGE_TOKEN },
    });
    await s.ended;
    const result = s.events.at(-1)!;
    expect(result.type).toBe('result');
    expect(JSON.stringify(result.data.results.cf_list_zones.result)).toContain('example.com');
    expect(result.data.results.cf_get_zone.result).toMatchObject({ zone: { name: 'example.com' } });
    // The steps carried the sealed token, so BullMQ dropped them when they finished; the answer
    // still comes back from GET /jobs/{id}.
    const rootId = s.events[0]!.data.job_id;
    const status = json(await h.request({ method: 'GET', url: `/jobs/${rootId}`, headers: { authorization: `Bearer ${pro.apiKey}` } }));
    expect(status).toMatchObject({ status: 'completed', results: result.data.results });
    for (const step of s.events[0]!.data.steps) expect(await h.container.queues.getJob(step.job_id)).toBeNull();

    const chain = await h.request({
      method: 'POST',
      url: '/',
      headers: { authorization: `Bearer ${pro.apiKey}`, 'content-type': 'application/json' },
      payload: JSON.stringify({ chain: ['compute', 'cf_get_zone'], q: '"example.com"', edge_token: EDGE_TOKEN }),
    });
    expect(chain.statusCode).toBe(400);
    expect(json(chain).error.failed_step.tool).toBe('cf_get_zone');

    const redis = h.container.redis;
    const dump: string[] = [];
    for await (const { keys } of deploymentKeys(redis, h.config.REDIS_PREFIX)) {
      for (const key of keys) {
        const type = await redis.type(key);
        if (type === 'string') dump.push(key, (await redis.get(key)) ?? '');
        else if (type === 'hash') dump.push(key, JSON.stringify(await redis.hgetall(key)));
        else if (type === 'stream') dump.push(key, JSON.stringify(await redis.xrange(key, '-', '+')));
      }
    }
    expect(dump.some((k) => k.includes(`:events:${rootId}`))).toBe(true);
    expect(dump.join('\n')).not.toContain(EDGE_TOKEN);
    expect(h.logs.join('')).not.toContain(EDGE_TOKEN);
  });
});

function compareStreamIds(a: string, b: string): number {
  const [am, as] = a.split('-').map(BigInt);
  const [bm, bs] = b.split('-').map(BigInt);
  return am! === bm! ? Number(as! - bs!) : am! < bm! ? -1 : 1;
}
