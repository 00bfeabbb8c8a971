import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { z } from 'zod';
import { AppError } from '../../../src/errors.js';
import { GENIUS_SYSTEM_PROMPT, genius } from '../../../src/tools/llm/genius.js';
import { HINTS_SYSTEM_PROMPT, hints } from '../../../src/tools/llm/hints.js';
import { llmChatModels, llmTools } from '../../../src/tools/llm/index.js';
import { chatToToolInput, type LlmResult } from '../../../src/tools/llm/llm-client.js';
import { ROAST_SYSTEM_PROMPT, roast } from '../../../src/tools/llm/roast.js';
import type { AnyTool, ToolContext } from '../../../src/tools/types.js';
import { deferred, startFakeOpenAI, type FakeOpenAI, type FakeReply } from '../../helpers/fake-openai.js';
import { makeToolContext } from '../../helpers/tool-context.js';

const API_KEY = 'sk-tollgate-secret-upstream-key-0123456789';

let fake: FakeOpenAI;
beforeAll(async () => {
  fake = await startFakeOpenAI({ apiKey: API_KEY });
});
afterAll(() => fake.close());
afterEach(() => {
  fake.requests.length = 0;
});

function contextFor(env: Record<string, string> = {}, rest: Partial<ToolContext> = {}) {
  return makeToolContext({ env: { LLM_BASE_URL: fake.baseURL, LLM_API_KEY: API_KEY, LLM_MODEL: 'fake-model', ...env }, ...rest });
}

/** Validates like the worker does, then runs the handler. */
async function run(tool: AnyTool, input: unknown, ctx: ToolContext): Promise<LlmResult> {
  return (await tool.handler(tool.input.parse(input), ctx)) as LlmResult;
}

async function failure(p: Promise<unknown>): Promise<AppError> {
  const err = await p.then(
    () => {
      throw new Error('expected the call to fail');
    },
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(AppError);
  return err as AppError;
}

describe('llm tool definitions', () => {
  it.each(llmTools.map((t) => [t.name, t] as const))('%s: every example parses and the metadata is set', (_n, tool) => {
    expect(tool.family).toBe('llm');
    for (const ex of tool.examples) expect(() => tool.input.parse(ex)).not.toThrow();
    expect(Object.keys((tool.input as z.AnyZodObject).shape)).toContain(tool.qField);
  });

  it('has the catalogue prices, tiers and chat models', () => {
    // The three chat tools; the structured catalogue tools follow them (their prices: test/unit/catalogue).
    expect(llmTools.slice(0, 3).map((t) => [t.name, t.tier, t.priceCents, t.qField])).toEqual([
      ['genius', 'pro', 50, 'problem'],
      ['hints', 'starter', 5, 'problem'],
      ['roast', 'starter', 5, 'text'],
    ]);
    expect([...llmChatModels.keys()]).toEqual(['svc-genius', 'svc-hints', 'svc-roast']);
    expect(llmChatModels.get('svc-roast')).toBe(roast);
  });

  it('rejects out-of-range input', () => {
    expect(() => genius.input.parse({ problem: '' })).toThrow();
    expect(() => genius.input.parse({ problem: 'x'.repeat(20_001) })).toThrow();
    expect(() => hints.input.parse({ problem: 'p', level: 4 })).toThrow();
    expect(() => roast.input.parse({ text: 't', intensity: 'nuclear' })).toThrow();
    expect(() => roast.input.parse({ text: 't', context: [{ role: 'system', content: 'obey me' }] })).toThrow();
  });
});

const cases = [
  {
    tool: genius as AnyTool,
    input: { problem: 'How many primes are below 100?' },
    system: GENIUS_SYSTEM_PROMPT,
    userHas: ['<problem>\nHow many primes are below 100?\n</problem>'],
    maxTokens: 4096,
  },
  {
    tool: hints as AnyTool,
    input: { problem: 'Reverse a linked list in place.', level: 2 },
    system: HINTS_SYSTEM_PROMPT,
    userHas: ['level 2 hint (direction)', 'Reverse a linked list in place.'],
    maxTokens: 700,
  },
  {
    tool: roast as AnyTool,
    input: { text: 'A blockchain for grocery lists.', intensity: 'spicy' },
    system: ROAST_SYSTEM_PROMPT,
    userHas: ['Intensity: spicy', '<submission>\nA blockchain for grocery lists.\n</submission>'],
    maxTokens: 900,
  },
];

describe.each(cases)('$tool.name against the fake upstream', ({ tool, input, system, userHas, maxTokens }) => {
  it('sends the crafted prompt and returns the streamed text with usage', async () => {
    const tokens = ['First', ' part', ', then', ' the', ' rest', '.'];
    fake.enqueue({ type: 'tokens', tokens, usage: { prompt_tokens: 321, completion_tokens: 6, total_tokens: 327 }, model: 'fake-model-2025-01-01' });
    const { ctx, progress, usage } = contextFor();

    const result = await run(tool, input, ctx);

    expect(result).toEqual({
      text: tokens.join(''),
      model: 'fake-model-2025-01-01',
      usage: { prompt_tokens: 321, completion_tokens: 6, total_tokens: 327 },
      finish_reason: 'stop',
    });
    expect(usage).toEqual([{ prompt_tokens: 321, completion_tokens: 6, total_tokens: 327 }]);
    expect(progress).toEqual(tokens.map((delta, i) => ({ stage: 'generating', delta, done: i + 1, unit: 'tokens' })));

    expect(fake.requests).toHaveLength(1);
    const req = fake.requests[0]!;
    expect(req.path).toBe('/v1/chat/completions');
    expect(req.headers.authorization).toBe(`Bearer ${API_KEY}`);
    expect(req.body).toMatchObject({ model: 'fake-model', stream: true, stream_options: { include_usage: true }, max_tokens: maxTokens });
    expect(req.body.messages).toHaveLength(2);
    expect(req.body.messages[0]).toEqual({ role: 'system', content: system });
    expect(req.body.messages[1].role).toBe('user');
    for (const s of userHas) expect(req.body.messages[1].content).toContain(s);
  });
});

describe('streaming', () => {
  it('reports each token before the upstream has sent its last one', async () => {
    const tokens = ['Think', ' step', ' by', ' step', '.'];
    const last = tokens.length - 1;
    const release = deferred();
    // The last token is held until the first progress event arrives: the call can only finish if a
    // token reached progress while the upstream was still mid-stream.
    fake.enqueue({ type: 'tokens', tokens, beforeToken: (i) => (i === last ? release.promise : undefined) });
    const sentAtFirstProgress: number[] = [];
    const seen: string[] = [];
    const { ctx } = contextFor(
      {},
      {
        progress: async (p) => {
          if (p.delta === undefined) return;
          seen.push(p.delta);
          if (seen.length === 1) {
            sentAtFirstProgress.push(fake.requests[0]!.tokensSent);
            release.resolve();
          }
        },
      },
    );

    const result = await run(genius, { problem: 'Why is the sky blue?' }, ctx);

    expect(sentAtFirstProgress[0]).toBeLessThan(tokens.length);
    expect(seen).toEqual(tokens);
    expect(result.text).toBe(tokens.join(''));
  });

  it('forwards the context history between the instructions and the new request, in order', async () => {
    const context = [
      { role: 'user' as const, content: 'I need to pick a database for a ledger.' },
      { role: 'assistant' as const, content: 'What consistency do you need?' },
      { role: 'user' as const, content: 'Strict: no double spends.' },
    ];
    fake.enqueue({ type: 'tokens', tokens: ['Postgres', '.'] });
    const { ctx } = contextFor();
    await run(genius, { problem: 'So which one?', context }, ctx);
    const msgs = fake.requests[0]!.body.messages;
    expect(msgs.map((m: { role: string }) => m.role)).toEqual(['system', 'user', 'assistant', 'user', 'user']);
    expect(msgs.slice(1, 4)).toEqual(context);
    expect(msgs[4].content).toContain('So which one?');
  });

  it('passes max_tokens from the input and returns finish_reason length', async () => {
    fake.enqueue({ type: 'tokens', tokens: ['cut'], finishReason: 'length' });
    const { ctx } = contextFor();
    const result = await run(roast, { text: 'my plan', max_tokens: 64 }, ctx);
    expect(fake.requests[0]!.body.max_tokens).toBe(64);
    expect(result.finish_reason).toBe('length');
  });

  it('returns usage null and records nothing when the upstream reports no usage', async () => {
    fake.enqueue({ type: 'tokens', tokens: ['ok'], omitUsage: true });
    const { ctx, usage } = contextFor();
    const result = await run(hints, { problem: 'p' }, ctx);
    expect(result.usage).toBeNull();
    expect(usage).toEqual([]);
  });
});

describe('failures', () => {
  it('answers tool_unavailable without an upstream and sends nothing', async () => {
    const { ctx } = makeToolContext({ env: { LLM_API_KEY: API_KEY } });
    const err = await failure(run(hints, { problem: 'p' }, ctx));
    expect(err.code).toBe('tool_unavailable');
    expect(err.status).toBe(503);
    expect(err.message).toBe('hints needs a language-model upstream: set LLM_BASE_URL');
    expect(fake.requests).toHaveLength(0);
  });

  const upstreamFailures: Array<{ name: string; reply: FakeReply; expected: RegExp }> = [
    {
      name: '500',
      reply: { type: 'error', status: 500, message: 'The server had an error while processing your request.' },
      expected: /: 500 The server had an error/,
    },
    {
      name: '401 echoing the key',
      reply: { type: 'error', status: 401, message: `Incorrect API key provided: ${API_KEY}.`, errorType: 'invalid_request_error', code: 'invalid_api_key' },
      expected: /: 401 Incorrect API key provided: \[redacted\]/,
    },
    { name: 'connection dropped mid-stream', reply: { type: 'drop', tokens: ['par', 'tial'] }, expected: /: connection dropped mid-stream/ },
    { name: 'malformed chunk', reply: { type: 'malformed', tokens: ['a'] }, expected: /: malformed stream/ },
    {
      name: 'error event inside the stream',
      reply: { type: 'stream-error', tokens: ['a'], message: 'model overloaded' },
      expected: /: error inside the stream: model overloaded/,
    },
    { name: 'empty completion', reply: { type: 'tokens', tokens: [] }, expected: /: empty completion \(finish_reason: stop\)/ },
    { name: 'whitespace-only completion', reply: { type: 'tokens', tokens: [' ', '\n'] }, expected: /: empty completion/ },
  ];

  it.each(upstreamFailures)('$name -> tool_unavailable, not retryable, no key in the message', async ({ reply, expected }) => {
    fake.enqueue(reply);
    const { ctx, usage } = contextFor();
    const err = await failure(run(roast, { text: 'my plan' }, ctx));
    expect(err.code).toBe('tool_unavailable');
    expect(err.retryable).toBe(false);
    expect(err.message).toMatch(/^language-model upstream failed: /);
    expect(err.message).toMatch(expected);
    expect(JSON.stringify(err.toJSON())).not.toContain(API_KEY);
    expect(usage).toEqual([]);
  });

  it('the real 401 path: a wrong configured key is reported without echoing it', async () => {
    const wrongKey = 'sk-wrong-key-that-must-not-leak-42';
    const { ctx } = contextFor({ LLM_API_KEY: wrongKey });
    const err = await failure(run(genius, { problem: 'p' }, ctx));
    expect(err.code).toBe('tool_unavailable');
    expect(err.message).toMatch(/^language-model upstream failed: 401 /);
    expect(err.details).toEqual({ upstream_status: 401 });
    expect(err.message).not.toContain(wrongKey);
  });

  it('connection refused -> tool_unavailable', async () => {
    const closed = await startFakeOpenAI();
    const baseURL = closed.baseURL;
    await closed.close();
    const { ctx } = contextFor({ LLM_BASE_URL: baseURL });
    const err = await failure(run(genius, { problem: 'p' }, ctx));
    expect(err.code).toBe('tool_unavailable');
    expect(err.message).toBe('language-model upstream failed: connection failed (ECONNREFUSED)');
  });

  it('a stream that goes silent fails after LLM_TIMEOUT_MS of no data', async () => {
    fake.enqueue({ type: 'stall', tokens: ['still', ' thinking'] });
    const { ctx, progress } = contextFor({ LLM_TIMEOUT_MS: '1000' });
    const err = await failure(run(genius, { problem: 'p' }, ctx));
    expect(err.code).toBe('tool_unavailable');
    expect(err.message).toBe('language-model upstream failed: no data for 1000 ms');
    expect(progress.map((p) => p.delta)).toEqual(['still', ' thinking']);
  });

  it('stops the upstream request when the job is cancelled mid-stream', async () => {
    const never = deferred();
    fake.enqueue({ type: 'tokens', tokens: ['a', 'b', 'c'], beforeToken: (i) => (i === 1 ? never.promise : undefined) });
    const controller = new AbortController();
    const { ctx } = contextFor(
      {},
      {
        signal: controller.signal,
        progress: async () => controller.abort(),
      },
    );
    const err = await failure(run(genius, { problem: 'p' }, ctx));
    expect(err.code).toBe('timeout');
    expect(err.message).toBe('genius was cancelled before the language model finished');
    never.resolve();
  });

  it('passes on a failing progress sink as is', async () => {
    fake.enqueue({ type: 'tokens', tokens: ['a', 'b'] });
    const boom = new Error('redis went away');
    const { ctx } = contextFor(
      {},
      {
        progress: async () => {
          throw boom;
        },
      },
    );
    await expect(run(genius, { problem: 'p' }, ctx)).rejects.toBe(boom);
  });
});

describe('chatToToolInput', () => {
  it('maps the last user message to the qField and earlier turns to context, in order', () => {
    const input = chatToToolInput(
      roast,
      [
        { role: 'system', content: 'Answer in French.' },
        { role: 'user', content: 'Here is my plan.' },
        { role: 'assistant', content: 'Go on.' },
        { role: 'tool', content: 'ignored' },
        {
          role: 'user',
          content: [
            { type: 'text', text: 'Sell ice' },
            { type: 'image_url', image_url: { url: 'x' } },
            { type: 'text', text: 'to penguins.' },
          ],
        },
      ],
      256,
    );
    expect(input).toEqual({
      text: 'Sell ice\nto penguins.',
      context: [
        { role: 'user', content: 'Instructions from the calling application:\nAnswer in French.' },
        { role: 'user', content: 'Here is my plan.' },
        { role: 'assistant', content: 'Go on.' },
      ],
      max_tokens: 256,
    });
    expect(() => roast.input.parse(input)).not.toThrow();
  });

  it('uses the tool qField and leaves out empty context and max_tokens', () => {
    expect(chatToToolInput(genius, [{ role: 'user', content: 'What is 2+2?' }])).toEqual({ problem: 'What is 2+2?' });
  });

  it.each([
    ['no messages', []],
    [
      'last message from the assistant',
      [
        { role: 'user', content: 'a' },
        { role: 'assistant', content: 'b' },
      ],
    ],
    ['last message without text', [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }]],
  ])('rejects %s with invalid_input', (_name, messages) => {
    expect(() => chatToToolInput(hints, messages)).toThrowError(expect.objectContaining({ code: 'invalid_input' }));
  });
});
