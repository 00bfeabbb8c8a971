import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { getEncoding } from 'js-tiktoken';
import { countTokensA } from '../../../src/tools/text/tiktoken-count.js';

const enc = { o200k_base: getEncoding('o200k_base'), cl100k_base: getEncoding('cl100k_base') };

describe('countTokensA (text group A token counts)', () => {
  it("equals js-tiktoken's counts on arbitrary text, both encodings", () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 400, unit: 'binary' }), fc.constantFrom('o200k_base' as const, 'cl100k_base' as const), (text, e) => {
        expect(countTokensA(text, e)).toBe(enc[e].encode(text, [], []).length);
      }),
      { numRuns: 300 },
    );
  });

  it('equals them on long runs without spaces (where merging order matters)', () => {
    fc.assert(
      fc.property(
        fc.array(fc.constantFrom('a', 'b', 'ab', 'ing', 'e', 'x', 'Z', 'é'), { minLength: 50, maxLength: 400 }),
        fc.constantFrom('o200k_base' as const, 'cl100k_base' as const),
        (parts, e) => {
          const text = parts.join('');
          expect(countTokensA(text, e)).toBe(enc[e].encode(text).length);
        },
      ),
      { numRuns: 60 },
    );
    for (const text of ['a'.repeat(2000), 'ab'.repeat(900), 'Supercalifragilistic'.repeat(50)])
      expect(countTokensA(text)).toBe(enc.o200k_base.encode(text).length);
  });

  it('counts special-token spellings as text instead of throwing', () => {
    expect(countTokensA('hello <|endoftext|> world')).toBe(enc.o200k_base.encode('hello <|endoftext|> world', [], []).length);
  });

  it('counts a 400,000-letter run without spaces quickly', () => {
    const t = Date.now();
    expect(countTokensA('a'.repeat(400_000))).toBeGreaterThan(0);
    // A liveness bound (a quadratic merge takes hours here), wide enough for a loaded CI machine.
    expect(Date.now() - t).toBeLessThan(20_000);
  }, 40_000);
});
