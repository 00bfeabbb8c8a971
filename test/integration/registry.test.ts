import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TOOLS } from '../../src/tools/index.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';

/**
 * The registry's promises, for every tool that computes without an upstream (core, text, math):
 * each example runs through the real path (HTTP, queue, sandbox thread, settlement), its result
 * satisfies the tool's output schema, and running it again gives the same bytes. The catalogue
 * families declare everything the registry asks of them. A tool whose needs are not configured is
 * 503 at admission and costs nothing.
 */

const LOCAL = ['core', 'text', 'math'] as const;
const local = TOOLS.filter((t) => (LOCAL as readonly string[]).includes(t.family));
const catalogue = TOOLS.filter((t) => t.family === 'text' || t.family === 'math');
/** Tools that must use the event loop's context (ctx.store) and hand their CPU work to a pool task. */
const ON_EVENT_LOOP = new Set(['cvi_loop']);
/** Tools whose results are new on every call (fresh handles and expiry times): run, checked, not compared. */
const NOT_REPEATABLE = new Set(['passport_store', 'passport_send']);

let h: Harness;
let acct: TestAccount;

beforeAll(async () => {
  h = await startHarness({}, { workers: [...LOCAL] });
  acct = await h.account('enterprise', 1_000_000, { rpm: 100_000, maxInFlight: 100 });
});

afterAll(async () => {
  await h?.close();
});

describe.skipIf(!catalogue.length)('catalogue tools declare what the registry needs', () => {
  it.each(catalogue.map((t) => [t.name, t] as const))('%s: output schema, examples, limits, isolated, deterministic q', (_name, tool) => {
    expect(tool.outputSchema, 'outputSchema').toBeDefined();
    expect(tool.examples.length, 'examples').toBeGreaterThan(0);
    // cvi_loop keeps its rounds in ctx.store (event loop only); its CPU round runs as a pool task.
    if (!ON_EVENT_LOOP.has(tool.name)) expect(tool.isolated, 'runs in the sandbox pool').toBeTruthy();
    expect(tool.limits, 'limits').toBeDefined();
    for (const ex of tool.examples) expect(tool.input.safeParse(ex).success).toBe(true);
  });
});

describe('every example of every local tool', () => {
  const cases = local.flatMap((t) => t.examples.map((ex, i) => [`${t.name} #${i + 1}`, t, ex] as const));
  it.each(cases)('%s: answers 200, matches its output schema, and repeats byte for byte', async (_label, tool, example) => {
    const first = await h.call(tool.name, example, acct.apiKey);
    expect(first.statusCode, first.body).toBe(200);
    const result = json(first).result;
    if (tool.outputSchema) {
      const parsed = tool.outputSchema.safeParse(result);
      expect(parsed.success, parsed.success ? '' : JSON.stringify(parsed.error.issues.slice(0, 3))).toBe(true);
    }
    // check_balance reads a balance that the calls themselves move.
    if (tool.name === 'check_balance' || NOT_REPEATABLE.has(tool.name)) return;
    const again = await h.call(tool.name, example, acct.apiKey);
    expect(again.statusCode).toBe(200);
    expect(JSON.stringify(json(again).result)).toBe(JSON.stringify(result));
  });
});

describe('needs', () => {
  it('a tool whose need is not configured is 503 tool_unavailable at admission: nothing queued, held or charged', async () => {
    const needy = TOOLS.find((t) => t.needs?.includes('llm'))!;
    const before = await h.credits(acct.accountId);
    const charges = await h.ledgerCharges(acct.accountId);
    const example = needy.examples[0];
    const res = await h.call(needy.name, example, acct.apiKey);
    expect(res.statusCode).toBe(503);
    expect(json(res).error).toMatchObject({ code: 'tool_unavailable', needs: ['llm'], message: expect.stringMatching(/LLM_BASE_URL/) });
    expect(res.headers['x-job-id']).toBeUndefined();
    expect(await h.credits(acct.accountId)).toBe(before);
    expect(await h.ledgerCharges(acct.accountId)).toBe(charges);
    // The same on the root protocol.
    const root = await h.request({
      method: 'POST',
      url: '/',
      headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json' },
      payload: { chain: ['compute', needy.name], q: '1+1' },
    });
    expect(root.statusCode).toBe(503);
  });
});
