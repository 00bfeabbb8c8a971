import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { llmTools } from '../../src/tools/llm/index.js';
import type { AnyTool } from '../../src/tools/types.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { dataBlocksOf, startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import { startFakeDns, type FakeDnsServer } from '../helpers/dns-server.js';

/** The tools under test here, from the family's registry. */
const llmToolsA = llmTools.filter((t) => ['intent_to_spec', 'hints_plus', 'one_liner', 'name_it', 'price_it'].includes(t.name));

/**
 * The five group-A structured tools through the real path (HTTP, admission, queue, llm worker,
 * settlement) against a fake OpenAI-compatible upstream whose replies are derived from the request,
 * and a fake DNS server for name_it.
 */

let h: Harness;
let llm: FakeOpenAI;
let dns: FakeDnsServer;
let base: string;
let acct: TestAccount;

beforeAll(async () => {
  llm = await startFakeOpenAI();
  dns = await startFakeDns({ com: { NS: ['a.gtld.test'] }, io: { NS: ['a.nic.test'] }, 'quillfox.com': { NS: ['ns1.registrar.test'] } });
  h = await startHarness({ LLM_BASE_URL: llm.baseURL, LLM_MODEL: 'fake-model', DNS_SERVERS: dns.address, DNS_TIMEOUT_MS: '500' }, { workers: ['llm'] });
  base = await h.app.listen({ port: 0, host: '127.0.0.1' });
  acct = await h.account('pro', 1000);
});
afterAll(async () => {
  await h?.close();
  await llm?.close();
  await dns?.close();
});
beforeEach(() => {
  llm.requests.length = 0;
});

const tool = (name: string): AnyTool => llmTools.find((t) => t.name === name)!;

interface Case {
  name: string;
  input: Record<string, unknown>;
  /** The fake's reply, derived from the caller's data blocks. */
  reply: (blocks: Record<string, string>) => unknown;
  /** What the caller's input must look like inside the request's data blocks. */
  blocks: Record<string, string>;
  check: (result: any) => void;
}

const cases: Case[] = [
  {
    name: 'intent_to_spec',
    input: { intent: 'Let admins export invoices as CSV' },
    blocks: { intent: 'Let admins export invoices as CSV' },
    reply: (b) => ({
      title: `Spec: ${b.intent}`,
      actors: ['admin'],
      requirements: [
        { text: b.intent, priority: 'must', acceptance: [{ given: 'an admin', when: 'they export', then: 'a CSV downloads' }] },
        { text: 'Exports are audited', priority: 'should', acceptance: [] },
      ],
      non_functional: [{ category: 'performance', text: 'Exports finish in 30 s' }],
      open_questions: [],
      assumptions: ['Admins are signed in'],
    }),
    check: (r) => {
      expect(r.title).toBe('Spec: Let admins export invoices as CSV');
      expect(r.requirements.map((q: any) => [q.id, q.text])).toEqual([
        ['R1', 'Let admins export invoices as CSV'],
        ['R2', 'Exports are audited'],
      ]);
      expect(r.non_functional[0].id).toBe('N1');
      expect(r.markdown).toMatch(/^# Spec: Let admins export invoices as CSV\n/);
    },
  },
  {
    name: 'hints_plus',
    input: { problem: 'Detect a cycle in a linked list', tried: ['a hash set of visited nodes'], count: 3 },
    blocks: { problem: 'Detect a cycle in a linked list', tried: 'a hash set of visited nodes' },
    reply: (b) => ({
      hints: [
        { kind: 'question', hint: `What if two pointers walk the list in "${b.problem}"?`, why: 'w', check_by: 'c' },
        { kind: 'strategy', hint: `Use ${b.tried}`, why: 'repeats the tried approach', check_by: 'c' },
        { kind: 'step', hint: 'Move one pointer twice as fast', why: 'w', check_by: 'c' },
      ],
    }),
    check: (r) => {
      expect(r.hints.map((x: any) => [x.level, x.kind])).toEqual([
        [1, 'question'],
        [2, 'step'],
      ]);
      expect(r.hints[0].hint).toContain('Detect a cycle in a linked list');
      expect(r.filtered_as_tried).toEqual([{ kind: 'strategy', hint: 'Use a hash set of visited nodes', tried_index: 0, jaccard: 0.857 }]);
    },
  },
  {
    name: 'one_liner',
    input: { text: 'Retry storms double charge customers when the billing job times out', style: 'headline', max_chars: 40 },
    blocks: { text: 'Retry storms double charge customers when the billing job times out' },
    reply: (b) => ({ line: b.text }),
    check: (r) => {
      expect(r).toMatchObject({ line: 'Retry storms double charge customers', chars: 36, max_chars: 40, style: 'headline', truncated: true });
    },
  },
  {
    name: 'name_it',
    input: { description: 'A writing app for foxes', count: 3, tlds: ['com', 'io'] },
    blocks: { description: 'A writing app for foxes' },
    reply: (b) => ({
      names: [
        { name: 'QuillFox', rationale: `For: ${b.description}` },
        { name: 'Inkden Zq', rationale: 'a den for ink' },
      ],
    }),
    check: (r) => {
      expect(r.names).toEqual([
        {
          name: 'QuillFox',
          rationale: 'For: A writing app for foxes',
          label: 'quillfox',
          domains: [
            { domain: 'quillfox.com', resolves: true },
            { domain: 'quillfox.io', resolves: false },
          ],
        },
        {
          name: 'Inkden Zq',
          rationale: 'a den for ink',
          label: 'inkdenzq',
          domains: [
            { domain: 'inkdenzq.com', resolves: false },
            { domain: 'inkdenzq.io', resolves: false },
          ],
        },
      ]);
      expect(r.tlds_not_in_dns).toEqual([]);
      expect(r.domain_note).toMatch(/likely unregistered, NOT confirmed available/);
    },
  },
  {
    name: 'price_it',
    input: { product: 'Mug subscription', unit_cost: 10, fixed_costs: 30000, competitor_prices: [{ price: 30 }] },
    blocks: { product: 'Mug subscription', competitors: 'Competitor 1: 30' },
    reply: (b) => ({
      tiers: [
        { name: 'Premium', price: 40, rationale: 'gift buyers' },
        { name: 'Basic', price: 25, rationale: b.product },
      ],
      anchors: ['Show Premium first'],
    }),
    check: (r) => {
      expect(r.tiers.map((t: any) => t.name)).toEqual(['Basic', 'Premium']);
      expect(r.tiers[0].rationale).toBe('Mug subscription');
      expect(r.economics[0]).toEqual({ tier: 'Basic', price: 25, unit_cost: 10, unit_margin: 15, margin_pct: 60, break_even_units: 2000 });
      expect(r.economics[1]).toEqual({ tier: 'Premium', price: 40, unit_cost: 10, unit_margin: 30, margin_pct: 75, break_even_units: 1000 });
      expect(r.competitors).toEqual({ count: 1, min: 30, median: 30, max: 30 });
    },
  },
];

describe.each(cases)('$name', (c) => {
  it('returns the reply derived from the caller input, checked, with meta; the upstream saw the input as data under a strict json_schema; charged exactly the price', async () => {
    const t = tool(c.name);
    const before = await h.credits(acct.accountId);
    const charges = await h.ledgerCharges(acct.accountId);
    llm.enqueue({ type: 'json', value: (body: any) => c.reply(dataBlocksOf(body)) });
    const res = await h.call(c.name, c.input, acct.apiKey);
    expect(res.statusCode, res.body).toBe(200);
    const body = json(res);
    expect(body.cost_cents).toBe(t.priceCents);
    c.check(body.result);
    expect(body.result.meta).toMatchObject({ model: 'fake-model', prompt_version: `${c.name}/1`, usage: { total_tokens: expect.any(Number) } });
    const parsed = t.outputSchema!.safeParse(body.result);
    expect(parsed.success, parsed.success ? '' : JSON.stringify(parsed.error.issues)).toBe(true);

    expect(llm.requests).toHaveLength(1);
    const sent = llm.requests[0]!.body;
    expect(dataBlocksOf(sent)).toEqual(c.blocks);
    expect(sent.response_format).toMatchObject({ type: 'json_schema', json_schema: { name: c.name, strict: true } });
    expect(sent.response_format.json_schema.schema.additionalProperties).toBe(false);
    expect(sent.stream).toBe(true);
    // Caller text is never in the instructions.
    const system = sent.messages.find((m: any) => m.role === 'system').content as string;
    for (const text of Object.values(c.blocks)) expect(system).not.toContain(text);

    expect(await h.credits(acct.accountId)).toBe(before - t.priceCents);
    expect(await h.ledgerCharges(acct.accountId)).toBe(charges + 1);
  });

  it('invalid JSON twice -> 503 after exactly one repair request; upstream 500 and a dropped connection -> 503; none charged', async () => {
    const before = await h.credits(acct.accountId);
    const charges = await h.ledgerCharges(acct.accountId);

    llm.enqueue({ type: 'tokens', tokens: ['not', ' json'] }, { type: 'tokens', tokens: ['still ', '{not json'] });
    const invalid = await h.call(c.name, c.input, acct.apiKey);
    expect(invalid.statusCode, invalid.body).toBe(503);
    expect(json(invalid).error.code).toBe('tool_unavailable');
    expect(llm.requests).toHaveLength(2);
    expect(llm.requests[1]!.body.messages.at(-1).content).toMatch(/not valid: it is not JSON/);

    llm.requests.length = 0;
    llm.enqueue({ type: 'error', status: 500, message: 'upstream exploded' });
    const e500 = await h.call(c.name, c.input, acct.apiKey);
    expect(e500.statusCode).toBe(503);
    expect(json(e500).error).toMatchObject({ code: 'tool_unavailable', upstream_status: 500 });
    expect(llm.requests).toHaveLength(1);

    llm.enqueue({ type: 'drop', tokens: ['{"a'] });
    const dropped = await h.call(c.name, c.input, acct.apiKey);
    expect(dropped.statusCode).toBe(503);
    expect(json(dropped).error.code).toBe('tool_unavailable');

    expect(await h.credits(acct.accountId)).toBe(before);
    expect(await h.ledgerCharges(acct.accountId)).toBe(charges);
  });

  it('streams the model tokens as progress before the result', async () => {
    const q = String(c.input[tool(c.name).qField]);
    // Root protocol `q` carries only the q field; the reply still derives from it.
    llm.enqueue({ type: 'json', value: (body: any) => c.reply({ ...c.blocks, ...dataBlocksOf(body) }) });
    const res = await fetch(`${base}/`, {
      method: 'POST',
      headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json', accept: 'text/event-stream' },
      body: JSON.stringify({ stream: true, m: c.name, q }),
    });
    expect(res.status).toBe(200);
    const text = await res.text();
    const events = [...text.matchAll(/event: (\w+)\ndata: (.*)\n/g)].map((m) => ({ type: m[1]!, data: JSON.parse(m[2]!) }));
    const types = events.map((e) => e.type);
    const result = types.indexOf('result');
    expect(result).toBeGreaterThan(0);
    const tokens = events.filter((e, i) => e.type === 'progress' && e.data.stage === 'generating' && i < result);
    expect(tokens.length).toBeGreaterThan(1);
    // The deltas are the model's JSON reply, in order, all before the result.
    const streamed = JSON.parse(tokens.map((e) => e.data.delta).join(''));
    expect(streamed).toEqual(c.reply({ ...c.blocks, ...dataBlocksOf(llm.requests[0]!.body) }));
    expect(types.lastIndexOf('progress')).toBeLessThan(result);
    if (c.name === 'name_it') {
      // The DNS step follows the naming: `resolving` progress after the last token, before the result.
      const lastToken = events.lastIndexOf(tokens.at(-1)!);
      const resolving = events.map((e, i) => ({ e, i })).filter(({ e }) => e.type === 'progress' && e.data.stage === 'resolving');
      expect(resolving.length).toBeGreaterThan(1);
      expect(resolving[0]!.i).toBeGreaterThan(lastToken);
      expect(resolving.at(-1)!.e.data).toMatchObject({ done: 3, total: 3, unit: 'lookups' }); // com + 2 names
    }
    expect(tool(c.name).outputSchema!.safeParse(events[result]!.data.result).success).toBe(true);
  });
});

describe('catalogue', () => {
  it('GET /tools/{name} shows each tool with its input and output JSON Schemas, needs and progress', async () => {
    for (const t of llmToolsA) {
      const res = await h.request({ method: 'GET', url: `/tools/${t.name}`, headers: { authorization: `Bearer ${acct.apiKey}` } });
      expect(res.statusCode, t.name).toBe(200);
      const d = json(res);
      expect(d).toMatchObject({ name: t.name, family: 'llm', price_cents: t.priceCents, q_field: t.qField, needs: ['llm'], progress: true });
      expect(d.output_schema.properties.meta, t.name).toBeDefined();
      expect(Object.keys(d.input_schema.properties), t.name).toContain(t.qField);
    }
  });
});

describe('json_object mode and admission', () => {
  it('LLM_STRUCTURED=json_object: the request uses json_object, the schema rides in the instructions, the reply is validated', async () => {
    const h2 = await startHarness(
      { LLM_BASE_URL: llm.baseURL, LLM_STRUCTURED: 'json_object', DNS_SERVERS: dns.address, DNS_TIMEOUT_MS: '500' },
      { workers: ['llm'] },
    );
    try {
      const a = await h2.account('pro', 100);
      llm.enqueue({ type: 'json', value: (body: any) => ({ line: `${dataBlocksOf(body).text} now` }) });
      const ok = await h2.call('one_liner', { text: 'Ship faster' }, a.apiKey);
      expect(ok.statusCode, ok.body).toBe(200);
      expect(json(ok).result).toMatchObject({ line: 'Ship faster now', truncated: false });
      expect(llm.requests[0]!.body.response_format).toEqual({ type: 'json_object' });
      expect(llm.requests[0]!.body.messages[0].content).toContain('<<<SCHEMA>>>');
      // Wrong shape twice: 503, uncharged.
      llm.enqueue({ type: 'json', value: { line: 7 } }, { type: 'json', value: { nope: true } });
      const bad = await h2.call('one_liner', { text: 'Ship faster' }, a.apiKey);
      expect(bad.statusCode).toBe(503);
      expect(await h2.credits(a.accountId)).toBe(100 - 2);
    } finally {
      await h2.close();
    }
  });

  it('without LLM_BASE_URL every group-A tool is 503 tool_unavailable at admission, nothing queued or charged', async () => {
    const h3 = await startHarness({}, { workers: ['llm'] });
    try {
      const a = await h3.account('pro', 100);
      for (const t of llmToolsA) {
        const res = await h3.call(t.name, t.examples[0], a.apiKey);
        expect(res.statusCode, t.name).toBe(503);
        expect(json(res).error).toMatchObject({ code: 'tool_unavailable', needs: ['llm'] });
        expect(res.headers['x-job-id']).toBeUndefined();
      }
      expect(await h3.credits(a.accountId)).toBe(100);
      expect(await h3.ledgerCharges(a.accountId)).toBe(0);
    } finally {
      await h3.close();
    }
  });
});
