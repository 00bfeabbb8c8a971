import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { AppError } from '../../../src/errors.js';
import { runBcalc } from '../../../src/tools/math/bcalc.js';
import { bcalcWhy, BcalcWhyOutput, runBcalcWhy } from '../../../src/tools/math/bcalc-why.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const { ctx } = makeToolContext();
const run = async (input: Record<string, unknown>) => {
  const out = await bcalcWhy.handler(bcalcWhy.input.parse(input), ctx);
  expect(BcalcWhyOutput.safeParse(out).success).toBe(true);
  return out;
};

describe('bcalc_why', () => {
  it('shows each operation with its formula, values substituted and exact value', async () => {
    const r = await run({ expression: '(0.1 + 0.2) * 3' });
    expect(r.steps).toEqual([
      { op: 'add', formula: '0.1 + 0.2', substituted: '0.1 + 0.2', value: '0.3' },
      { op: 'multiply', formula: '(0.1 + 0.2) * 3', substituted: '0.3 * 3', value: '0.9' },
    ]);
    expect(r.result).toBe('0.9');
    expect(r.explanation_markdown).toContain('Multiply');
  });

  it('assignments, business functions and a final rounding step', async () => {
    const r = await run({ expression: 'net = 1250; net + vat(net, 19)', scale: 2 });
    expect(r.steps.map((s) => s.op)).toEqual(['assign', 'vat', 'add', 'round']);
    expect(r.steps[1]!.substituted).toBe('vat(1250, 19)');
    expect(r.steps.at(-1)!.value).toBe('1487.50');
  });

  const cases = [
    { expression: '0.1 + 0.2' },
    { expression: '2.345', scale: 2 },
    { expression: 'a = 2; b = 3; a' },
    { expression: '3 - -2 * 2^-1' },
    { expression: 'pmt(0.04 / 12, 60, 25000)', scale: 2, rounding: 'half_up' },
    { expression: 'irr([-100, 30, 40, 50, 20])', precision: 50 },
    { expression: 'x > 2 ? pct(x, 10) : 0', variables: { x: '5.5' } },
    { expression: 'sum([0.1, 0.2, 0.3]) / 3' },
    { expression: 'amort(5000, 0.01, 6)' },
    { expression: '5 cm to inch' },
    { expression: 'sqrt(2) ^ 2', precision: 20 },
  ];
  it.each(cases)('the last step equals bcalc: %j', async (input) => {
    const r = await run(input);
    const b = runBcalc(bcalcWhy.input.parse(input));
    expect(r.result).toBe(b.result);
    expect(r.steps.at(-1)!.value).toBe(b.result);
  });

  it('property: on random arithmetic, the last step equals bcalc', async () => {
    const leaf = fc.oneof(
      fc.integer({ min: -999, max: 999 }).map(String),
      fc.tuple(fc.nat(999), fc.nat(999)).map(([a, b]) => `${a}.${b}`),
    );
    const expr: fc.Arbitrary<string> = fc.letrec<{ e: string }>((tie) => ({
      e: fc.oneof(
        { depthSize: 'small', withCrossShrink: true },
        leaf,
        fc.tuple(tie('e'), fc.constantFrom('+', '-', '*', '/'), tie('e')).map(([a, op, b]) => `(${a} ${op} ${b})`),
      ),
    })).e;
    await fc.assert(
      fc.asyncProperty(
        expr,
        fc.integer({ min: 5, max: 60 }),
        fc.option(fc.integer({ min: 0, max: 6 }), { nil: undefined }),
        async (expression, precision, scale) => {
          let expected: string | undefined;
          try {
            expected = runBcalc(bcalcWhy.input.parse({ expression, precision, scale })).result;
          } catch (e) {
            expect((e as AppError).code).toBe('invalid_input');
            await expect(run({ expression, precision, scale })).rejects.toBeInstanceOf(AppError);
            return;
          }
          const r = await run({ expression, precision, scale });
          expect(r.steps.at(-1)!.value).toBe(expected);
        },
      ),
      { numRuns: 100 },
    );
  });

  it('refuses what bcalc refuses', async () => {
    for (const expression of ['import({a: 1})', 'evaluate("2")', '1/0', 'f(x) = x']) {
      await expect(run({ expression })).rejects.toMatchObject({ code: 'invalid_input' });
    }
  });

  it('deterministic, and largestInput runs inside its limits', async () => {
    const a = JSON.stringify(await run(bcalcWhy.examples[2]!));
    expect(JSON.stringify(await run(bcalcWhy.examples[2]!))).toBe(a);
    const t = cpuNow();
    runBcalcWhy(bcalcWhy.input.parse(bcalcWhy.largestInput!()));
    const ms = cpuNow() - t;
    expect(ms).toBeLessThan(bcalcWhy.limits!.timeMs!);
    console.log(`bcalc_why largestInput: ${ms.toFixed(0)} ms`);
  });
});
