import type { IncomingMessage } from 'node:http';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import OpenAI, { APIError, AuthenticationError, BadRequestError, InternalServerError, NotFoundError, RateLimitError } from 'openai';
import { startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';

/**
 * The OpenAI-compatible endpoints say what they do: a request field these models cannot honour is a
 * 400 naming it (never a 200 that ignored it), every error under /v1 is an error the `openai` package
 * parses, and a failure a retry cannot fix says so (`x-should-retry: false`), so the package sends it
 * once. Driven with the real `openai` package, with its default retries unless a test says otherwise.
 */

let h: Harness;
let bare: Harness;
let llm: FakeOpenAI;
let baseURL: string;
let bareURL: string;
/** Requests that reached each service, by path (counted at the HTTP server, before any routing). */
const seen = new Map<string, string[]>();

function count(app: Harness['app'], name: string) {
  app.server.on('request', (req: IncomingMessage) => seen.get(name)!.push(`${req.method} ${req.url}`));
}

beforeAll(async () => {
  llm = await startFakeOpenAI();
  h = await startHarness({ LLM_BASE_URL: llm.baseURL });
  baseURL = `${await h.app.listen({ port: 0, host: '127.0.0.1' })}/v1`;
  // No language-model upstream: the models are 503 tool_unavailable at admission.
  bare = await startHarness({}, { workers: [] });
  bareURL = `${await bare.app.listen({ port: 0, host: '127.0.0.1' })}/v1`;
  count(h.app, 'h');
  count(bare.app, 'bare');
});
afterAll(async () => {
  await h.close();
  await bare.close();
  await llm.close();
});
beforeEach(() => {
  seen.set('h', []);
  seen.set('bare', []);
});

/** The SDK as applications use it: its default two retries, shortened so a wrong retry shows quickly. */
const client = (apiKey: string, url = baseURL) => new OpenAI({ apiKey, baseURL: url, timeout: 20_000 });
const ask = (content: string) => [{ role: 'user' as const, content }];

/** The message the service wrote (the SDK's own `message` puts the status in front). */
const said = (e: APIError) => (e.error as { message?: string }).message;

async function failure<E extends APIError>(p: Promise<unknown>, type: { prototype: E }): Promise<E> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(type);
  return e as E;
}

describe('fields these models cannot honour are refused, not ignored', () => {
  let acct: TestAccount;
  beforeAll(async () => {
    acct = await h.account('starter', 100);
  });

  const refusals: Array<[string, Record<string, unknown>, string, RegExp]> = [
    [
      'tools',
      { tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } }] },
      'tools',
      /^Function calling is not available/,
    ],
    ['tool_choice: required', { tool_choice: 'required' }, 'tool_choice', /can only be 'none' or 'auto'/],
    ['functions (the older name)', { functions: [{ name: 'f', parameters: {} }] }, 'functions', /^Function calling is not available/],
    [
      'response_format json_schema',
      { response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } } },
      'response_format',
      /^Structured output is not available/,
    ],
    ['response_format json_object', { response_format: { type: 'json_object' } }, 'response_format', /^Structured output is not available/],
    ['n: 2', { n: 2 }, 'n', /^'n' must be 1/],
    ['stop sequences', { stop: ['\n'] }, 'stop', /^Stop sequences are not available/],
    ['logprobs', { logprobs: true }, 'logprobs', /log probabilities are not available/],
    ['logit_bias', { logit_bias: { '50256': -100 } }, 'logit_bias', /not available/],
    ['audio output', { modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'wav' } }, 'modalities', /^Audio output is not available/],
    ['web search', { web_search_options: {} }, 'web_search_options', /^Web search is not available/],
    ['a field OpenAI does not have', { top_k: 5 }, 'top_k', /^Unrecognized request argument supplied: top_k\.$/],
  ];

  it.each(refusals)('%s is a BadRequestError naming the field, sent once, nothing run or charged', async (_l, extra, param, message) => {
    const before = llm.requests.length;
    const err = await failure(client(acct.apiKey).chat.completions.create({ model: 'svc-hints', messages: ask('x'), ...extra } as never), BadRequestError);
    expect(err.status).toBe(400);
    expect(err.param).toBe(param);
    expect(err.type).toBe('invalid_request_error');
    expect(err.code).toBe('invalid_input');
    expect(said(err)).toMatch(message);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(seen.get('h')).toEqual(['POST /v1/chat/completions']);
    expect(llm.requests.length).toBe(before);
    expect(await h.credits(acct.accountId)).toBe(100);
  });

  it('streaming refuses them the same way, before any event', async () => {
    const err = await failure(
      client(acct.apiKey).chat.completions.create({ model: 'svc-roast', messages: ask('x'), stream: true, response_format: { type: 'json_object' } }),
      BadRequestError,
    );
    expect(err.param).toBe('response_format');
  });

  it.each([
    [
      'an image part',
      [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'What is this?' },
            { type: 'image_url', image_url: { url: 'https://example.com/a.png' } },
          ],
        },
      ],
      'messages[0].content[1]',
    ],
    [
      'a tool result',
      [
        { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }] },
        { role: 'tool', tool_call_id: 'c1', content: '42' },
        { role: 'user', content: 'So?' },
      ],
      'messages[0].tool_calls',
    ],
  ])('a conversation with %s is refused, naming the message', async (_l, messages, param) => {
    const err = await failure(client(acct.apiKey).chat.completions.create({ model: 'svc-hints', messages } as never), BadRequestError);
    expect(err.param).toBe(param);
  });

  it('their no-op values are accepted, as are fields that only tune sampling, and the answer is charged as before', async () => {
    llm.enqueue({ type: 'tokens', tokens: ['Two ', 'pointers.'], usage: { prompt_tokens: 9, completion_tokens: 2, total_tokens: 11 } });
    const payer = await h.account('starter', 20);
    const res = await client(payer.apiKey).chat.completions.create({
      model: 'svc-hints',
      messages: ask('Cycle in a linked list?'),
      n: 1,
      tools: [],
      tool_choice: 'none',
      response_format: { type: 'text' },
      logprobs: false,
      modalities: ['text'],
      temperature: 1.5,
      top_p: 0.5,
      seed: 7,
      user: 'u-1',
      metadata: { run: 'a' },
      store: false,
      parallel_tool_calls: false,
    });
    expect(res.choices[0]!.message.content).toBe('Two pointers.');
    expect((res as unknown as { tollgate: unknown }).tollgate).toMatchObject({ cost_cents: 5, remaining_credits: 15 });
    expect(await h.credits(payer.accountId)).toBe(15);
    expect(await h.ledgerCharges(payer.accountId)).toBe(1);
    // Nothing asked of the model beyond the tool's own request: no tools, no format, the tool's temperature.
    const sent = llm.requests.at(-1)!.body;
    expect(sent.tools).toBeUndefined();
    expect(sent.response_format).toBeUndefined();
    expect(sent.temperature).toBe(0.4);
  });
});

describe('a failure a retry cannot fix is sent once', () => {
  it('a 503 because no model upstream is configured reaches the service once, x-should-retry: false', async () => {
    const acct = await bare.account('starter', 10);
    const err = await failure(client(acct.apiKey, bareURL).chat.completions.create({ model: 'svc-hints', messages: ask('x') }), InternalServerError);
    expect(err.status).toBe(503);
    expect(err.type).toBe('server_error');
    expect(err.code).toBe('tool_unavailable');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(seen.get('bare')).toEqual(['POST /v1/chat/completions']);
    expect(await bare.credits(acct.accountId)).toBe(10);
  });

  it('a model upstream that fails is one request here and one upstream, not three', async () => {
    llm.enqueue({ type: 'error', status: 500, message: 'upstream exploded' });
    const acct = await h.account('starter', 10);
    const before = llm.requests.length;
    const err = await failure(client(acct.apiKey).chat.completions.create({ model: 'svc-hints', messages: ask('x') }), InternalServerError);
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(seen.get('h')).toEqual(['POST /v1/chat/completions']);
    expect(llm.requests.length - before).toBe(1);
    expect(await h.credits(acct.accountId)).toBe(10);
  });

  it('a busy model upstream (429) may be retried: x-should-retry: true, and the retry is answered', async () => {
    llm.enqueue({ type: 'error', status: 429, message: 'Rate limit reached', errorType: 'rate_limit_error' });
    llm.enqueue({ type: 'tokens', tokens: ['Fine', '.'] });
    const acct = await h.account('starter', 10);
    const res = await client(acct.apiKey).chat.completions.create({ model: 'svc-hints', messages: ask('x') });
    expect(res.choices[0]!.message.content).toBe('Fine.');
    expect(seen.get('h')).toEqual(['POST /v1/chat/completions', 'POST /v1/chat/completions']);
    expect(await h.credits(acct.accountId)).toBe(5);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
  });

  it('a rate limit says it may be retried, and when', async () => {
    const acct = await h.account('enterprise', 100, { rpm: 1 });
    const c = new OpenAI({ apiKey: acct.apiKey, baseURL, maxRetries: 0 });
    await c.chat.completions.create({ model: 'svc-hints', messages: ask('x') });
    const err = await failure(c.chat.completions.create({ model: 'svc-hints', messages: ask('x') }), RateLimitError);
    expect(err.type).toBe('rate_limit_error');
    expect(err.headers?.get('x-should-retry')).toBe('true');
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThan(0);
  });
});

describe('every error under /v1 is one the openai package parses', () => {
  let acct: TestAccount;
  beforeAll(async () => {
    acct = await h.account('starter', 100);
  });

  it('an unknown path is a NotFoundError in OpenAI shape', async () => {
    const err = await failure(client(acct.apiKey).embeddings.create({ model: 'svc-hints', input: 'x' }), NotFoundError);
    expect(err.type).toBe('invalid_request_error');
    expect(err.code).toBe('not_found');
    expect(err.param).toBeNull();
    expect(said(err)).toMatch(/No route POST \/v1\/embeddings/);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    const bad = await failure(client(acct.apiKey).get('/v1'), NotFoundError);
    expect(bad.type).toBe('invalid_request_error');
  });

  it('a missing or unknown key is an AuthenticationError, sent once', async () => {
    const err = await failure(client(`cv_${'A'.repeat(40)}`).chat.completions.create({ model: 'svc-hints', messages: ask('x') }), AuthenticationError);
    expect(err.type).toBe('authentication_error');
    expect(err.code).toBe('key_not_found');
    expect(seen.get('h')).toEqual(['POST /v1/chat/completions']);
  });

  it('no credit is a 402 APIError of type insufficient_quota, sent once', async () => {
    const broke = await h.account('starter', 0);
    const err = await failure(client(broke.apiKey).chat.completions.create({ model: 'svc-hints', messages: ask('x') }), APIError);
    expect(err.status).toBe(402);
    expect(err.type).toBe('insufficient_quota');
    expect(err.code).toBe('insufficient_credits');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(seen.get('h')).toEqual(['POST /v1/chat/completions']);
  });

  it('an unknown model is a NotFoundError naming model', async () => {
    const err = await failure(client(acct.apiKey).chat.completions.create({ model: 'gpt-4o', messages: ask('x') }), NotFoundError);
    expect(err.param).toBe('model');
    expect(err.code).toBe('tool_not_found');
  });

  it('a body that is not JSON is a BadRequestError', async () => {
    // The SDK always sends JSON; this one's transport cuts the body short on the way.
    const broken = new OpenAI({ apiKey: acct.apiKey, baseURL, fetch: (url, init) => fetch(url, { ...init, body: '{"model": ' }) });
    const err = await failure(broken.chat.completions.create({ model: 'svc-hints', messages: ask('x') }), BadRequestError);
    expect(err.type).toBe('invalid_request_error');
    expect(said(err)).toMatch(/^Body is not valid JSON/);
    expect(seen.get('h')).toEqual(['POST /v1/chat/completions']);
  });

  it.each([
    [
      'an unknown role',
      { model: 'svc-hints', messages: [{ role: 'bot', content: 'x' }] },
      'messages[0].role',
      "Invalid value for 'messages[0].role': \"bot\". Supported values are: 'system', 'developer', 'user', 'assistant', 'tool', 'function'.",
    ],
    ['no messages field', { model: 'svc-hints' }, 'messages', "Missing required parameter: 'messages'."],
    ['an empty conversation', { model: 'svc-hints', messages: [] }, 'messages', "'messages' must have at least 1 item."],
    [
      'a number as content',
      { model: 'svc-hints', messages: [{ role: 'user', content: 7 }] },
      'messages[0].content',
      "Invalid type for 'messages[0].content': expected one of string, array, null, but got number instead.",
    ],
    [
      'a wrong type for tools',
      { model: 'svc-hints', messages: ask('x'), tools: 'all' },
      'tools',
      "Invalid type for 'tools': expected array, but got string instead.",
    ],
    ['max_tokens below what the models take', { model: 'svc-hints', messages: ask('x'), max_tokens: 2 }, 'max_tokens', "'max_tokens' must be at least 16."],
    ['a temperature out of range', { model: 'svc-hints', messages: ask('x'), temperature: 3 }, 'temperature', "'temperature' must be at most 2."],
    [
      'a last message that is too long for the tool',
      { model: 'svc-hints', messages: ask('x'.repeat(20_001)) },
      'messages[0].content',
      "'messages[0].content' must be at most 20000 characters long.",
    ],
  ])('%s is a BadRequestError whose param is the field and whose message is a sentence', async (_l, body, param, message) => {
    const err = await failure(client(acct.apiKey).chat.completions.create(body as never), BadRequestError);
    expect(err.param).toBe(param);
    if (message) expect(said(err)).toBe(message);
    // No zod wording reaches the caller.
    expect(said(err)).not.toMatch(/Expected .*, received|Invalid enum value|element\(s\)|character\(s\)/);
    expect(err.headers?.get('x-should-retry')).toBe('false');
  });
});

describe('POST /v1/responses', () => {
  it('answers with one output message from the tool behind the model, with usage, and charges its price once', async () => {
    llm.enqueue({ type: 'tokens', tokens: ['Use ', 'two ', 'pointers.'], usage: { prompt_tokens: 40, completion_tokens: 3, total_tokens: 43 } });
    const acct = await h.account('starter', 20);
    const res = await client(acct.apiKey).responses.create({
      model: 'svc-hints',
      instructions: 'Answer in one sentence.',
      input: 'How do I detect a cycle in a linked list?',
      max_output_tokens: 120,
      metadata: { run: 'r1' },
    });
    expect(res.object).toBe('response');
    expect(res.id).toMatch(/^resp_llm-/);
    expect(res.status).toBe('completed');
    expect(res.output_text).toBe('Use two pointers.');
    expect(res.output).toHaveLength(1);
    expect(res.output[0]).toMatchObject({ type: 'message', role: 'assistant', status: 'completed' });
    expect(res.usage).toMatchObject({ input_tokens: 40, output_tokens: 3, total_tokens: 43 });
    expect(res.metadata).toEqual({ run: 'r1' });
    expect((res as unknown as { tollgate: unknown }).tollgate).toMatchObject({ cost_cents: 5, remaining_credits: 15 });
    expect(await h.credits(acct.accountId)).toBe(15);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    const sent = llm.requests.at(-1)!.body;
    expect(sent.max_tokens).toBe(120);
    expect(sent.messages[1].content).toContain('Answer in one sentence.');
    expect(sent.messages.at(-1).content).toContain('How do I detect a cycle in a linked list?');
  });

  it('takes the conversation as input messages, and a cut-off answer is incomplete', async () => {
    llm.enqueue({ type: 'tokens', tokens: ['Ice ', 'cubes'], finishReason: 'length' });
    const acct = await h.account('starter', 20);
    const res = await client(acct.apiKey).responses.create({
      model: 'svc-roast',
      input: [
        { role: 'user', content: 'My startup sells ice.' },
        { role: 'assistant', content: [{ type: 'output_text', text: 'Cold take.', annotations: [] }] as never },
        { role: 'user', content: [{ type: 'input_text', text: 'Artisanal ice cubes, by subscription.' }] },
      ],
    });
    expect(res.status).toBe('incomplete');
    expect(res.incomplete_details).toEqual({ reason: 'max_output_tokens' });
    expect(res.output_text).toBe('Ice cubes');
    const sent = llm.requests
      .at(-1)!
      .body.messages.map((m: { content: string }) => m.content)
      .join('\n');
    expect(sent).toContain('My startup sells ice.');
    expect(sent).toContain('Cold take.');
    expect(sent).toContain('Artisanal ice cubes, by subscription.');
  });

  it('streams the Responses events, one text delta per token, and finalResponse has the answer', async () => {
    llm.enqueue({ type: 'tokens', tokens: ['one ', 'two ', 'three'], usage: { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 } });
    const acct = await h.account('starter', 10);
    const stream = client(acct.apiKey).responses.stream({ model: 'svc-hints', input: 'Count to three.' });
    const types: string[] = [];
    const deltas: string[] = [];
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === 'response.output_text.delta') deltas.push(event.delta);
    }
    const final = await stream.finalResponse();
    expect(deltas).toEqual(['one ', 'two ', 'three']);
    expect(types).toEqual([
      'response.created',
      'response.in_progress',
      'response.output_item.added',
      'response.content_part.added',
      'response.output_text.delta',
      'response.output_text.delta',
      'response.output_text.delta',
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
      'response.completed',
    ]);
    expect(final.output_text).toBe('one two three');
    expect(final.usage).toMatchObject({ input_tokens: 5, output_tokens: 3, total_tokens: 8 });
    expect(await h.credits(acct.accountId)).toBe(5);
  });

  it('a failure after the stream started is raised by the SDK, and nothing is charged', async () => {
    llm.enqueue({ type: 'stream-error', tokens: ['Half '], message: 'The model overloaded' });
    const acct = await h.account('starter', 10);
    const stream = await client(acct.apiKey).responses.create({ model: 'svc-hints', input: 'Explain.', stream: true });
    const err = await (async () => {
      for await (const _event of stream) {
        /* read to the end */
      }
    })().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(APIError);
    expect((err as APIError).message).toMatch(/language-model upstream failed/);
    expect(await h.credits(acct.accountId)).toBe(10);
  });

  it.each([
    ['tools', { tools: [{ type: 'web_search' }] }, 'tools'],
    ['structured output', { text: { format: { type: 'json_schema', name: 'x', schema: { type: 'object' } } } }, 'text.format'],
    ['a stored conversation', { previous_response_id: 'resp_123' }, 'previous_response_id'],
    ['storing the response', { store: true }, 'store'],
    ['background mode', { background: true }, 'background'],
    ['an image', { input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'https://example.com/a.png' }] }] }, 'input[0].content[0]'],
    ['a function call output', { input: [{ type: 'function_call_output', call_id: 'c', output: '1', role: 'user', content: 'x' }] }, 'input[0].type'],
    ['an unknown field', { top_k: 3 }, 'top_k'],
    ['no input', { input: undefined }, 'input'],
    ['an empty input list', { input: [] }, 'input'],
    ['an unknown model', { model: 'gpt-4o' }, 'model'],
  ])('%s is refused with the field named, sent once, nothing run', async (_l, extra, param) => {
    const acct = await h.account('starter', 10);
    const before = llm.requests.length;
    const err = await failure(client(acct.apiKey).responses.create({ model: 'svc-hints', input: 'x', ...extra } as never), APIError);
    expect([400, 404]).toContain(err.status);
    expect(err.param).toBe(param);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(seen.get('h')).toEqual(['POST /v1/responses']);
    expect(llm.requests.length).toBe(before);
    expect(await h.credits(acct.accountId)).toBe(10);
  });

  it('an Idempotency-Key retry gets the first response and is charged once', async () => {
    const acct = await h.account('starter', 20);
    const c = client(acct.apiKey);
    const first = await c.responses.create({ model: 'svc-hints', input: 'Once?' }, { headers: { 'Idempotency-Key': 'resp-1' } });
    const again = await c.responses.create({ model: 'svc-hints', input: 'Once?' }, { headers: { 'Idempotency-Key': 'resp-1' } });
    expect(again.id).toBe(first.id);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    expect(await h.credits(acct.accountId)).toBe(15);
  });
});

describe('a request an attacker shapes', () => {
  it('an empty input list says it is empty, not that it should be a string', async () => {
    const acct = await h.account('starter', 10);
    const err = await failure(client(acct.apiKey).responses.create({ model: 'svc-hints', input: [] }), BadRequestError);
    expect(said(err)).toBe("'input' must have at least 1 item.");
  });

  it('a body over the limit is a 413 in OpenAI shape, sent once', async () => {
    const acct = await h.account('starter', 10);
    const err = await failure(client(acct.apiKey).chat.completions.create({ model: 'svc-hints', messages: ask('x'.repeat(2_000_000)) }), APIError);
    expect(err.status).toBe(413);
    expect(err.type).toBe('invalid_request_error');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(seen.get('h')).toEqual(['POST /v1/chat/completions']);
  });

  it('a JSON body nested past the limit is a 400 in OpenAI shape', async () => {
    const acct = await h.account('starter', 10);
    const deep = `${'['.repeat(500)}${']'.repeat(500)}`;
    const res = await fetch(`${baseURL}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json' },
      body: `{"model": "svc-hints", "messages": ${deep}}`,
    });
    expect(res.status).toBe(400);
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect((await res.json()).error).toMatchObject({ type: 'invalid_request_error', code: 'invalid_input' });
  });

  it('two identical refused requests at once are both refused, and nothing is charged', async () => {
    const acct = await h.account('starter', 10);
    const c = client(acct.apiKey);
    const both = await Promise.all([1, 2].map(() => failure(c.chat.completions.create({ model: 'svc-hints', messages: ask('x'), n: 3 }), BadRequestError)));
    expect(both.map((e) => e.param)).toEqual(['n', 'n']);
    expect(await h.credits(acct.accountId)).toBe(10);
  });
});
