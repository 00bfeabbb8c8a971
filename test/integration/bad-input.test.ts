import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TOOLS } from '../../src/tools/index.js';
import { startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import { startFakeSearxng, type FakeSearxng } from '../helpers/fake-searxng.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';

/**
 * Every tool, every upstream configured (fakes), hostile bodies: each is a 4xx in the error envelope,
 * refused at admission (no job, nothing charged), never a 5xx.
 */

let h: Harness;
let acct: TestAccount;
let llm: FakeOpenAI;
let searx: FakeSearxng;

beforeAll(async () => {
  [llm, searx] = await Promise.all([startFakeOpenAI(), startFakeSearxng()]);
  h = await startHarness(
    { LLM_BASE_URL: llm.baseURL, SEARCH_BASE_URL: searx.url, YOUTUBE_BASE_URL: 'http://127.0.0.1:9', EDGE_TOKEN_KEY: 'cd'.repeat(32), SYNC_TIMEOUT_MS: '300' },
    { workers: [] },
  );
  acct = await h.account('enterprise', 1000, { rpm: 1_000_000, maxInFlight: 1000 });
});
afterAll(async () => {
  await h?.close();
  await llm?.close();
  await searx?.close();
});

const deep = (n: number): unknown => (n === 0 ? 'x' : { a: deep(n - 1) });
const BODIES: Array<[string, unknown]> = [
  ['an empty object', {}],
  ['an array', [1, 2, 3]],
  ['a string', 'just text'],
  ['null', null],
  [
    'wrong types everywhere',
    { url: 42, text: { a: 1 }, query: [], expression: false, problem: null, domain: 7, video: {}, content: 1, urls: 'x', ideas: 5, claim: [], idea: 3 },
  ],
  ['a prototype key', JSON.parse('{"__proto__": {"polluted": true}, "constructor": {"prototype": {"x": 1}}}')],
  ['deep nesting', deep(40)],
];

describe('hostile bodies', () => {
  const cases = TOOLS.filter((t) => !t.name.startsWith('cf_')).flatMap((t) => BODIES.map(([label, body]) => [t.name, label, body] as const));
  it.each(cases)('%s with %s: 4xx at admission, uncharged', async (tool, _label, body) => {
    const res = await h.call(tool, body, acct.apiKey, { 'x-edge-token': 'tok' });
    // A body some tool accepts (check_balance and passport_store's list take {}): queued, not refused.
    // No worker runs here, so it is answered 202 and never runs.
    const def = TOOLS.find((t) => t.name === tool)!;
    if (def.input.safeParse(body ?? {}).success) return expect(res.statusCode, res.body.slice(0, 300)).toBe(202);
    expect(res.statusCode, res.body.slice(0, 300)).toBeGreaterThanOrEqual(400);
    expect(res.statusCode, res.body.slice(0, 300)).toBeLessThan(500);
    expect(json(res).error).toMatchObject({ code: expect.any(String), message: expect.any(String), request_id: expect.any(String) });
    expect(res.headers['x-job-id']).toBeUndefined();
  });

  it('charged nothing', async () => {
    expect(await h.ledgerCharges(acct.accountId)).toBe(0);
    expect(await h.credits(acct.accountId)).toBe(1000);
  });
});
