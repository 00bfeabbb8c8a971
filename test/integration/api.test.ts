import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';

let h: Harness;
let pro: TestAccount;
let free: TestAccount;

beforeAll(async () => {
  h = await startHarness();
  // Most calls here share one account: enterprise with a high custom rate so the rate limit stays out of the way.
  pro = await h.account('enterprise', 1000, { rpm: 100_000 });
  free = await h.account('free', 1000);
});
afterAll(() => h.close());

const envelope = (body: any) => {
  expect(Object.keys(body)).toEqual(['error']);
  expect(typeof body.error.code).toBe('string');
  expect(typeof body.error.message).toBe('string');
  expect(typeof body.error.request_id).toBe('string');
};

describe('discovery endpoints', () => {
  it('GET / carries every field of the root document, derived from the registry', async () => {
    const res = await h.request({ method: 'GET', url: '/' });
    expect(res.statusCode).toBe(200);
    const doc = json(res);
    expect(Object.keys(doc).sort()).toEqual(['_', 'docs', 'endpoints', 'npm', 'openai', 'protocol', 't', 'tools', 'total_tools', 'v'].sort());
    expect(Object.keys(doc.tools).sort()).toEqual(['enterprise', 'free', 'pro', 'starter']);
    expect(doc.tools.pro.compute).toEqual({ cost: '0.02', tier: 'pro' });
    expect(doc.tools.free.check_balance).toEqual({ cost: '0.00', tier: 'free' });
    const listed = Object.values(doc.tools).reduce((n: number, t: any) => n + Object.keys(t).length, 0);
    expect(doc.total_tools).toBe(listed);
    expect(Object.keys(doc.protocol).sort()).toEqual(['chain', 'direct', 'parallel', 'stream']);
    expect(doc.openai.models).toEqual(expect.arrayContaining(['svc-genius', 'svc-hints', 'svc-roast']));
    // The stdio MCP client, installed by npx from the tarball this service serves, with the env it needs.
    expect(doc.npm).toMatch(/^TOLLGATE_URL=(\S+) TOLLGATE_API_KEY=<your key> npx -y \1\/client\/tollgate-mcp\.tgz$/);
    expect(Math.abs(doc.t - Date.now() / 1000)).toBeLessThan(60);
  });

  it('GET /health checks Redis and Postgres', async () => {
    const res = await h.request({ method: 'GET', url: '/health' });
    expect(res.statusCode).toBe(200);
    expect(json(res).checks).toEqual({ redis: 'ok', postgres: 'ok' });
  });

  it('GET /tools lists name, cost and endpoint for every tool', async () => {
    const { tools } = json(await h.request({ method: 'GET', url: '/tools' }));
    const compute = tools.find((t: any) => t.name === 'compute');
    expect(compute).toMatchObject({ name: 'compute', cost: '0.02', endpoint: 'POST /tools/compute' });
    for (const t of tools) expect(t.cost).toMatch(/^\d+\.\d{2}$/);
  });

  it('GET /tools/{name} gives the JSON Schema, examples, price and tier', async () => {
    const res = await h.request({ method: 'GET', url: '/tools/compute' });
    const t = json(res);
    expect(t).toMatchObject({ name: 'compute', tier: 'pro', price_cents: 2, cost: '0.02', q_field: 'expression' });
    expect(t.input_schema.type).toBe('object');
    expect(t.input_schema.required).toEqual(['expression']);
    expect(t.examples.length).toBeGreaterThan(0);
  });

  it('GET /tools/{unknown} is 404 tool_not_found', async () => {
    const res = await h.request({ method: 'GET', url: '/tools/nope' });
    expect(res.statusCode).toBe(404);
    envelope(json(res));
    expect(json(res).error.code).toBe('tool_not_found');
  });

  it('GET /v1/manifest lists tiers and prices', async () => {
    const m = json(await h.request({ method: 'GET', url: '/v1/manifest' }));
    expect(m.tiers.pro).toEqual(expect.arrayContaining([expect.objectContaining({ name: 'compute', price_cents: 2, cost: '0.02' })]));
  });
});

describe('POST /tools/{name}', () => {
  it('runs compute through the queue, charges its price once and reports the balance', async () => {
    const acct = await h.account('pro', 100);
    const res = await h.call('compute', { expression: '2 * (3 + 4)' }, acct.apiKey);
    expect(res.statusCode).toBe(200);
    expect(res.headers['x-job-id']).toMatch(/^core-/);
    expect(json(res)).toEqual({
      result: { expression: '2 * (3 + 4)', result: '14', value: 14, type: 'number' },
      cost_cents: 2,
      remaining_credits: 98,
    });
    expect(await h.credits(acct.accountId)).toBe(98);
    expect(await h.ledgerSum(acct.accountId)).toBe(98);
  });

  it('evaluates units and matrices with the expression library, never eval', async () => {
    const units = json(await h.call('compute', { expression: '12.7 cm to inch' }, pro.apiKey));
    expect(units.result.result).toBe('5 inch');
    const injection = await h.call('compute', { expression: 'import({x: 1})' }, pro.apiKey);
    expect(injection.statusCode).toBe(400);
  });

  it('check_balance returns the caller balance for free', async () => {
    const acct = await h.account('free', 37);
    const res = await h.call('check_balance', {}, acct.apiKey);
    expect(res.statusCode).toBe(200);
    expect(json(res)).toEqual({ result: { credits: 37, plan: 'free', used_this_month: 0 }, cost_cents: 0, remaining_credits: 37 });
  });

  it('a bad expression is 400 invalid_input and charges nothing', async () => {
    const acct = await h.account('pro', 10);
    const res = await h.call('compute', { expression: '2 * (3 +' }, acct.apiKey);
    expect(res.statusCode).toBe(400);
    envelope(json(res));
    expect(json(res).error.code).toBe('invalid_input');
    expect(await h.credits(acct.accountId)).toBe(10);
    // The hold was given back: the full balance is usable again.
    const ok = await h.call('compute', { expression: '1+1' }, acct.apiKey);
    expect(ok.statusCode).toBe(200);
  });

  it.each([
    ['no Authorization header', undefined, 401, 'unauthorized'],
    ['a malformed key', 'cv_short', 401, 'invalid_api_key'],
    ['a key with a bad prefix', 'xx_' + 'a'.repeat(40), 401, 'invalid_api_key'],
    ['a well-formed unknown key', 'cv_' + 'A'.repeat(40), 401, 'key_not_found'],
  ])('%s is %i %s', async (_label, key, status, code) => {
    const res = await h.call('compute', { expression: '1' }, key as string | undefined);
    expect(res.statusCode).toBe(status);
    envelope(json(res));
    expect(json(res).error.code).toBe(code);
  });

  it.each([
    ['schema violation', { expression: 42 }, 400, 'invalid_input'],
    ['empty expression', { expression: '' }, 400, 'invalid_input'],
  ])('%s is 400 invalid_input naming the field', async (_l, body, status, code) => {
    const res = await h.call('compute', body, pro.apiKey);
    expect(res.statusCode).toBe(status);
    expect(json(res).error.code).toBe(code);
    expect(json(res).error.issues[0].path).toEqual(['expression']);
  });

  it('malformed JSON is 400 invalid_input in the envelope, not a 500', async () => {
    const res = await h.request({
      method: 'POST',
      url: '/tools/compute',
      headers: { authorization: `Bearer ${pro.apiKey}`, 'content-type': 'application/json' },
      payload: '{"expression": ',
    });
    expect(res.statusCode).toBe(400);
    envelope(json(res));
    expect(json(res).error.code).toBe('invalid_input');
  });

  it('unknown tool is 404 tool_not_found', async () => {
    const res = await h.call('does_not_exist', {}, pro.apiKey);
    expect(res.statusCode).toBe(404);
    expect(json(res).error.code).toBe('tool_not_found');
  });

  it('a plan below the tier is 403 plan_required with required_plan', async () => {
    const res = await h.call('compute', { expression: '1' }, free.apiKey);
    expect(res.statusCode).toBe(403);
    expect(json(res).error).toMatchObject({ code: 'plan_required', required_plan: 'pro', current_plan: 'free' });
  });

  it('a balance below the price is 402 insufficient_credits', async () => {
    const poor = await h.account('pro', 1);
    const res = await h.call('compute', { expression: '1' }, poor.apiKey);
    expect(res.statusCode).toBe(402);
    expect(json(res).error.code).toBe('insufficient_credits');
  });
});

describe('async calls and GET /jobs/{id}', () => {
  it('Prefer: respond-async answers 202 and the job later returns the sync body', async () => {
    const acct = await h.account('pro', 50);
    const res = await h.call('compute', { expression: '6*7' }, acct.apiKey, { prefer: 'respond-async' });
    expect(res.statusCode).toBe(202);
    const { job_id, status_url } = json(res);
    expect(status_url).toBe(`/jobs/${job_id}`);
    let body: any;
    for (;;) {
      const r = await h.request({ method: 'GET', url: status_url, headers: { authorization: `Bearer ${acct.apiKey}` } });
      body = json(r);
      if (body.status === 'completed') break;
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(body).toMatchObject({ job_id, status: 'completed', result: { value: 42 }, cost_cents: 2, remaining_credits: 48 });
    const other = await h.request({ method: 'GET', url: status_url, headers: { authorization: `Bearer ${pro.apiKey}` } });
    expect(other.statusCode).toBe(404);
    expect(json(other).error.code).toBe('not_found');
  });

  it('a sync wait longer than SYNC_TIMEOUT_MS turns into a 202', async () => {
    const slow = await startHarness({ SYNC_TIMEOUT_MS: '100' }, { workers: [] });
    try {
      const acct = await slow.account('pro', 10);
      // No workers run in this harness, so the job waits in the queue past the sync timeout.
      const res = await slow.call('compute', { expression: '1+1' }, acct.apiKey);
      expect(res.statusCode).toBe(202);
      const st = json(await slow.request({ method: 'GET', url: json(res).status_url, headers: { authorization: `Bearer ${acct.apiKey}` } }));
      expect(st.status).toBe('queued');
    } finally {
      await slow.close();
    }
  });
});

describe('GET /balance', () => {
  it('reports credits, plan and use this month', async () => {
    const acct = await h.account('pro', 20);
    await h.call('compute', { expression: '1' }, acct.apiKey);
    const res = await h.request({ method: 'GET', url: '/balance', headers: { authorization: `Bearer ${acct.apiKey}` } });
    expect(json(res)).toMatchObject({ credits: 18, plan: 'pro', used_this_month: 2 });
  });
});

describe('page_fetch SSRF guard through the full call path', () => {
  it('refuses loopback, metadata and redirects to them, charging nothing', async () => {
    const http = await import('node:http');
    const target = http.createServer((_req, res) => res.end('secret'));
    await new Promise<void>((r) => target.listen(0, '127.0.0.1', r));
    const port = (target.address() as { port: number }).port;
    const redirector = http.createServer((_req, res) => {
      res.writeHead(302, { location: `http://127.0.0.1:${port}/` });
      res.end();
    });
    await new Promise<void>((r) => redirector.listen(0, '127.0.0.1', r));
    const rport = (redirector.address() as { port: number }).port;
    // Only the redirector is exempt; the address it redirects to is not.
    const guarded = await startHarness({ FETCH_ALLOWED_HOSTS: `127.0.0.1:${rport}` }, { workers: ['web'] });
    try {
      const acct = await guarded.account('free', 0);
      for (const url of [
        `http://127.0.0.1:${port}/`,
        'http://169.254.169.254/latest/meta-data/',
        'http://[::1]:80/',
        'http://10.0.0.1/',
        'http://localhost/',
      ]) {
        const res = await guarded.call('page_fetch', { url }, acct.apiKey);
        expect(res.statusCode, url).toBe(400);
        expect(json(res).error).toMatchObject({ code: 'invalid_input', reason: 'blocked_address' });
      }
      const viaRedirect = await guarded.call('page_fetch', { url: `http://127.0.0.1:${rport}/` }, acct.apiKey);
      expect(viaRedirect.statusCode).toBe(400);
      expect(json(viaRedirect).error.reason).toBe('blocked_address');
    } finally {
      await guarded.close();
      target.close();
      redirector.close();
    }
  });
});

describe('GET /health when a dependency is down', () => {
  it('answers 503 naming Postgres', async () => {
    const broken = await startHarness({}, { workers: [] });
    try {
      await broken.container.pool.end();
      const res = await broken.request({ method: 'GET', url: '/health' });
      expect(res.statusCode).toBe(503);
      expect(json(res)).toMatchObject({ status: 'degraded', checks: { redis: 'ok', postgres: 'down' } });
    } finally {
      await broken.close();
    }
  });
});
