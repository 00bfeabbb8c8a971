import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { getEncoding } from 'js-tiktoken';
import { beaconScan, largeMarkdown } from '../../../src/tools/text/beacon-scan.js';
import { makeToolContext } from '../../helpers/tool-context.js';

const o200k = getEncoding('o200k_base');
const cl100k = getEncoding('cl100k_base');
const run = (input: unknown) => beaconScan.handler(beaconScan.input.parse(input), makeToolContext().ctx);

describe('beacon_scan', () => {
  it('counts equal js-tiktoken for o200k_base and cl100k_base', async () => {
    await fc.assert(
      fc.asyncProperty(fc.string({ minLength: 1, maxLength: 300, unit: 'grapheme' }), async (text) => {
        const r = await run({ text });
        expect(r.tokens.o200k_base).toBe(o200k.encode(text).length);
        expect(r.tokens.cl100k_base).toBe(cl100k.encode(text).length);
        expect(r.encoding).toEqual({ name: 'o200k_base', tokens: r.tokens.o200k_base, label: 'exact' });
      }),
      { numRuns: 60 },
    );
  });

  it('labels other encodings as estimates (chars/4)', async () => {
    const r = await run({ text: 'x'.repeat(10), encoding: 'p50k_base' });
    expect(r.encoding).toEqual({ name: 'p50k_base', tokens: 3, label: 'estimate' });
    expect(r.tokens.o200k_base).toBe(o200k.encode('x'.repeat(10)).length);
  });

  it('maps Markdown sections with offsets that slice back, skipping fenced code', async () => {
    const text = 'Preface line.\n# One\nalpha\n```\n# not a heading\n```\nTwo\n===\nbeta\n## Three ##\ngamma';
    const r = await run({ text, encoding: 'cl100k_base' });
    expect(r.sections.map((s) => [s.heading, s.level])).toEqual([
      [null, 0],
      ['One', 1],
      ['Two', 1],
      ['Three', 2],
    ]);
    expect(r.sections.map((s) => text.slice(s.start, s.end)).join('')).toBe(text);
    for (const s of r.sections) expect(s.tokens).toBe(cl100k.encode(text.slice(s.start, s.end)).length);
    expect(r.heaviest!.tokens).toBe(Math.max(...r.sections.map((s) => s.tokens)));
    expect(beaconScan.outputSchema!.parse(r)).toEqual(r);
  });

  it('sections always tile the text; same input, same output', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.constantFrom('# H\n', 'text ', '\n', '```\n', '===\n', '## x\n', 'para.\n\n'), { minLength: 1, maxLength: 30 }),
        async (parts) => {
          const text = parts.join('');
          const a = await run({ text });
          expect(a.sections.map((s) => text.slice(s.start, s.end)).join('')).toBe(text);
          expect(JSON.stringify(await run({ text }))).toBe(JSON.stringify(a));
        },
      ),
      { numRuns: 100 },
    );
  });

  it('reports fits against windows', async () => {
    const r = await run({ text: 'hello world, this is a test', windows: [1, 1000] });
    expect(r.fits.map((f) => f.fits)).toEqual([false, true]);
  });

  it('counts pasted special-token spellings as text and a 400,000-letter run quickly (no throw, no quadratic merge)', async () => {
    const text = '<|im_start|>user\nhello<|im_end|> <|endoftext|>';
    const r = await run({ text });
    expect(r.tokens.o200k_base).toBe(o200k.encode(text, [], []).length);
    expect(r.tokens.cl100k_base).toBe(cl100k.encode(text, [], []).length);
    const t = Date.now();
    const long = await run({ text: 'a'.repeat(400_000) });
    expect(long.tokens.o200k_base).toBeGreaterThan(0);
    // A liveness bound: a quadratic merge takes hours on this run; counting in chunks takes 1-3 s, 10.1 s
    // once on a loaded CI machine.
    expect(Date.now() - t).toBeLessThan(30_000);
  }, 60_000);

  it('refuses text past 400,000 characters and empty text (schema)', () => {
    expect(beaconScan.input.safeParse({ text: 'a'.repeat(400_001) }).success).toBe(false);
    expect(beaconScan.input.safeParse({ text: '' }).success).toBe(false);
    expect(beaconScan.input.safeParse({ text: 'a'.repeat(400_000) }).success).toBe(true);
  });

  it('largestInput is at the cap and finishes', async () => {
    const input = beaconScan.largestInput!();
    expect(input.text.length).toBe(400_000);
    expect(largeMarkdown(100).length).toBe(100);
    const t = Date.now();
    const r = await run(input);
    expect(r.sections.length).toBeGreaterThan(100);
    expect(Date.now() - t).toBeLessThan(15_000);
  }, 30_000);
});
