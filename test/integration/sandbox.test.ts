import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerTool } from '../../src/tools/index.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { routes, startHttpTarget, type HttpTarget } from '../helpers/http-targets.js';
import { testTools } from '../unit/sandbox/test-tools.js';

let h: Harness;
let site: HttpTarget;

const nested = (bytes: number) => '<!doctype html><html><body>' + '<div>'.repeat(Math.floor(bytes / 5)) + 'deep text';
const wide = '<!doctype html><html><body>' + '<p>x</p>'.repeat(150_000) + '</body></html>';

beforeAll(async () => {
  for (const t of testTools) registerTool(t);
  site = await startHttpTarget(
    routes({
      '/nested-2mb': [200, { 'content-type': 'text/html' }, nested(2 * 1024 * 1024)],
      '/nested-100kb': [200, { 'content-type': 'text/html' }, nested(100 * 1024)],
      '/wide': [200, { 'content-type': 'text/html' }, wide],
      '/fat-header': (_req, res) => {
        res.writeHead(200, { 'content-type': 'text/html', 'x-padding': 'p'.repeat(60 * 1024) }).end('<p>hi</p>');
      },
    }),
  );
  // A byte cap above the largest page, so what truncates these pages is the parse caps.
  h = await startHarness({ FETCH_ALLOWED_HOSTS: site.hostPort, FETCH_MAX_BYTES: '3000000' });
});

afterAll(async () => {
  await h?.close();
  await site?.close();
});

/** An account whose rate limit stays out of the way. */
const account = (credits = 1000) => h.account('enterprise', credits, { rpm: 100_000 });

const balance = async (a: TestAccount) =>
  json(await h.request({ method: 'GET', url: '/balance', headers: { authorization: `Bearer ${a.apiKey}` } })).credits as number;

/** Runs `work` while polling GET /health; returns the work's result and the slowest health answer. */
async function withHealthProbe<T>(work: () => Promise<T>): Promise<{ result: T; slowestHealthMs: number }> {
  let done = false;
  let slowest = 0;
  const probe = (async () => {
    while (!done) {
      const t0 = performance.now();
      const res = await h.request({ method: 'GET', url: '/health' });
      expect(res.statusCode).toBe(200);
      slowest = Math.max(slowest, performance.now() - t0);
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
  try {
    return { result: await work(), slowestHealthMs: slowest };
  } finally {
    done = true;
    await probe;
  }
}

async function expectNothingCharged(a: TestAccount, credits: number) {
  expect(await h.credits(a.accountId)).toBe(credits);
  expect(await h.ledgerCharges(a.accountId)).toBe(0);
  expect(await balance(a)).toBe(credits);
}

describe('tools that pass their limits', () => {
  it('a tool allocating without bound ends as 422 limit_exceeded (memory), not charged, and the process lives on', async () => {
    const a = await account(100);
    const pid = process.pid;
    const res = await h.call('test_sandbox_hog', {}, a.apiKey);
    expect(res.statusCode).toBe(422);
    expect(json(res).error).toMatchObject({ code: 'limit_exceeded', limit: 'memory', limit_value: 64 });
    expect(json(res).error.message).toMatch(/memory limit of 64 MB/);
    await expectNothingCharged(a, 100);
    expect(process.pid).toBe(pid);
    const ok = await h.call('compute', { expression: '6*7' }, a.apiKey);
    expect(ok.statusCode).toBe(200);
    expect(json(ok).result.value).toBe(42);
  }, 60_000);

  it('a tool spinning forever ends as 422 limit_exceeded (time), not charged, while /health keeps answering', async () => {
    const a = await account(100);
    const { result: res, slowestHealthMs } = await withHealthProbe(() => h.call('test_sandbox_spin', {}, a.apiKey));
    expect(res.statusCode).toBe(422);
    expect(json(res).error).toMatchObject({ code: 'limit_exceeded', limit: 'time', limit_value: 300 });
    expect(slowestHealthMs).toBeLessThan(1000);
    await expectNothingCharged(a, 100);
    expect((await h.call('compute', { expression: '1+1' }, a.apiKey)).statusCode).toBe(200);
  });

  it('an isolated tool gets its progress, usage and account through the pool', async () => {
    const a = await account(100);
    const res = await h.call('test_sandbox_echo', { q: 'hello' }, a.apiKey);
    expect(res.statusCode).toBe(200);
    expect(json(res)).toMatchObject({ result: { q: 'hello', accountId: a.accountId, sandbox: false }, cost_cents: 1, remaining_credits: 99 });
    expect(json(res).result.threadId).toBeGreaterThan(0);
  });
});

describe('compute attacks', () => {
  it('range(1, 1e9) three times in a row: 400 each, nothing charged', async () => {
    const a = await account(100);
    for (let i = 0; i < 3; i++) {
      const res = await h.call('compute', { expression: 'range(1, 1e9)' }, a.apiKey);
      expect(res.statusCode).toBe(400);
      expect(json(res).error.code).toBe('invalid_input');
      expect(json(res).error.message).toMatch(/at most 1,000,000/);
    }
    await expectNothingCharged(a, 100);
  });

  it.each([['size(range(1,5e7))'], ['1:1e9'], ['range("1:1e9")'], ['n = 1e9; range(1, n)'], ['zeros(1e4, 1e4)'], ['identity(1e4)']])(
    '%s is refused by the size cap',
    async (expression) => {
      const res = await h.call('compute', { expression }, (await account()).apiKey);
      expect(res.statusCode).toBe(400);
      expect(json(res).error).toMatchObject({ code: 'invalid_input' });
      expect(json(res).error.message).toMatch(/COMPUTE_MAX_ELEMENTS/);
    },
  );

  it('det(ones(500,500)+1) answers (or stops at the time limit) without freezing the service', async () => {
    const a = await account(100);
    const { result: res, slowestHealthMs } = await withHealthProbe(() => h.call('compute', { expression: 'det(ones(500,500)+1)' }, a.apiKey));
    expect([200, 422]).toContain(res.statusCode);
    if (res.statusCode === 422) expect(json(res).error).toMatchObject({ code: 'limit_exceeded', limit: 'time', limit_value: 5000 });
    expect(slowestHealthMs).toBeLessThan(1000);
  }, 30_000);

  it.each([
    ['config({number: "BigNumber", precision: 3})', 'config'],
    ['help(cos)', 'help'],
    ['f(x) = x', 'f'],
    ['import({x: 1})', 'import'],
    ['evaluate("1+1")', 'evaluate'],
    ['chain(3)', 'chain'],
    ['x = parse', 'parse'],
  ])('%s is 400 invalid_input naming %s', async (expression, name) => {
    const a = await account(100);
    const res = await h.call('compute', { expression }, a.apiKey);
    expect(res.statusCode).toBe(400);
    expect(json(res).error.code).toBe('invalid_input');
    expect(json(res).error.message).toContain(name);
    await expectNothingCharged(a, 100);
  });

  it("one account's config(...) attempt changes nothing for another", async () => {
    const a = await account();
    const b = await account();
    for (let i = 0; i < 4; i++) {
      await h.call('compute', { expression: 'config({number: "BigNumber", precision: 3})' }, a.apiKey);
      await h.call('compute', { expression: 'config({randomSeed: "x"})' }, a.apiKey);
    }
    const res = await h.call('compute', { expression: '2/3' }, b.apiKey);
    expect(json(res).result.value).toBe(0.6666666666666666);
    expect(json(res).result.type).toBe('number');
  });

  it('random() repeats for the same expression and no variable survives a call', async () => {
    const a = await account();
    const first = json(await h.call('compute', { expression: 'random()' }, a.apiKey)).result.value;
    const second = json(await h.call('compute', { expression: 'random()' }, a.apiKey)).result.value;
    expect(typeof first).toBe('number');
    expect(second).toBe(first);
    expect(json(await h.call('compute', { expression: 'randomInt(1, 1000); random()' }, a.apiKey)).result.value).not.toBe(first);
    await h.call('compute', { expression: 'leak = 5' }, a.apiKey);
    expect((await h.call('compute', { expression: 'leak + 1' }, a.apiKey)).statusCode).toBe(400);
  });

  it('a deeply nested expression is 400, never 500', async () => {
    const res = await h.call('compute', { expression: '('.repeat(999) + '1' + ')'.repeat(999) }, (await account()).apiKey);
    expect([200, 400]).toContain(res.statusCode);
    const minus = await h.call('compute', { expression: '-'.repeat(1999) + '1' }, (await account()).apiKey);
    expect([200, 400]).toContain(minus.statusCode);
  });
});

describe('page_fetch on hostile pages', () => {
  it.each([['/nested-2mb'], ['/nested-100kb'], ['/wide']])('%s answers quickly with truncated: true while /health answers', async (path) => {
    const a = await account();
    const { result: res, slowestHealthMs } = await withHealthProbe(() => h.call('page_fetch', { url: site.url(path) }, a.apiKey));
    expect(res.statusCode).toBe(200);
    expect(json(res).result).toMatchObject({ status: 200, truncated: true });
    expect(slowestHealthMs).toBeLessThan(1000);
  });

  it('a 60 KB response header is 422 tool_failed with reason invalid_response', async () => {
    const res = await h.call('page_fetch', { url: site.url('/fat-header') }, (await account()).apiKey);
    expect(res.statusCode).toBe(422);
    expect(json(res).error).toMatchObject({ code: 'tool_failed', reason: 'invalid_response' });
  });
});
