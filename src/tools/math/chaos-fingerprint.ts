import { z } from 'zod';
import { defineTool } from '../types.js';
import { checkAborted, linearFit, sig } from './stats.js';

/**
 * chaos_fingerprint: nonlinear measures of one series, hand-written (no maintained npm library).
 * - Largest Lyapunov exponent (Rosenstein 1993): delay embedding, each reference point's nearest
 *   neighbour outside a Theiler window, mean log divergence over the next steps, least-squares slope
 *   over the first `lyapunov_fit_steps` steps (per sample). A 1-D map needs embedding dimension 1.
 * - Sample entropy (Richman & Moorman), m = 2, r = 0.2·σ by default, on the first 10,000 points.
 * - Permutation entropy (Bandt & Pompe), normalised by ln(order!), ties broken by position.
 * - Hurst exponent by DFA-1 (the fluctuation exponent α: ≈ 0.5 for white noise, ≈ 1.5 for a random walk).
 * - Gottwald–Melbourne 0-1 test for chaos (correlation method): K is the median over 32 values of c
 *   spread evenly over (π/5, 4π/5) (fixed, so the result is deterministic), on the first 20,000 points.
 * Every figure is rounded to 6 significant digits.
 */

export const MIN_POINTS = 100;
export const MAX_POINTS = 100_000;
const LYAP_REFERENCES = 2_000;
const LYAP_SCAN = 20_000;
const SAMPEN_POINTS = 10_000;
const ZERO_ONE_POINTS = 20_000;
const ZERO_ONE_C = 32;
const ZERO_ONE_N = 100;

const Input = z.object({
  series: z
    .array(z.number().finite())
    .min(MIN_POINTS)
    .max(MAX_POINTS)
    .describe('The series, evenly sampled: 100 to 100,000 numbers (the 1 MiB request body holds about 60,000 full-precision values)'),
  embedding_dimension: z
    .number()
    .int()
    .min(1)
    .max(10)
    .default(1)
    .describe('Delay-embedding dimension for the Lyapunov exponent (default 1: right for 1-D maps; use 3 to 6 for flows)'),
  delay: z.number().int().min(1).max(100).default(1).describe('Embedding delay in samples (default 1)'),
  theiler_window: z.number().int().min(0).max(1000).default(10).describe('Neighbours closer in time than this many samples are ignored (default 10)'),
  lyapunov_fit_steps: z
    .number()
    .int()
    .min(1)
    .max(50)
    .default(4)
    .describe('Steps of mean log divergence the Lyapunov slope is fitted over (default 4: the first few, before saturation)'),
  permutation_order: z.number().int().min(3).max(7).default(4).describe('Ordinal pattern length for permutation entropy (3 to 7, default 4)'),
  sample_entropy_m: z.number().int().min(1).max(5).default(2).describe('Template length for sample entropy (default 2)'),
  sample_entropy_r: z.number().positive().max(10).default(0.2).describe('Tolerance for sample entropy as a fraction of the standard deviation (default 0.2)'),
});

const Num = z.number().nullable();
const Output = z.object({
  n: z.number().int(),
  lyapunov: Num,
  sample_entropy: Num,
  permutation_entropy: Num,
  hurst: Num,
  zero_one_K: Num,
  classification: z.enum(['constant', 'periodic', 'chaotic', 'stochastic', 'nonstationary', 'indeterminate']),
  fingerprint: z.string(),
  details: z.object({
    lyapunov_divergence: z.array(z.number()),
    lyapunov_references: z.number().int(),
    sample_entropy_points: z.number().int(),
    zero_one_points: z.number().int(),
    dfa_scales: z.array(z.number().int()),
  }),
});
type Out = z.infer<typeof Output>;

export const chaosFingerprint = defineTool({
  name: 'chaos_fingerprint',
  description:
    'Nonlinear fingerprint of a series: Lyapunov exponent (Rosenstein), sample and permutation entropy, Hurst (DFA), 0-1 test K and a classification.',
  tier: 'enterprise',
  priceCents: 5,
  family: 'math',
  input: Input,
  qField: 'series',
  qParse: 'numbers',
  progress: true,
  output: '{n, lyapunov, sample_entropy, permutation_entropy, hurst, zero_one_K, classification, fingerprint, details}',
  outputSchema: Output,
  examples: [
    { series: logistic(400, 4, 0.1).map((v) => Number(v.toFixed(8))) },
    { series: Array.from({ length: 200 }, (_, i) => Number(Math.sin((2 * Math.PI * i) / 25).toFixed(6))) },
  ],
  isolated: import.meta.url,
  limits: { timeMs: 30_000, memoryMb: 256 },
  // The slowest case found: a two-valued series makes every template match and every neighbour tie (about 2.7 s here).
  largestInput: () => ({
    series: Array.from({ length: MAX_POINTS }, (_, i) => i % 2),
    embedding_dimension: 10,
    permutation_order: 7,
    lyapunov_fit_steps: 50,
    theiler_window: 1000,
  }),
  handler: async (input, ctx): Promise<Out> => {
    const x = input.series;
    const n = x.length;
    const mean = x.reduce((a, b) => a + b, 0) / n;
    const sd = Math.sqrt(x.reduce((a, b) => a + (b - mean) ** 2, 0) / n);
    const empty = { lyapunov_divergence: [], lyapunov_references: 0, sample_entropy_points: 0, zero_one_points: 0, dfa_scales: [] };
    if (sd === 0) {
      return {
        n,
        lyapunov: null,
        sample_entropy: null,
        permutation_entropy: 0,
        hurst: null,
        zero_one_K: null,
        classification: 'constant',
        fingerprint: 'constant',
        details: empty,
      };
    }
    const step = async (stage: string, done: number) => {
      checkAborted(ctx.signal);
      await ctx.progress({ stage, done, total: 5 });
    };
    await step('lyapunov', 0);
    const ly = lyapunov(x, input.embedding_dimension, input.delay, input.theiler_window, input.lyapunov_fit_steps, (1e-10 * sd) ** 2, ctx.signal);
    await step('sample_entropy', 1);
    const sampleN = Math.min(n, SAMPEN_POINTS);
    const se = sampleEntropy(x.slice(0, sampleN), input.sample_entropy_m, input.sample_entropy_r * sd, ctx.signal);
    await step('permutation_entropy', 2);
    const pe = permutationEntropy(x, input.permutation_order);
    await step('dfa', 3);
    const dfa = dfaAlpha(x);
    await step('zero_one', 4);
    const zeroN = Math.min(n, ZERO_ONE_POINTS);
    const K = zeroOne(x.slice(0, zeroN), ctx.signal);
    await ctx.progress({ stage: 'done', done: 5, total: 5 });
    const r = {
      lyapunov: ly.lambda === null ? null : sig(ly.lambda),
      sample_entropy: se === null ? null : sig(se),
      permutation_entropy: sig(pe),
      hurst: dfa.alpha === null ? null : sig(dfa.alpha),
      zero_one_K: K === null ? null : sig(K),
    };
    const classification = classify(r);
    const f = (v: number | null) => (v === null ? 'na' : v.toFixed(2));
    return {
      n,
      ...r,
      classification,
      fingerprint: `L${f(r.lyapunov)}|S${f(r.sample_entropy)}|P${f(r.permutation_entropy)}|H${f(r.hurst)}|K${f(r.zero_one_K)}|${classification}`,
      details: {
        lyapunov_divergence: ly.divergence.map((v) => sig(v)),
        lyapunov_references: ly.references,
        sample_entropy_points: sampleN,
        zero_one_points: zeroN,
        dfa_scales: dfa.scales,
      },
    };
  },
});

/** The logistic map x ← r·x·(1 − x) from x0 (examples, largestInput, tests). */
export function logistic(n: number, r: number, x0: number): number[] {
  const out = new Array<number>(n);
  let v = x0;
  for (let i = 0; i < n; i++) {
    out[i] = v;
    v = r * v * (1 - v);
  }
  return out;
}

type Measures = { lyapunov: number | null; sample_entropy: number | null; permutation_entropy: number; hurst: number | null; zero_one_K: number | null };

/**
 * Rules, in order: K < 0.5 with permutation entropy < 0.8 is regular (periodic or quasi-periodic);
 * a DFA α above 1.2 is a nonstationary, random-walk-like series; permutation entropy ≥ 0.95 (almost
 * every ordinal pattern equally likely) is noise; K ≥ 0.8 with a positive Lyapunov exponent is
 * chaos; any other K < 0.5 is regular; anything else is indeterminate.
 */
export function classify(m: Measures): Out['classification'] {
  if (m.zero_one_K === null) return 'indeterminate';
  if (m.zero_one_K < 0.5 && m.permutation_entropy < 0.8) return 'periodic';
  if (m.hurst !== null && m.hurst > 1.2) return 'nonstationary';
  if (m.permutation_entropy >= 0.95) return 'stochastic';
  if (m.zero_one_K >= 0.8 && m.lyapunov !== null && m.lyapunov > 0) return 'chaotic';
  if (m.zero_one_K < 0.5) return 'periodic';
  return 'indeterminate';
}

function lyapunov(x: number[], m: number, tau: number, theiler: number, fit: number, floor: number, signal: AbortSignal) {
  const M = x.length - (m - 1) * tau; // embedded points
  const horizon = fit;
  const usable = M - horizon; // references and neighbours need `horizon` steps ahead
  if (usable < 2) return { lambda: null, divergence: [], references: 0 };
  const coord = (i: number, d: number) => x[i + d * tau]!;
  const order = Array.from({ length: usable }, (_, i) => i).sort((a, b) => x[a]! - x[b]! || a - b);
  const pos = new Int32Array(usable);
  for (let s = 0; s < usable; s++) pos[order[s]!] = s;
  const refs = Math.min(LYAP_REFERENCES, usable);
  const sum = new Float64Array(horizon + 1);
  const cnt = new Float64Array(horizon + 1);
  let used = 0;
  for (let t = 0; t < refs; t++) {
    if (t % 256 === 0) checkAborted(signal);
    const i = Math.floor((t * usable) / refs);
    let best = Infinity;
    let bestJ = -1;
    const s0 = pos[i]!;
    let scanned = 0;
    for (const dir of [-1, 1]) {
      for (let s = s0 + dir; s >= 0 && s < usable && scanned < LYAP_SCAN; s += dir) {
        const j = order[s]!;
        const d0 = x[j]! - x[i]!;
        if (d0 * d0 >= best) break;
        scanned++;
        if (Math.abs(i - j) <= theiler) continue;
        let d = 0;
        for (let k = 0; k < m && d < best; k++) d += (coord(i, k) - coord(j, k)) ** 2;
        if (d > floor && (d < best || (d === best && j < bestJ))) {
          best = d;
          bestJ = j;
        }
      }
    }
    if (bestJ < 0) continue;
    used++;
    for (let k = 0; k <= horizon; k++) {
      let d = 0;
      for (let e = 0; e < m; e++) d += (coord(i + k, e) - coord(bestJ + k, e)) ** 2;
      if (d > floor) {
        sum[k]! += 0.5 * Math.log(d);
        cnt[k]! += 1;
      }
    }
  }
  if (!used) return { lambda: null, divergence: [], references: 0 };
  const ks: number[] = [];
  const ys: number[] = [];
  for (let k = 0; k <= horizon; k++) {
    if (cnt[k]) {
      ks.push(k);
      ys.push(sum[k]! / cnt[k]!);
    }
  }
  return { lambda: ks.length >= 2 ? linearFit(ks, ys).slope : null, divergence: ys, references: used };
}

function sampleEntropy(x: number[], m: number, r: number, signal: AbortSignal): number | null {
  const n = x.length;
  const templates = n - m; // same number of templates for lengths m and m + 1
  let B = 0;
  let A = 0;
  for (let i = 0; i < templates; i++) {
    if (i % 512 === 0) checkAborted(signal);
    for (let j = i + 1; j < templates; j++) {
      let ok = true;
      for (let k = 0; k < m; k++) {
        if (Math.abs(x[i + k]! - x[j + k]!) > r) {
          ok = false;
          break;
        }
      }
      if (!ok) continue;
      B++;
      if (Math.abs(x[i + m]! - x[j + m]!) <= r) A++;
    }
  }
  if (A === 0 || B === 0) return null;
  return -Math.log(A / B);
}

function permutationEntropy(x: number[], order: number): number {
  const counts = new Map<number, number>();
  const idx = new Array<number>(order);
  let total = 0;
  for (let i = 0; i + order <= x.length; i++) {
    for (let k = 0; k < order; k++) idx[k] = k;
    idx.sort((a, b) => x[i + a]! - x[i + b]! || a - b);
    let code = 0;
    for (let k = 0; k < order; k++) code = code * order + idx[k]!;
    counts.set(code, (counts.get(code) ?? 0) + 1);
    total++;
  }
  let h = 0;
  for (const c of counts.values()) {
    const p = c / total;
    h -= p * Math.log(p);
  }
  let fact = 1;
  for (let k = 2; k <= order; k++) fact *= k;
  return h / Math.log(fact);
}

function dfaAlpha(x: number[]): { alpha: number | null; scales: number[] } {
  const n = x.length;
  const mean = x.reduce((a, b) => a + b, 0) / n;
  const y = new Float64Array(n);
  let acc = 0;
  for (let i = 0; i < n; i++) {
    acc += x[i]! - mean;
    y[i] = acc;
  }
  const scales: number[] = [];
  const lo = 4;
  const hi = Math.floor(n / 4);
  for (let k = 0; k < 20; k++) {
    const s = Math.round(lo * (hi / lo) ** (k / 19));
    if (!scales.includes(s)) scales.push(s);
  }
  const lx: number[] = [];
  const lf: number[] = [];
  for (const s of scales) {
    const boxes = Math.floor(n / s);
    let total = 0;
    // Boxes from the start and from the end, so no data is left out.
    for (const fromEnd of [false, true]) {
      for (let b = 0; b < boxes; b++) {
        const start = fromEnd ? n - (b + 1) * s : b * s;
        // Least-squares line over t = 0..s-1.
        let sy = 0;
        let sty = 0;
        for (let t = 0; t < s; t++) {
          sy += y[start + t]!;
          sty += t * y[start + t]!;
        }
        const mt = (s - 1) / 2;
        const stt = (s * (s * s - 1)) / 12;
        const slope = (sty - mt * sy) / stt;
        const icpt = sy / s - slope * mt;
        let v = 0;
        for (let t = 0; t < s; t++) v += (y[start + t]! - icpt - slope * t) ** 2;
        total += v / s;
      }
    }
    const F = Math.sqrt(total / (2 * boxes));
    if (F > 0) {
      lx.push(Math.log(s));
      lf.push(Math.log(F));
    }
  }
  return { alpha: lx.length >= 2 ? linearFit(lx, lf).slope : null, scales };
}

function zeroOne(x: number[], signal: AbortSignal): number | null {
  const n = x.length;
  const ncut = Math.floor(n / 10);
  if (ncut < 2) return null;
  const mean = x.reduce((a, b) => a + b, 0) / n;
  const ns: number[] = [];
  const stepN = Math.max(1, ncut / ZERO_ONE_N);
  for (let v = 1; v <= ncut; v = Math.max(v + 1, Math.round(v + stepN))) ns.push(v);
  const p = new Float64Array(n);
  const q = new Float64Array(n);
  const ks: number[] = [];
  for (let ci = 0; ci < ZERO_ONE_C; ci++) {
    checkAborted(signal);
    const c = Math.PI / 5 + ((3 * Math.PI) / 5) * ((ci + 0.5) / ZERO_ONE_C);
    let ps = 0;
    let qs = 0;
    for (let j = 0; j < n; j++) {
      ps += x[j]! * Math.cos((j + 1) * c);
      qs += x[j]! * Math.sin((j + 1) * c);
      p[j] = ps;
      q[j] = qs;
    }
    const D: number[] = [];
    for (const m of ns) {
      let s = 0;
      for (let j = 0; j < n - m; j++) s += (p[j + m]! - p[j]!) ** 2 + (q[j + m]! - q[j]!) ** 2;
      D.push(s / (n - m) - mean * mean * ((1 - Math.cos(m * c)) / (1 - Math.cos(c))));
    }
    const r = corr(ns, D);
    if (r !== null) ks.push(r);
  }
  if (!ks.length) return null;
  ks.sort((a, b) => a - b);
  const mid = ks.length >> 1;
  return ks.length % 2 ? ks[mid]! : (ks[mid - 1]! + ks[mid]!) / 2;
}

function corr(a: number[], b: number[]): number | null {
  const n = a.length;
  const ma = a.reduce((s, v) => s + v, 0) / n;
  const mb = b.reduce((s, v) => s + v, 0) / n;
  let sab = 0;
  let saa = 0;
  let sbb = 0;
  for (let i = 0; i < n; i++) {
    sab += (a[i]! - ma) * (b[i]! - mb);
    saa += (a[i]! - ma) ** 2;
    sbb += (b[i]! - mb) ** 2;
  }
  return saa && sbb ? sab / Math.sqrt(saa * sbb) : null;
}
