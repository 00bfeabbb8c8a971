import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { deferred, startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import { routes, startHttpTarget, type HttpTarget } from '../helpers/http-targets.js';
import { MAX_STEPS, PROTOCOL_MODES, parseProtocolRequest } from '../../src/calls/protocol.js';

let h: Harness;
let llm: FakeOpenAI;
let site: HttpTarget;
let pro: TestAccount;

beforeAll(async () => {
  llm = await startFakeOpenAI();
  site = await startHttpTarget(
    routes({
      '/expr': [200, { 'content-type': 'text/plain; charset=utf-8' }, '6 * 7'],
    }),
  );
  h = await startHarness({ LLM_BASE_URL: llm.baseURL, FETCH_ALLOWED_HOSTS: site.hostPort });
  pro = await h.account('pro', 10_000);
});
afterAll(async () => {
  await h.close();
  await llm.close();
  await site.close();
});
beforeEach(() => {
  llm.requests.length = 0;
  llm.setDefault({ type: 'tokens', tokens: ['Hello', ' from', ' the', ' fake', ' model', '.'] });
});

const root = (body: unknown, apiKey?: string, headers: Record<string, string> = {}) =>
  h.request({
    method: 'POST',
    url: '/',
    headers: { ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}), 'content-type': 'application/json', ...headers },
    payload: JSON.stringify(body),
  });

const getJob = (id: string, apiKey: string) => h.request({ method: 'GET', url: `/jobs/${id}`, headers: { authorization: `Bearer ${apiKey}` } });

/** Waits until a job finishes: subscribed first, then checked, so a completion cannot slip past. */
async function settled(jobId: string, apiKey: string) {
  const wait = h.container.api!.dispatcher.waitFor(jobId, 20_000);
  const first = await getJob(jobId, apiKey);
  if (first.statusCode !== 200 || json(first).status === 'completed') {
    wait.cancel();
    return first;
  }
  await wait.outcome;
  return getJob(jobId, apiKey);
}

/** A job's final BullMQ state, waited for on its events. */
async function finalState(jobId: string) {
  const wait = h.container.api!.dispatcher.waitFor(jobId, 20_000);
  const view = await h.container.queues.view(jobId);
  if (view && view.state !== 'pending') {
    wait.cancel();
    return view.state;
  }
  return (await wait.outcome).state;
}

const userMessages = () => llm.requests.filter((r) => r.path === '/v1/chat/completions').map((r) => JSON.stringify(r.body.messages));

describe('direct {m, q}', () => {
  it('answers exactly like POST /tools/{m}', async () => {
    const direct = await root({ m: 'compute', q: '2 * (3 + 4)' }, pro.apiKey);
    const tool = await h.call('compute', { expression: '2 * (3 + 4)' }, pro.apiKey);
    expect(direct.statusCode).toBe(200);
    expect(direct.headers['x-job-id']).toMatch(/^core-/);
    const body = json(direct);
    expect(Object.keys(body).sort()).toEqual(Object.keys(json(tool)).sort());
    expect(body).toMatchObject({ result: { expression: '2 * (3 + 4)', result: '14', value: 14, type: 'number' }, cost_cents: 2 });
    expect(body.remaining_credits).toBe(json(tool).remaining_credits + 2);
  });

  it.each([
    ['an unknown tool', { m: 'nope', q: 'x' }, { m: 'nope', body: { expression: 'x' } }],
    ['an input the tool rejects', { m: 'compute', q: '2 * (3 +' }, { m: 'compute', body: { expression: '2 * (3 +' } }],
  ])('gives the same error as POST /tools/{m} for %s', async (_l, direct, tool) => {
    const a = json(await root(direct, pro.apiKey));
    const b = json(await h.call(tool.m, tool.body, pro.apiKey));
    const strip = (e: any) => ({ ...e.error, request_id: undefined, job_id: undefined });
    expect(strip(a)).toEqual(strip(b));
  });
});

describe('chain', () => {
  it('passes each step output to the next across three tool families, charging every step', async () => {
    const acct = await h.account('pro', 100);
    llm.enqueue({ type: 'tokens', tokens: ['42', ' is', ' a', ' lazy', ' answer.'] });
    const res = await root({ chain: ['page_fetch', 'compute', 'roast'], q: site.url('/expr') }, acct.apiKey);
    expect(res.statusCode).toBe(200);
    const body = json(res);
    expect(Object.keys(body)).toEqual(['steps', 'result', 'cost_cents', 'remaining_credits']);
    expect(body.steps.map((s: any) => [s.tool, s.cost_cents])).toEqual([
      ['page_fetch', 0],
      ['compute', 2],
      ['roast', 5],
    ]);
    expect(body.steps[0].result.text).toBe('6 * 7');
    // compute got the page's text as its expression, roast got compute's result as its text.
    expect(body.steps[1].result).toMatchObject({ expression: '6 * 7', result: '42' });
    expect(userMessages()).toHaveLength(1);
    expect(userMessages()[0]).toContain('42');
    expect(body.result).toMatchObject({ text: '42 is a lazy answer.' });
    expect(body.steps[2].result).toEqual(body.result);
    expect(body.cost_cents).toBe(7);
    expect(body.remaining_credits).toBe(93);
    expect(await h.credits(acct.accountId)).toBe(93);
    expect(await h.ledgerCharges(acct.accountId)).toBe(2);
  });

  it('runs the same tool twice in a row', async () => {
    const res = await root({ chain: ['compute', 'compute'], q: '12.7 cm to inch' }, pro.apiKey);
    expect(res.statusCode).toBe(200);
    const body = json(res);
    expect(body.steps.map((s: any) => s.result.result)).toEqual(['5 inch', '5 inch']);
    expect(body.steps[1].result.expression).toBe('5 inch');
    expect(body.cost_cents).toBe(4);
  });

  it('stops at a failing step: earlier steps charged and returned, later ones never run, their holds freed', async () => {
    // 5 + 2 + 5: exactly enough for the whole chain.
    const acct = await h.account('pro', 12);
    llm.enqueue({ type: 'tokens', tokens: ['1', ' +'] });
    const res = await root({ chain: ['hints', 'compute', 'roast'], q: 'a sum, but unfinished' }, acct.apiKey);
    expect(res.statusCode).toBe(400);
    const { error } = json(res);
    expect(error.code).toBe('invalid_input');
    expect(error.message).toMatch(/^Chain step 2 of 3 \(compute\) failed: Cannot evaluate expression/);
    expect(error.message).toContain('1 earlier step completed and is charged');
    expect(error.message).toContain('1 later step did not run');
    expect(error.failed_step).toMatchObject({ index: 1, tool: 'compute', error: { code: 'invalid_input' } });
    expect(error.failed_step.error.message).toMatch(/^Cannot evaluate expression/);
    expect(error.steps).toEqual([{ tool: 'hints', result: expect.objectContaining({ text: '1 +' }), cost_cents: 5 }]);
    expect(error.cost_cents).toBe(5);
    expect(error.remaining_credits).toBe(7);
    expect(error.job_id).toBe(res.headers['x-job-id']);
    expect(typeof error.request_id).toBe('string');
    // roast never ran: once its job has ended (failed: compute's failure was the caller's, so roast's
    // worker ends it without running it, as BullMQ fails it after a fault),
    // the model was still asked only once (by hints), and only hints is in the ledger.
    expect(await finalState(error.job_id)).toBe('failed');
    expect(userMessages()).toHaveLength(1);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    expect(await h.credits(acct.accountId)).toBe(7);
    // The holds of compute and roast came back: the remaining 7 cents are all usable.
    const next = await root({ chain: ['compute', 'hints'], q: '1 + 1' }, acct.apiKey);
    expect(next.statusCode).toBe(200);
    expect(json(next).remaining_credits).toBe(0);
    // GET /jobs/{root} tells the same story.
    const status = await getJob(error.job_id, acct.apiKey);
    expect(status.statusCode).toBe(400);
    expect(json(status).error).toMatchObject({ code: 'invalid_input', failed_step: { index: 1 }, cost_cents: 5 });
  });

  it('a failing first step charges nothing', async () => {
    const acct = await h.account('pro', 10);
    const res = await root({ chain: ['compute', 'compute'], q: '2 * apples' }, acct.apiKey);
    expect(res.statusCode).toBe(400);
    const { error } = json(res);
    expect(error.failed_step).toMatchObject({ index: 0, tool: 'compute' });
    expect(error).toMatchObject({ steps: [], cost_cents: 0, remaining_credits: 10 });
    expect(await h.credits(acct.accountId)).toBe(10);
    expect(json(await root({ chain: ['compute', 'compute', 'compute', 'compute', 'compute'], q: '1' }, acct.apiKey)).cost_cents).toBe(10);
  });

  it('reserves credit for every step before anything runs', async () => {
    const acct = await h.account('pro', 5);
    const res = await root({ chain: ['compute', 'compute', 'compute'], q: '1 + 1' }, acct.apiKey);
    expect(res.statusCode).toBe(402);
    expect(json(res).error.code).toBe('insufficient_credits');
    expect(await h.ledgerCharges(acct.accountId)).toBe(0);
    expect(json(await root({ chain: ['compute', 'compute'], q: '1 + 1' }, acct.apiKey)).cost_cents).toBe(4);
  });

  it('checks every step against the plan before anything runs', async () => {
    const acct = await h.account('free', 100);
    const res = await root({ chain: ['check_balance', 'compute'], q: 'x' }, acct.apiKey);
    expect(res.statusCode).toBe(403);
    expect(json(res).error).toMatchObject({ code: 'plan_required', required_plan: 'pro' });
    expect(json(res).error.message).toContain('compute');
  });

  it("applies a sub-key's allowed tools and monthly limit to the whole chain", async () => {
    const acct = await h.account('enterprise', 1000);
    const sub = await h.container.accounts.createKey({ accountId: acct.accountId, type: 'sub', name: 'bot', monthlyLimitCents: 5, allowedTools: ['compute'] });
    const scoped = await root({ chain: ['compute', 'check_balance'], q: '1' }, sub.api_key);
    expect(scoped.statusCode).toBe(403);
    expect(json(scoped).error.code).toBe('tool_not_allowed');
    const over = await root({ chain: ['compute', 'compute', 'compute'], q: '1' }, sub.api_key);
    expect(over.statusCode).toBe(402);
    expect(json(over).error.code).toBe('monthly_limit_exceeded');
    const fits = await root({ chain: ['compute', 'compute'], q: '1' }, sub.api_key);
    expect(fits.statusCode).toBe(200);
    expect(await h.ledgerCharges(acct.accountId)).toBe(2);
  });

  it('answers 202 with the root job under Prefer: respond-async; GET /jobs/{id} then has the whole chain', async () => {
    const res = await root({ chain: ['compute', 'compute'], q: '3 ^ 2' }, pro.apiKey, { prefer: 'respond-async' });
    expect(res.statusCode).toBe(202);
    const accepted = json(res);
    expect(accepted).toEqual({ job_id: res.headers['x-job-id'], status: 'queued', status_url: `/jobs/${accepted.job_id}` });
    expect(res.headers.location).toBe(accepted.status_url);
    const done = await settled(accepted.job_id, pro.apiKey);
    expect(done.statusCode).toBe(200);
    expect(json(done)).toMatchObject({ job_id: accepted.job_id, status: 'completed', result: { result: '9' }, cost_cents: 4 });
    expect(json(done).steps).toHaveLength(2);
    const other = await h.account('pro', 10);
    expect((await getJob(accepted.job_id, other.apiKey)).statusCode).toBe(404);
  });

  it('GET /jobs/{id} shows each step while the chain runs', async () => {
    const reached = deferred();
    const gate = deferred();
    llm.enqueue({ type: 'tokens', tokens: ['1 + 1'], beforeToken: () => (reached.resolve(), gate.promise) });
    const res = await root({ chain: ['hints', 'compute'], q: 'add one and one' }, pro.apiKey, { prefer: 'respond-async' });
    const id = json(res).job_id;
    await reached.promise;
    const running = json(await getJob(id, pro.apiKey));
    expect(running).toEqual({
      job_id: id,
      status: 'running',
      mode: 'chain',
      steps: [
        { tool: 'hints', job_id: expect.stringMatching(/^llm-/), status: 'running' },
        { tool: 'compute', job_id: id, status: 'queued' },
      ],
    });
    gate.resolve();
    expect(json(await settled(id, pro.apiKey))).toMatchObject({ status: 'completed', result: { result: '2' }, cost_cents: 7 });
  });

  it('sandbox keys run the chain for free', async () => {
    const acct = await h.account('pro', 50);
    const test = await h.key(acct.accountId, 'test');
    const res = await root({ chain: ['compute', 'compute'], q: '1 + 2' }, test.apiKey);
    expect(res.statusCode).toBe(200);
    expect(json(res)).toMatchObject({ cost_cents: 0, remaining_credits: 50, sandbox: true });
    expect(json(res).steps.every((s: any) => s.cost_cents === 0)).toBe(true);
    expect(await h.credits(acct.accountId)).toBe(50);
  });

  it('Idempotency-Key replays the first answer and runs nothing again', async () => {
    const acct = await h.account('pro', 100);
    const body = { chain: ['compute', 'compute'], q: '5 * 5' };
    const first = await root(body, acct.apiKey, { 'idempotency-key': 'chain-once' });
    const again = await root(body, acct.apiKey, { 'idempotency-key': 'chain-once' });
    expect(again.statusCode).toBe(200);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(json(again)).toEqual(json(first));
    expect(await h.ledgerCharges(acct.accountId)).toBe(2);
    const reused = await root({ ...body, q: '6 * 6' }, acct.apiKey, { 'idempotency-key': 'chain-once' });
    expect(reused.statusCode).toBe(422);
  });
});

describe('parallel', () => {
  it('runs every tool on the same q; a failing tool is reported, only successes are charged', async () => {
    const acct = await h.account('pro', 100);
    const res = await root({ parallel: ['hints', 'roast', 'compute'], q: '2 * 3 apples' }, acct.apiKey);
    expect(res.statusCode).toBe(200);
    const body = json(res);
    expect(Object.keys(body)).toEqual(['results', 'cost_cents', 'remaining_credits']);
    expect(Object.keys(body.results)).toEqual(['hints', 'roast', 'compute']);
    expect(body.results.hints).toEqual({ result: expect.objectContaining({ text: 'Hello from the fake model.' }), cost_cents: 5 });
    expect(body.results.roast).toEqual({ result: expect.objectContaining({ text: 'Hello from the fake model.' }), cost_cents: 5 });
    expect(body.results.compute).toEqual({ error: expect.objectContaining({ code: 'invalid_input' }) });
    expect(body.results.compute.error.message).toMatch(/^Cannot evaluate expression/);
    expect(body.cost_cents).toBe(10);
    expect(body.remaining_credits).toBe(90);
    expect(await h.credits(acct.accountId)).toBe(90);
    expect(await h.ledgerCharges(acct.accountId)).toBe(2);
    // Both model tools got the same q.
    expect(userMessages().every((m) => m.includes('2 * 3 apples'))).toBe(true);
  });

  it('keys a repeated tool as name#2, name#3', async () => {
    const res = await root({ parallel: ['compute', 'compute', 'check_balance', 'compute'], q: '7 * 6' }, pro.apiKey);
    expect(res.statusCode).toBe(200);
    const { results, cost_cents } = json(res);
    expect(Object.keys(results)).toEqual(['compute', 'compute#2', 'check_balance', 'compute#3']);
    expect(results['compute#3'].result.result).toBe('42');
    expect(results.check_balance.cost_cents).toBe(0);
    expect(cost_cents).toBe(6);
  });

  it('validates every input at admission', async () => {
    const res = await root({ parallel: ['compute', 'page_fetch'], q: '' }, pro.apiKey);
    expect(res.statusCode).toBe(400);
    expect(json(res).error.message).toMatch(/^Input for compute is invalid/);
  });

  it('answers 202 under Prefer: respond-async; GET /jobs/{id} then has every result', async () => {
    const res = await root({ parallel: ['compute', 'check_balance'], q: '2 + 2' }, pro.apiKey, { prefer: 'respond-async' });
    expect(res.statusCode).toBe(202);
    const done = await settled(json(res).job_id, pro.apiKey);
    expect(json(done)).toMatchObject({ status: 'completed', results: { compute: { result: { result: '4' } } }, cost_cents: 2 });
  });
});

describe('request validation', () => {
  it.each([
    ['no mode', { q: '1' }, 400, /^The body matches no mode/],
    ['stream without m', { stream: true, q: '1' }, 400, /^The body matches no mode/],
    ['several modes', { chain: ['compute'], m: 'compute', q: '1' }, 400, /^The body matches several modes \(chain and m\)/],
    ['an array body', ['compute'], 400, /^POST \/ takes a JSON object/],
    ['an empty chain', { chain: [], q: '1' }, 400, /chain lists no tools/],
    ['an empty parallel', { parallel: [], q: '1' }, 400, /parallel lists no tools/],
    ['too many steps', { chain: Array(MAX_STEPS + 1).fill('compute'), q: '1' }, 400, /more than 10 tools/],
    ['no q', { m: 'compute' }, 400, /q is required/],
    ['a q that is not a string', { chain: ['compute'], q: 5 }, 400, /q must be a string/],
    ['an unknown field', { m: 'compute', q: '1', input: {} }, 400, /Unrecognized key/],
    ['a non-boolean stream', { m: 'compute', q: '1', stream: 'yes' }, 400, /stream/],
    ['an unknown tool in a chain', { chain: ['compute', 'nope'], q: '1' }, 404, /^No tool named 'nope' \(chain step 2 of 2\)/],
    ['an unknown tool in a parallel', { parallel: ['nope'], q: '1' }, 404, /^No tool named 'nope' \(parallel step 1 of 1\)/],
  ])('%s is %i with a message that says why', async (_l, body, status, message) => {
    const res = await root(body, pro.apiKey);
    expect(res.statusCode).toBe(status);
    const { error } = json(res);
    expect(error.code).toBe(status === 404 ? 'tool_not_found' : 'invalid_input');
    expect(error.message).toMatch(message);
  });

  it('needs an API key', async () => {
    const res = await root({ m: 'compute', q: '1' });
    expect(res.statusCode).toBe(401);
    expect(json(res).error.code).toBe('unauthorized');
  });

  it('the root document lists the modes with working examples', async () => {
    const doc = json(await h.request({ method: 'GET', url: '/' }));
    expect(doc.protocol).toEqual(JSON.parse(JSON.stringify(PROTOCOL_MODES)));
    for (const mode of ['chain', 'parallel', 'stream', 'direct'] as const) {
      const parsed = parseProtocolRequest(doc.protocol[mode].example);
      expect(parsed.mode).toBe(mode === 'stream' ? 'direct' : mode);
      expect(parsed.stream).toBe(mode === 'stream');
    }
    expect(doc.endpoints['POST /']).toBeDefined();
    expect(doc.endpoints['GET /jobs/{id}/events']).toBeDefined();
    const direct = await root(doc.protocol.direct.example, pro.apiKey);
    expect(json(direct).result.result).toBe('14');
  });
});
