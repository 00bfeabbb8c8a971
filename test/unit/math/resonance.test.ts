import { describe, expect, it } from 'vitest';
import { resonance } from '../../../src/tools/math/resonance.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const run = async (input: unknown) => {
  const { ctx } = makeToolContext();
  const result = await resonance.handler(resonance.input.parse(input), ctx);
  expect(resonance.outputSchema!.safeParse(result).success).toBe(true);
  return result;
};

const sines = (n: number, fs: number, parts: Array<[number, number, number?]>) =>
  Array.from({ length: n }, (_, i) => parts.reduce((s, [f, a, ph = 0]) => s + a * Math.sin((2 * Math.PI * f * i) / fs + ph), 0));

describe('resonance', () => {
  it('a 5 Hz + 12 Hz signal peaks at 5 and 12 Hz, within a tenth of a bin after interpolation', async () => {
    const fs = 100;
    const r = await run({
      series: sines(1000, fs, [
        [5, 1],
        [12, 0.5],
      ]),
      sample_rate: fs,
      top_k: 2,
    });
    expect(r.padded_to).toBe(1024);
    expect(r.bin_width).toBeCloseTo(fs / 1024, 6);
    const [p1, p2] = r.peaks;
    const tol = 0.1 * r.bin_width;
    expect(Math.abs(p1!.frequency - 5)).toBeLessThan(tol);
    expect(Math.abs(p2!.frequency - 12)).toBeLessThan(tol);
    expect(p1!.period).toBeCloseTo(0.2, 3);
    expect(p1!.amplitude).toBeCloseTo(1, 1);
    expect(p2!.amplitude).toBeCloseTo(0.5, 1);
    expect(p1!.power_share + p2!.power_share).toBeGreaterThan(0.99);
  });

  it('off-bin frequencies land within a tenth of a bin for every window but rectangular (half a bin there)', async () => {
    for (const window of ['hann', 'hamming', 'blackman', 'rectangular'] as const) {
      for (const f of [3.3, 7.77, 21.05]) {
        const r = await run({ series: sines(2000, 64, [[f, 2, 0.3]]), sample_rate: 64, window, top_k: 1 });
        const tol = (window === 'rectangular' ? 0.5 : 0.1) * r.bin_width;
        expect(Math.abs(r.peaks[0]!.frequency - f), `${window} ${f}`).toBeLessThan(tol);
      }
    }
  });

  it('a linear trend is removed by detrend linear; a constant series has no peaks', async () => {
    const series = sines(512, 1, [[0.1, 1]]).map((v, i) => v + 0.05 * i);
    const r = await run({ series, detrend: 'linear', top_k: 1 });
    expect(Math.abs(r.peaks[0]!.frequency - 0.1)).toBeLessThan(0.1 * r.bin_width);
    expect((await run({ series: new Array(100).fill(3) })).peaks).toEqual([]);
  });

  it('caps: 8 to 262,144 finite numbers, top_k ≤ 50, positive sample_rate', () => {
    expect(resonance.input.safeParse({ series: [1, 2, 3] }).success).toBe(false);
    expect(resonance.input.safeParse({ series: new Array(262_145).fill(0) }).success).toBe(false);
    expect(resonance.input.safeParse({ series: new Array(16).fill(0), top_k: 51 }).success).toBe(false);
    expect(resonance.input.safeParse({ series: new Array(16).fill(0), sample_rate: 0 }).success).toBe(false);
  });

  it('largestInput (262,144 points) finishes well inside its limits; examples repeat byte for byte', async () => {
    const start = cpuNow();
    const r = await run(resonance.largestInput!());
    expect(r.padded_to).toBe(262_144);
    expect(cpuNow() - start).toBeLessThan(resonance.limits!.timeMs!);
    for (const ex of resonance.examples) expect(JSON.stringify(await run(ex))).toBe(JSON.stringify(await run(ex)));
    expect((await run(resonance.examples[0]!)).peaks[0]!.period).toBeCloseTo(8, 3);
  });
});
