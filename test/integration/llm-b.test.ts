import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { llmTools } from '../../src/tools/llm/index.js';
import type { AnyTool } from '../../src/tools/types.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { dataBlocksOf, startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import { startFakeSearxng, type FakeSearxng } from '../helpers/fake-searxng.js';

/** The tools under test here, from the family's registry. */
const llmToolsB = llmTools.filter((t) => ['mind_opener', 'idea_fold', 'hints_parade', 'genius_plus', 'skeptic_pov'].includes(t.name));

/**
 * The five group-B tools through the real path (HTTP, admission, queue, llm worker, sandbox pool tasks,
 * settlement) against a fake OpenAI-compatible upstream whose replies derive from the request, a fake
 * SearXNG and a local page server admitted by FETCH_ALLOWED_HOSTS.
 */

let h: Harness;
let llm: FakeOpenAI;
let searx: FakeSearxng;
let pages: http.Server;
let pagesBase: string;
let acct: TestAccount;

const PAGES: Record<string, string> = {
  '/rfc':
    '<html><head><title>RFC 9113 notes</title></head><body><main><p>RFC 9113 deprecates the priority signalling scheme of RFC 7540.</p><p>Servers may ignore the dependency tree entirely.</p></main></body></html>',
  '/blog':
    '<html><head><title>Priority blog</title></head><body><article><p>The extensible priority scheme of RFC 9218 uses the urgency and incremental parameters.</p></article></body></html>',
};

beforeAll(async () => {
  llm = await startFakeOpenAI();
  searx = await startFakeSearxng();
  pages = http.createServer((req, res) => {
    const body = PAGES[req.url ?? ''];
    if (!body) return void res.writeHead(404).end('missing');
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(body);
  });
  await new Promise<void>((r) => pages.listen(0, '127.0.0.1', r));
  pagesBase = `http://127.0.0.1:${(pages.address() as AddressInfo).port}`;
  h = await startHarness(
    { LLM_BASE_URL: llm.baseURL, LLM_MODEL: 'fake-model', SEARCH_BASE_URL: searx.url, FETCH_ALLOWED_HOSTS: new URL(pagesBase).host },
    { workers: ['llm'] },
  );
  acct = await h.account('enterprise', 10_000);
});
afterAll(async () => {
  await h?.close();
  await llm?.close();
  await searx?.close();
  await new Promise<void>((r) => (pages ? pages.close(() => r()) : r()));
});
beforeEach(() => {
  llm.requests.length = 0;
  searx.requests.length = 0;
  searx.failWith = null;
  searx.respond(() => [
    { url: `${pagesBase}/rfc`, title: 'RFC' },
    { url: `${pagesBase}/blog`, title: 'Blog' },
  ]);
});

const tool = (name: string): AnyTool => llmToolsB.find((t) => t.name === name)!;

/** Calls a tool and checks what every successful call promises: 200, its output schema, meta, the exact price charged once. */
async function callOk(name: string, input: unknown): Promise<any> {
  const t = tool(name);
  const before = await h.credits(acct.accountId);
  const charges = await h.ledgerCharges(acct.accountId);
  const res = await h.call(name, input, acct.apiKey);
  expect(res.statusCode, res.body).toBe(200);
  const body = json(res);
  expect(body.cost_cents).toBe(t.priceCents);
  const parsed = t.outputSchema!.safeParse(body.result);
  expect(parsed.success, parsed.success ? '' : JSON.stringify(parsed.error.issues.slice(0, 3))).toBe(true);
  expect(body.result.meta).toMatchObject({ model: 'fake-model', prompt_version: `${name}/1` });
  expect(await h.credits(acct.accountId)).toBe(before - t.priceCents);
  expect(await h.ledgerCharges(acct.accountId)).toBe(charges + 1);
  return body.result;
}

/** Calls a tool that must fail uncharged with this status and code. */
async function callFails(name: string, input: unknown, status: number, code: string): Promise<any> {
  const before = await h.credits(acct.accountId);
  const charges = await h.ledgerCharges(acct.accountId);
  const res = await h.call(name, input, acct.apiKey);
  expect(res.statusCode, res.body).toBe(status);
  expect(json(res).error.code).toBe(code);
  expect(await h.credits(acct.accountId)).toBe(before);
  expect(await h.ledgerCharges(acct.accountId)).toBe(charges);
  return json(res).error;
}

const systemOf = (body: any): string => body.messages.find((m: any) => m.role === 'system').content;

describe('every group-B tool on the fake upstream', () => {
  const cases: Array<{ name: string; input: Record<string, unknown>; calls: number; blocks: Record<string, string> }> = [
    { name: 'mind_opener', input: { problem: 'Our meal kits churn in month two.' }, calls: 1, blocks: { problem: 'Our meal kits churn in month two.' } },
    {
      name: 'idea_fold',
      input: { ideas: ['Offer a referral discount to customers who invite friends', 'Customers who invite friends get a referral discount'] },
      calls: 1,
      blocks: { idea_1: 'Offer a referral discount to customers who invite friends', idea_2: 'Customers who invite friends get a referral discount' },
    },
    {
      name: 'hints_parade',
      input: { problem: 'The nightly CSV import got slow.', personas: ['debugger', 'ops'] },
      calls: 2,
      blocks: { problem: 'The nightly CSV import got slow.' },
    },
    { name: 'skeptic_pov', input: { claim: 'Rust will cut our cloud bill by 70%.' }, calls: 1, blocks: { claim: 'Rust will cut our cloud bill by 70%.' } },
  ];
  it.each(cases)('$name: schema-checked result, caller text only in data blocks, strict json_schema, charged its price', async (c) => {
    // No scripted reply: the fake synthesises a schema-conforming value from the caller's words.
    await callOk(c.name, c.input);
    expect(llm.requests).toHaveLength(c.calls);
    for (const r of llm.requests) {
      expect(dataBlocksOf(r.body)).toEqual(c.blocks);
      expect(r.body.response_format).toMatchObject({ type: 'json_schema', json_schema: { strict: true } });
      for (const text of Object.values(c.blocks)) expect(systemOf(r.body)).not.toContain(text);
    }
  });
});

describe('mind_opener', () => {
  it('the request schema has exactly one key per requested lens', async () => {
    const lenses = ['scale_shift', 'stakeholder_swap'];
    const result = await callOk('mind_opener', { problem: 'Two maintainers, 40k users.', lenses, per_lens: 1 });
    const schema = llm.requests[0]!.body.response_format.json_schema.schema;
    expect(Object.keys(schema.properties.reframes.properties)).toEqual(lenses);
    expect(schema.properties.reframes.required).toEqual(lenses);
    expect(Object.keys(result.reframes)).toEqual(lenses);
  });
});

describe('idea_fold', () => {
  it('paraphrases share a cluster (in the sandbox pool); one model call per multi-member cluster', async () => {
    const ideas = [
      'Offer a referral discount to customers who invite friends',
      'Rewrite the onboarding emails to be shorter',
      'Customers who invite friends get a referral discount',
      'Sponsor a local running club',
      'Shorter onboarding emails, rewritten',
    ];
    const result = await callOk('idea_fold', { ideas });
    expect(result.folds.map((f: any) => f.members.map((m: any) => m.index))).toEqual([
      [0, 2],
      [1, 4],
    ]);
    expect(result.singletons).toEqual([{ index: 3, text: ideas[3] }]);
    expect(llm.requests).toHaveLength(2);
  });

  it('takes q as one idea per line on the root protocol', async () => {
    const res = await h.request({
      method: 'POST',
      url: '/',
      headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json' },
      payload: { m: 'idea_fold', q: 'fix the login bug\nfix the login bug on mobile\npaint the office' },
    });
    expect(res.statusCode, res.body).toBe(200);
    const body = json(res);
    const result = body.result ?? body;
    expect(result.folds[0].members.map((m: any) => m.index)).toEqual([0, 1]);
    expect(llm.requests).toHaveLength(1);
  });
});

describe('hints_parade', () => {
  it('exactly N model calls for N personas', async () => {
    const personas = ['debugger', 'architect', 'tester', 'security', 'performance'];
    const result = await callOk('hints_parade', { problem: 'Password reset mails arrive late.', personas });
    expect(llm.requests).toHaveLength(5);
    expect(llm.requests.map((r) => r.body.response_format.json_schema.name).sort()).toEqual(personas.map((p) => `hints_parade_${p}`).sort());
    expect(Object.keys(result.by_persona)).toEqual(personas);
    // The fake draws every persona's hints from the same words: code finds them in agreement.
    expect(result.consensus[0].support).toBeGreaterThanOrEqual(2);
  });

  it('one failing persona -> 503, uncharged', async () => {
    llm.enqueue(
      { type: 'json', value: (b: any) => ({ hints: [{ hint: dataBlocksOf(b).problem, why: 'w' }] }) },
      { type: 'error', status: 500, message: 'overloaded' },
    );
    const err = await callFails('hints_parade', { problem: 'p', personas: ['debugger', 'ops', 'ux'] }, 503, 'tool_unavailable');
    expect(err.upstream_status).toBe(500);
  });
});

describe('skeptic_pov', () => {
  it('anchored is computed from the claim', async () => {
    const claim = 'Remote teams are less productive, so we should require five office days a week.';
    llm.enqueue({
      type: 'json',
      value: (b: any) => ({
        steelman: 's',
        objections: [
          { target_quote: dataBlocksOf(b).claim!.slice(0, 35), severity: 'high', objection: 'Which study?', test: 'Compare output per team.' },
          { target_quote: 'remote work is always worse', severity: 'critical', objection: 'Not in the claim.', test: 't' },
        ],
        assumptions: ['Output is measurable'],
        verdict: 'unproven',
        verdict_reason: 'r',
      }),
    });
    const result = await callOk('skeptic_pov', { claim });
    expect(result.objections.map((o: any) => [o.severity, o.target_quote, o.anchored])).toEqual([
      ['critical', 'remote work is always worse', false],
      ['high', 'Remote teams are less productive, s', true],
    ]);
  });

  it('invalid JSON twice -> 503 after one repair prompt, uncharged', async () => {
    llm.enqueue({ type: 'tokens', tokens: ['not', ' json'] }, { type: 'json', value: { steelman: 7 } });
    await callFails('skeptic_pov', { claim: 'c' }, 503, 'tool_unavailable');
    expect(llm.requests).toHaveLength(2);
  });
});

describe('genius_plus', () => {
  it('citations are checked verbatim against the fetched source; a fabricated quote is verified: false', async () => {
    llm.enqueue({
      type: 'json',
      value: (b: any) => {
        const source1 = dataBlocksOf(b).source_1!;
        const real = /RFC 9113 deprecates[^.]*\./.exec(source1)![0];
        return {
          answer: 'It deprecates the old scheme [1].',
          citations: [
            { n: 1, quote: real },
            { n: 2, quote: 'RFC 9218 forbids urgency parameters.' },
          ],
        };
      },
    });
    const problem = 'What did RFC 9113 change about HTTP/2 priorities?';
    const result = await callOk('genius_plus', { problem, max_sources: 2 });
    expect(result.citations).toEqual([
      { n: 1, url: `${pagesBase}/rfc`, quote: 'RFC 9113 deprecates the priority signalling scheme of RFC 7540.', verified: true },
      { n: 2, url: `${pagesBase}/blog`, quote: 'RFC 9218 forbids urgency parameters.', verified: false },
    ]);
    expect(result.sources.map((s: any) => s.url)).toEqual([`${pagesBase}/rfc`, `${pagesBase}/blog`]);
    expect(llm.requests).toHaveLength(1);
    expect(dataBlocksOf(llm.requests[0]!.body).problem).toBe(problem);
    expect(searx.requests[0]!.params['q']).toBe(problem);
  });

  it('search down (5xx) -> 503, uncharged, and the model received no request', async () => {
    searx.failWith = 503;
    await callFails('genius_plus', { problem: 'anything' }, 503, 'tool_unavailable');
    expect(llm.requests).toHaveLength(0);
  });
});

describe('catalogue and streaming', () => {
  it('GET /tools/{name} shows each tool with its output JSON Schema, needs and progress', async () => {
    for (const t of llmToolsB) {
      const res = await h.request({ method: 'GET', url: `/tools/${t.name}`, headers: { authorization: `Bearer ${acct.apiKey}` } });
      expect(res.statusCode, t.name).toBe(200);
      const d = json(res);
      expect(d).toMatchObject({ name: t.name, family: 'llm', price_cents: t.priceCents, q_field: t.qField, needs: t.needs, progress: true });
      expect(d.output_schema.properties.meta, t.name).toBeDefined();
    }
  });

  it("hints_parade streams each persona's tokens and a per-persona count before the result", async () => {
    const base = await h.app.listen({ port: 0, host: '127.0.0.1' });
    const res = await fetch(`${base}/`, {
      method: 'POST',
      headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json', accept: 'text/event-stream' },
      body: JSON.stringify({ stream: true, m: 'hints_parade', q: 'Our build takes 40 minutes.' }),
    });
    expect(res.status).toBe(200);
    const text = await res.text();
    const events = [...text.matchAll(/event: (\w+)\ndata: (.*)\n/g)].map((m) => ({ type: m[1]!, data: JSON.parse(m[2]!) }));
    const result = events.findIndex((e) => e.type === 'result');
    expect(result).toBeGreaterThan(0);
    const before = events
      .slice(0, result)
      .filter((e) => e.type === 'progress')
      .map((e) => e.data);
    // Default: all eight personas, each streaming its own stage, then counted.
    expect(new Set(before.filter((p) => p.delta !== undefined).map((p) => p.stage)).size).toBe(8);
    expect(before.filter((p) => p.stage === 'personas').map((p) => p.done)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8]);
    expect(llm.requests).toHaveLength(8);
    expect(tool('hints_parade').outputSchema!.safeParse(events[result]!.data.result).success).toBe(true);
  });
});

describe('admission without upstreams', () => {
  it('unset LLM_BASE_URL (and SEARCH_BASE_URL): every group-B tool is 503 at admission, nothing charged, no upstream asked', async () => {
    const h2 = await startHarness({}, { workers: [] });
    try {
      const a = await h2.account('enterprise', 1_000);
      for (const t of llmToolsB) {
        const res = await h2.call(t.name, t.examples[0], a.apiKey);
        expect(res.statusCode, t.name).toBe(503);
        const error = json(res).error;
        expect(error.code).toBe('tool_unavailable');
        expect(error.needs).toEqual(t.name === 'genius_plus' ? ['llm', 'search'] : ['llm']);
        expect(res.headers['x-job-id']).toBeUndefined();
      }
      expect(await h2.credits(a.accountId)).toBe(1_000);
      expect(await h2.ledgerCharges(a.accountId)).toBe(0);
      expect(llm.requests).toHaveLength(0);
      expect(searx.requests).toHaveLength(0);
    } finally {
      await h2.close();
    }
  });

  it('unset SEARCH_BASE_URL alone: genius_plus is 503 at admission and the model is never asked', async () => {
    const h3 = await startHarness({ LLM_BASE_URL: llm.baseURL }, { workers: [] });
    try {
      const a = await h3.account('enterprise', 1_000);
      const res = await h3.call('genius_plus', { problem: 'p' }, a.apiKey);
      expect(res.statusCode).toBe(503);
      expect(json(res).error).toMatchObject({ code: 'tool_unavailable', needs: ['search'] });
      expect(llm.requests).toHaveLength(0);
      expect(await h3.credits(a.accountId)).toBe(1_000);
    } finally {
      await h3.close();
    }
  });
});
