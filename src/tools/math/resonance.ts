import { z } from 'zod';
import FFT from 'fft.js';
import { AppError } from '../../errors.js';
import { defineTool } from '../types.js';
import { checkAborted, sig } from './stats.js';

/**
 * resonance: the dominant periodicities of a series. The series is detrended, windowed (Hann by
 * default), zero-padded to a power of two and transformed with fft.js; local maxima of the
 * magnitude spectrum are refined by parabolic interpolation on the log magnitude of the three bins
 * around them, which puts a clean sinusoid's peak within a few hundredths of a bin of its true
 * frequency (the tests hold it to a tenth of a bin). Figures are rounded to 6 significant digits.
 */

export const MAX_POINTS = 262_144;
const WINDOWS = ['hann', 'hamming', 'blackman', 'rectangular'] as const;
/** Peaks weaker than this fraction of the strongest magnitude (-60 dB) are leakage, not periodicities. */
const FLOOR = 1e-3;

const Input = z.object({
  series: z
    .array(z.number().finite())
    .min(8)
    .max(MAX_POINTS)
    .describe(
      'The samples, evenly spaced, 8 to 262,144 of them. The request body is capped at 1 MiB: about 60,000 full-precision numbers fit; 262,144 fit only as short values (≤ 3 characters each)',
    ),
  sample_rate: z.number().positive().finite().default(1).describe('Samples per unit of time (default 1: frequencies are in cycles per sample)'),
  window: z.enum(WINDOWS).default('hann').describe('Window applied before the FFT: hann (default), hamming, blackman or rectangular'),
  top_k: z.number().int().min(1).max(50).default(5).describe('How many peaks to return, strongest first (default 5, at most 50)'),
  detrend: z.enum(['mean', 'linear', 'none']).default('mean').describe('Removed before the transform: the mean (default), a least-squares line, or nothing'),
});

const Peak = z.object({
  frequency: z.number(),
  period: z.number(),
  amplitude: z.number(),
  power_share: z.number(),
  bin: z.number().int(),
});
const Output = z.object({
  n: z.number().int(),
  padded_to: z.number().int(),
  sample_rate: z.number(),
  window: z.enum(WINDOWS),
  bin_width: z.number(),
  nyquist: z.number(),
  peaks: z.array(Peak),
});
type Out = z.infer<typeof Output>;

export const resonance = defineTool({
  name: 'resonance',
  description:
    'Dominant periodicities of an evenly sampled series: windowed, zero-padded FFT peaks with interpolated frequency, period, amplitude and power share.',
  tier: 'enterprise',
  priceCents: 2,
  family: 'math',
  input: Input,
  qField: 'series',
  qParse: 'numbers',
  output: '{n, padded_to, sample_rate, window, bin_width, nyquist, peaks[{frequency, period, amplitude, power_share, bin}]}',
  outputSchema: Output,
  examples: [
    { series: Array.from({ length: 64 }, (_, i) => Math.round(100 * Math.sin((2 * Math.PI * i) / 8)) / 100), top_k: 1 },
    { series: [3, 5, 9, 4, 3, 5, 9, 4, 3, 5, 9, 4, 3, 5, 9, 4, 3, 5, 9, 4, 3, 5, 9, 4], sample_rate: 12, top_k: 3 },
  ],
  isolated: import.meta.url,
  limits: { timeMs: 10_000, memoryMb: 128 },
  largestInput: () => ({ series: Array.from({ length: MAX_POINTS }, (_, i) => (i * 7919) % 97), top_k: 50 }),
  handler: async (input, ctx): Promise<Out> => spectrum(input, ctx.signal),
});

function windowValue(kind: (typeof WINDOWS)[number], i: number, n: number): number {
  if (n === 1) return 1;
  const x = (2 * Math.PI * i) / (n - 1);
  switch (kind) {
    case 'hann':
      return 0.5 - 0.5 * Math.cos(x);
    case 'hamming':
      return 0.54 - 0.46 * Math.cos(x);
    case 'blackman':
      return 0.42 - 0.5 * Math.cos(x) + 0.08 * Math.cos(2 * x);
    case 'rectangular':
      return 1;
  }
}

export function spectrum(input: z.output<typeof Input>, signal: AbortSignal): Out {
  const { series, sample_rate: fs, window, top_k, detrend } = input;
  const n = series.length;
  let size = 1;
  while (size < n) size *= 2;
  const data = new Array<number>(size).fill(0);
  // Detrend.
  let a = 0;
  let b = 0;
  if (detrend !== 'none') {
    let sx = 0;
    let sy = 0;
    for (let i = 0; i < n; i++) {
      sx += i;
      sy += series[i]!;
    }
    const mx = sx / n;
    const my = sy / n;
    if (detrend === 'linear') {
      let sxx = 0;
      let sxy = 0;
      for (let i = 0; i < n; i++) {
        sxx += (i - mx) ** 2;
        sxy += (i - mx) * (series[i]! - my);
      }
      b = sxx ? sxy / sxx : 0;
    }
    a = my - b * mx;
  }
  let wsum = 0;
  for (let i = 0; i < n; i++) {
    const w = windowValue(window, i, n);
    wsum += w;
    data[i] = (series[i]! - a - b * i) * w;
  }
  checkAborted(signal);
  const fft = new FFT(size);
  const out = fft.createComplexArray() as number[];
  fft.realTransform(out, data);
  checkAborted(signal);
  const half = size / 2;
  const mag = new Float64Array(half + 1);
  let total = 0;
  let max = 0;
  for (let k = 0; k <= half; k++) {
    const re = out[2 * k]!;
    const im = out[2 * k + 1]!;
    mag[k] = Math.hypot(re, im);
    if (k >= 1) total += mag[k]! ** 2;
    if (k >= 1 && mag[k]! > max) max = mag[k]!;
  }
  const peaks: Array<{ k: number; m: number }> = [];
  if (max > 0) {
    for (let k = 1; k < half; k++) {
      const m = mag[k]!;
      if (m > mag[k - 1]! && m >= mag[k + 1]! && m >= FLOOR * max) peaks.push({ k, m });
    }
  }
  peaks.sort((x, y) => y.m - x.m || x.k - y.k);
  const lobe = window === 'rectangular' ? 1 : window === 'blackman' ? 3 : 2;
  const result = peaks.slice(0, top_k).map(({ k }) => {
    const la = Math.log(Math.max(mag[k - 1]!, Number.MIN_VALUE));
    const lb = Math.log(mag[k]!);
    const lc = Math.log(Math.max(mag[k + 1]!, Number.MIN_VALUE));
    const den = la - 2 * lb + lc;
    let delta = den === 0 ? 0 : (0.5 * (la - lc)) / den;
    if (!Number.isFinite(delta) || Math.abs(delta) > 0.5) delta = 0;
    const peakMag = Math.exp(lb - 0.25 * (la - lc) * delta);
    const frequency = ((k + delta) * fs) / size;
    let power = 0;
    for (let j = Math.max(1, k - lobe); j <= Math.min(half, k + lobe); j++) power += mag[j]! ** 2;
    return {
      frequency: sig(frequency),
      period: sig(1 / frequency),
      amplitude: sig((2 * peakMag) / wsum),
      power_share: sig(total ? Math.min(1, power / total) : 0),
      bin: k,
    };
  });
  if (!result.length && max > 0 && half < 2) throw new AppError('invalid_input', 'series too short for a spectrum');
  return { n, padded_to: size, sample_rate: fs, window, bin_width: sig(fs / size), nyquist: sig(fs / 2), peaks: result };
}
