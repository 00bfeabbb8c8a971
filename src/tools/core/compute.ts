import { z } from 'zod';
import { create, all, type MathJsInstance } from 'mathjs';
import { AppError } from '../../errors.js';
import { defineTool } from '../types.js';

/**
 * A mathjs instance with the functions that could reach outside an expression removed: no import,
 * no createUnit, no parse/evaluate from inside an expression (mathjs' documented hardening).
 */
const math: MathJsInstance = create(all!, { number: 'number', precision: 64 });
const evaluate = math.evaluate.bind(math);
const blocked = ['import', 'createUnit', 'evaluate', 'parse', 'simplify', 'derivative', 'resolve', 'reviver', 'compile'];
math.import(
  Object.fromEntries(
    blocked.map((name) => [
      name,
      () => {
        throw new Error(`function ${name} is not available`);
      },
    ]),
  ),
  { override: true },
);

const ComputeInput = z.object({
  expression: z
    .string()
    .min(1)
    .max(2000)
    .describe('A math expression: arithmetic, functions (sqrt, sin, log...), units (5 cm to inch), matrices, variables set with ; between statements'),
  precision: z.number().int().min(1).max(64).optional().describe('Significant digits for the formatted result (default 14)'),
});

export const compute = defineTool({
  name: 'compute',
  description: 'Evaluates a math expression exactly as written (arithmetic, functions, units, matrices) with mathjs.',
  tier: 'pro',
  priceCents: 2,
  family: 'core',
  input: ComputeInput,
  qField: 'expression',
  output: '{expression, result (formatted string), value (number when numeric), type}',
  examples: [{ expression: '2 * (3 + 4)' }, { expression: 'sqrt(2) * 10', precision: 6 }, { expression: '12.5 cm to inch' }],
  handler: async ({ expression, precision }) => {
    let value: unknown;
    try {
      value = evaluate(expression);
    } catch (e) {
      throw new AppError('invalid_input', `Cannot evaluate expression: ${(e as Error).message}`, {
        issues: [{ path: ['expression'], message: (e as Error).message }],
      });
    }
    // Several statements give a ResultSet; the caller wants the last value.
    if (value && typeof value === 'object' && 'entries' in value && Array.isArray((value as { entries: unknown[] }).entries)) {
      const entries = (value as { entries: unknown[] }).entries;
      value = entries[entries.length - 1];
    }
    if (value === undefined || typeof value === 'function') {
      throw new AppError('invalid_input', 'Expression does not produce a value', { issues: [{ path: ['expression'], message: 'no value' }] });
    }
    const type = math.typeOf(value);
    const formatted = math.format(value as never, { precision: precision ?? 14 });
    return {
      expression,
      result: formatted,
      value:
        typeof value === 'number' && Number.isFinite(value)
          ? value
          : type === 'Matrix'
            ? (JSON.parse(JSON.stringify((value as { toArray(): unknown }).toArray())) as unknown)
            : null,
      type,
    };
  },
});
