import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import * as formulajs from '@formulajs/formulajs';
import { AppError } from '../../../src/errors.js';
import { bcalc, BcalcOutput, runBcalc } from '../../../src/tools/math/bcalc.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const { ctx } = makeToolContext();
const run = async (input: Record<string, unknown>) => {
  const parsed = bcalc.input.parse(input);
  const out = await bcalc.handler(parsed, ctx);
  expect(BcalcOutput.safeParse(out).success).toBe(true);
  return out;
};
const refused = async (input: Record<string, unknown>) => {
  const parsed = bcalc.input.safeParse(input);
  if (!parsed.success) return 'schema';
  try {
    await bcalc.handler(parsed.data, ctx);
  } catch (e) {
    expect(e).toBeInstanceOf(AppError);
    expect((e as AppError).code).toBe('invalid_input');
    return 'invalid_input';
  }
  return 'accepted';
};

/** Relative agreement: |a - b| <= tol * max(1, |b|). */
function close(a: string, b: number, tol: number) {
  expect(Math.abs(Number(a) - b)).toBeLessThanOrEqual(tol * Math.max(1, Math.abs(b)));
}

describe('bcalc: exact decimals', () => {
  it('0.1 + 0.2 is exactly "0.3"', async () => {
    expect((await run({ expression: '0.1 + 0.2' })).result).toBe('0.3');
  });

  it('half_even rounds 2.345 to 2.34 at scale 2; half_up to 2.35; every mode on ±2.345', async () => {
    expect((await run({ expression: '2.345', scale: 2 })).result).toBe('2.34');
    expect((await run({ expression: '2.345', scale: 2, rounding: 'half_even' })).result).toBe('2.34');
    const table: Record<string, [string, string]> = {
      half_even: ['2.34', '-2.34'],
      half_up: ['2.35', '-2.35'],
      half_down: ['2.34', '-2.34'],
      up: ['2.35', '-2.35'],
      down: ['2.34', '-2.34'],
      ceil: ['2.35', '-2.34'],
      floor: ['2.34', '-2.35'],
    };
    for (const [rounding, [pos, neg]] of Object.entries(table)) {
      expect((await run({ expression: '2.345', scale: 2, rounding })).result, rounding).toBe(pos);
      expect((await run({ expression: '-2.345', scale: 2, rounding })).result, rounding).toBe(neg);
    }
    expect((await run({ expression: '2.355', scale: 2 })).result).toBe('2.36');
  });

  it('precision sets significant digits; variables keep every digit; display groups thousands', async () => {
    expect((await run({ expression: '1/3', precision: 5 })).result).toBe('0.33333');
    expect((await run({ expression: '2/3', precision: 5, rounding: 'down' })).result).toBe('0.66666');
    const r = await run({ expression: 'price * qty', variables: { price: '1234567.891', qty: 3 } });
    expect(r.result).toBe('3703703.673');
    expect(r.display).toBe('3,703,703.673');
    expect((await run({ expression: 'x = 3; x^2 + y', variables: { y: '0.5' } })).result).toBe('9.5');
  });

  it('business functions: pct, margin, vat, cagr, fv', async () => {
    expect((await run({ expression: 'pct(200, 15)' })).result).toBe('30');
    expect((await run({ expression: 'margin(150, 90)' })).result).toBe('40');
    expect((await run({ expression: 'vat(100, 20)' })).result).toBe('20');
    expect((await run({ expression: 'cagr(100, 121, 2)' })).result).toBe('0.1');
    expect((await run({ expression: 'fv(0.1, 2, 0, -100)' })).result).toBe('121');
  });

  it('amort builds a schedule whose principal sums to the loan and whose last balance is 0', async () => {
    const r = await run({ expression: 'amort(10000, 0.05 / 12, 12)', scale: 2 });
    expect(r.result).toBe('856.07');
    expect(r.schedule).toHaveLength(12);
    const principal = r.schedule!.reduce((s, row) => s + Math.round(Number(row.principal) * 100), 0);
    expect(principal).toBe(1_000_000);
    expect(r.schedule!.at(-1)!.balance).toBe('0.00');
    expect(r.schedule![0]).toEqual({ period: 1, payment: '856.07', interest: '41.67', principal: '814.40', balance: '9185.60' });
  });
});

/**
 * Tolerance against @formulajs/formulajs (binary floating point): pmt, npv and fv agree to a relative
 * 1e-10 (10 significant digits); irr to 1e-9 absolute, because formulajs's IRR stops once a Newton
 * step is below 1e-10 (bcalc iterates to its decimal precision, and its NPV at the rate is ~0).
 */
describe('bcalc agrees with @formulajs/formulajs', () => {
  const pmtCases: Array<[number, number, number, number?, number?]> = [
    [0.05 / 12, 360, 200000],
    [0.04 / 12, 60, 25000, 0, 1],
    [0.07, 10, -5000, 1000],
    [0, 12, 1200],
    [0.015, 48, 18000, -2000, 0],
    [0.1, 1, 100],
    [0.0025, 600, 1e6],
    [-0.01, 20, 1000],
  ];
  it.each(pmtCases)('pmt(%s, %s, %s, %s, %s)', async (rate, nper, pv, fv, type) => {
    const args = [rate, nper, pv, fv, type].filter((a) => a !== undefined);
    const r = await run({ expression: `pmt(${args.join(', ')})` });
    close(r.result, formulajs.PMT(rate, nper, pv, fv ?? 0, type ?? 0) as number, 1e-10);
  });

  const npvCases: Array<[number, number[]]> = [
    [0.1, [-100, 30, 40, 50]],
    [0.08, [-10000, 3000, 4200, 6800]],
    [0.05, [100]],
    [0.2, [0, 0, 1000, -50, 700]],
    [0, [1, 2, 3]],
    [-0.05, [-100, 60, 60]],
  ];
  it.each(npvCases)('npv(%s, %j)', async (rate, flows) => {
    const a = await run({ expression: `npv(${rate}, ${flows.join(', ')})` });
    const b = await run({ expression: `npv(${rate}, [${flows.join(', ')}])` });
    expect(a.result).toBe(b.result);
    close(a.result, formulajs.NPV(rate, ...flows) as number, 1e-10);
  });

  const irrCases: number[][] = [
    [-100, 30, 40, 50, 20],
    [-10000, 3000, 4200, 6800],
    [-70000, 12000, 15000, 18000, 21000, 26000],
    [-1000, 100, 100, 100, 100, 1100],
    [-500, 0, 0, 1000],
    [-100, 90, 5],
    [100, -50, -60],
  ];
  it.each(irrCases.map((c) => [c]))('irr(%j)', async (flows) => {
    const r = await run({ expression: `irr([${flows.join(', ')}])` });
    close(r.result, formulajs.IRR(flows) as number, 1e-9);
    const check = await run({ expression: `npv(${r.result}, ${flows.slice(1).join(', ')}) + ${flows[0]}` });
    expect(Math.abs(Number(check.result))).toBeLessThan(1e-20);
  });

  it('fv matches formulajs', async () => {
    for (const [rate, nper, pmt, pv, type] of [
      [0.05 / 12, 120, -100, -1000, 1],
      [0.03, 5, -200, 0, 0],
      [0, 10, -5, -5, 0],
    ] as const) {
      close((await run({ expression: `fv(${rate}, ${nper}, ${pmt}, ${pv}, ${type})` })).result, formulajs.FV(rate, nper, pmt, pv, type) as number, 1e-10);
    }
  });
});

describe('bcalc: safety and caps', () => {
  it('refuses what reaches the parser or changes the instance, inside expressions', async () => {
    for (const expression of [
      'import({a: 1})',
      'config({number: "number"})',
      'evaluate("1+1")',
      'parse("1")',
      'x = config',
      'f(x) = x',
      'random()',
      '1:5',
      'range(1, 10)',
      'zeros(1000, 1000)',
      'createUnit("foo")',
    ]) {
      expect(await refused({ expression }), expression).toBe('invalid_input');
    }
  });

  it('refuses caps in the schema: expression > 2000 chars, precision > 500, unknown keys, bad variables', async () => {
    expect(await refused({ expression: '1+'.repeat(1000) + '1' })).toBe('schema');
    expect(await refused({ expression: '1', precision: 501 })).toBe('schema');
    expect(await refused({ expression: '1', scale: 101 })).toBe('schema');
    expect(await refused({ expression: '1', rounding: 'bankers' })).toBe('schema');
    expect(await refused({ expression: '1', extra: true })).toBe('schema');
    expect(await refused({ expression: 'x', variables: { x: '1,5' } })).toBe('schema');
    expect(await refused({ expression: 'x', variables: { 'bad name': 1 } })).toBe('schema');
    const many = Object.fromEntries(Array.from({ length: 51 }, (_, i) => [`v${i}`, i]));
    expect(await refused({ expression: '1', variables: many })).toBe('schema');
  });

  it('division by zero, unknown functions and bad arguments are invalid_input', async () => {
    for (const expression of ['1/0', '0/0', 'nosuch(2)', 'irr([1, 2, 3])', 'amort(1000, 0.01, 5000)', 'factorial(100000)', 'pmt(1)', 'margin(0, 5)']) {
      expect(await refused({ expression }), expression).toBe('invalid_input');
    }
  });

  it('deterministic: the same input gives the same bytes, whatever ran between', async () => {
    const input = { expression: 'irr([-100, 30, 40, 50, 20]) + 1/3', precision: 40 };
    const a = JSON.stringify(await run(input));
    await run({ expression: '2/3', precision: 3, rounding: 'floor', scale: 1 });
    expect(JSON.stringify(await run(input))).toBe(a);
  });

  it('property: sums of decimals with up to 6 places are exact (match integer arithmetic)', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.bigInt({ min: -(10n ** 15n), max: 10n ** 15n }), { minLength: 1, maxLength: 20 }), async (cents) => {
        const toDec = (v: bigint) => {
          const neg = v < 0n;
          const s = (neg ? -v : v).toString().padStart(7, '0');
          return `${neg ? '-' : ''}${s.slice(0, -6)}.${s.slice(-6)}`;
        };
        const expression = cents.map((c) => `(${toDec(c)})`).join(' + ');
        const sum = cents.reduce((a, b) => a + b, 0n);
        const r = await run({ expression, scale: 6 });
        expect(r.result).toBe(toDec(sum));
      }),
      { numRuns: 60 },
    );
  });

  it('examples and largestInput run inside the limits', async () => {
    for (const ex of bcalc.examples) await run(ex);
    const t = cpuNow();
    const out = runBcalc(bcalc.input.parse(bcalc.largestInput!()));
    const ms = cpuNow() - t;
    expect(out.schedule).toHaveLength(1200);
    expect(ms).toBeLessThan(bcalc.limits!.timeMs!);
    console.log(`bcalc largestInput: ${ms.toFixed(0)} ms`);
  });
});
