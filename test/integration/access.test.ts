import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { sql } from '../../src/db/pool.js';
import { z } from 'zod';
import { json, startHarness, type Harness } from '../helpers/harness.js';

let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(() => h.close());

const auth = (key: string) => ({ authorization: `Bearer ${key}` });
const get = (url: string, key: string) => h.request({ method: 'GET', url, headers: auth(key) });
const post = (url: string, key: string, body: unknown, headers: Record<string, string> = {}) =>
  h.request({ method: 'POST', url, headers: { ...auth(key), 'content-type': 'application/json', ...headers }, payload: JSON.stringify(body) });

function expectError(res: { statusCode: number; body: string }, status: number, code: string) {
  expect(res.statusCode).toBe(status);
  const body = JSON.parse(res.body);
  expect(Object.keys(body)).toEqual(['error']);
  expect(body.error.code).toBe(code);
  expect(body.error.message.length).toBeGreaterThan(5);
  expect(body.error.request_id).toBeTruthy();
}

describe('key types against every endpoint', () => {
  type Keys = Record<'production' | 'agent' | 'vip' | 'test' | 'sub', string>;
  let keys: Keys;
  let accountId: string;

  beforeAll(async () => {
    const acct = await h.account('enterprise', 10_000, { rpm: 100_000 });
    accountId = acct.accountId;
    await h.admin.setAccount(accountId, { elite: true });
    const agent = await h.key(accountId, 'agent', 'research-bot');
    const vip = await h.key(accountId, 'vip');
    const test = await h.key(accountId, 'test');
    const sub = json(await post('/subkeys/create', acct.apiKey, { name: 'ci', monthly_limit: 100, allowed_tools: ['compute'] }));
    keys = { production: acct.apiKey, agent: agent.apiKey, vip: vip.apiKey, test: test.apiKey, sub: sub.api_key };
  });

  // [key type, GET /balance, POST /tools/compute, POST /tools/check_balance, GET /subkeys, POST /subkeys/create]
  // Only the production key manages sub-keys (src/access/keys.ts): an agent's or VIP key calls tools.
  const matrix: Array<[keyof Keys, number, number, number, number, number]> = [
    ['production', 200, 200, 200, 200, 201],
    ['agent', 200, 200, 200, 403, 403],
    ['vip', 200, 200, 200, 403, 403],
    ['test', 200, 200, 200, 403, 403],
    ['sub', 200, 200, 403, 403, 403],
  ];

  it.each(matrix)('%s key: balance %i, compute %i, check_balance %i, list sub-keys %i, create sub-key %i', async (type, bal, comp, chk, list, create) => {
    const key = keys[type];
    expect((await get('/balance', key)).statusCode).toBe(bal);
    expect((await post('/tools/compute', key, { expression: '1+1' })).statusCode).toBe(comp);
    expect((await post('/tools/check_balance', key, {})).statusCode).toBe(chk);
    expect((await get('/subkeys', key)).statusCode).toBe(list);
    expect((await post('/subkeys/create', key, { name: 'x', monthly_limit: 5, allowed_tools: ['compute'] })).statusCode).toBe(create);
  });

  it('every authenticated response carries the rate-limit headers', async () => {
    for (const key of Object.values(keys)) {
      const res = await get('/balance', key);
      expect(Number(res.headers['x-ratelimit-limit'])).toBe(100_000);
      expect(Number(res.headers['x-ratelimit-remaining'])).toBeLessThan(100_000);
      expect(res.headers['x-ratelimit-reset']).toMatch(/^\d+$/);
    }
  });

  it('sandbox keys are never charged and say so', async () => {
    const before = await h.credits(accountId);
    const res = await post('/tools/compute', keys.test, { expression: '3*3' });
    expect(json(res)).toMatchObject({ result: { value: 9 }, cost_cents: 0, remaining_credits: before, sandbox: true });
    expect(await h.credits(accountId)).toBe(before);
  });

  it('agent keys are recorded in the ledger under the agent name', async () => {
    const res = await post('/tools/compute', keys.agent, { expression: '1+2' });
    const jobId = res.headers['x-job-id'] as string;
    const agent = await h.container.pool.oneFirst(sql.type(z.object({ agent_name: z.string().nullable() }))`
      SELECT agent_name FROM ledger WHERE entry_key = ${jobId}`);
    expect(agent).toBe('research-bot');
  });

  it('VIP keys are refused for accounts that are not elite enterprise', async () => {
    const plain = await h.account('enterprise', 0);
    await expect(h.key(plain.accountId, 'vip')).rejects.toMatchObject({ code: 'forbidden' });
    const pro = await h.account('pro', 0);
    await h.admin.setAccount(pro.accountId, { elite: true });
    await expect(h.key(pro.accountId, 'vip')).rejects.toThrow(/enterprise accounts marked elite/);
  });

  it('key strings must be a known prefix plus at least 32 base62 characters', async () => {
    for (const bad of ['cv_' + 'a'.repeat(31), 'cv_test_' + 'a'.repeat(20), 'titan_vip_' + '!'.repeat(40), 'sk-' + 'a'.repeat(40)]) {
      expectError(await get('/balance', bad), 401, 'invalid_api_key');
    }
  });
});

describe('every error code in the DECISIONS table', () => {
  it.each([
    ['invalid_input', 400, async (k: string) => post('/tools/compute', k, { expression: 7 })],
    ['unauthorized', 401, async () => h.request({ method: 'GET', url: '/balance' })],
    ['invalid_api_key', 401, async () => get('/balance', 'cv_nope')],
    ['key_not_found', 401, async () => get('/balance', 'cv_' + 'Z'.repeat(40))],
    ['insufficient_credits', 402, async () => post('/tools/compute', (await h.account('pro', 1)).apiKey, { expression: '1' })],
    ['plan_required', 403, async () => post('/tools/compute', (await h.account('starter', 100)).apiKey, { expression: '1' })],
    ['tool_not_found', 404, async (k: string) => post('/tools/no_such_tool', k, {})],
    ['tool_unavailable', 503, async (k: string) => post('/tools/genius', k, { problem: 'x' })],
  ])('%s (%i) by a real request', async (code, status, make) => {
    const acct = await h.account('enterprise', 1000, { rpm: 1000 });
    const res = await make(acct.apiKey);
    expectError(res, status, code);
    if (status !== 401) expect(await h.credits(acct.accountId)).toBe(1000);
  });

  it('monthly_limit_exceeded (402) and tool_not_allowed (403) for sub-keys', async () => {
    const acct = await h.account('enterprise', 1000);
    const sub = json(await post('/subkeys/create', acct.apiKey, { name: 's', monthly_limit: 3, allowed_tools: ['compute'] }));
    expect((await post('/tools/compute', sub.api_key, { expression: '1' })).statusCode).toBe(200);
    expectError(await post('/tools/compute', sub.api_key, { expression: '1' }), 402, 'monthly_limit_exceeded');
    expectError(await post('/tools/domain_check', sub.api_key, { domain: 'example.com' }), 403, 'tool_not_allowed');
  });

  it('rate_limited (429) with Retry-After, never 403', async () => {
    const acct = await h.account('free', 0);
    for (let i = 0; i < 10; i++) expect((await get('/balance', acct.apiKey)).statusCode).toBe(200);
    const res = await get('/balance', acct.apiKey);
    expectError(res, 429, 'rate_limited');
    expect(Number(res.headers['retry-after'])).toBeGreaterThan(0);
    expect(res.headers['x-ratelimit-remaining']).toBe('0');
    expect(json(res).error.retry_after).toBe(Number(res.headers['retry-after']));
  });
});

describe('rate limits across replicas', () => {
  it('two API instances sharing Redis admit exactly the plan limit together', async () => {
    const second = await startHarness({ REDIS_PREFIX: h.config.REDIS_PREFIX }, { workers: [] });
    try {
      const acct = await h.account('starter', 0);
      const apps = [h, second];
      const res = await Promise.all(Array.from({ length: 80 }, (_, i) => apps[i % 2]!.request({ method: 'GET', url: '/balance', headers: auth(acct.apiKey) })));
      expect(res.filter((r) => r.statusCode === 200)).toHaveLength(30);
      expect(res.filter((r) => r.statusCode === 429)).toHaveLength(50);
    } finally {
      await second.close();
    }
  });

  it('a revocation on one replica reaches the other within a second, although keys are cached', async () => {
    const second = await startHarness({ REDIS_PREFIX: h.config.REDIS_PREFIX, KEY_CACHE_SECONDS: '30' }, { workers: [] });
    try {
      const acct = await h.account('enterprise', 100, { rpm: 100_000 });
      const sub = json(await post('/subkeys/create', acct.apiKey, { name: 'r', monthly_limit: 5, allowed_tools: ['compute'] }));
      const viaSecond = () => second.request({ method: 'GET', url: '/balance', headers: auth(sub.api_key) });
      expect((await viaSecond()).statusCode).toBe(200); // now cached on the second replica for 30 s
      const revokedAt = Date.now();
      await h.request({ method: 'DELETE', url: `/subkeys/${sub.key_id}`, headers: auth(acct.apiKey) });
      await vi.waitFor(async () => expect((await viaSecond()).statusCode).toBe(401), { timeout: 1000, interval: 10 });
      expect(Date.now() - revokedAt).toBeLessThan(1000);
    } finally {
      await second.close();
    }
  });

  it('the window slides: no 2x burst across a window edge', async () => {
    // A two-second window stands in for the minute so the edge can be crossed in a test (two, not
    // one: on a loaded machine the first five requests alone can take a few hundred milliseconds).
    const fast = await startHarness({ RATE_LIMIT_WINDOW_MS: '2000' }, { workers: [] });
    try {
      const acct = await fast.account('free', 0);
      const hit = () => fast.request({ method: 'GET', url: '/balance', headers: auth(acct.apiKey) });
      const t0 = Date.now();
      for (let i = 0; i < 5; i++) expect((await hit()).statusCode).toBe(200);
      const t5 = Date.now();
      // Wait past where a fixed window aligned on t0 would have reset halfway...
      while (Date.now() - t0 < 1200) await new Promise((r) => setTimeout(r, 20));
      const tb = Date.now();
      const burst = await Promise.all(Array.from({ length: 10 }, hit));
      // ...yet only the 5 left in the sliding window are admitted: 10 in any two-second span.
      expect(burst.filter((r) => r.statusCode === 200)).toHaveLength(5);
      expect(Date.now() - t0).toBeLessThan(2000);
      // Once the first five are a window old (and the burst's are not), five more fit, and no more.
      while (Date.now() - t5 < 2050) await new Promise((r) => setTimeout(r, 20));
      expect(Date.now() - tb).toBeLessThan(2000);
      const later = await Promise.all(Array.from({ length: 8 }, hit));
      expect(later.filter((r) => r.statusCode === 200)).toHaveLength(5);
    } finally {
      await fast.close();
    }
  });
});

describe('sub-keys', () => {
  it('create, list and delete, with the documented fields and no secrets in the list', async () => {
    const acct = await h.account('enterprise', 500);
    const res = await post('/subkeys/create', acct.apiKey, { name: 'billing-bot', monthly_limit: 250, allowed_tools: ['compute', 'check_balance'] });
    expect(res.statusCode).toBe(201);
    const created = json(res);
    expect(Object.keys(created).sort()).toEqual(['allowed_tools', 'api_key', 'created_at', 'key_id', 'monthly_limit', 'name', 'tool_set', 'used_this_month']);
    expect(created.api_key).toMatch(/^cv_sub_[A-Za-z0-9]{40}$/);
    expect(created).toMatchObject({ name: 'billing-bot', monthly_limit: 250, allowed_tools: ['compute', 'check_balance'], used_this_month: 0 });

    await post('/tools/compute', created.api_key, { expression: '2' });
    const list = json(await get('/subkeys', acct.apiKey));
    expect(list.subkeys).toHaveLength(1);
    expect(list.subkeys[0]).toMatchObject({ key_id: created.key_id, name: 'billing-bot', used_this_month: 2, monthly_limit: 250 });
    expect(JSON.stringify(list)).not.toContain(created.api_key);

    const bal = json(await get('/balance', created.api_key));
    expect(bal).toMatchObject({ credits: 498, plan: 'enterprise', used_this_month: 2, monthly_limit: 250 });

    const del = await h.request({ method: 'DELETE', url: `/subkeys/${created.key_id}`, headers: auth(acct.apiKey) });
    expect(json(del)).toEqual({ key_id: created.key_id, revoked: true });
    // Revocation is immediate, even though keys are cached.
    expectError(await get('/balance', created.api_key), 401, 'key_not_found');
  });

  it.each([
    [{ name: 'x', monthly_limit: 0, allowed_tools: ['compute'] }, 'monthly_limit'],
    [{ name: 'x', monthly_limit: -5, allowed_tools: ['compute'] }, 'monthly_limit'],
    [{ name: 'x', monthly_limit: 5, allowed_tools: ['compute', 'nope'] }, 'allowed_tools'],
    [{ name: '', monthly_limit: 5, allowed_tools: ['compute'] }, 'name'],
  ])('invalid create %j names the field %s', async (body, field) => {
    const acct = await h.account('enterprise', 0);
    const res = await post('/subkeys/create', acct.apiKey, body);
    expectError(res, 400, 'invalid_input');
    expect(json(res).error.issues[0].path[0]).toBe(field);
  });

  it('non-enterprise accounts get plan_required; another account\u2019s key is 404', async () => {
    const pro = await h.account('pro', 0);
    expectError(await post('/subkeys/create', pro.apiKey, { name: 'x', monthly_limit: 5, allowed_tools: ['compute'] }), 403, 'plan_required');
    const a = await h.account('enterprise', 0);
    const b = await h.account('enterprise', 0);
    const sub = json(await post('/subkeys/create', a.apiKey, { name: 'x', monthly_limit: 5, allowed_tools: ['compute'] }));
    expectError(await h.request({ method: 'DELETE', url: `/subkeys/${sub.key_id}`, headers: auth(b.apiKey) }), 404, 'not_found');
  });

  it('concurrent calls never pass the monthly limit', async () => {
    const acct = await h.account('enterprise', 10_000, { rpm: 100_000 });
    const sub = json(await post('/subkeys/create', acct.apiKey, { name: 'capped', monthly_limit: 11, allowed_tools: ['compute'] }));
    const res = await Promise.all(Array.from({ length: 30 }, (_, i) => post('/tools/compute', sub.api_key, { expression: `${i}` })));
    expect(res.filter((r) => r.statusCode === 200)).toHaveLength(5);
    expect(res.filter((r) => r.statusCode === 402).every((r) => json(r).error.code === 'monthly_limit_exceeded')).toBe(true);
    expect(await h.credits(acct.accountId)).toBe(10_000 - 10);
  });
});

describe('Idempotency-Key', () => {
  it('a storm of 50 identical retries runs the tool once and charges once', async () => {
    const acct = await h.account('enterprise', 100, { rpm: 100_000 });
    const res = await Promise.all(
      Array.from({ length: 50 }, () => post('/tools/compute', acct.apiKey, { expression: '5*5' }, { 'idempotency-key': 'storm-1' })),
    );
    const ok = res.filter((r) => r.statusCode === 200);
    const busy = res.filter((r) => r.statusCode === 409);
    expect(ok.length + busy.length).toBe(50);
    for (const r of busy) expect(json(r).error.code).toBe('idempotency_in_progress');
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    expect(await h.credits(acct.accountId)).toBe(98);
    // Once finished, a retry gets the first response again, marked as a replay.
    const again = await post('/tools/compute', acct.apiKey, { expression: '5*5' }, { 'idempotency-key': 'storm-1' });
    expect(again.statusCode).toBe(200);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(json(again)).toEqual({ result: expect.objectContaining({ value: 25 }), cost_cents: 2, remaining_credits: 98 });
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
  });

  it('the same key with another body is 422', async () => {
    const acct = await h.account('enterprise', 100);
    await post('/tools/compute', acct.apiKey, { expression: '1' }, { 'idempotency-key': 'k2' });
    expectError(await post('/tools/compute', acct.apiKey, { expression: '2' }, { 'idempotency-key': 'k2' }), 422, 'idempotency_key_reused');
  });
});
