import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool } from '../types.js';
import { checkAborted, chiSquaredP, sig } from './stats.js';

/**
 * prime_residue: primes up to n (≤ 10^8) counted over the residue classes of a modulus, with a
 * chi-squared test across the classes coprime to the modulus (the prime race); or, for one n up to
 * 10^30, an inspection: Miller–Rabin, Pollard–Brent factoring, Jacobi symbol, multiplicative order.
 * Everything is exact integer work; shares, chi2 and p are rounded to 6 significant digits.
 */

export const SIEVE_MAX = 100_000_000;
const INSPECT_MAX = 10n ** 30n;
/** Pollard–Brent modular multiplications per inspection (about 15 s here) before a cofactor is reported unfactored. */
const RHO_BUDGET = 60_000_000;
/** Bases 2..41: a deterministic Miller–Rabin test for n < 3,317,044,064,679,887,385,961,981. */
const MR_BASES = [2n, 3n, 5n, 7n, 11n, 13n, 17n, 19n, 23n, 29n, 31n, 37n, 41n];
const MR_PROVEN_BELOW = 3_317_044_064_679_887_385_961_981n;
const MR_EXTRA = [43n, 47n, 53n, 59n, 61n, 67n, 71n];

const N = z
  .union([
    z.number().int().min(1),
    z
      .string()
      .trim()
      .regex(/^\d{1,31}$/, 'a positive integer in decimal digits'),
  ])
  .describe('The number: the sieve bound (count mode, ≤ 100,000,000) or the number to inspect (inspect mode, ≤ 10^30; send it as a string past 2^53)');

const Input = z
  .object({
    n: N,
    mode: z
      .enum(['auto', 'count', 'inspect'])
      .default('auto')
      .describe(
        'count: primes ≤ n over residue classes; inspect: primality, factors, Jacobi symbol and order of n; auto (default): count when n ≤ 10^8, else inspect',
      ),
    modulus: z.number().int().min(2).max(1000).default(4).describe('The modulus whose residue classes are counted (count) or reported (inspect); default 4'),
    base: z
      .number()
      .int()
      .min(1)
      .max(1_000_000)
      .default(2)
      .describe('inspect: a in the Jacobi symbol (a/n) and the multiplicative order of a mod n; default 2'),
  })
  .superRefine((v, ctx) => {
    if (typeof v.n === 'string' && !/^\d+$/.test(v.n.trim())) return;
    const n = BigInt(v.n);
    if (n < 1n) ctx.addIssue({ code: 'custom', path: ['n'], message: 'n must be at least 1' });
    if (n > INSPECT_MAX) ctx.addIssue({ code: 'custom', path: ['n'], message: 'n must be at most 10^30' });
    if (v.mode === 'count' && n > BigInt(SIEVE_MAX)) ctx.addIssue({ code: 'custom', path: ['n'], message: 'count mode sieves up to 100,000,000' });
  });

const Residue = z.object({ r: z.number().int(), count: z.number().int(), share: z.number(), coprime: z.boolean() });
const CountOut = z.object({
  mode: z.literal('count'),
  n: z.number().int(),
  modulus: z.number().int(),
  count: z.number().int(),
  by_residue: z.array(Residue),
  coprime_classes: z.number().int(),
  chi2: z.number(),
  df: z.number().int(),
  p: z.number(),
  race: z.object({ leader: z.number().int().nullable(), trailer: z.number().int().nullable(), lead: z.number().int() }),
});
const InspectOut = z.object({
  mode: z.literal('inspect'),
  n: z.string(),
  is_prime: z.boolean(),
  primality: z.enum(['proven', 'probable']),
  factors: z.array(z.object({ p: z.string(), e: z.number().int(), prime: z.boolean() })),
  fully_factored: z.boolean(),
  modulus: z.number().int(),
  residue: z.number().int(),
  base: z.number().int(),
  jacobi: z.number().int().nullable(),
  order: z.string().nullable(),
});
const Output = z.discriminatedUnion('mode', [CountOut, InspectOut]);
type Out = z.infer<typeof Output>;

export const primeResidue = defineTool({
  name: 'prime_residue',
  description:
    'Primes up to n (≤ 10^8) over the residue classes of a modulus with a chi-squared test (prime races), or one n ≤ 10^30 inspected: primality, factors, Jacobi symbol, order.',
  tier: 'enterprise',
  priceCents: 5,
  family: 'math',
  input: Input,
  qField: 'n',
  qParse: 'text',
  progress: true,
  output:
    'count: {mode, n, modulus, count, by_residue[{r,count,share,coprime}], coprime_classes, chi2, df, p, race{leader,trailer,lead}}; inspect: {mode, n, is_prime, primality, factors[{p,e,prime}], fully_factored, modulus, residue, base, jacobi, order}',
  outputSchema: Output,
  examples: [{ n: 1_000_000 }, { n: 1_000_000, modulus: 10 }, { n: '1000000000000000000000000000', mode: 'inspect', modulus: 4 }],
  isolated: import.meta.url,
  // The 10^8 sieve takes about 1 s here (odd-only segments of 256 KiB); the margin is for busy machines.
  limits: { timeMs: 60_000, memoryMb: 128 },
  largestInput: () => ({ n: SIEVE_MAX, modulus: 1000 }),
  handler: async (input, ctx): Promise<Out> => {
    const n = BigInt(input.n);
    const mode = input.mode === 'auto' ? (n <= BigInt(SIEVE_MAX) ? 'count' : 'inspect') : input.mode;
    if (mode === 'count') return count(Number(n), input.modulus, ctx);
    await ctx.progress({ stage: 'inspecting' });
    const out = inspect(n, input.modulus, input.base, ctx.signal);
    await ctx.progress({ stage: 'done' });
    return out;
  },
});

// ---- count: a segmented, odd-only sieve of Eratosthenes ------------------------------------------

function smallPrimes(limit: number): number[] {
  const mark = new Uint8Array(limit + 1);
  const out: number[] = [];
  for (let i = 2; i <= limit; i++) {
    if (mark[i]) continue;
    out.push(i);
    for (let j = i * i; j <= limit; j += i) mark[j] = 1;
  }
  return out;
}

const SEGMENT = 1 << 18; // odd numbers per segment (covers 2^19 integers)

async function count(
  n: number,
  m: number,
  ctx: { signal: AbortSignal; progress: (p: { stage: string; done?: number; total?: number; unit?: string }) => Promise<void> },
): Promise<Out> {
  const counts = new Float64Array(m);
  if (n >= 2) counts[2 % m]! += 1;
  const base = smallPrimes(Math.floor(Math.sqrt(n)) + 1).filter((p) => p > 2);
  // Odd number 2i+1 has index i; index 0 is 1 (not prime). Odd numbers ≤ n: indexes 0..last.
  const last = n >= 1 ? Math.floor((n - 1) / 2) : -1;
  const next = base.map((p) => (p * p - 1) / 2); // first index to cross off for p
  const seg = new Uint8Array(SEGMENT);
  for (let s = 0, lo = 0; lo <= last; s++, lo += SEGMENT) {
    checkAborted(ctx.signal);
    const hi = Math.min(lo + SEGMENT - 1, last);
    seg.fill(0);
    for (let k = 0; k < base.length; k++) {
      const p = base[k]!;
      let j = next[k]!;
      if (j > hi) continue;
      for (; j <= hi; j += p) seg[j - lo] = 1;
      next[k] = j;
    }
    for (let i = lo === 0 ? 1 : lo; i <= hi; i++) if (!seg[i - lo]) counts[(2 * i + 1) % m]! += 1;
    if (s % 16 === 15 || hi === last) await ctx.progress({ stage: 'sieving', done: Math.min(2 * hi + 2, n), total: n, unit: 'numbers' });
  }
  let total = 0;
  for (const c of counts) total += c;
  const by_residue: Array<z.infer<typeof Residue>> = [];
  const coprimeCounts: Array<[number, number]> = [];
  for (let r = 0; r < m; r++) {
    const coprime = gcd(r, m) === 1;
    if (coprime) coprimeCounts.push([r, counts[r]!]);
    if (coprime || counts[r]! > 0) by_residue.push({ r, count: counts[r]!, share: total ? sig(counts[r]! / total) : 0, coprime });
  }
  const k = coprimeCounts.length;
  const inClasses = coprimeCounts.reduce((a, [, c]) => a + c, 0);
  const expected = inClasses / k;
  const chi2 = expected > 0 ? coprimeCounts.reduce((a, [, c]) => a + (c - expected) ** 2 / expected, 0) : 0;
  const df = k - 1;
  let leader: number | null = null;
  let trailer: number | null = null;
  for (const [r, c] of coprimeCounts) {
    if (leader === null || c > counts[leader]!) leader = r;
    if (trailer === null || c < counts[trailer]!) trailer = r;
  }
  const lead = leader === null || trailer === null ? 0 : counts[leader]! - counts[trailer]!;
  return {
    mode: 'count',
    n,
    modulus: m,
    count: total,
    by_residue,
    coprime_classes: k,
    chi2: sig(chi2),
    df,
    p: expected > 0 ? sig(chiSquaredP(chi2, df)) : 1,
    race: { leader: lead > 0 ? leader : null, trailer: lead > 0 ? trailer : null, lead },
  };
}

function gcd(a: number, b: number): number {
  while (b) [a, b] = [b, a % b];
  return a;
}

// ---- inspect: BigInt number theory ---------------------------------------------------------------

function bgcd(a: bigint, b: bigint): bigint {
  if (a < 0n) a = -a;
  while (b) [a, b] = [b, a % b];
  return a;
}

export function modPow(b: bigint, e: bigint, m: bigint): bigint {
  if (m === 1n) return 0n;
  let r = 1n;
  b %= m;
  while (e > 0n) {
    if (e & 1n) r = (r * b) % m;
    b = (b * b) % m;
    e >>= 1n;
  }
  return r;
}

function strongProbablePrime(n: bigint, a: bigint, d: bigint, s: number): boolean {
  let x = modPow(a, d, n);
  if (x === 1n || x === n - 1n) return true;
  for (let i = 1; i < s; i++) {
    x = (x * x) % n;
    if (x === n - 1n) return true;
    if (x === 1n) return false;
  }
  return false;
}

/** Miller–Rabin: deterministic (proven) below 3.3·10^24 with bases 2..41; 20 prime bases above. */
export function isPrime(n: bigint): boolean {
  if (n < 2n) return false;
  for (const p of [...MR_BASES, ...MR_EXTRA]) {
    if (n === p) return true;
    if (n % p === 0n) return false;
  }
  let d = n - 1n;
  let s = 0;
  while ((d & 1n) === 0n) {
    d >>= 1n;
    s++;
  }
  const bases = n < MR_PROVEN_BELOW ? MR_BASES : [...MR_BASES, ...MR_EXTRA];
  return bases.every((a) => strongProbablePrime(n, a, d, s));
}

/** Pollard's rho with Brent's cycle detection and batched gcds; null when the budget runs out. */
function pollardBrent(n: bigint, budget: { left: number }, signal: AbortSignal): bigint | null {
  if ((n & 1n) === 0n) return 2n;
  for (let c = 1n; c < 64n; c++) {
    let y = 2n;
    let r = 1;
    let q = 1n;
    let g = 1n;
    let x = 0n;
    let ys = 0n;
    const m = 128;
    const f = (v: bigint) => (v * v + c) % n;
    do {
      x = y;
      for (let i = 0; i < r; i++) y = f(y);
      let k = 0;
      do {
        ys = y;
        const steps = Math.min(m, r - k);
        for (let i = 0; i < steps; i++) {
          y = f(y);
          q = (q * (x > y ? x - y : y - x)) % n;
        }
        budget.left -= 2 * steps;
        if (budget.left < 0) return null;
        if ((budget.left & 0xffff) < 2 * m) checkAborted(signal);
        g = bgcd(q, n);
        k += m;
      } while (k < r && g === 1n);
      r *= 2;
    } while (g === 1n);
    if (g === n) {
      // The batch overshot: step one at a time from the saved point.
      do {
        ys = f(ys);
        g = bgcd(x > ys ? x - ys : ys - x, n);
        budget.left -= 1;
      } while (g === 1n && budget.left > 0);
    }
    if (g !== n && g !== 1n) return g;
  }
  return null;
}

const TRIAL = smallPrimesBig(10_000);
function smallPrimesBig(limit: number): bigint[] {
  const mark = new Uint8Array(limit + 1);
  const out: bigint[] = [];
  for (let i = 2; i <= limit; i++) {
    if (mark[i]) continue;
    out.push(BigInt(i));
    for (let j = i * i; j <= limit; j += i) mark[j] = 1;
  }
  return out;
}

/** Prime factorisation: trial division to 10^4, then Miller–Rabin and Pollard–Brent within a budget. */
export function factorize(
  n: bigint,
  signal: AbortSignal,
  budget = { left: RHO_BUDGET },
): { factors: Map<bigint, { e: number; prime: boolean }>; complete: boolean } {
  const factors = new Map<bigint, { e: number; prime: boolean }>();
  const add = (p: bigint, prime: boolean) => {
    const f = factors.get(p);
    if (f) f.e++;
    else factors.set(p, { e: 1, prime });
  };
  for (const p of TRIAL) {
    if (p * p > n) break;
    while (n % p === 0n) {
      add(p, true);
      n /= p;
    }
  }
  let complete = true;
  const stack = n > 1n ? [n] : [];
  while (stack.length) {
    const m = stack.pop()!;
    if (isPrime(m)) {
      add(m, true);
      continue;
    }
    const d = pollardBrent(m, budget, signal);
    if (d === null) {
      add(m, false);
      complete = false;
      continue;
    }
    stack.push(d, m / d);
  }
  return { factors, complete };
}

/** Jacobi symbol (a/n) for odd n > 0. */
export function jacobi(a: bigint, n: bigint): number {
  a %= n;
  if (a < 0n) a += n;
  let t = 1;
  while (a !== 0n) {
    while ((a & 1n) === 0n) {
      a >>= 1n;
      const r = n & 7n;
      if (r === 3n || r === 5n) t = -t;
    }
    [a, n] = [n, a];
    if ((a & 3n) === 3n && (n & 3n) === 3n) t = -t;
    a %= n;
  }
  return n === 1n ? t : 0;
}

function lcm(a: bigint, b: bigint): bigint {
  return (a / bgcd(a, b)) * b;
}

function inspect(n: bigint, modulus: number, base: number, signal: AbortSignal): Out {
  const budget = { left: RHO_BUDGET };
  const prime = isPrime(n);
  const { factors, complete } = prime ? { factors: new Map([[n, { e: 1, prime: true }]]), complete: true } : factorize(n, signal, budget);
  const a = BigInt(base);
  let order: string | null = null;
  if (n > 1n && complete && bgcd(a, n) === 1n) {
    // Carmichael λ(n), then strip each of its prime factors while a^(λ/q) ≡ 1.
    let lambda = 1n;
    for (const [p, { e }] of factors) {
      const pe1 = p ** BigInt(e - 1);
      const l = p === 2n ? (e <= 2 ? pe1 : pe1 / 2n) : pe1 * (p - 1n);
      lambda = lcm(lambda, l);
    }
    const lf = factorize(lambda, signal, budget);
    if (lf.complete) {
      let ord = lambda;
      for (const [q] of lf.factors) {
        while (ord % q === 0n && modPow(a, ord / q, n) === 1n) ord /= q;
      }
      order = ord.toString();
    }
  } else if (n === 1n) {
    order = '1';
  }
  const sorted = [...factors.entries()].sort((x, y) => (x[0] < y[0] ? -1 : 1));
  if (!complete && !sorted.some(([, f]) => !f.prime)) throw new AppError('internal_error', 'factorisation state');
  return {
    mode: 'inspect',
    n: n.toString(),
    is_prime: prime,
    primality: prime && n >= MR_PROVEN_BELOW ? 'probable' : 'proven',
    factors: sorted.map(([p, f]) => ({ p: p.toString(), e: f.e, prime: f.prime })),
    fully_factored: complete,
    modulus,
    residue: Number(n % BigInt(modulus)),
    base,
    jacobi: (n & 1n) === 1n ? jacobi(a, n) : null,
    order,
  };
}
