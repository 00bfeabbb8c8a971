import { z } from 'zod';
import { defineTool } from '../types.js';
import { BcalcInput, ScheduleRow, ROUNDINGS, asInputError, finalResult, lastValue, prepare, MAX_EXPRESSION, type BcalcInputT } from './decimal-engine.js';

/** The sandbox thread loads mathjs with this module (src/tools/heavy.ts). */
export { warm } from './decimal-engine.js';

/**
 * bcalc: an exact decimal business calculator. mathjs on BigNumber (decimal.js), so 0.1 + 0.2 is
 * exactly 0.3; precision (significant digits) and rounding mode per call; an optional scale rounds
 * the result; business functions in decimal arithmetic. Runs in the sandbox pool.
 */

export const BcalcOutput = z.object({
  expression: z.string(),
  result: z.string().describe('The exact result as a plain decimal string (rounded to scale when one is given)'),
  display: z.string().describe('The result with thousands separators'),
  type: z.string().describe('mathjs type of the result: BigNumber for decimals'),
  precision: z.number().int(),
  rounding: z.enum(ROUNDINGS),
  scale: z.number().int().nullable(),
  schedule: z.array(ScheduleRow).optional().describe('Amortisation schedule, when the expression calls amort'),
});
export type BcalcResult = z.infer<typeof BcalcOutput>;

/** Evaluates like bcalc (shared with tests and bcalc_why's cross-check). */
export function runBcalc(input: BcalcInputT): BcalcResult {
  const p = prepare(input);
  let value: unknown;
  try {
    value = lastValue(p.node.compile().evaluate(p.scope));
  } catch (e) {
    throw asInputError(e);
  }
  const { result, display, type } = finalResult(p, value);
  const schedule = p.engine.state.schedule;
  return {
    expression: input.expression,
    result,
    display,
    type,
    precision: p.precision,
    rounding: p.rounding,
    scale: p.scale ?? null,
    ...(schedule ? { schedule } : {}),
  };
}

export const bcalc = defineTool({
  name: 'bcalc',
  description:
    'Exact decimal business calculator: 0.1+0.2 = 0.3, chosen precision, rounding and scale, variables, pct, margin, vat, cagr, npv, irr, pmt, fv and amortisation schedules.',
  tier: 'enterprise',
  priceCents: 5,
  family: 'math',
  input: BcalcInput,
  qField: 'expression',
  qParse: 'text',
  output: '{expression, result (exact decimal string), display, type, precision, rounding, scale, schedule? [{period, payment, interest, principal, balance}]}',
  outputSchema: BcalcOutput,
  examples: [
    { expression: '0.1 + 0.2' },
    { expression: 'price * qty + vat(price * qty, 20)', variables: { price: '19.99', qty: 3 }, scale: 2 },
    { expression: 'amort(10000, 0.05 / 12, 12)', scale: 2 },
  ],
  isolated: import.meta.url,
  limits: { timeMs: 8000, memoryMb: 256 },
  largestInput: () => ({
    // The longest expression, at the highest precision, of the slowest operations bcalc allows.
    expression: ('irr([-1000, 300, 420, 680, 100, 50], 0.1) + ' + 'amort(1e6, 0.004, 1200) + ')
      .repeat(30)
      .slice(0, MAX_EXPRESSION - 2)
      .replace(/ \+ [^+]*$/, ''),
    precision: 500,
  }),
  handler: async (input) => runBcalc(input),
});
