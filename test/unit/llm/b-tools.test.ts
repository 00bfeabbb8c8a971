import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.js';
import { llmTools } from '../../../src/tools/llm/index.js';
import { createLlm } from '../../../src/tools/llm/structured.js';
import { createGuardedHttp } from '../../../src/tools/web/guarded-http.js';
import { createResolver } from '../../../src/tools/web/resolver.js';
import { createSearch } from '../../../src/tools/web/search-client.js';
import type { AnyTool, ToolContext } from '../../../src/tools/types.js';
import { dataBlocksOf, startFakeOpenAI, type FakeOpenAI } from '../../helpers/fake-openai.js';
import { startFakeSearxng, type FakeSearxng } from '../../helpers/fake-searxng.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { countTokensA } from '../../../src/tools/text/tiktoken-count.js';

/** The tools under test here, from the family's registry. */
const llmToolsB = llmTools.filter((t) => ['mind_opener', 'idea_fold', 'hints_parade', 'genius_plus', 'skeptic_pov'].includes(t.name));

/**
 * The five group-B handlers called directly against the fake OpenAI-compatible upstream (replies
 * derived from the request), the SearXNG fake and a local page server: the request each tool builds,
 * and what code (never the model) decides in the result.
 */

let llm: FakeOpenAI;
let searx: FakeSearxng;
let pages: http.Server;
let pagesBase: string;
const PAGES: Record<string, string> = {
  '/rfc':
    '<html><head><title>RFC 9113 notes</title></head><body><main><p>RFC 9113 deprecates the priority signalling scheme of RFC 7540.</p><p>Servers may ignore the dependency tree entirely.</p></main></body></html>',
  '/blog':
    '<html><head><title>Priority blog</title></head><body><article><p>The extensible priority scheme of RFC 9218 uses the urgency and incremental parameters.</p></article></body></html>',
  '/plain': 'A plain text page about HTTP/2 priorities and urgency values from zero to seven.',
};

beforeAll(async () => {
  // Handlers called directly run their pool tasks inline: load the tokenizer tables now, so that work does
  // not hold this event loop (and the fakes' keep-alive timers) in the middle of a test.
  countTokensA('warm up');
  llm = await startFakeOpenAI();
  searx = await startFakeSearxng();
  pages = http.createServer((req, res) => {
    const body = PAGES[req.url ?? ''];
    if (!body) return void res.writeHead(404).end('missing');
    res.writeHead(200, { 'content-type': req.url === '/plain' ? 'text/plain; charset=utf-8' : 'text/html; charset=utf-8' }).end(body);
  });
  await new Promise<void>((r) => pages.listen(0, '127.0.0.1', r));
  pagesBase = `http://127.0.0.1:${(pages.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await llm.close();
  await searx.close();
  await new Promise<void>((r) => pages.close(() => r()));
});
afterEach(() => {
  llm.requests.length = 0;
  searx.requests.length = 0;
  searx.failWith = null;
});

const tool = (name: string): AnyTool => llmToolsB.find((t) => t.name === name)!;

function context(env: Record<string, string> = {}) {
  const made = makeToolContext({
    env: { LLM_BASE_URL: llm.baseURL, LLM_MODEL: 'fake-model', SEARCH_BASE_URL: searx.url, FETCH_ALLOWED_HOSTS: new URL(pagesBase).host, ...env },
  });
  const { ctx } = made;
  const { config } = ctx;
  if (config.LLM_BASE_URL) ctx.llm = createLlm({ config, log: ctx.log, signal: ctx.signal, progress: ctx.progress, recordUsage: ctx.recordUsage });
  const search = createSearch(config, ctx.signal);
  if (search) ctx.search = search;
  ctx.http = createGuardedHttp({ config, resolver: createResolver(config), tool: 'test', signal: ctx.signal, progress: ctx.progress });
  return made;
}

async function run(name: string, input: unknown, ctx: ToolContext): Promise<any> {
  const t = tool(name);
  const result = await t.handler(t.input.parse(input), ctx);
  const parsed = t.outputSchema!.safeParse(result);
  expect(parsed.success, parsed.success ? '' : JSON.stringify(parsed.error.issues.slice(0, 3))).toBe(true);
  return result;
}

async function failure(p: Promise<unknown>): Promise<AppError> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(AppError);
  return e as AppError;
}

const schemaOf = (body: any) => body.response_format.json_schema.schema;

describe('group B definitions', () => {
  it('has the catalogue names, tiers, prices, q fields and needs', () => {
    expect(llmToolsB.map((t) => [t.name, t.tier, t.priceCents, t.qField, t.qParse ?? 'text', t.needs, t.progress])).toEqual([
      ['mind_opener', 'pro', 8, 'problem', 'text', ['llm'], true],
      ['idea_fold', 'pro', 10, 'ideas', 'lines', ['llm'], true],
      ['hints_parade', 'pro', 100, 'problem', 'text', ['llm'], true],
      ['genius_plus', 'enterprise', 65, 'problem', 'text', ['llm', 'search'], true],
      ['skeptic_pov', 'enterprise', 30, 'claim', 'text', ['llm'], true],
    ]);
    for (const t of llmToolsB) {
      expect(t.family).toBe('llm');
      expect(t.outputSchema).toBeDefined();
      for (const ex of t.examples) expect(t.input.safeParse(ex).success).toBe(true);
    }
  });

  it('rejects out-of-range input', () => {
    expect(tool('mind_opener').input.safeParse({ problem: 'p', lenses: ['inversion', 'inversion'] }).success).toBe(false);
    expect(tool('mind_opener').input.safeParse({ problem: 'p', lenses: ['sideways'] }).success).toBe(false);
    expect(tool('idea_fold').input.safeParse({ ideas: ['only one'] }).success).toBe(false);
    expect(tool('idea_fold').input.safeParse({ ideas: Array.from({ length: 201 }, (_, i) => `idea ${i}`) }).success).toBe(false);
    expect(tool('hints_parade').input.safeParse({ problem: 'p', personas: ['wizard'] }).success).toBe(false);
    expect(tool('skeptic_pov').input.safeParse({ claim: 'x'.repeat(8_001) }).success).toBe(false);
    expect(tool('skeptic_pov').input.safeParse({ claim: 'c', max_objections: 2 }).success).toBe(false);
    expect(tool('skeptic_pov').input.safeParse({ claim: 'c', max_objections: 16 }).success).toBe(false);
  });
});

describe('mind_opener', () => {
  it('asks for exactly one schema key per requested lens, strict, with the problem only in a data block', async () => {
    const { ctx } = context();
    const problem = 'Our library has 40k users and two burnt-out maintainers.';
    const lenses = ['worst_idea', 'analogy', 'time_shift'];
    const result = await run('mind_opener', { problem, lenses, per_lens: 1 }, ctx);
    expect(llm.requests).toHaveLength(1);
    const body = llm.requests[0]!.body;
    expect(body.response_format.json_schema.strict).toBe(true);
    const reframes = schemaOf(body).properties.reframes;
    expect(Object.keys(reframes.properties)).toEqual(lenses);
    expect(reframes.required).toEqual(lenses);
    expect(reframes.additionalProperties).toBe(false);
    expect(dataBlocksOf(body)).toEqual({ problem });
    expect(body.messages[0].content).not.toContain('burnt-out');
    // Code keeps the requested order and trims each lens to per_lens (the fake sends two).
    expect(Object.keys(result.reframes)).toEqual(lenses);
    for (const l of lenses) expect(result.reframes[l]).toHaveLength(1);
    expect(result.meta).toMatchObject({ model: 'fake-model', prompt_version: 'mind_opener/1' });
    expect(result.meta.usage.total_tokens).toBeGreaterThan(0);
  });

  it('defaults to three lenses; an empty lens is 503', async () => {
    const { ctx } = context();
    llm.enqueue({
      type: 'json',
      value: (body: any) => ({
        reframes: Object.fromEntries(
          Object.keys(schemaOf(body).properties.reframes.properties).map((k, i) => [k, i === 1 ? [] : [{ question: 'q?', insight: 'i', first_step: 's' }]]),
        ),
      }),
    });
    const err = await failure(run('mind_opener', { problem: 'p' }, ctx));
    expect(err.code).toBe('tool_unavailable');
    expect(Object.keys(schemaOf(llm.requests[0]!.body).properties.reframes.properties)).toEqual(['inversion', 'first_principles', 'constraint_removal']);
  });

  it('invalid JSON twice is 503 after one repair prompt', async () => {
    const { ctx } = context();
    llm.enqueue({ type: 'tokens', tokens: ['not json'] }, { type: 'tokens', tokens: ['{"still": "wrong"}'] });
    const err = await failure(run('mind_opener', { problem: 'p' }, ctx));
    expect(err.code).toBe('tool_unavailable');
    expect(llm.requests).toHaveLength(2);
  });
});

describe('idea_fold', () => {
  const ideas = [
    'Offer a referral discount to customers who invite friends',
    'Rewrite the onboarding emails to be shorter',
    'Customers who invite friends get a referral discount',
    'Sponsor a local running club',
    'Shorter onboarding emails, rewritten',
  ];

  it('makes one model call per multi-member cluster; members come from the clustering', async () => {
    const { ctx, progress } = context();
    const merge = {
      type: 'json' as const,
      value: (body: any) => ({ title: 'Merged', merged_idea: Object.values(dataBlocksOf(body)).join(' + '), tension: '' }),
    };
    llm.enqueue(merge, merge);
    const result = await run('idea_fold', { ideas }, ctx);
    expect(llm.requests).toHaveLength(2);
    const blocks = llm.requests.map((r) => dataBlocksOf(r.body)).sort((a, b) => Object.keys(a)[0]!.localeCompare(Object.keys(b)[0]!));
    expect(blocks).toEqual([
      { idea_1: ideas[0], idea_3: ideas[2] },
      { idea_2: ideas[1], idea_5: ideas[4] },
    ]);
    expect(result.folds.map((f: any) => f.members.map((m: any) => m.index))).toEqual([
      [0, 2],
      [1, 4],
    ]);
    expect(result.folds[0].members[1]).toEqual({ index: 2, text: ideas[2] });
    expect(result.folds[0].merged_idea).toBe(`${ideas[0]} + ${ideas[2]}`);
    expect(result.folds[0].tension).toBeNull();
    expect(result.singletons).toEqual([{ index: 3, text: ideas[3] }]);
    expect(progress.filter((p) => p.stage === 'merging' && p.delta === undefined).at(-1)).toMatchObject({ done: 2, total: 2 });
  });

  it('no call at all when nothing folds', async () => {
    const { ctx } = context();
    const result = await run('idea_fold', { ideas: ['paint the office', 'hire a tax advisor'] }, ctx);
    expect(llm.requests).toHaveLength(0);
    expect(result.folds).toEqual([]);
    expect(result.singletons).toHaveLength(2);
    expect(result.meta).toEqual({ model: 'fake-model', usage: null, prompt_version: 'idea_fold/1' });
  });
});

describe('hints_parade', () => {
  it('makes exactly one call per persona and computes consensus in code', async () => {
    const { ctx, progress } = context();
    const personas = ['debugger', 'tester', 'ops'];
    const shared = 'Add logging around the CSV import to find the slow step';
    const reply = {
      type: 'json' as const,
      value: (body: any) => {
        const persona = /You are an? ([a-z ]+?)(?: engineer)?:/.exec(body.messages[0].content)?.[1] ?? '?';
        const own: Record<string, string> = {
          hints_parade_debugger: 'Bisect the commits of last week',
          hints_parade_tester: 'Write a regression benchmark with a fixed file',
          hints_parade_ops: 'Compare disk metrics on the database host',
        };
        return {
          hints: [
            { hint: shared, why: `${persona} says so` },
            { hint: own[body.response_format.json_schema.name]!, why: 'w' },
          ],
        };
      },
    };
    llm.enqueue(reply, reply, reply);
    const problem = 'The nightly CSV import became slow.';
    const result = await run('hints_parade', { problem, personas, hints_per_persona: 2 }, ctx);
    expect(llm.requests).toHaveLength(3);
    expect(llm.requests.map((r) => r.body.response_format.json_schema.name).sort()).toEqual([
      'hints_parade_debugger',
      'hints_parade_ops',
      'hints_parade_tester',
    ]);
    for (const r of llm.requests) expect(dataBlocksOf(r.body)).toEqual({ problem });
    expect(Object.keys(result.by_persona)).toEqual(personas);
    expect(result.consensus).toEqual([{ hint: shared, personas, support: 3, similarity: 1 }]);
    expect(result.unique).toHaveLength(3);
    expect(result.meta.prompt_version).toBe('hints_parade/1');
    expect(progress.filter((p) => p.stage === 'personas').map((p) => p.done)).toEqual([0, 1, 2, 3]);
  });

  it('one failing persona fails the call: no further persona starts', async () => {
    const { ctx } = context();
    llm.enqueue({ type: 'error', status: 500, message: 'overloaded' });
    const err = await failure(run('hints_parade', { problem: 'p' }, ctx));
    expect(err.code).toBe('tool_unavailable');
    // Four run at once; the one that failed stops the other four from starting.
    expect(llm.requests.length).toBe(4);
  });
});

describe('skeptic_pov', () => {
  const claim = 'Rewriting our backend in Rust will cut our cloud bill by 70% because Rust is faster than Python.';

  it('computes anchored from the claim, orders by severity and caps the count', async () => {
    const { ctx } = context();
    llm.enqueue({
      type: 'json',
      value: (body: any) => ({
        steelman: 'Rust services use less CPU.',
        objections: [
          // The least severe first: with max_objections 3, it is the one left out.
          { target_quote: dataBlocksOf(body).claim!.slice(0, 10), severity: 'low', objection: 'Fourth.', test: 't' },
          { target_quote: 'cut our cloud bill by 70%', severity: 'medium', objection: 'No measurement.', test: 'Profile the bill.' },
          { target_quote: 'Rust is  faster\nthan Python', severity: 'critical', objection: 'Speed is not cost.', test: 'Benchmark.' },
          { target_quote: 'Rust is always cheaper', severity: 'high', objection: 'Invented quote.', test: 'Read the claim.' },
        ],
        assumptions: ['The bill is CPU-bound'],
        verdict: 'unproven',
        verdict_reason: 'No data.',
      }),
    });
    const result = await run('skeptic_pov', { claim, max_objections: 3 }, ctx);
    expect(dataBlocksOf(llm.requests[0]!.body)).toEqual({ claim });
    expect(result.objections.map((o: any) => [o.id, o.severity, o.anchored])).toEqual([
      [1, 'critical', true],
      [2, 'high', false],
      [3, 'medium', true],
    ]);
    const first = result.objections[0];
    expect(claim.slice(first.start, first.end)).toBe('Rust is faster than Python');
    expect(result.objections[1]).toMatchObject({ start: null, end: null });
    expect(result.anchored_ratio).toBe(0.667);
    expect(result.verdict).toBe('unproven');
  });
});

describe('genius_plus', () => {
  const problem = 'What does RFC 9113 say about HTTP/2 priorities?';

  it('searches, reads pages, and verifies each quote against its source', async () => {
    const { ctx, progress } = context();
    searx.respond(() => [
      { url: `${pagesBase}/rfc`, title: 'RFC', content: 'rfc' },
      { url: `${pagesBase}/missing`, title: 'Gone' },
      { url: `${pagesBase}/blog`, title: 'Blog' },
      { url: `${pagesBase}/plain`, title: 'Plain' },
    ]);
    llm.enqueue({
      type: 'json',
      value: (body: any) => {
        const blocks = dataBlocksOf(body);
        const n = Object.keys(blocks).filter((k) => k.startsWith('source_')).length;
        return {
          answer: `RFC 9113 deprecates RFC 7540 priorities [1]; see also [2, 7] and [12]; ${n} sources.`,
          citations: [
            { n: 2, quote: 'uses the urgency and   incremental parameters' },
            { n: 1, quote: 'RFC 9113 deprecates the priority signalling scheme of RFC 7540.' },
            { n: 1, quote: 'RFC 9113 mandates the dependency tree.' },
            { n: 9, quote: 'a source that does not exist' },
          ],
        };
      },
    });
    const result = await run('genius_plus', { problem, max_sources: 3 }, ctx);
    expect(searx.requests[0]!.params['q']).toBe(problem);
    expect(result.sources.map((s: any) => [s.n, s.url, s.title])).toEqual([
      [1, `${pagesBase}/rfc`, 'RFC 9113 notes'],
      [2, `${pagesBase}/blog`, 'Priority blog'],
      [3, `${pagesBase}/plain`, 'Plain'],
    ]);
    expect(result.skipped).toEqual([{ url: `${pagesBase}/missing`, reason: 'http 404' }]);
    expect(result.citations).toEqual([
      { n: 1, url: `${pagesBase}/rfc`, quote: 'RFC 9113 deprecates the priority signalling scheme of RFC 7540.', verified: true },
      { n: 1, url: `${pagesBase}/rfc`, quote: 'RFC 9113 mandates the dependency tree.', verified: false },
      { n: 2, url: `${pagesBase}/blog`, quote: 'uses the urgency and   incremental parameters', verified: true },
      { n: 9, url: null, quote: 'a source that does not exist', verified: false },
    ]);
    expect(result.verified_ratio).toBe(0.5);
    expect(result.unknown_refs).toEqual([7, 12]);
    expect(result.answer).toContain('3 sources');
    const blocks = dataBlocksOf(llm.requests[0]!.body);
    expect(blocks['problem']).toBe(problem);
    expect(blocks['source_1']).toContain('RFC 9113 deprecates the priority signalling scheme');
    expect(llm.requests[0]!.body.messages[0].content).not.toContain('RFC 9113');
    expect(progress.map((p) => p.stage).filter((s, i, a) => a.indexOf(s) === i)).toEqual(['searching', 'fetching', 'selecting', 'generating', 'verifying']);
  });

  it('search down (5xx) is 503 and the model is never asked', async () => {
    const { ctx } = context();
    searx.failWith = 502;
    const err = await failure(run('genius_plus', { problem }, ctx));
    expect(err.code).toBe('tool_unavailable');
    expect(llm.requests).toHaveLength(0);
  });

  it('no readable page is 502 fetch_failed with no model call', async () => {
    const { ctx } = context();
    searx.respond(() => [{ url: `${pagesBase}/missing`, title: 'Gone' }]);
    const err = await failure(run('genius_plus', { problem }, ctx));
    expect(err.code).toBe('fetch_failed');
    expect(llm.requests).toHaveLength(0);
  });

  it('a page on a refused address is skipped, not fetched', async () => {
    const { ctx } = context({ FETCH_ALLOWED_HOSTS: '' });
    searx.respond(() => [{ url: `${pagesBase}/rfc`, title: 'RFC' }]);
    const err = await failure(run('genius_plus', { problem }, ctx));
    expect(err.code).toBe('fetch_failed');
    expect((err.details as any).skipped[0].reason).toMatch(/^invalid_input/);
    expect(llm.requests).toHaveLength(0);
  });
});

describe('without a model upstream', () => {
  it.each(llmToolsB.map((t) => [t.name, t] as const))('%s is 503 tool_unavailable', async (_n, t) => {
    const { ctx } = context({ LLM_BASE_URL: '' });
    const err = await failure(t.handler(t.input.parse(t.examples[0]), ctx));
    expect(err.code).toBe('tool_unavailable');
    expect(llm.requests).toHaveLength(0);
  });
});
