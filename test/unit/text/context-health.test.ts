import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { contextHealth } from '../../../src/tools/text/context-health.js';
import { conversationTokens } from '../../../src/tools/text/conversation.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { conversationArb } from './conversations-b.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const { ctx } = makeToolContext();
const run = (input: unknown) => contextHealth.handler(contextHealth.input.parse(input), ctx);

describe('context_health', () => {
  it('fill_ratio equals total / window (property)', async () => {
    await fc.assert(
      fc.asyncProperty(conversationArb, fc.integer({ min: 1000, max: 200_000 }), async (messages, window) => {
        const r = await run({ messages, window });
        expect(r.tokens.total).toBe(conversationTokens(messages));
        expect(r.fill_ratio).toBe(r.tokens.total / window);
        expect(Object.values(r.tokens.by_role).reduce((a, b) => a + b, 0)).toBe(r.tokens.total);
        expect(contextHealth.outputSchema!.safeParse(r).success).toBe(true);
        expect(JSON.stringify(await run({ messages, window }))).toBe(JSON.stringify(r));
      }),
      { numRuns: 40 },
    );
  });

  it('finds duplicates and superseded tool outputs, and recommends by status', async () => {
    const r = await run(contextHealth.examples[0]);
    expect(r.duplicates).toEqual([{ i: 3, duplicate_of: 1, tokens: expect.any(Number) }]);
    expect(r.status).toBe('ok');
    const messages = [
      { role: 'user', content: 'x' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'a', type: 'function', function: { name: 'ls', arguments: '{}' } }] },
      { role: 'tool', tool_call_id: 'a', content: 'one' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'b', type: 'function', function: { name: 'ls', arguments: '{}' } }] },
      { role: 'tool', tool_call_id: 'b', content: 'two' },
    ];
    const s = await run({ messages, window: 1000 });
    expect(s.stale_tool_outputs).toEqual([{ i: 2, tool: 'ls', tokens: expect.any(Number), reason: 'superseded' }]);
    const full = await run({ transcript: 'user: ' + 'word '.repeat(950), window: 1000 });
    expect(full.status).toBe('handoff');
    expect(full.recommended.join(' ')).toMatch(/handoff/);
  });

  it('parses transcripts (continuation lines, aliases)', async () => {
    const r = await run({ transcript: 'Human: hi\nthere\nAI: hello', window: 1000 });
    expect(r.messages).toBe(2);
    expect(r.tokens.by_role.user).toBeGreaterThan(0);
  });

  it('refuses input past the caps and ambiguous input', () => {
    expect(contextHealth.input.safeParse({ transcript: 'x'.repeat(400_001) }).success).toBe(false);
    expect(contextHealth.input.safeParse({ messages: Array.from({ length: 1001 }, () => ({ role: 'user', content: 'a' })) }).success).toBe(false);
    expect(
      contextHealth.input.safeParse({
        messages: [
          { role: 'user', content: 'x'.repeat(200_001) },
          { role: 'user', content: 'x'.repeat(200_000) },
        ],
      }).success,
    ).toBe(false);
    expect(contextHealth.input.safeParse({ messages: [{ role: 'user', content: 'a' }], transcript: 'user: a' }).success).toBe(false);
    expect(contextHealth.input.safeParse({}).success).toBe(false);
  });

  it('largestInput finishes within its limits', async () => {
    const t = cpuNow();
    const r = await run(contextHealth.largestInput!());
    expect(r.messages).toBe(1000);
    expect(cpuNow() - t).toBeLessThan(contextHealth.limits!.timeMs ?? 5000);
  });
});
