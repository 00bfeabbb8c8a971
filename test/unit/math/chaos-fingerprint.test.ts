import { describe, expect, it } from 'vitest';
import { chaosFingerprint, logistic, classify } from '../../../src/tools/math/chaos-fingerprint.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const run = async (input: unknown) => {
  const { ctx, progress } = makeToolContext();
  const result = await chaosFingerprint.handler(chaosFingerprint.input.parse(input), ctx);
  const parsed = chaosFingerprint.outputSchema!.safeParse(result);
  expect(parsed.success, parsed.success ? '' : JSON.stringify(parsed.error.issues)).toBe(true);
  return { result, progress };
};

/** A deterministic LCG for test noise (no Math.random). */
function lcg(n: number, seed = 12345): number[] {
  let s = seed;
  return Array.from({ length: n }, () => {
    s = (s * 1103515245 + 12345) % 2147483648;
    return s / 2147483648;
  });
}

describe('chaos_fingerprint', () => {
  it('the logistic map at r = 4 (x0 = 0.1, 10,000 points) gives a Lyapunov exponent within 0.05 of ln 2, and is chaotic', async () => {
    const { result, progress } = await run({ series: logistic(10_000, 4, 0.1) });
    expect(Math.abs(result.lyapunov! - Math.LN2)).toBeLessThan(0.05);
    expect(result.zero_one_K!).toBeGreaterThan(0.9);
    expect(result.classification).toBe('chaotic');
    expect(result.fingerprint).toMatch(/^L0\.69\|/);
    expect(progress.at(-1)).toMatchObject({ stage: 'done', done: 5, total: 5 });
    // Embedding in two dimensions gives the same exponent.
    const m2 = await run({ series: logistic(10_000, 4, 0.1), embedding_dimension: 2 });
    expect(Math.abs(m2.result.lyapunov! - Math.LN2)).toBeLessThan(0.05);
  });

  it('a sine is periodic (K near 0), white noise is stochastic (PE near 1, α near 0.5), a random walk is nonstationary (α near 1.5)', async () => {
    const sine = await run({ series: Array.from({ length: 5000 }, (_, i) => Math.sin(i * 0.3)) });
    expect(Math.abs(sine.result.zero_one_K!)).toBeLessThan(0.2);
    expect(sine.result.classification).toBe('periodic');
    const noise = await run({ series: lcg(5000) });
    expect(noise.result.permutation_entropy!).toBeGreaterThan(0.98);
    expect(Math.abs(noise.result.hurst! - 0.5)).toBeLessThan(0.1);
    expect(noise.result.classification).toBe('stochastic');
    let w = 0;
    const walk = await run({ series: lcg(5000, 7).map((v) => (w += v - 0.5)) });
    expect(Math.abs(walk.result.hurst! - 1.5)).toBeLessThan(0.15);
    expect(walk.result.classification).toBe('nonstationary');
  });

  it('sample entropy of a period-4 orbit is 0; a constant series is classified constant', async () => {
    const { result } = await run({ series: Array.from({ length: 400 }, (_, i) => [1, 5, 2, 8][i % 4]!) });
    expect(result.sample_entropy).toBe(0);
    expect(result.classification).toBe('periodic');
    const flat = await run({ series: new Array(200).fill(7) });
    expect(flat.result).toMatchObject({ classification: 'constant', lyapunov: null, zero_one_K: null });
  });

  it('classify follows its documented rules', () => {
    const base = { lyapunov: 0.7, sample_entropy: 0.6, permutation_entropy: 0.7, hurst: 0.5, zero_one_K: 0.99 };
    expect(classify(base)).toBe('chaotic');
    expect(classify({ ...base, zero_one_K: 0.1 })).toBe('periodic');
    expect(classify({ ...base, permutation_entropy: 0.99 })).toBe('stochastic');
    expect(classify({ ...base, hurst: 1.5 })).toBe('nonstationary');
    expect(classify({ ...base, zero_one_K: 0.6 })).toBe('indeterminate');
  });

  it('caps: 100 to 100,000 finite points; parameters within their ranges', () => {
    expect(chaosFingerprint.input.safeParse({ series: new Array(99).fill(1) }).success).toBe(false);
    expect(chaosFingerprint.input.safeParse({ series: new Array(100_001).fill(1) }).success).toBe(false);
    expect(chaosFingerprint.input.safeParse({ series: new Array(100).fill(1), embedding_dimension: 11 }).success).toBe(false);
    expect(chaosFingerprint.input.safeParse({ series: new Array(100).fill(1), permutation_order: 8 }).success).toBe(false);
  });

  it('deterministic: the same input gives the same bytes (examples and the largest input inside its limits)', async () => {
    for (const ex of chaosFingerprint.examples) {
      expect(JSON.stringify((await run(ex)).result)).toBe(JSON.stringify((await run(ex)).result));
    }
    const start = cpuNow();
    const a = await run(chaosFingerprint.largestInput!());
    expect(cpuNow() - start).toBeLessThan(chaosFingerprint.limits!.timeMs!);
    expect(a.result.n).toBe(100_000);
  });

  it('stops when the signal is aborted', async () => {
    const ac = new AbortController();
    ac.abort(new Error('time is up'));
    const { ctx } = makeToolContext({ signal: ac.signal });
    await expect(chaosFingerprint.handler(chaosFingerprint.input.parse({ series: logistic(1000, 4, 0.1) }), ctx)).rejects.toThrow('time is up');
  });
});
