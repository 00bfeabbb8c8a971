import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { contextExtract } from '../../../src/tools/text/context-extract.js';
import { conversationOf } from '../../../src/tools/text/conversation.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { conversationArb } from './conversations-b.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const { ctx } = makeToolContext();
const run = (input: unknown) => contextExtract.handler(contextExtract.input.parse(input), ctx);

describe('context_extract', () => {
  it('quotes slice back out of their messages (property, messages and transcripts)', async () => {
    const line = fc
      .array(
        fc.oneof(
          fc.lorem({ maxCount: 12 }),
          fc.constantFrom(
            'We decided to ship on Monday.',
            'TODO: fix the flaky test',
            'Is it done?',
            'It must not exceed 5 MB.',
            'See https://example.com/x.',
            'I wrote src/app.ts. ',
            'e.g. this. ',
            '```\ncode\n```',
          ),
        ),
        { maxLength: 6 },
      )
      .map((p) => p.join(' '));
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          conversationArb.map((messages) => ({ messages })),
          fc
            .array(fc.tuple(fc.constantFrom('user', 'assistant', 'system'), line), { minLength: 1, maxLength: 8 })
            .map((ls) => ({ transcript: ls.map(([r, t]) => `${r}: ${t}`).join('\n') })),
        ),
        async (input) => {
          const r = await run(input);
          const messages = conversationOf(contextExtract.input.parse(input));
          for (const it of r.items) expect(messages[it.message_index]!.content!.slice(it.start, it.end)).toBe(it.text);
          // In conversation order.
          for (let k = 1; k < r.items.length; k++) {
            const a = r.items[k - 1]!;
            const b = r.items[k]!;
            expect(a.message_index < b.message_index || (a.message_index === b.message_index && a.end <= b.start)).toBe(true);
          }
          expect(contextExtract.outputSchema!.safeParse(r).success).toBe(true);
          expect(JSON.stringify(await run(input))).toBe(JSON.stringify(r));
        },
      ),
      { numRuns: 60 },
    );
  });

  it('finds each kind in the example', async () => {
    const r = await run(contextExtract.examples[0]);
    const byKind = (k: string) => r.items.filter((i) => i.kind === k).map((i) => i.text);
    expect(byKind('constraint')).toEqual(['Answers must be under 200 words.']);
    expect(byKind('decision')).toEqual(['We decided to use Postgres 16 because of its row-level locking.']);
    expect(byKind('artifact')).toEqual(['I wrote the schema to db/ledger.sql.']);
    expect(byKind('todo')).toEqual(['TODO: add a migration for the refunds table.']);
    expect(byKind('open_question')).toEqual(['Should we use Postgres or MySQL for the ledger?', 'Is the deadline still Friday?']);
  });

  it('filters kinds, caps items, refuses input past the caps', async () => {
    const r = await run({ ...contextExtract.examples[0], kinds: ['todo'], max_items: 1 });
    expect(r.items.map((i) => i.kind)).toEqual(['todo']);
    const capped = await run({ ...contextExtract.examples[0], max_items: 1 });
    expect(capped).toMatchObject({ truncated: true });
    expect(capped.items).toHaveLength(1);
    expect(contextExtract.input.safeParse({ transcript: 'x'.repeat(400_001) }).success).toBe(false);
    expect(contextExtract.input.safeParse({ transcript: 'user: a', max_items: 5001 }).success).toBe(false);
  });

  it('largestInput finishes within its limits', async () => {
    const t = cpuNow();
    await run(contextExtract.largestInput!());
    expect(cpuNow() - t).toBeLessThan(contextExtract.limits!.timeMs ?? 5000);
  });
});
