import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { contextCompress } from '../../../src/tools/text/context-compress.js';
import { conversationTokens, lastUserIndex, messageTokens, type Message } from '../../../src/tools/text/conversation.js';
import { AppError } from '../../../src/errors.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { conversationArb, isValidChat } from './conversations-b.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const run = (input: unknown) => {
  const { ctx } = makeToolContext();
  return contextCompress.handler(contextCompress.input.parse(input), ctx);
};

/** The smallest budget the protected messages allow. */
function floor(messages: Message[]): number {
  const last = lastUserIndex(messages);
  return messages.reduce((a, m, i) => a + (m.role === 'system' || i === last ? messageTokens(m) : 0), 0);
}

describe('context_compress', () => {
  it('stays a valid chat transcript, fits its budget recounted, keeps order, system and last user verbatim (property)', async () => {
    await fc.assert(
      fc.asyncProperty(conversationArb, fc.double({ min: 0, max: 1, noNaN: true }), fc.integer({ min: 1, max: 20 }), async (messages, f, keep) => {
        const min = Math.max(50, floor(messages));
        const budget = Math.round(min + f * Math.max(0, conversationTokens(messages) - min));
        const r = await run({ messages, budget_tokens: budget, keep_last_turns: keep });
        expect(contextCompress.outputSchema!.safeParse(r).success).toBe(true);
        expect(conversationTokens(r.messages)).toBe(r.tokens_after);
        expect(r.tokens_after).toBeLessThanOrEqual(budget);
        expect(isValidChat(r.messages)).toBe(true);
        // Order preserved: kept indices ascend, and each kept message has its original role.
        for (let k = 1; k < r.kept.length; k++) expect(r.kept[k]!).toBeGreaterThan(r.kept[k - 1]!);
        r.kept.forEach((i, k) => expect(r.messages[k]!.role).toBe(messages[i]!.role));
        const last = lastUserIndex(messages);
        expect(r.kept).toContain(last);
        expect(r.messages[r.kept.indexOf(last)]).toEqual(messages[last]);
        expect(r.messages[0]).toEqual(messages[0]);
        expect(JSON.stringify(await run({ messages, budget_tokens: budget, keep_last_turns: keep }))).toBe(JSON.stringify(r));
      }),
      { numRuns: 60 },
    );
  });

  it('leaves a conversation that fits alone', async () => {
    const messages = [
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: 'hello' },
    ];
    const r = await run({ messages, budget_tokens: 1000 });
    expect(r.actions).toEqual([]);
    expect(r.messages).toEqual(messages.map((m) => ({ ...m })));
  });

  it('trims the tool output before dropping turns (example 2)', async () => {
    const r = await run(contextCompress.examples[1]);
    expect(r.actions[0]).toMatchObject({ i: 3, action: 'trim_tool_output' });
    expect(r.tokens_after).toBeLessThanOrEqual(150);
    expect(isValidChat(r.messages as Message[])).toBe(true);
  });

  it('refuses a budget below the protected messages', async () => {
    const messages = [
      { role: 'system', content: 'word '.repeat(200) },
      { role: 'user', content: 'hi' },
    ];
    await expect(run({ messages, budget_tokens: 50 })).rejects.toMatchObject({ code: 'invalid_input' });
    await expect(run({ messages, budget_tokens: 50 })).rejects.toBeInstanceOf(AppError);
  });

  it('a 390,000-letter run without spaces (quadratic in the js-tiktoken BPE) is counted in bounded time and compressed to the budget', async () => {
    const t = Date.now();
    const r = await run({
      messages: [
        { role: 'user', content: 'first' },
        { role: 'assistant', content: 'x'.repeat(390_000) },
        { role: 'user', content: 'next?' },
      ],
      budget_tokens: 100,
    });
    expect(r.tokens_after).toBeLessThanOrEqual(100);
    expect(r.tokens_before).toBeGreaterThan(40_000);
    // A liveness bound: the quadratic BPE would take minutes on this run; bounded counting takes about a
    // second, 5 s on a loaded CI machine (5.05 s seen), so the bound is 20 s.
    expect(Date.now() - t).toBeLessThan(20_000);
  });

  it('counts special-token spellings as text', async () => {
    const r = await run({ transcript: 'user: what is <|endoftext|> and <|im_start|>?\nassistant: special tokens.\nuser: ok', budget_tokens: 1000 });
    expect(r.tokens_before).toBeGreaterThan(10);
  });

  it('refuses inputs past the caps', () => {
    expect(contextCompress.input.safeParse({ transcript: 'user: hi', budget_tokens: 10 }).success).toBe(false);
    expect(contextCompress.input.safeParse({ transcript: 'user: hi', budget_tokens: 100, keep_last_turns: 21 }).success).toBe(false);
    expect(contextCompress.input.safeParse({ transcript: 'x'.repeat(400_001), budget_tokens: 100 }).success).toBe(false);
  });

  it('largestInput finishes within its limits and reports progress', async () => {
    const { ctx, progress } = makeToolContext();
    const t = cpuNow();
    const r = await contextCompress.handler(contextCompress.input.parse(contextCompress.largestInput!()), ctx);
    expect(r.tokens_after).toBeLessThanOrEqual(2000);
    expect(cpuNow() - t).toBeLessThan(contextCompress.limits!.timeMs ?? 5000);
    expect(progress.length).toBeGreaterThan(0);
  });
});
