import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { handoff } from '../../../src/tools/text/handoff.js';
import { countTokens } from '../../../src/tools/text/tokens.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { conversationArb } from './conversations-b.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const { ctx } = makeToolContext();
const run = (input: unknown) => handoff.handler(handoff.input.parse(input), ctx);

describe('handoff', () => {
  it('the brief fits its budget when recounted (property, including huge messages)', async () => {
    const huge = fc.constantFrom('', 'We decided to keep it. '.repeat(400), 'TODO: x. '.repeat(900), 'word '.repeat(3000));
    await fc.assert(
      fc.asyncProperty(conversationArb, huge, fc.integer({ min: 200, max: 8000 }), async (messages, extra, budget) => {
        const input = { messages: [...messages, { role: 'user', content: extra || 'ok' }], budget_tokens: budget };
        const r = await run(input);
        expect(countTokens(r.brief_markdown)).toBe(r.tokens);
        expect(r.tokens).toBeLessThanOrEqual(budget);
        expect(handoff.outputSchema!.safeParse(r).success).toBe(true);
        expect(JSON.stringify(await run(input))).toBe(JSON.stringify(r));
      }),
      { numRuns: 40 },
    );
  });

  it('the example brief carries goal, state, decisions, todos, questions and constraints', async () => {
    const r = await run(handoff.examples[0]);
    expect(r.brief.goal).toBe('Add rate limiting to the public API.');
    expect(r.brief.state).toBe('Per minute is simpler to explain. TODO: add tests for burst traffic.');
    expect(r.brief.decisions).toEqual(['We decided to use a token bucket per API key, stored in Redis.']);
    expect(r.brief.todos).toEqual(['TODO: add tests for burst traffic.']);
    expect(r.brief.open_questions).toEqual(['Should the limit be per minute or per second?']);
    expect(r.brief.constraints).toEqual(['You are a coding assistant. Never push to main directly.'.split('. ')[1]!]);
    expect(r.brief_markdown).toMatch(/^# Handoff/);
  });

  it('refuses budgets outside 200-8,000 and input past the caps; largestInput finishes within its limits', async () => {
    expect(handoff.input.safeParse({ transcript: 'user: a', budget_tokens: 199 }).success).toBe(false);
    expect(handoff.input.safeParse({ transcript: 'user: a', budget_tokens: 8001 }).success).toBe(false);
    expect(handoff.input.safeParse({ transcript: 'x'.repeat(400_001) }).success).toBe(false);
    const t = cpuNow();
    const r = await run(handoff.largestInput!());
    expect(r.tokens).toBeLessThanOrEqual(8000);
    expect(cpuNow() - t).toBeLessThan(handoff.limits!.timeMs ?? 5000);
  });
});
