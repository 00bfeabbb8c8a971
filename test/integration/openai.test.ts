import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI, { APIError } from 'openai';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { deferred, startFakeOpenAI, type Deferred, type FakeOpenAI } from '../helpers/fake-openai.js';
import { HINTS_SYSTEM_PROMPT } from '../../src/tools/llm/hints.js';

let h: Harness;
let llm: FakeOpenAI;
let baseURL: string;

beforeAll(async () => {
  llm = await startFakeOpenAI();
  h = await startHarness({ LLM_BASE_URL: llm.baseURL });
  const address = await h.app.listen({ port: 0, host: '127.0.0.1' });
  baseURL = `${address}/v1`;
});
afterAll(async () => {
  await h.close();
  await llm.close();
});

const client = (apiKey: string) => new OpenAI({ apiKey, baseURL, maxRetries: 0 });
const ask = (content: string) => [{ role: 'user' as const, content }];

/** The error a call rejects with, for assertions on its status, code and body. */
async function failure(p: Promise<unknown>): Promise<APIError> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(APIError);
  return e as APIError;
}

describe('GET /v1/models', () => {
  it.each([
    ['starter', ['svc-hints', 'svc-roast']],
    ['pro', ['svc-genius', 'svc-hints', 'svc-roast']],
    ['free', []],
  ] as const)('lists the svc-* models a %s key may use', async (plan, models) => {
    const acct = await h.account(plan, 0);
    const page = await client(acct.apiKey).models.list();
    expect(page.data.map((m) => m.id).sort()).toEqual(models);
    for (const m of page.data) expect(m).toMatchObject({ object: 'model', owned_by: 'tollgate' });
  });

  it('retrieves one model, and refuses one above the plan in OpenAI shape', async () => {
    const starter = await h.account('starter', 0);
    expect(await client(starter.apiKey).models.retrieve('svc-hints')).toMatchObject({ id: 'svc-hints', price_cents: 5, tool: 'hints' });
    const err = await failure(client(starter.apiKey).models.retrieve('svc-genius'));
    expect(err.status).toBe(403);
    expect(err.code).toBe('plan_required');
  });
});

describe('POST /v1/chat/completions', () => {
  it('answers a chat.completion from the tool behind the model, with usage, and charges its price', async () => {
    const usage = { prompt_tokens: 212, completion_tokens: 3, total_tokens: 215 };
    llm.enqueue({ type: 'tokens', tokens: ['Use ', 'two ', 'pointers.'], usage });
    const acct = await h.account('starter', 20);
    const before = llm.requests.length;
    const res = await client(acct.apiKey).chat.completions.create({
      model: 'svc-hints',
      messages: [
        { role: 'system', content: 'Answer in one sentence.' },
        { role: 'user', content: 'How do I detect a cycle in a linked list?' },
      ],
      max_completion_tokens: 200,
      temperature: 0.2,
    });
    expect(res.object).toBe('chat.completion');
    expect(res.model).toBe('svc-hints');
    expect(res.id).toMatch(/^chatcmpl-llm-/);
    expect(res.choices).toEqual([
      { index: 0, message: { role: 'assistant', content: 'Use two pointers.', refusal: null }, logprobs: null, finish_reason: 'stop' },
    ]);
    expect(res.usage).toEqual(usage);
    expect((res as unknown as { tollgate: unknown }).tollgate).toMatchObject({ cost_cents: 5, remaining_credits: 15 });
    expect(await h.credits(acct.accountId)).toBe(15);

    // The tool's own prompt leads; the client's system message travels as context, not instead of it.
    const sent = llm.requests[before]!.body;
    expect(sent.messages[0]).toEqual({ role: 'system', content: HINTS_SYSTEM_PROMPT });
    expect(sent.messages[1].content).toContain('Answer in one sentence.');
    expect(sent.messages.at(-1).content).toContain('How do I detect a cycle in a linked list?');
    expect(sent.max_tokens).toBe(200);
  });

  it('streams through finalChatCompletion with include_usage', async () => {
    const usage = { prompt_tokens: 90, completion_tokens: 4, total_tokens: 94 };
    llm.enqueue({ type: 'tokens', tokens: ['Ice ', 'cubes ', 'melt', '.'], usage });
    const acct = await h.account('starter', 10);
    const stream = client(acct.apiKey).chat.completions.stream({
      model: 'svc-roast',
      messages: ask('Startup idea: a subscription for artisanal ice cubes.'),
      stream_options: { include_usage: true },
    });
    const final = await stream.finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe('Ice cubes melt.');
    expect(final.choices[0]!.finish_reason).toBe('stop');
    expect(final.usage).toEqual(usage);
    expect(final.model).toBe('svc-roast');
    expect(await h.credits(acct.accountId)).toBe(5);
  });

  it('sends each token as its own SSE chunk while the call is still running', async () => {
    const tokens = ['one ', 'two ', 'three ', 'four'];
    const gates: Deferred[] = tokens.map(() => deferred());
    gates[0]!.resolve();
    llm.enqueue({ type: 'tokens', tokens, beforeToken: (i) => gates[i]!.promise });
    const acct = await h.account('starter', 10);
    const stream = await client(acct.apiKey).chat.completions.create({ model: 'svc-hints', messages: ask('Count to four.'), stream: true });
    const deltas: string[] = [];
    const balances: number[] = [];
    for await (const chunk of stream) {
      const delta = chunk.choices[0]?.delta.content;
      if (!delta) continue;
      deltas.push(delta);
      // The fake model sends the next token only after this one reached the client: if the server
      // buffered the answer, this loop would never get here a second time.
      if (deltas.length < tokens.length) {
        balances.push(await h.credits(acct.accountId));
        gates[deltas.length]!.resolve();
      }
    }
    expect(deltas).toEqual(tokens);
    // Nothing was charged while the tokens were arriving: the call had not completed yet.
    expect(balances).toEqual([10, 10, 10]);
    expect(await h.credits(acct.accountId)).toBe(5);
  });

  it('speaks the SSE wire format: role first, finish chunk, usage chunk with no choices, [DONE]', async () => {
    llm.enqueue({ type: 'tokens', tokens: ['Hi', '!'], usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 } });
    const acct = await h.account('starter', 10);
    const res = await fetch(`${baseURL}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'svc-hints', messages: ask('Say hi.'), stream: true, stream_options: { include_usage: true } }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    const events = (await res.text())
      .split('\n\n')
      .filter((e) => e.startsWith('data: '))
      .map((e) => e.slice('data: '.length));
    expect(events.at(-1)).toBe('[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    for (const c of chunks) expect(c).toMatchObject({ object: 'chat.completion.chunk', model: 'svc-hints', id: chunks[0].id });
    expect(chunks[0].choices[0].delta).toEqual({ role: 'assistant', content: '' });
    expect(chunks.slice(1, 3).map((c) => c.choices[0].delta.content)).toEqual(['Hi', '!']);
    expect(chunks[3].choices[0]).toMatchObject({ delta: {}, finish_reason: 'stop' });
    expect(chunks[3].tollgate).toMatchObject({ cost_cents: 5, remaining_credits: 5 });
    expect(chunks[4]).toMatchObject({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 } });
    expect(chunks).toHaveLength(5);
  });

  it('a failure after the stream started arrives as an error event, and nothing is charged', async () => {
    llm.enqueue({ type: 'stream-error', tokens: ['Half ', 'an '], message: 'The model overloaded' });
    const acct = await h.account('starter', 10);
    const stream = await client(acct.apiKey).chat.completions.create({ model: 'svc-hints', messages: ask('Explain.'), stream: true });
    const deltas: string[] = [];
    const err = await (async () => {
      for await (const chunk of stream) if (chunk.choices[0]?.delta.content) deltas.push(chunk.choices[0].delta.content);
    })().catch((e: unknown) => e);
    expect(deltas).toEqual(['Half ', 'an ']);
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).message).toMatch(/language-model upstream failed/);
    expect(await h.credits(acct.accountId)).toBe(10);
  });

  it('a streamed call that fails before its first token still answers 503 with OpenAI\u2019s error body', async () => {
    llm.enqueue({ type: 'error', status: 500, message: 'upstream exploded' });
    const acct = await h.account('starter', 10);
    const err = await failure(client(acct.apiKey).chat.completions.create({ model: 'svc-roast', messages: ask('Roast this.'), stream: true }));
    expect(err.status).toBe(503);
    expect(err.code).toBe('tool_unavailable');
    expect(err.message).toMatch(/language-model upstream failed: 500/);
    expect(await h.credits(acct.accountId)).toBe(10);
  });

  it('an upstream failure without streaming is 503 tool_unavailable in OpenAI shape, not charged', async () => {
    llm.enqueue({ type: 'error', status: 500, message: 'upstream exploded' });
    const acct = await h.account('starter', 10);
    const err = await failure(client(acct.apiKey).chat.completions.create({ model: 'svc-hints', messages: ask('Explain.') }));
    expect(err.status).toBe(503);
    expect(err.code).toBe('tool_unavailable');
    expect(err.type).toBe('server_error');
    expect(await h.credits(acct.accountId)).toBe(10);
  });
});

describe('errors in OpenAI shape', () => {
  let starter: TestAccount;
  beforeAll(async () => {
    starter = await h.account('starter', 100);
  });

  const raw = (body: unknown, apiKey?: string) =>
    h.request({
      method: 'POST',
      url: '/v1/chat/completions',
      headers: { 'content-type': 'application/json', ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}) },
      payload: typeof body === 'string' ? body : JSON.stringify(body),
    });

  it('no key is 401 unauthorized with exactly message, type, param and code', async () => {
    const res = await raw({ model: 'svc-hints', messages: ask('x') });
    expect(res.statusCode).toBe(401);
    const { error } = json(res);
    expect(error).toMatchObject({ type: 'authentication_error', param: null, code: 'unauthorized' });
    expect(typeof error.message).toBe('string');

    const e = await failure(new OpenAI({ apiKey: 'cv_' + 'A'.repeat(40), baseURL, maxRetries: 0 }).models.list());
    expect(e.status).toBe(401);
    expect(e.code).toBe('key_not_found');
  });

  it('no credit is 402 insufficient_credits with x-should-retry: false', async () => {
    const broke = await h.account('starter', 0);
    const err = await failure(client(broke.apiKey).chat.completions.create({ model: 'svc-hints', messages: ask('x') }));
    expect(err.status).toBe(402);
    expect(err.code).toBe('insufficient_credits');
    expect(err.type).toBe('insufficient_quota');
    expect(err.headers?.get('x-should-retry')).toBe('false');
  });

  it('a model above the plan is 403 plan_required with x-should-retry: false', async () => {
    const err = await failure(client(starter.apiKey).chat.completions.create({ model: 'svc-genius', messages: ask('x') }));
    expect(err.status).toBe(403);
    expect(err.code).toBe('plan_required');
    expect((err.error as { required_plan?: string }).required_plan).toBe('pro');
    expect(err.headers?.get('x-should-retry')).toBe('false');
  });

  it('an unknown model is 404 tool_not_found naming the model param', async () => {
    const err = await failure(client(starter.apiKey).chat.completions.create({ model: 'gpt-4o', messages: ask('x') }));
    expect(err.status).toBe(404);
    expect(err.code).toBe('tool_not_found');
    expect(err.param).toBe('model');
  });

  it.each([
    ['no messages', { model: 'svc-hints', messages: [] }, 'messages'],
    ['a last message that is not the user\u2019s', { model: 'svc-hints', messages: [{ role: 'assistant', content: 'hi' }] }, 'messages'],
    ['max_tokens below what the tool accepts', { model: 'svc-hints', messages: ask('x'), max_tokens: 2 }, 'max_tokens'],
    ['a problem longer than the tool accepts', { model: 'svc-hints', messages: ask('x'.repeat(20_001)) }, 'messages[0].content'],
    ['n above 1', { model: 'svc-hints', messages: ask('x'), n: 2 }, 'n'],
  ])('%s is 400 invalid_input with param %s', async (_l, body, param) => {
    const res = await raw(body, starter.apiKey);
    expect(res.statusCode).toBe(400);
    expect(json(res).error).toMatchObject({ type: 'invalid_request_error', code: 'invalid_input', param });
  });

  it('malformed JSON is 400 in OpenAI shape', async () => {
    const res = await raw('{"model": ', starter.apiKey);
    expect(res.statusCode).toBe(400);
    expect(json(res).error).toMatchObject({ type: 'invalid_request_error', code: 'invalid_input' });
  });

  it('a wrong method on these paths is 404 in OpenAI shape too', async () => {
    const res = await h.request({ method: 'GET', url: '/v1/chat/completions' });
    expect(res.statusCode).toBe(404);
    expect(json(res).error).toMatchObject({ type: 'invalid_request_error', code: 'not_found', param: null });
  });

  it('other paths keep the service envelope', async () => {
    const res = await h.call('compute', { expression: '1' });
    expect(json(res).error).toMatchObject({ code: 'unauthorized', request_id: expect.any(String) });
    expect(json(res).error.type).toBeUndefined();
  });
});

describe('Idempotency-Key on chat completions', () => {
  it('a retry with the same key gets the first completion and is charged once; streaming refuses the key', async () => {
    const acct = await h.account('starter', 50);
    const before = llm.requests.length;
    const send = () =>
      h.request({
        method: 'POST',
        url: '/v1/chat/completions',
        headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json', 'idempotency-key': 'chat-1' },
        payload: JSON.stringify({ model: 'svc-hints', messages: ask('idempotent?') }),
      });
    const first = await send();
    expect(first.statusCode).toBe(200);
    const again = await send();
    expect(again.statusCode).toBe(200);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(json(again).id).toBe(json(first).id);
    expect(llm.requests.length - before).toBe(1);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    const streamed = await h.request({
      method: 'POST',
      url: '/v1/chat/completions',
      headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json', 'idempotency-key': 'chat-2' },
      payload: JSON.stringify({ model: 'svc-hints', stream: true, messages: ask('x') }),
    });
    expect(streamed.statusCode).toBe(400);
    expect(json(streamed).error).toMatchObject({ code: 'invalid_input', type: 'invalid_request_error' });
  });
});

describe('Idempotency-Key on a chat completion whose client hangs up', () => {
  it('keeps the key: the retry gets the completion of the first job, charged once', async () => {
    const acct = await h.account('starter', 50);
    const gate = deferred();
    llm.enqueue({ type: 'tokens', tokens: ['Slow ', 'answer.'], beforeToken: (i) => (i === 0 ? gate.promise : undefined) });
    const before = llm.requests.length;
    const send = (signal?: AbortSignal) =>
      fetch(`${baseURL}/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json', 'idempotency-key': 'chat-gone-1' },
        body: JSON.stringify({ model: 'svc-hints', messages: ask('slow one') }),
        signal,
      });
    const abort = new AbortController();
    const first = send(abort.signal).catch((e: Error) => e);
    // The model has the request: the job runs. The client hangs up.
    while (llm.requests.length === before) await new Promise((r) => setTimeout(r, 10));
    abort.abort();
    expect(await first).toBeInstanceOf(Error);
    await new Promise((r) => setTimeout(r, 100));
    gate.resolve();
    const retry = await send();
    expect(retry.status).toBe(200);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    const body = (await retry.json()) as { object: string; choices: Array<{ message: { content: string } }> };
    expect(body.object).toBe('chat.completion');
    expect(body.choices[0]!.message.content).toBe('Slow answer.');
    expect(llm.requests.length - before).toBe(1);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
  });
});
