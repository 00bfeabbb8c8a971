import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startFakeOpenAI, type FakeOpenAI } from '../../helpers/fake-openai.js';

// The fake is only useful if the official client accepts its wire format, so it is checked with it.
describe('fake OpenAI upstream, driven by the official openai SDK', () => {
  let fake: FakeOpenAI;
  let client: OpenAI;

  beforeAll(async () => {
    fake = await startFakeOpenAI({ apiKey: 'sk-fake-test-key-123456' });
    client = new OpenAI({ baseURL: fake.baseURL, apiKey: 'sk-fake-test-key-123456', maxRetries: 0 });
  });
  afterAll(() => fake.close());

  it('lists models', async () => {
    const page = await client.models.list();
    expect(page.data.map((m) => m.id)).toContain('gpt-4o-mini');
  });

  it('answers a non-streaming completion with message and usage', async () => {
    fake.enqueue({ type: 'tokens', tokens: ['4', '2'], usage: { prompt_tokens: 9, completion_tokens: 2, total_tokens: 11 } });
    const res = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'six times seven?' }] });
    expect(res.object).toBe('chat.completion');
    expect(res.choices[0]?.message.content).toBe('42');
    expect(res.choices[0]?.finish_reason).toBe('stop');
    expect(res.usage).toEqual({ prompt_tokens: 9, completion_tokens: 2, total_tokens: 11 });
    expect(fake.requests.at(-1)?.body.messages).toEqual([{ role: 'user', content: 'six times seven?' }]);
  });

  it('streams one chunk per token, a usage chunk, and [DONE]', async () => {
    fake.enqueue({ type: 'tokens', tokens: ['Hel', 'lo', '!'] });
    const stream = client.chat.completions.stream({
      model: 'gpt-4o-mini',
      messages: [{ role: 'user', content: 'hi' }],
      stream_options: { include_usage: true },
    });
    const deltas: string[] = [];
    stream.on('content', (delta) => deltas.push(delta));
    const final = await stream.finalChatCompletion();
    expect(deltas).toEqual(['Hel', 'lo', '!']);
    expect(final.choices[0]?.message.content).toBe('Hello!');
    expect(final.usage?.completion_tokens).toBe(3);
  });

  it('answers a wrong key with 401 in the OpenAI error shape', async () => {
    const bad = new OpenAI({ baseURL: fake.baseURL, apiKey: 'sk-wrong', maxRetries: 0 });
    const err = await bad.models.list().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
    expect((err as InstanceType<typeof OpenAI.AuthenticationError>).code).toBe('invalid_api_key');
  });

  it('answers a scripted 500 as InternalServerError', async () => {
    fake.enqueue({ type: 'error', status: 500, message: 'The server had an error while processing your request.' });
    const err = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'x' }] }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.InternalServerError);
  });
});
