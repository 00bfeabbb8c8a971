import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import { sql } from '../../src/db/pool.js';
import { getTool } from '../../src/tools/index.js';

let h: Harness;
let llm: FakeOpenAI;
let acct: TestAccount;
let agent: { keyId: string; apiKey: string };
let sandbox: { keyId: string; apiKey: string };
let sub: { key_id: string; api_key: string };
const TOPUP = 1234;
const compute = getTool('compute').priceCents;
const hints = getTool('hints').priceCents;

const auth = (key: string) => ({ authorization: `Bearer ${key}` });
const get = (url: string, key: string) => h.request({ method: 'GET', url, headers: auth(key) });
const root = (body: unknown, key: string) =>
  h.request({ method: 'POST', url: '/', headers: { ...auth(key), 'content-type': 'application/json' }, payload: JSON.stringify(body) });

/** Every page of GET /usage/entries for `query`, in order. */
async function allEntries(key: string, query = '', limit = 200): Promise<any[]> {
  const out: any[] = [];
  let cursor: string | null = null;
  do {
    const res = await get(`/usage/entries?limit=${limit}${query}${cursor ? `&cursor=${cursor}` : ''}`, key);
    expect(res.statusCode, res.body).toBe(200);
    const page = json(res);
    out.push(...page.entries);
    cursor = page.next_cursor;
  } while (cursor);
  return out;
}

const LedgerRow = z.object({ id: z.number(), kind: z.string(), tool: z.string().nullable(), key_id: z.string().nullable(), delta_cents: z.number() });
const ledger = (accountId: string) =>
  h.container.pool.any(sql.type(LedgerRow)`SELECT id, kind, tool, key_id, delta_cents FROM ledger WHERE account_id = ${accountId} ORDER BY id DESC`);

beforeAll(async () => {
  llm = await startFakeOpenAI();
  llm.setDefault({ type: 'tokens', tokens: ['A', ' hint.'] });
  h = await startHarness({ LLM_BASE_URL: llm.baseURL });
  acct = await h.account('enterprise', 10_000, { rpm: 100_000 });
  agent = await h.key(acct.accountId, 'agent', 'bot');
  sandbox = await h.key(acct.accountId, 'test');
  const created = await h.request({
    method: 'POST',
    url: '/subkeys/create',
    headers: { ...auth(acct.apiKey), 'content-type': 'application/json' },
    payload: JSON.stringify({ name: 'team-a', monthly_limit: 1000, allowed_tools: ['compute'] }),
  });
  expect(created.statusCode, created.body).toBe(201);
  sub = json(created);
  const ok = (res: { statusCode: number; body: string }) => expect(res.statusCode, res.body).toBe(200);
  ok(await h.call('compute', { expression: '1 + 1' }, acct.apiKey));
  ok(await h.call('compute', { expression: '2 + 2' }, acct.apiKey));
  ok(await root({ m: 'hints', q: 'how do I sum a list?' }, acct.apiKey));
  ok(await h.call('compute', { expression: '3 + 3' }, agent.apiKey));
  ok(await h.call('compute', { expression: '4 + 4' }, sub.api_key));
  ok(await h.call('compute', { expression: '5 + 5' }, sub.api_key));
  ok(await root({ chain: ['compute', 'compute'], q: '2*3' }, acct.apiKey));
  ok(await h.call('compute', { expression: '6 + 6' }, sandbox.apiKey));
  await h.admin.addCredits(acct.accountId, TOPUP);
}, 60_000);
afterAll(async () => {
  await h.close();
  await llm.close();
});

describe('GET /usage', () => {
  it('totals, by tool, by key and by day equal the ledger lines, and the balance moves end at the balance', async () => {
    const res = await get('/usage', acct.apiKey);
    expect(res.statusCode, res.body).toBe(200);
    const u = json(res);
    const month = new Date().toISOString().slice(0, 7);
    expect(u).toMatchObject({ month, scope: 'account', unit: 'cents' });

    // The expected figures, counted by hand: 6 compute calls with a key that pays (2 production, 1 agent,
    // 2 sub-key... and the chain's 2 steps) minus nothing for the sandbox call, plus one hints call.
    const prodCompute = 4; // two direct calls and the chain's two steps
    expect(u.total).toEqual({ cents: (prodCompute + 1 + 2) * compute + hints, calls: prodCompute + 1 + 2 + 1 });
    expect(u.by_tool).toEqual(
      expect.arrayContaining([
        { tool: 'compute', cents: 7 * compute, calls: 7 },
        { tool: 'hints', cents: hints, calls: 1 },
      ]),
    );
    expect(u.by_tool).toHaveLength(2);
    const byKey = Object.fromEntries(u.by_key.map((k: any) => [k.key_id, k]));
    expect(byKey[acct.keyId]).toMatchObject({ type: 'production', cents: prodCompute * compute + hints, calls: prodCompute + 1 });
    expect(byKey[agent.keyId]).toMatchObject({ type: 'agent', name: 'bot', cents: compute, calls: 1 });
    expect(byKey[sub.key_id]).toMatchObject({ type: 'sub', name: 'team-a', cents: 2 * compute, calls: 2 });
    // Sandbox calls are free and write no ledger line.
    expect(byKey[sandbox.keyId]).toBeUndefined();
    expect(u.by_day).toEqual([{ day: new Date().toISOString().slice(0, 10), cents: u.total.cents, calls: u.total.calls }]);
    expect(u.topups).toEqual({ cents: TOPUP, count: 1 });

    // The ledger itself: the same lines through the API and straight from Postgres.
    const rows = await ledger(acct.accountId);
    const charges = rows.filter((r) => r.kind === 'charge');
    expect(u.total.cents).toBe(-charges.reduce((s, r) => s + r.delta_cents, 0));
    expect(u.total.calls).toBe(charges.length);
    for (const t of u.by_tool) {
      const lines = charges.filter((r) => r.tool === t.tool);
      expect(t).toEqual({ tool: t.tool, cents: -lines.reduce((s, r) => s + r.delta_cents, 0), calls: lines.length });
    }
    const entries = await allEntries(acct.apiKey);
    expect(entries.map((e) => e.id)).toEqual(rows.map((r) => String(r.id)));
    expect(entries.reduce((s, e) => s + e.amount_cents, 0)).toBe(rows.reduce((s, r) => s + r.delta_cents, 0));

    const credits = await h.credits(acct.accountId);
    expect(u.balance).toEqual({ start_cents: 0, opening_cents: 10_000, topups_cents: TOPUP, charges_cents: -u.total.cents, end_cents: credits });
    expect(credits).toBe(10_000 + TOPUP - u.total.cents);
  });

  it('a sub-key sees only its own lines and totals, no balance', async () => {
    const u = json(await get('/usage', sub.api_key));
    expect(u).toMatchObject({ scope: 'key', key_id: sub.key_id, total: { cents: 2 * compute, calls: 2 }, balance: null, topups: { cents: 0, count: 0 } });
    expect(u.by_key).toEqual([expect.objectContaining({ key_id: sub.key_id, cents: 2 * compute, calls: 2 })]);
    expect(u.by_tool).toEqual([{ tool: 'compute', cents: 2 * compute, calls: 2 }]);
    const entries = await allEntries(sub.api_key);
    expect(entries).toHaveLength(2);
    for (const e of entries) expect(e).toMatchObject({ kind: 'charge', key_id: sub.key_id, tool: 'compute', amount_cents: -compute });
    // Asking for another key's lines shows nothing rather than the account's.
    expect(await allEntries(sub.api_key, `&key_id=${acct.keyId}`)).toEqual([]);
  });

  it('a sandbox key sees only its own lines: its calls are free, so none', async () => {
    const u = json(await get('/usage', sandbox.apiKey));
    expect(u).toMatchObject({ scope: 'key', key_id: sandbox.keyId, total: { cents: 0, calls: 0 }, by_tool: [], by_key: [], balance: null });
    expect(await allEntries(sandbox.apiKey)).toEqual([]);
  });

  it('another month has its own figures: nothing before the account existed', async () => {
    const u = json(await get('/usage?month=2020-01', acct.apiKey));
    expect(u).toMatchObject({ month: '2020-01', from: '2020-01-01T00:00:00.000Z', to: '2020-02-01T00:00:00.000Z', total: { cents: 0, calls: 0 } });
    expect(u.balance).toMatchObject({ start_cents: 0, end_cents: 0 });
  });

  it.each(['2025-13', '2025-1', 'november', '2025-00'])('a bad month (%s) is 400 invalid_input', async (month) => {
    const res = await get(`/usage?month=${month}`, acct.apiKey);
    expect(res.statusCode).toBe(400);
    expect(json(res).error.code).toBe('invalid_input');
  });

  it('needs a key', async () => {
    expect((await h.request({ method: 'GET', url: '/usage' })).statusCode).toBe(401);
    expect((await h.request({ method: 'GET', url: '/usage/entries' })).statusCode).toBe(401);
  });
});

describe('GET /usage/entries', () => {
  it('filters by tool, key and time', async () => {
    const hintLines = await allEntries(acct.apiKey, '&tool=hints');
    expect(hintLines).toHaveLength(1);
    expect(hintLines[0]).toMatchObject({ kind: 'charge', tool: 'hints', key_id: acct.keyId, amount_cents: -hints });
    expect(hintLines[0].job_id).toEqual(expect.any(String));
    const agentLines = await allEntries(acct.apiKey, `&key_id=${agent.keyId}`);
    expect(agentLines.map((e) => e.key_id)).toEqual([agent.keyId]);
    expect(await allEntries(acct.apiKey, `&since=${encodeURIComponent(new Date(Date.now() + 60_000).toISOString())}`)).toEqual([]);
    const all = await allEntries(acct.apiKey, `&since=${encodeURIComponent(new Date(Date.now() - 3_600_000).toISOString())}`);
    expect(all.map((e) => e.kind).sort()).toEqual([...Array(8).fill('charge'), 'opening', 'topup'].sort());
  });

  it.each([
    ['limit=0'],
    ['limit=201'],
    ['limit=abc'],
    ['cursor=not-a-cursor'],
    ['cursor=' + Buffer.from('[1,2]').toString('base64url')],
    ['key_id=nope'],
    ['since=yesterday'],
    ['colour=blue'],
  ])('%s is 400 invalid_input', async (q) => {
    const res = await get(`/usage/entries?${q}`, acct.apiKey);
    expect(res.statusCode, res.body).toBe(400);
    expect(json(res).error.code).toBe('invalid_input');
  });

  it('pages return every line exactly once while calls insert new lines', async () => {
    const other = await h.account('pro', 10_000, { rpm: 100_000 });
    for (let i = 0; i < 12; i++) expect((await h.call('compute', { expression: `${i} * 2` }, other.apiKey)).statusCode).toBe(200);
    const before = (await ledger(other.accountId)).map((r) => String(r.id));
    expect(before).toHaveLength(13); // the opening line and 12 charges

    const seen: string[] = [];
    const firing: Array<Promise<unknown>> = [];
    let cursor: string | null = null;
    let pages = 0;
    do {
      // New lines land between pages (and during them): they are newer than every cursor, so they
      // can neither repeat a line nor push one off a page.
      firing.push(h.call('compute', { expression: `${pages} + 100` }, other.apiKey), h.call('compute', { expression: `${pages} + 200` }, other.apiKey));
      const res = await get(`/usage/entries?limit=2${cursor ? `&cursor=${cursor}` : ''}`, other.apiKey);
      expect(res.statusCode, res.body).toBe(200);
      const page = json(res);
      expect(page.entries.length).toBeLessThanOrEqual(2);
      seen.push(...page.entries.map((e: any) => e.id));
      cursor = page.next_cursor;
      pages++;
    } while (cursor);
    // GET /usage while lines keep landing: its figures come from one snapshot, so they agree.
    const during = await Promise.all([get('/usage', other.apiKey), h.call('compute', { expression: '7 * 7' }, other.apiKey), get('/usage', other.apiKey)]);
    for (const res of [during[0], during[2]]) {
      const u = json(res);
      const sum = (xs: any[], f: string) => xs.reduce((s, x) => s + x[f], 0);
      for (const part of [u.by_tool, u.by_key, u.by_day]) expect([sum(part, 'cents'), sum(part, 'calls')]).toEqual([u.total.cents, u.total.calls]);
      expect(u.balance.end_cents).toBe(u.balance.start_cents + u.balance.opening_cents + u.balance.topups_cents + u.balance.charges_cents);
    }
    await Promise.all(firing);
    expect(new Set(seen).size).toBe(seen.length);
    for (const id of before) expect(seen).toContain(id);
    // Newest first throughout.
    expect(seen.map(Number)).toEqual([...seen.map(Number)].sort((a, b) => b - a));
    expect(pages).toBeGreaterThanOrEqual(7);
    // Afterwards every line, old and new, is listed once and the sums still match.
    const rows = await ledger(other.accountId);
    expect(rows.length).toBeGreaterThan(13);
    const entries = await allEntries(other.apiKey, '', 5);
    expect(entries.map((e) => e.id)).toEqual(rows.map((r) => String(r.id)));
    const u = json(await get('/usage', other.apiKey));
    expect(u.total.calls).toBe(rows.length - 1);
    expect(u.balance.end_cents).toBe(await h.credits(other.accountId));
  }, 60_000);
});
