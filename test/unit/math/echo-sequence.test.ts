import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { echoSequence, echo, MAX_DIGITS, MAX_TERMS } from '../../../src/tools/math/echo-sequence.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const { ctx, progress } = makeToolContext();
const run = async (input: Record<string, unknown>) => {
  const out = await echoSequence.handler(echoSequence.input.parse(input), ctx);
  const parsed = echoSequence.outputSchema!.safeParse(out);
  expect(parsed.success, parsed.success ? '' : JSON.stringify(parsed.error.issues)).toBe(true);
  return out;
};

function fibs(count: number): bigint[] {
  const out = [0n, 1n];
  while (out.length < count) out.push(out[out.length - 1]! + out[out.length - 2]!);
  return out.slice(0, count);
}

/** Deterministic pseudo-random 64-bit integers (a fixed LCG): noise with no rule. */
function noise(count: number, seed: bigint, digits = 18): string[] {
  let x = seed;
  return Array.from({ length: count }, () => {
    let s = '';
    while (s.length < digits) {
      x = (x * 6364136223846793005n + 1442695040888963407n) % (1n << 64n);
      s += x.toString();
    }
    return '1' + s.slice(0, digits - 1);
  });
}

describe('echo_sequence', () => {
  it('Fibonacci continues exactly, past 2^53 and as far as asked', async () => {
    const all = fibs(140);
    const r = await run({ terms: all.slice(0, 90).map(String), extend: 50 });
    expect(r.rule).toMatchObject({ kind: 'linear_recurrence', name: 'Fibonacci-type', coefficients: ['1', '1'], order: 2 });
    expect(r.next).toEqual(all.slice(90, 140).map(String));
    expect(BigInt(r.next.at(-1)!)).toBeGreaterThan(2n ** 53n);
    expect(r.verified_terms).toBe(90);
    expect(r.confidence).toBe('high');
    const short = await run({ terms: [0, 1, 1, 2, 3, 5, 8, 13, 21, 34], extend: 3 });
    expect(short.next).toEqual(['55', '89', '144']);
  });

  it('2^n continues exactly beyond 2^53 (digit strings in, digit strings out)', async () => {
    const terms = Array.from({ length: 10 }, (_, i) => (2n ** BigInt(i + 50)).toString());
    const r = await run({ terms, extend: 20 });
    expect(r.rule).toMatchObject({ kind: 'geometric', coefficients: ['2'] });
    expect(r.next).toEqual(Array.from({ length: 20 }, (_, i) => (2n ** BigInt(i + 60)).toString()));
    const small = await run({ terms: [1, 2, 4, 8, 16, 32, 64], extend: 50 });
    expect(small.next.at(-1)).toBe((2n ** 56n).toString());
  });

  it('polynomials by finite differences, with exact rational coefficients', async () => {
    const tri = await run({ terms: [0, 1, 3, 6, 10, 15], extend: 3 });
    expect(tri.rule).toMatchObject({ kind: 'polynomial', degree: 2, coefficients: ['0', '1/2', '1/2'] });
    expect(tri.next).toEqual(['21', '28', '36']);
    const cubes = await run({ terms: [0, 1, 8, 27, 64, 125, 216, 343], extend: 2 });
    expect(cubes.rule).toMatchObject({ kind: 'polynomial', degree: 3, name: 'cubes' });
    expect(cubes.next).toEqual(['512', '729']);
    const arith = await run({ terms: ['-9007199254740993', '-9007199254740990', '-9007199254740987'], extend: 2 });
    expect(arith.rule).toMatchObject({ kind: 'polynomial', name: 'arithmetic' });
    expect(arith.next).toEqual(['-9007199254740984', '-9007199254740981']);
  });

  it('noise gives no rule and no continuation', async () => {
    for (const terms of [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9], [3, 1, 4], noise(40, 7n), noise(200, 11n, 60), [1, 2, 6, 24, 120, 720, 5040]]) {
      const r = await run({ terms });
      expect(r.rule, JSON.stringify(terms).slice(0, 60)).toBeNull();
      expect(r.next).toEqual([]);
      expect(r.confidence).toBe('none');
    }
  });

  it('too few terms to be confident: the rule is given with low confidence', async () => {
    const r = await run({ terms: [1, 1, 2, 3, 5], extend: 2 });
    expect(r.next).toEqual(['8', '13']);
    expect(r.confidence).toBe('low');
    expect(r.note).toMatch(/give more terms/);
  });

  it('property: random linear recurrences (order ≤ 3, small integer coefficients) are found and continued exactly', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 3 }).chain((order) =>
          fc.tuple(
            fc.array(fc.integer({ min: -3, max: 3 }), { minLength: order, maxLength: order }).filter((c) => c[order - 1] !== 0),
            fc.array(fc.integer({ min: -50, max: 50 }), { minLength: order, maxLength: order }),
          ),
        ),
        async ([coeffs, init]) => {
          const seq = init.map(BigInt);
          while (seq.length < 30) seq.push(coeffs.reduce((s, c, j) => s + BigInt(c) * seq[seq.length - 1 - j]!, 0n));
          const r = await echo(seq.slice(0, 20).map(String), 10, ctx);
          expect(r.rule).not.toBeNull();
          expect(r.verified_terms).toBe(20);
          expect(r.next).toEqual(seq.slice(20, 30).map(String));
        },
      ),
      { numRuns: 150 },
    );
  });

  it('property: whenever a rule is given it reproduces every given term (verified_terms = all)', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.integer({ min: -20, max: 20 }), { minLength: 3, maxLength: 30 }), async (terms) => {
        const r = await echo(terms, 5, ctx);
        if (r.rule) expect(r.verified_terms).toBe(terms.length);
        else expect(r.next).toEqual([]);
      }),
      { numRuns: 300 },
    );
  });

  it('caps: 3-200 terms, digit strings up to the cap, safe integers only as numbers, extend ≤ 50, no unknown keys', () => {
    const p = (x: unknown) => echoSequence.input.safeParse(x).success;
    expect(p({ terms: [1, 2] })).toBe(false);
    expect(p({ terms: Array(MAX_TERMS + 1).fill(1) })).toBe(false);
    expect(p({ terms: [1, 2, 2 ** 53 + 2] })).toBe(false);
    expect(p({ terms: [1, 2, 1.5] })).toBe(false);
    expect(p({ terms: ['1', '2', '9'.repeat(MAX_DIGITS)] })).toBe(true);
    expect(p({ terms: ['1', '2', '9'.repeat(MAX_DIGITS + 1)] })).toBe(false);
    expect(p({ terms: ['1', '2', '3e5'] })).toBe(false);
    expect(p({ terms: [1, 2, 3], extend: 51 })).toBe(false);
    expect(p({ terms: [1, 2, 3], mode: 'x' })).toBe(false);
  });

  it('deterministic; reports progress; largestInput and a period-25 recurrence at the caps finish inside the limits', async () => {
    for (const ex of echoSequence.examples) expect(JSON.stringify(await run(ex))).toBe(JSON.stringify(await run(ex)));
    let t = cpuNow();
    const r = await run(echoSequence.largestInput!());
    const msLargest = cpuNow() - t;
    expect(r.rule).toMatchObject({ order: 25 });
    expect(msLargest).toBeLessThan(echoSequence.limits!.timeMs!);
    t = cpuNow();
    expect((await run({ terms: noise(MAX_TERMS, 13n, MAX_DIGITS), extend: 50 })).rule).toBeNull();
    const ms = cpuNow() - t;
    expect(progress.some((p) => p.stage === 'berlekamp-massey')).toBe(true);
    expect(ms).toBeLessThan(echoSequence.limits!.timeMs!);
    const base = noise(25, 3n, MAX_DIGITS);
    const periodic = Array.from({ length: MAX_TERMS }, (_, i) => base[i % 25]!);
    t = cpuNow();
    const p = await run({ terms: periodic, extend: 50 });
    const ms2 = cpuNow() - t;
    expect(p.rule).toMatchObject({ kind: 'linear_recurrence', order: 25 });
    expect(p.next).toEqual(Array.from({ length: 50 }, (_, i) => base[(MAX_TERMS + i) % 25]!));
    expect(ms2).toBeLessThan(echoSequence.limits!.timeMs!);
    console.log(
      `echo_sequence largestInput: ${msLargest.toFixed(0)} ms; noise at the caps: ${ms.toFixed(0)} ms; another period-25 recurrence: ${ms2.toFixed(0)} ms`,
    );
  });
});
