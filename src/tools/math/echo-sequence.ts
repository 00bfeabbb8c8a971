import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool, type ToolContext } from '../types.js';

/**
 * echo_sequence: the rule of an integer sequence and its exact continuation, in BigInt and exact
 * rationals (never floating point). Candidates, simplest first:
 *   - polynomial: finite differences; degree d when the d-th differences are constant over at least
 *     two values (so d + 1 terms fix the rule and at least one more confirms it);
 *   - linear recurrence with constant rational coefficients: Berlekamp–Massey over the rationals;
 *     order L ≤ 25 is accepted only when 2L < number of terms (2L terms fix it; the rest confirm it).
 *     Order 1 is the known geometric form a(n) = a(0)·r^n; a few named recurrences are labelled.
 * A rule is returned only if regenerating the sequence from it reproduces every given term exactly
 * (`verified_terms`). Noise (no rule that the terms over-determine) gives `rule: null`, `next: []`.
 */

export const MAX_TERMS = 200;
export const MIN_TERMS = 3;
export const MAX_DIGITS = 120;
export const MAX_EXTEND = 50;
/** Longest linear recurrence looked for (2 × 25 terms determine it). */
export const MAX_ORDER = 25;

// ------------------------------------------------------------------ exact rationals (BigInt)

const babs = (a: bigint) => (a < 0n ? -a : a);
function gcd(a: bigint, b: bigint): bigint {
  a = babs(a);
  b = babs(b);
  while (b) [a, b] = [b, a % b];
  return a;
}

export class Q {
  readonly n: bigint;
  readonly d: bigint;
  constructor(n: bigint, d = 1n) {
    if (d === 0n) throw new Error('zero denominator');
    if (d < 0n) {
      n = -n;
      d = -d;
    }
    const g = d === 1n ? 1n : gcd(n, d);
    this.n = g > 1n ? n / g : n;
    this.d = g > 1n ? d / g : d;
  }
  static readonly ZERO = new Q(0n);
  static readonly ONE = new Q(1n);
  add(o: Q): Q {
    return this.d === o.d ? new Q(this.n + o.n, this.d) : new Q(this.n * o.d + o.n * this.d, this.d * o.d);
  }
  sub(o: Q): Q {
    return this.add(o.neg());
  }
  mul(o: Q): Q {
    return new Q(this.n * o.n, this.d * o.d);
  }
  div(o: Q): Q {
    return new Q(this.n * o.d, this.d * o.n);
  }
  neg(): Q {
    return new Q(-this.n, this.d);
  }
  isZero(): boolean {
    return this.n === 0n;
  }
  eq(o: Q): boolean {
    return this.n === o.n && this.d === o.d;
  }
  isInteger(): boolean {
    return this.d === 1n;
  }
  toString(): string {
    return this.d === 1n ? this.n.toString() : `${this.n}/${this.d}`;
  }
}

// ------------------------------------------------------------------ input / output

const Term = z.union([
  z.number().int().refine(Number.isSafeInteger, 'integers beyond 2^53 must be given as digit strings'),
  z.string().regex(new RegExp(`^-?\\d{1,${MAX_DIGITS}}$`), `an integer as a digit string (at most ${MAX_DIGITS} digits)`),
]);

const EchoInput = z
  .object({
    terms: z
      .array(Term)
      .min(MIN_TERMS)
      .max(MAX_TERMS)
      .describe(
        `${MIN_TERMS}-${MAX_TERMS} consecutive integer terms, as numbers or digit strings (exact: digit strings for anything beyond 2^53, up to ${MAX_DIGITS} digits)`,
      ),
    extend: z.number().int().min(1).max(MAX_EXTEND).optional().describe(`How many further terms to give (default 10, max ${MAX_EXTEND})`),
  })
  .strict();

const KINDS = ['polynomial', 'geometric', 'linear_recurrence'] as const;

const EchoOutput = z.object({
  rule: z
    .object({
      kind: z.enum(KINDS),
      name: z.string().nullable().describe('A known form, e.g. "Fibonacci-type", "arithmetic", "squares"; null when none'),
      formula: z.string(),
      coefficients: z
        .array(z.string())
        .describe('polynomial: c0, c1, ... of a(n) = Σ c_k n^k (n from 0); recurrence: c1..cL of a(n) = Σ c_j a(n-j); exact rationals as "p/q"'),
      degree: z.number().int().nullable(),
      order: z.number().int().nullable(),
    })
    .nullable(),
  next: z.array(z.string()).describe('The continuation, as exact integer strings ("p/q" if the rule leaves the integers)'),
  verified_terms: z.number().int().describe('How many of the given terms the rule reproduces exactly (all of them, or 0 with no rule)'),
  terms_given: z.number().int(),
  confidence: z
    .enum(['high', 'medium', 'low', 'none'])
    .describe('From the terms beyond those needed to fix the rule: low 1-2, medium 3-4, high 5+; none with no rule'),
  confirming_terms: z.number().int().describe('Given terms beyond those needed to determine the rule'),
  note: z.string(),
});
type EchoResult = z.infer<typeof EchoOutput>;

// ------------------------------------------------------------------ polynomial (finite differences)

interface Candidate {
  kind: (typeof KINDS)[number];
  name: string | null;
  formula: string;
  coefficients: Q[];
  degree: number | null;
  order: number | null;
  /** Terms needed to determine the rule. */
  params: number;
  generate(count: number): Q[];
}

function polynomial(terms: bigint[]): Candidate | null {
  const rows: bigint[][] = [terms];
  for (let d = 0; d <= terms.length - 2; d++) {
    const row = rows[d]!;
    if (row.every((v) => v === row[0])) return polyCandidate(rows, d);
    const next: bigint[] = [];
    for (let i = 1; i < row.length; i++) next.push(row[i]! - row[i - 1]!);
    rows.push(next);
  }
  return null;
}

function polyCandidate(rows: bigint[][], degree: number): Candidate {
  const heads = rows.slice(0, degree + 1).map((r) => r[0]!);
  // Newton form a(n) = Σ heads[k]·C(n, k), expanded into Σ c_j n^j with exact rationals.
  let coeffs: Q[] = [Q.ZERO];
  let basis: Q[] = [Q.ONE]; // C(n, k) as a polynomial in n
  let fact = 1n;
  for (let k = 0; k <= degree; k++) {
    if (k > 0) {
      // basis *= (n - (k-1)), fact *= k
      const shifted: Q[] = [Q.ZERO, ...basis];
      const m = new Q(BigInt(-(k - 1)));
      for (let j = 0; j < basis.length; j++) shifted[j] = shifted[j]!.add(basis[j]!.mul(m));
      basis = shifted;
      fact *= BigInt(k);
    }
    const scale = new Q(heads[k]!, fact);
    while (coeffs.length < basis.length) coeffs.push(Q.ZERO);
    coeffs = coeffs.map((c, j) => (j < basis.length ? c.add(basis[j]!.mul(scale)) : c));
  }
  while (coeffs.length > 1 && coeffs[coeffs.length - 1]!.isZero()) coeffs.pop();
  const name =
    degree === 0
      ? 'constant'
      : degree === 1
        ? 'arithmetic'
        : degree === 2 && coeffs.length === 3 && coeffs[2]!.eq(Q.ONE) && coeffs[1]!.isZero() && coeffs[0]!.isZero()
          ? 'squares'
          : degree === 3 && coeffs.length === 4 && coeffs[3]!.eq(Q.ONE) && coeffs.slice(0, 3).every((c) => c.isZero())
            ? 'cubes'
            : null;
  return {
    kind: 'polynomial',
    name,
    formula: `a(n) = ${polyString(coeffs)}, n = 0, 1, 2, ...`,
    coefficients: coeffs,
    degree,
    order: null,
    params: degree + 1,
    generate: (count) => {
      // Extend the difference table: exact integers.
      const table = rows.slice(0, degree + 1).map((r) => [...r]);
      const out: Q[] = [];
      const total = rows[0]!.length + count;
      const built = table.map((r) => r.slice(0, 1));
      // Rebuild from the heads so the generation does not lean on the given terms.
      for (let i = 0; i < total; i++) {
        out.push(new Q(built[0]![i]!));
        // next value of each row from the row below: row_k[i+1] = row_k[i] + row_{k+1}[i]
        for (let k = degree; k >= 0; k--) {
          const row = built[k]!;
          row.push(k === degree ? row[i]! : row[i]! + built[k + 1]![i]!);
        }
      }
      return out;
    },
  };
}

function polyString(coeffs: Q[]): string {
  const parts: string[] = [];
  for (let j = coeffs.length - 1; j >= 0; j--) {
    const c = coeffs[j]!;
    if (c.isZero() && coeffs.length > 1) continue;
    const mono = j === 0 ? '' : j === 1 ? 'n' : `n^${j}`;
    const abs = c.n < 0n ? c.neg() : c;
    const num = mono && abs.eq(Q.ONE) ? '' : abs.isInteger() ? abs.toString() : `(${abs})`;
    const term = `${num}${mono}` || '0';
    parts.push(parts.length === 0 ? (c.n < 0n ? `-${term}` : term) : `${c.n < 0n ? '-' : '+'} ${term}`);
  }
  return parts.join(' ') || '0';
}

// ------------------------------------------------------------------ Berlekamp–Massey over Q

/** Berlekamp–Massey over the rationals: the shortest recurrence a(n) = Σ c_j a(n-j) of `s`. */
export function berlekampMassey(s: Q[]): Q[] {
  let C: Q[] = [Q.ONE];
  let B: Q[] = [Q.ONE];
  let L = 0;
  let m = 1;
  let b = Q.ONE;
  for (let i = 0; i < s.length; i++) {
    let d = s[i]!;
    for (let j = 1; j <= L; j++) if (!C[j]!.isZero()) d = d.add(C[j]!.mul(s[i - j]!));
    if (d.isZero()) {
      m++;
      continue;
    }
    const coef = d.div(b);
    const T = C;
    const next = [...C];
    while (next.length < B.length + m) next.push(Q.ZERO);
    for (let j = 0; j < B.length; j++) if (!B[j]!.isZero()) next[j + m] = next[j + m]!.sub(coef.mul(B[j]!));
    C = next;
    if (2 * L <= i) {
      L = i + 1 - L;
      B = T;
      b = d;
      m = 1;
    } else m++;
  }
  const c: Q[] = [];
  for (let j = 1; j <= L; j++) c.push((C[j] ?? Q.ZERO).neg());
  return c;
}

/**
 * The linear complexity of `s` modulo a prime (Berlekamp–Massey in F_p): O(n²) small modular
 * operations, where the rational version's numbers grow with noise. Over Q the complexity is the
 * same except when p divides one of a few determinants, so two large primes are used and the larger
 * answer kept; the rational recurrence is then found from 2L terms and checked on every term.
 */
async function complexityModP(terms: bigint[], p: bigint, ctx: ToolContext): Promise<number> {
  const mod = (a: bigint) => ((a % p) + p) % p;
  const inv = (a: bigint) => {
    // a^(p-2) mod p
    let result = 1n;
    let base = mod(a);
    let e = p - 2n;
    while (e > 0n) {
      if (e & 1n) result = (result * base) % p;
      base = (base * base) % p;
      e >>= 1n;
    }
    return result;
  };
  const s = terms.map(mod);
  let C: bigint[] = [1n];
  let B: bigint[] = [1n];
  let L = 0;
  let m = 1;
  let b = 1n;
  for (let i = 0; i < s.length; i++) {
    if (ctx.signal.aborted) throw new AppError('invalid_input', 'echo_sequence was stopped');
    if (i % 50 === 49) await ctx.progress({ stage: 'berlekamp-massey', done: i + 1, total: s.length, unit: 'terms' });
    let d = s[i]!;
    for (let j = 1; j <= L; j++) d += C[j]! * s[i - j]!;
    d %= p;
    if (d === 0n) {
      m++;
      continue;
    }
    const coef = (d * inv(b)) % p;
    const T = C;
    const next = [...C];
    while (next.length < B.length + m) next.push(0n);
    for (let j = 0; j < B.length; j++) next[j + m] = mod(next[j + m]! - coef * B[j]!);
    C = next;
    if (2 * L <= i) {
      L = i + 1 - L;
      B = T;
      b = d;
      m = 1;
    } else m++;
  }
  return L;
}

/**
 * The coefficients of a(n) = Σ_{j=1..L} c_j a(n-j) from the L equations n = L..2L-1, by fraction-free
 * (Bareiss) elimination on integers, then exact back-substitution: the numbers stay near L times the
 * terms' size, where Berlekamp–Massey over Q lets them grow. Null when the system is singular.
 */
function solveRecurrence(a: bigint[], L: number): Q[] | null {
  const M: bigint[][] = [];
  for (let i = 0; i < L; i++) {
    const row: bigint[] = [];
    for (let j = 0; j < L; j++) row.push(a[L + i - j - 1]!);
    row.push(a[L + i]!);
    M.push(row);
  }
  let prev = 1n;
  for (let k = 0; k < L; k++) {
    let pivot = k;
    while (pivot < L && M[pivot]![k] === 0n) pivot++;
    if (pivot === L) return null;
    if (pivot !== k) [M[k], M[pivot]] = [M[pivot]!, M[k]!];
    const rk = M[k]!;
    for (let i = k + 1; i < L; i++) {
      const ri = M[i]!;
      for (let j = k + 1; j <= L; j++) ri[j] = (rk[k]! * ri[j]! - ri[k]! * rk[j]!) / prev;
      ri[k] = 0n;
    }
    prev = rk[k]!;
  }
  const c: Q[] = new Array<Q>(L);
  for (let i = L - 1; i >= 0; i--) {
    const row = M[i]!;
    let v = new Q(row[L]!);
    for (let j = i + 1; j < L; j++) v = v.sub(new Q(row[j]!).mul(c[j]!));
    c[i] = v.div(new Q(row[i]!));
  }
  return c;
}

const PRIMES = [(1n << 127n) - 1n, (1n << 89n) - 1n];

const NAMED: Array<{ c: string[]; name: string }> = [
  { c: ['1', '1'], name: 'Fibonacci-type' },
  { c: ['2', '1'], name: 'Pell-type' },
  { c: ['1', '1', '1'], name: 'Tribonacci-type' },
  { c: ['0', '1', '1'], name: 'Padovan-type' },
  { c: ['1', '2'], name: 'Jacobsthal-type' },
];

function recurrenceCandidate(terms: Q[], c: Q[]): Candidate {
  const L = c.length;
  const coefficients = c;
  const generate = (count: number): Q[] => {
    const out = terms.slice(0, L);
    const total = terms.length + count;
    while (out.length < total) {
      let v = Q.ZERO;
      for (let j = 1; j <= L; j++) if (!c[j - 1]!.isZero()) v = v.add(c[j - 1]!.mul(out[out.length - j]!));
      out.push(v);
    }
    return out;
  };
  if (L === 1) {
    const r = c[0]!;
    const a0 = terms[0]!;
    return {
      kind: 'geometric',
      name: r.eq(Q.ONE) ? 'constant' : null,
      formula: `a(n) = ${a0.eq(Q.ONE) ? '' : `${wrap(a0)}·`}${wrap(r)}^n, n = 0, 1, 2, ...`,
      coefficients,
      degree: null,
      order: 1,
      params: 2,
      generate,
    };
  }
  const key = c.map(String);
  const name = NAMED.find((n) => n.c.length === key.length && n.c.every((v, i) => v === key[i]))?.name ?? null;
  const parts: string[] = [];
  c.forEach((q, i) => {
    if (q.isZero()) return;
    const abs = q.n < 0n ? q.neg() : q;
    const term = `${abs.eq(Q.ONE) ? '' : `${wrap(abs)}·`}a(n-${i + 1})`;
    parts.push(parts.length === 0 ? (q.n < 0n ? `-${term}` : term) : `${q.n < 0n ? '-' : '+'} ${term}`);
  });
  return {
    kind: 'linear_recurrence',
    name,
    formula: `a(n) = ${parts.join(' ') || '0'} for n ≥ ${L}, from a(0..${L - 1}) = ${terms.slice(0, L).join(', ')}`,
    coefficients,
    degree: null,
    order: L,
    params: 2 * L,
    generate,
  };
}

function wrap(q: Q): string {
  return q.isInteger() && q.n >= 0n ? q.toString() : `(${q})`;
}

// ------------------------------------------------------------------ the tool

function confidenceOf(confirming: number): EchoResult['confidence'] {
  return confirming >= 5 ? 'high' : confirming >= 3 ? 'medium' : 'low';
}

export async function echo(termsIn: Array<number | string>, extend: number, ctx: ToolContext): Promise<EchoResult> {
  const ints = termsIn.map((t) => BigInt(t));
  const terms = ints.map((t) => new Q(t));
  const n = terms.length;
  await ctx.progress({ stage: 'differences', done: 0, total: n, unit: 'terms' });
  const candidates: Candidate[] = [];
  const poly = polynomial(ints);
  if (poly) candidates.push(poly);
  if (!poly || poly.params > 2) {
    let L = 0;
    for (const p of PRIMES) L = Math.max(L, await complexityModP(ints, p, ctx));
    if (L > 0 && L <= MAX_ORDER && 2 * L < n) {
      const c = solveRecurrence(ints, L) ?? (L <= 8 ? berlekampMassey(terms.slice(0, 2 * L)) : []);
      if (c.length > 0 && 2 * c.length < n) candidates.push(recurrenceCandidate(terms, c));
    }
  }
  candidates.sort((a, b) => a.params - b.params);
  for (const cand of candidates) {
    const seq = cand.generate(extend);
    let verified = 0;
    while (verified < n && seq[verified]!.eq(terms[verified]!)) verified++;
    if (verified !== n) continue;
    const confirming = n - cand.params;
    const next = seq.slice(n).map(String);
    const integral = seq.slice(n).every((q) => q.isInteger());
    return {
      rule: {
        kind: cand.kind,
        name: cand.name,
        formula: cand.formula,
        coefficients: cand.coefficients.map(String),
        degree: cand.degree,
        order: cand.order,
      },
      next,
      verified_terms: verified,
      terms_given: n,
      confidence: confidenceOf(confirming),
      confirming_terms: confirming,
      note:
        `${cand.params} terms determine this rule and ${confirming} more confirm it` +
        (confirming <= 2 ? '; with so few confirming terms other rules fit as well, so give more terms to be sure' : '') +
        (integral ? '' : '; the rule leaves the integers, so some continued terms are exact fractions') +
        '.',
    };
  }
  return {
    rule: null,
    next: [],
    verified_terms: 0,
    terms_given: n,
    confidence: 'none',
    confirming_terms: 0,
    note:
      'No polynomial or linear recurrence with constant coefficients is over-determined by these terms: ' +
      'every such rule needs as many terms as were given, so none is confirmed (noise, or a rule of another kind, or too few terms).',
  };
}

const fib = [0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89];

export const echoSequence = defineTool({
  name: 'echo_sequence',
  description:
    'The rule of an integer sequence (polynomial, geometric or linear recurrence, found exactly) and its exact BigInt continuation; noise gives no rule.',
  tier: 'enterprise',
  priceCents: 2,
  family: 'math',
  input: EchoInput,
  qField: 'terms',
  qParse: 'numbers',
  output:
    '{rule{kind, name, formula, coefficients, degree, order} | null, next[] (exact integer strings), verified_terms, terms_given, confidence, confirming_terms, note}',
  outputSchema: EchoOutput,
  examples: [
    { terms: fib, extend: 5 },
    { terms: [1, 4, 9, 16, 25, 36] },
    { terms: ['4503599627370496', '9007199254740992', '18014398509481984', '36028797018963968'], extend: 3 },
  ],
  isolated: import.meta.url,
  progress: true,
  limits: { timeMs: 5000, memoryMb: 256 },
  largestInput: () => {
    // 200 terms of 120 digits repeating with period 25: the longest recurrence looked for (order 25),
    // found by Berlekamp–Massey mod p over every term, then Bareiss elimination, then 250 terms in
    // exact rationals. Slower than noise at the caps (which stops after the modular pass).
    const base = Array.from({ length: MAX_ORDER }, (_, i) => {
      let x = BigInt(i + 1) * 0x9e3779b97f4a7c15n;
      let s = '';
      while (s.length < MAX_DIGITS) {
        x = (x * 6364136223846793005n + 1442695040888963407n) % (1n << 64n);
        s += x.toString();
      }
      return (i % 2 ? '-' : '') + '9' + s.slice(0, MAX_DIGITS - 1);
    });
    return { terms: Array.from({ length: MAX_TERMS }, (_, i) => base[i % MAX_ORDER]!), extend: MAX_EXTEND };
  },
  handler: async ({ terms, extend }, ctx) => echo(terms, extend ?? 10, ctx),
});
