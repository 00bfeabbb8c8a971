import { describe, expect, it } from 'vitest';
import { primeResidue, isPrime, jacobi, factorize } from '../../../src/tools/math/prime-residue.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const run = async (input: unknown) => {
  const { ctx, progress } = makeToolContext();
  const result = await primeResidue.handler(primeResidue.input.parse(input), ctx);
  expect(primeResidue.outputSchema!.safeParse(result).success).toBe(true);
  return { result: result as any, progress };
};

describe('prime_residue count', () => {
  it('π(10^6) = 78,498 split 39,175 / 39,322 over 1 and 3 mod 4, with the class 2 holding the prime 2', async () => {
    const { result, progress } = await run({ n: 1_000_000 });
    expect(result.count).toBe(78_498);
    expect(result.by_residue).toEqual([
      { r: 1, count: 39_175, share: expect.any(Number), coprime: true },
      { r: 2, count: 1, share: expect.any(Number), coprime: false },
      { r: 3, count: 39_322, share: expect.any(Number), coprime: true },
    ]);
    expect(result.df).toBe(1);
    // chi2 = (147/2)^2 * 2 / 39248.5
    expect(result.chi2).toBeCloseTo((73.5 ** 2 * 2) / 39_248.5, 4);
    expect(result.p).toBeGreaterThan(0.59);
    expect(result.p).toBeLessThan(0.61);
    expect(result.race).toEqual({ leader: 3, trailer: 1, lead: 147 });
    expect(progress.at(-1)).toMatchObject({ stage: 'sieving', done: 1_000_000, total: 1_000_000 });
  });

  it('small bounds and moduli agree with a naive count', async () => {
    for (const [n, m] of [
      [1, 4],
      [2, 4],
      [3, 3],
      [100, 10],
      [9_973, 30],
      [65_536, 7],
    ] as const) {
      const { result } = await run({ n, modulus: m });
      const naive = new Map<number, number>();
      for (let k = 2; k <= n; k++) if (isPrime(BigInt(k))) naive.set(k % m, (naive.get(k % m) ?? 0) + 1);
      const got = new Map(result.by_residue.filter((r: any) => r.count > 0).map((r: any) => [r.r, r.count]));
      expect(got).toEqual(naive);
    }
  });

  it('mod 10 has the four classes 1, 3, 7, 9 (χ² over φ(10) = 4 classes, df 3) plus 2 and 5', async () => {
    const { result } = await run({ n: 1_000_000, modulus: 10 });
    expect(result.coprime_classes).toBe(4);
    expect(result.df).toBe(3);
    expect(result.by_residue.map((r: any) => r.r)).toEqual([1, 2, 3, 5, 7, 9]);
    expect(result.p).toBeGreaterThan(0);
    expect(result.p).toBeLessThanOrEqual(1);
  });

  it('largestInput: the 10^8 sieve gives π(10^8) = 5,761,455 inside its limits, and stops on abort', async () => {
    const start = cpuNow();
    const { result, progress } = await run(primeResidue.largestInput!());
    expect(result.count).toBe(5_761_455);
    expect(cpuNow() - start).toBeLessThan(primeResidue.limits!.timeMs!);
    expect(progress.length).toBeGreaterThan(5);
    const ac = new AbortController();
    ac.abort(new Error('time is up'));
    const { ctx } = makeToolContext({ signal: ac.signal });
    await expect(primeResidue.handler(primeResidue.input.parse({ n: 100_000_000 }), ctx)).rejects.toThrow('time is up');
  });
});

describe('prime_residue inspect', () => {
  it('a 28-digit semiprime factors (Pollard–Brent) with Jacobi symbol and order', async () => {
    const p = 1_000_003n;
    const q = 998_244_353n;
    const r = 1_000_000_007n;
    const { result } = await run({ n: String(p * q * r), mode: 'inspect', base: 3 });
    expect(result.is_prime).toBe(false);
    expect(result.factors).toEqual([
      { p: '1000003', e: 1, prime: true },
      { p: '998244353', e: 1, prime: true },
      { p: '1000000007', e: 1, prime: true },
    ]);
    expect(result.fully_factored).toBe(true);
    expect(result.jacobi).toBe(jacobi(3n, p) * jacobi(3n, q) * jacobi(3n, r));
    const ord = BigInt(result.order);
    const n = p * q * r;
    let x = 1n;
    // 3^ord ≡ 1 mod n
    let b = 3n;
    let e = ord;
    while (e > 0n) {
      if (e & 1n) x = (x * b) % n;
      b = (b * b) % n;
      e >>= 1n;
    }
    expect(x).toBe(1n);
  });

  it('10^30 − 11 is prime (probable past 3.3·10^24); 10^30 = 2^30·5^30', async () => {
    const { result } = await run({ n: '999999999999999999999999999989' });
    expect(result).toMatchObject({ mode: 'inspect', is_prime: true, primality: 'probable', residue: 1, jacobi: -1 });
    const big = await run({ n: '1000000000000000000000000000000' });
    expect(big.result.factors).toEqual([
      { p: '2', e: 30, prime: true },
      { p: '5', e: 30, prime: true },
    ]);
    expect(big.result.jacobi).toBeNull();
  });

  it('Miller–Rabin knows strong pseudoprimes and Carmichael numbers; Jacobi matches Euler on primes', () => {
    for (const c of [561n, 2047n, 3215031751n, 3825123056546413051n, 318665857834031151167461n]) expect(isPrime(c)).toBe(false);
    for (const p of [2n, 3n, 7919n, 2147483647n, 2305843009213693951n]) expect(isPrime(p)).toBe(true);
    const p = 7919n;
    for (let a = 1n; a < 50n; a++) {
      let x = 1n;
      for (let i = 0n; i < (p - 1n) / 2n; i++) x = (x * a) % p;
      expect(jacobi(a, p)).toBe(x === 1n ? 1 : -1);
    }
    const { factors, complete } = factorize(600851475143n, new AbortController().signal);
    expect(complete).toBe(true);
    expect([...factors.keys()]).toEqual(expect.arrayContaining([71n, 839n, 1471n, 6857n]));
  });
});

describe('prime_residue caps and determinism', () => {
  it('refuses n past 10^30, count past 10^8, a modulus past 1,000', () => {
    expect(primeResidue.input.safeParse({ n: '1000000000000000000000000000001' }).success).toBe(false);
    expect(primeResidue.input.safeParse({ n: 100_000_001, mode: 'count' }).success).toBe(false);
    expect(primeResidue.input.safeParse({ n: 10, modulus: 1001 }).success).toBe(false);
    expect(primeResidue.input.safeParse({ n: 0 }).success).toBe(false);
    expect(primeResidue.input.safeParse({ n: '12a' }).success).toBe(false);
  });

  it('same input, same bytes; examples are valid and fast', async () => {
    for (const ex of primeResidue.examples) {
      const a = await run(ex);
      const b = await run(ex);
      expect(JSON.stringify(a.result)).toBe(JSON.stringify(b.result));
    }
  });
});
