import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { quickVibe } from '../../../src/tools/text/quick-vibe.js';
import { makeToolContext } from '../../helpers/tool-context.js';

const run = (input: unknown) => quickVibe.handler(quickVibe.input.parse(input), makeToolContext().ctx);

describe('quick_vibe', () => {
  it('"I love this!" reads upbeat', async () => {
    const r = await run({ text: 'I love this!' });
    expect(r.vibe).toBe('upbeat');
    expect(r.sentiment.score).toBeGreaterThan(0);
    expect(r.sentiment.positive).toContain('love');
    expect(r.energy).toBeGreaterThan(0.4);
    expect(quickVibe.outputSchema!.parse(r)).toEqual(r);
  });

  it('reads an angry complaint as hostile, a gloomy one as downbeat, a plain statement as neutral', async () => {
    expect((await run({ text: 'This is TERRIBLE!!! I hate it, what a horrible waste!' })).vibe).toBe('hostile');
    expect((await run({ text: 'The results were sad and disappointing.' })).vibe).toBe('downbeat');
    expect((await run({ text: 'The meeting is on Tuesday at the second floor.' })).vibe).toBe('neutral');
  });

  it('scores formal text more formal than chatty text', async () => {
    const formal = await run({ text: 'Pursuant to the agreement, the committee therefore recommends additional documentation regarding procurement.' });
    const chatty = await run({ text: "hey guys lol I'm gonna grab stuff, you wanna come?? 😂" });
    expect(formal.formality).toBeGreaterThan(0.6);
    expect(chatty.formality).toBeLessThan(0.4);
  });

  it('computes Flesch reading ease and grade from words, sentences and syllables', async () => {
    // 6 words, 1 sentence, 6 syllables: 206.835 - 1.015*6 - 84.6*1 = 116.145; grade 0.39*6 + 11.8 - 15.59 = -1.45 (rounded half up: -1.4)
    const r = await run({ text: 'The cat sat on the mat.' });
    expect(r.readability).toEqual({ flesch: 116.1, grade: -1.4, sentences: 1, words: 6, syllables: 6 });
  });

  it('detects the language, und when too short', async () => {
    expect((await run({ text: 'The quick brown fox jumps over the lazy dog near the river bank.' })).language).toBe('eng');
    expect((await run({ text: 'Le renard brun rapide saute par-dessus le chien paresseux près de la rivière.' })).language).toBe('fra');
    expect((await run({ text: 'ok' })).language).toBe('und');
  });

  it('is deterministic and always fits its schema', async () => {
    await fc.assert(
      fc.asyncProperty(fc.string({ minLength: 1, maxLength: 200, unit: 'grapheme' }), async (text) => {
        const a = await run({ text });
        quickVibe.outputSchema!.parse(a);
        expect(JSON.stringify(await run({ text }))).toBe(JSON.stringify(a));
      }),
      { numRuns: 100 },
    );
  });

  it('refuses text past 20,000 characters (schema)', () => {
    expect(quickVibe.input.safeParse({ text: 'a'.repeat(20_001) }).success).toBe(false);
    expect(quickVibe.input.safeParse({ text: '' }).success).toBe(false);
  });

  it('largestInput is at the cap and finishes fast', async () => {
    const input = quickVibe.largestInput!();
    expect(input.text.length).toBe(20_000);
    const t = Date.now();
    const r = await run(input);
    expect(r.readability.words).toBeGreaterThan(3000);
    expect(Date.now() - t).toBeLessThan(3_000);
  });
});
