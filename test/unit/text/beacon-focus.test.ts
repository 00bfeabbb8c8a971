import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { getEncoding } from 'js-tiktoken';
import { beaconFocus } from '../../../src/tools/text/beacon-focus.js';
import { codeTerms } from '../../../src/tools/text/bm25.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const o200k = getEncoding('o200k_base');
const run = (input: unknown) => beaconFocus.handler(beaconFocus.input.parse(input), makeToolContext().ctx);

const LINES = [
  'const user = await getUser(id);',
  'if (!user) throw new NotFound("user");',
  '10:00:03 ERROR job 42 timeout after 5000 ms',
  '10:00:04 WARN retrying job 42',
  'The ledger records every charge.',
  '',
  '  return formatPrice(cents);',
  'x'.repeat(1500),
  'word '.repeat(400),
];

describe('beacon_focus', () => {
  it('passages are verbatim, ascending, within budget; same input, same output', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.oneof(fc.constantFrom(...LINES), fc.string({ maxLength: 40 })), { minLength: 1, maxLength: 80 }),
        fc.constantFrom('user not found', 'timeout job', 'ledger', 'price cents', 'word'),
        fc.integer({ min: 32, max: 400 }),
        fc.integer({ min: 0, max: 5 }),
        async (lines, query, budget, context) => {
          const text = lines.join('\n');
          if (!text) return;
          const input = { text, query, budget_tokens: budget, context_lines: context };
          const r = await run(input);
          expect(beaconFocus.outputSchema!.parse(r)).toEqual(r);
          let total = 0;
          for (const [k, p] of r.passages.entries()) {
            expect(text.slice(p.start, p.end)).toBe(p.text);
            expect(p.tokens).toBe(o200k.encode(p.text).length);
            total += p.tokens;
            if (k > 0) expect(p.start).toBeGreaterThan(r.passages[k - 1]!.end);
            expect(
              text
                .split('\n')
                .slice(p.start_line - 1, p.end_line)
                .join('\n'),
            ).toContain(p.text);
          }
          expect(total).toBe(r.tokens);
          expect(total).toBeLessThanOrEqual(budget);
          expect(JSON.stringify(await run(input))).toBe(JSON.stringify(r));
        },
      ),
      { numRuns: 80 },
    );
  });

  it('finds the error line in a log with its context and line numbers', async () => {
    const text = [
      '10:00:01 INFO worker started',
      '10:00:02 INFO job 41 done',
      '10:00:03 ERROR job 42 timeout after 5000 ms',
      '10:00:04 WARN retrying job 42',
      '10:00:05 INFO job 43 done',
    ].join('\n');
    const r = await run({ text, query: 'timeout', context_lines: 1 });
    expect(r.passages).toHaveLength(1);
    expect(r.passages[0]).toMatchObject({
      start_line: 2,
      end_line: 4,
      text: '10:00:02 INFO job 41 done\n10:00:03 ERROR job 42 timeout after 5000 ms\n10:00:04 WARN retrying job 42',
    });
    expect(r.coverage).toBe(1);
    expect(r.matched_lines).toBe(1);
  });

  it('matches parts of camelCase and snake_case identifiers', async () => {
    expect(codeTerms('getUserName max_retry_count')).toEqual(['getusername', 'get', 'user', 'name', 'max_retry_count', 'max', 'retry', 'count']);
    const r = await run({ text: 'a = 1\nfunction getUserName() {}\nb = 2', query: 'user name', context_lines: 0 });
    expect(r.passages.map((p) => p.start_line)).toEqual([2]);
  });

  it('coverage counts the query terms found in the passages', async () => {
    const r = await run({ text: 'alpha beta\ngamma', query: 'alpha zeta', context_lines: 0 });
    expect(r.query_terms).toEqual(['alpha', 'zeta']);
    expect(r.coverage).toBe(0.5);
  });

  it('refuses out-of-range budgets and context, and text past 400,000 characters (schema)', () => {
    expect(beaconFocus.input.safeParse({ text: 'a', query: 'a', budget_tokens: 31 }).success).toBe(false);
    expect(beaconFocus.input.safeParse({ text: 'a', query: 'a', context_lines: 21 }).success).toBe(false);
    expect(beaconFocus.input.safeParse({ text: 'a'.repeat(400_001), query: 'a' }).success).toBe(false);
  });

  it('largestInput finishes inside its limits', async () => {
    const t = cpuNow();
    const r = await run(beaconFocus.largestInput!());
    expect(r.tokens).toBeLessThanOrEqual(32_000);
    expect(r.passages.length).toBeGreaterThan(0);
    expect(cpuNow() - t).toBeLessThan(beaconFocus.limits!.timeMs!);
  }, 60_000);
});
