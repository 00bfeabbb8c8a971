import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { getEncoding } from 'js-tiktoken';
import { beaconCompress } from '../../../src/tools/text/beacon-compress.js';
import { splitSentences } from '../../../src/tools/text/text-kit.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const enc = { o200k_base: getEncoding('o200k_base'), cl100k_base: getEncoding('cl100k_base') };
const run = (input: unknown) => beaconCompress.handler(beaconCompress.input.parse(input), makeToolContext().ctx);

const SENTENCES = [
  'The ledger records every charge.',
  'Retries are free when a call fails.',
  'Webhooks report finished jobs to your server!',
  'Is the sandbox safe to use?',
  'Prices are listed per tool in cents.',
  'Dr. Smith reviewed the settlement code on Monday.',
  'A worker thread runs each CPU-bound tool under limits.',
  'The queue holds jobs until a worker takes them.',
];

const doc = fc
  .array(fc.oneof(fc.constantFrom(...SENTENCES), fc.string({ minLength: 1, maxLength: 60 })), { minLength: 1, maxLength: 60 })
  .chain((parts) => fc.tuple(fc.constant(parts), fc.array(fc.constantFrom(' ', '\n', '\n\n', '  '), { minLength: parts.length, maxLength: parts.length })))
  .map(([parts, seps]) => parts.map((p, i) => p + seps[i]).join(''))
  .filter((t) => t.trim().length > 0);

describe('beacon_compress', () => {
  it('outputs fit their budgets when recounted, keep document order and verbatim slices; same input, same output', async () => {
    await fc.assert(
      fc.asyncProperty(
        doc,
        fc.integer({ min: 32, max: 200 }),
        fc.option(fc.constantFrom('ledger charge', 'worker limits', 'sandbox', 'zzz'), { nil: undefined }),
        fc.constantFrom('o200k_base' as const, 'cl100k_base' as const),
        async (text, budget, query, encoding) => {
          const input = { text, budget_tokens: budget, query, encoding };
          const r = await run(input);
          expect(beaconCompress.outputSchema!.parse(r)).toEqual(r);
          expect(r.tokens_after).toBe(enc[encoding].encode(r.text).length);
          expect(r.tokens_after).toBeLessThanOrEqual(budget);
          expect(r.tokens_before).toBe(enc[encoding].encode(text).length);
          for (let k = 1; k < r.kept.length; k++) expect(r.kept[k]!.start).toBeGreaterThanOrEqual(r.kept[k - 1]!.end);
          let at = 0;
          for (const s of r.kept) {
            const piece = text.slice(s.start, s.end);
            const found = r.text.indexOf(piece, at);
            expect(found).toBeGreaterThanOrEqual(0);
            at = found + piece.length;
          }
          expect(JSON.stringify(await run(input))).toBe(JSON.stringify(r));
        },
      ),
      { numRuns: 80 },
    );
  });

  it('keeps the sentences the query asks about (BM25)', async () => {
    const text =
      Array.from({ length: 40 }, (_, i) => `Filler sentence number ${i} talks about nothing in particular.`).join(' ') +
      ' The refund policy allows returns within thirty days. ' +
      'More filler closes the text here.';
    const r = await run({ text, budget_tokens: 32, query: 'refund policy' });
    expect(r.method).toBe('bm25');
    expect(r.text).toContain('The refund policy allows returns within thirty days.');
  });

  it('uses TextRank without a query and returns a text that fits unchanged', async () => {
    const text = SENTENCES.join(' ').repeat(5);
    const r = await run({ text, budget_tokens: 40 });
    expect(r.method).toBe('textrank');
    expect(r.tokens_after).toBeLessThanOrEqual(40);
    const small = await run({ text: 'Already short.', budget_tokens: 64 });
    expect(small).toMatchObject({ text: 'Already short.', method: 'unchanged', tokens_before: small.tokens_after });
  });

  it('keeps a fitting prefix when no single sentence fits', async () => {
    const text = 'word '.repeat(300) + 'end. ' + 'other '.repeat(300) + 'end.';
    const r = await run({ text, budget_tokens: 32 });
    expect(r.tokens_after).toBeLessThanOrEqual(32);
    expect(r.tokens_after).toBeGreaterThan(20);
    expect(text.slice(r.kept[0]!.start, r.kept[0]!.end)).toBe(r.text);
  });

  it('splits sentences without breaking at abbreviations', () => {
    const t = 'Dr. Smith met Mr. Jones at 3 p.m. today. They agreed! Next steps?\n- item one\n- item two';
    expect(splitSentences(t).map((s) => t.slice(s.start, s.end))).toEqual([
      'Dr. Smith met Mr. Jones at 3 p.m. today.',
      'They agreed!',
      'Next steps?',
      '- item one',
      '- item two',
    ]);
  });

  it('refuses budgets outside 32..32,000 and text past 400,000 characters (schema)', () => {
    expect(beaconCompress.input.safeParse({ text: 'x', budget_tokens: 31 }).success).toBe(false);
    expect(beaconCompress.input.safeParse({ text: 'x', budget_tokens: 32_001 }).success).toBe(false);
    expect(beaconCompress.input.safeParse({ text: 'x'.repeat(400_001), budget_tokens: 100 }).success).toBe(false);
  });

  it('largestInput finishes inside its limits', async () => {
    const input = beaconCompress.largestInput!();
    const t = cpuNow();
    const r = await run(input);
    expect(r.tokens_after).toBeLessThanOrEqual(32_000);
    expect(cpuNow() - t).toBeLessThan(beaconCompress.limits!.timeMs!);
  }, 60_000);
});
