import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { cviVerify } from '../../../src/tools/text/cvi-verify.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const { ctx } = makeToolContext();
const run = (input: unknown) => cviVerify.handler(cviVerify.input.parse(input), ctx);

const SOURCE = 'In 2023 Acme had 340 employees. Revenue rose 12% to $4.2 million in 2023. Acme does not sell outside Europe.';

describe('cvi_verify', () => {
  it('a changed number gives conflict; the stated number is supported (property)', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 100_000 }),
        fc.integer({ min: 1, max: 100_000 }),
        fc.constantFrom('employees', 'stores', 'patents'),
        async (n, m, noun) => {
          fc.pre(n !== m);
          const source = `Last year the firm Zenith operated ${n.toLocaleString('en')} ${noun} across its regions.`;
          const r = await run({
            claims: [`Zenith operated ${n} ${noun} across its regions.`, `Zenith operated ${m} ${noun} across its regions.`],
            sources: [source],
          });
          expect(r.results[0]!.verdict).toBe('supported');
          expect(r.results[1]!.verdict).toBe('conflict');
          expect(r.results[1]!.number_mismatches[0]).toMatchObject({ claim_value: String(m), source_values: [String(n)] });
          expect(cviVerify.outputSchema!.safeParse(r).success).toBe(true);
        },
      ),
      { numRuns: 50 },
    );
  });

  it('evidence quotes slice back out of their sources, deterministically (property)', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.lorem({ maxCount: 30 }), { minLength: 1, maxLength: 4 }),
        fc.array(fc.lorem({ maxCount: 8 }), { minLength: 1, maxLength: 5 }),
        async (sources, claims) => {
          const input = { claims, sources: sources.map((text, i) => ({ id: `d${i}`, text })) };
          const r = await run(input);
          for (const res of r.results) for (const e of res.evidence) expect(sources[e.source_index]!.slice(e.start, e.end)).toBe(e.quote);
          expect(JSON.stringify(await run(input))).toBe(JSON.stringify(r));
        },
      ),
      { numRuns: 40 },
    );
  });

  it('example 1: supported, number conflict, negation conflict', async () => {
    const r = await run(cviVerify.examples[0]);
    expect(r.results.map((x) => x.verdict)).toEqual(['supported', 'conflict', 'conflict']);
    expect(r.results[2]!.negation_mismatch).toBe(true);
    expect(r.summary).toEqual({ supported: 1, partial: 0, unsupported: 0, conflict: 2 });
  });

  it('q-style text: claims, then sources after ---; unsupported claims', async () => {
    const r = await run({ text: `Acme has 340 employees. Acme builds rockets on Mars.\n---\n${SOURCE}` });
    expect(r.results.map((x) => x.verdict)).toEqual(['supported', 'unsupported']);
    await expect(run({ text: 'No sources here.' })).rejects.toMatchObject({ code: 'invalid_input' });
  });

  it('refuses input past the caps', async () => {
    expect(cviVerify.input.safeParse({ claims: Array(51).fill('a'), sources: ['b'] }).success).toBe(false);
    expect(cviVerify.input.safeParse({ claims: ['a'], sources: Array(21).fill('b') }).success).toBe(false);
    expect(cviVerify.input.safeParse({ claims: ['a'], sources: ['x'.repeat(200_000), 'x'.repeat(200_001)] }).success).toBe(false);
    expect(cviVerify.input.safeParse({ claims: ['a'] }).success).toBe(false);
    await expect(run({ text: 'Claim here. '.repeat(51), sources: ['A'] })).rejects.toMatchObject({ code: 'invalid_input' });
  });

  it('largestInput finishes within its limits', async () => {
    const t = cpuNow();
    const r = await run(cviVerify.largestInput!());
    expect(r.results).toHaveLength(50);
    expect(cpuNow() - t).toBeLessThan(cviVerify.limits!.timeMs ?? 5000);
  });
});
