import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { beaconRank } from '../../../src/tools/text/beacon-rank.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const run = (input: unknown) => beaconRank.handler(beaconRank.input.parse(input), makeToolContext().ctx);

const COMMON = ['the queue runs jobs', 'jobs are charged', 'the worker runs the queue', 'charged jobs settle', 'a queue of jobs'];

describe('beacon_rank', () => {
  it("a rare term's document ranks first", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.constantFrom(...COMMON), { minLength: 3, maxLength: 40 }), fc.nat(), async (docs, at) => {
        const i = at % (docs.length + 1);
        const all = [...docs.slice(0, i), 'jobs with a zeppelin', ...docs.slice(i)];
        const r = await run({ query: 'zeppelin jobs', documents: all, top_k: 5 });
        expect(r.ranked[0]).toMatchObject({ id: String(i), rank: 1, matched_terms: ['jobs', 'zeppelin'] });
        expect(beaconRank.outputSchema!.parse(r)).toEqual(r);
        expect(JSON.stringify(await run({ query: 'zeppelin jobs', documents: all, top_k: 5 }))).toBe(JSON.stringify(r));
      }),
      { numRuns: 40 },
    );
  });

  it('ranks only documents that match, ties in input order, with ids and top_k', async () => {
    const r = await run({ query: 'refund', documents: ['refund now', { id: 'x', text: 'nothing here' }, 'refund now'], top_k: 10 });
    expect(r.ranked.map((d) => [d.id, d.rank])).toEqual([
      ['0', 1],
      ['2', 2],
    ]);
    expect(r).toMatchObject({ total: 3, matched: 2 });
  });

  it('chunks a text at sentence boundaries; chunk offsets slice back to their text', async () => {
    const text = Array.from({ length: 30 }, (_, i) => `Sentence ${i} is about ${i === 17 ? 'kangaroos' : 'billing'} and queues.`).join(' ');
    const r = await run({ query: 'kangaroos', text, chunk_tokens: 20 });
    expect(r.ranked).toHaveLength(1);
    const top = r.ranked[0]!;
    expect(text.slice(top.start, top.end)).toContain('Sentence 17 is about kangaroos');
    expect(text.slice(top.start!, top.end!)).toBe(top.snippet);
    expect(r.total).toBeGreaterThan(5);
  });

  it('refuses both or neither of documents and text, duplicate ids, too many documents (schema)', () => {
    expect(beaconRank.input.safeParse({ query: 'a' }).success).toBe(false);
    expect(beaconRank.input.safeParse({ query: 'a', text: 'a', documents: ['a'] }).success).toBe(false);
    expect(
      beaconRank.input.safeParse({
        query: 'a',
        documents: [
          { id: 'd', text: 'a' },
          { id: 'd', text: 'b' },
        ],
      }).success,
    ).toBe(false);
    expect(beaconRank.input.safeParse({ query: 'a', documents: Array(1001).fill('a') }).success).toBe(false);
    expect(beaconRank.input.safeParse({ query: 'a', documents: ['a'.repeat(200_000), 'b'.repeat(200_001)] }).success).toBe(false);
    expect(beaconRank.input.safeParse({ query: 'a', documents: Array(1000).fill('a') }).success).toBe(true);
  });

  it('largestInput finishes inside its limits', async () => {
    const t = cpuNow();
    const r = await run(beaconRank.largestInput!());
    expect(r.ranked).toHaveLength(100);
    expect(cpuNow() - t).toBeLessThan(beaconRank.limits!.timeMs!);
  }, 60_000);
});
