import { z } from 'zod';
import type { MathNode } from 'mathjs';
import { defineTool } from '../types.js';
import {
  BcalcInput,
  ROUNDINGS,
  asInputError,
  decimalString,
  finalResult,
  formatValue,
  isDecimal,
  prepare,
  type BcalcInputT,
  type Engine,
  type Prepared,
} from './decimal-engine.js';

/** The sandbox thread loads mathjs with this module (src/tools/heavy.ts). */
export { warm } from './decimal-engine.js';

/**
 * bcalc_why: bcalc with every step shown. The steps come from a walk of the expression's syntax
 * tree: each operator, function call and assignment is evaluated once its arguments are known, in
 * the order bcalc evaluates them, and described from templates (no model). The last step's value
 * is bcalc's result for the same input.
 */

const Step = z.object({
  op: z.string().describe('The operation: add, multiply, a function name, assign, round, result...'),
  formula: z.string().describe('The sub-expression as written'),
  substituted: z.string().describe('The same with its arguments replaced by their values'),
  value: z.string().describe('Its value (exact decimal string for numbers)'),
});

export const BcalcWhyOutput = z.object({
  expression: z.string(),
  result: z.string(),
  type: z.string(),
  precision: z.number().int(),
  rounding: z.enum(ROUNDINGS),
  scale: z.number().int().nullable(),
  steps: z.array(Step).min(1),
  explanation_markdown: z.string(),
});
export type BcalcWhyResult = z.infer<typeof BcalcWhyOutput>;
type StepT = z.infer<typeof Step>;

const OP_WORDS: Record<string, string> = {
  add: 'Add',
  subtract: 'Subtract',
  multiply: 'Multiply',
  divide: 'Divide',
  pow: 'Raise to a power',
  mod: 'Modulo',
  unaryMinus: 'Negate',
  unaryPlus: 'Unary plus',
  factorial: 'Factorial',
  dotMultiply: 'Multiply element-wise',
  dotDivide: 'Divide element-wise',
  equal: 'Compare',
  unequal: 'Compare',
  smaller: 'Compare',
  larger: 'Compare',
  smallerEq: 'Compare',
  largerEq: 'Compare',
  and: 'Logical and',
  or: 'Logical or',
  not: 'Logical not',
  xor: 'Logical xor',
  pct: 'Percent of',
  margin: 'Gross margin (% of price)',
  vat: 'VAT amount',
  cagr: 'Compound annual growth rate',
  npv: 'Net present value',
  irr: 'Internal rate of return',
  pmt: 'Payment per period',
  fv: 'Future value',
  amort: 'Amortisation (level payment)',
  assign: 'Assign',
  round: 'Round',
  result: 'Result',
};

export function runBcalcWhy(input: BcalcInputT): BcalcWhyResult {
  const p = prepare(input);
  const { math } = p.engine;
  const steps: StepT[] = [];
  const fmt = (v: unknown) => formatValue(p.engine, v, p.precision);
  const str = (n: MathNode) => n.toString({ parenthesis: 'keep', handler: constantHandler(p.engine) } as never);
  const N = math as unknown as {
    ConstantNode: new (v: unknown) => MathNode;
    OperatorNode: new (op: string, fn: string, args: MathNode[], implicit?: boolean) => MathNode;
    FunctionNode: new (fn: MathNode, args: MathNode[]) => MathNode;
    ArrayNode: new (items: MathNode[]) => MathNode;
  };
  const constant = (v: unknown) => new N.ConstantNode(v);
  const evalNode = (n: MathNode) => n.compile().evaluate(p.scope) as unknown;
  const push = (op: string, formula: string, substituted: string, value: unknown) => {
    steps.push({ op, formula, substituted, value: fmt(value) });
  };

  let last: MathNode = p.node;
  const walk = (node: MathNode): unknown => {
    const n = node as unknown as Record<string, unknown>;
    switch (node.type) {
      case 'ParenthesisNode':
        return walk(n.content as MathNode);
      case 'ConstantNode':
      case 'SymbolNode':
        return evalNode(node);
      case 'BlockNode': {
        let value: unknown;
        for (const b of n.blocks as Array<{ node: MathNode }>) {
          last = b.node;
          value = walk(b.node);
        }
        return value;
      }
      case 'ArrayNode':
        return evalNode(new N.ArrayNode((n.items as MathNode[]).map((i) => constant(walk(i)))));
      case 'OperatorNode': {
        const args = (n.args as MathNode[]).map((a) => constant(walk(a)));
        const shallow = new N.OperatorNode(n.op as string, n.fn as string, args, n.implicit as boolean);
        const value = evalNode(shallow);
        push(n.fn as string, str(node), str(shallow), value);
        return value;
      }
      case 'FunctionNode': {
        const fn = n.fn as MathNode & { name?: string };
        const target = fn.type === 'SymbolNode' ? (math as unknown as Record<string, { rawArgs?: boolean } | undefined>)[fn.name!] : undefined;
        if (fn.type !== 'SymbolNode' || target?.rawArgs) break;
        const args = (n.args as MathNode[]).map((a) => constant(walk(a)));
        const shallow = new N.FunctionNode(fn, args);
        const value = evalNode(shallow);
        push(fn.name!, str(node), str(shallow), value);
        return value;
      }
      case 'AssignmentNode': {
        const object = n.object as MathNode & { name?: string };
        if (object.type !== 'SymbolNode' || n.index) break;
        const value = walk(n.value as MathNode);
        p.scope.set(object.name!, value);
        push('assign', str(node), `${object.name} = ${str(constant(value))}`, value);
        return value;
      }
    }
    // Anything else (conditionals, indexing, objects) is evaluated as one step.
    const value = evalNode(node);
    push(node.type.replace(/Node$/, '').toLowerCase(), str(node), str(node), value);
    return value;
  };

  let value: unknown;
  try {
    value = walk(p.node);
  } catch (e) {
    throw asInputError(e);
  }
  const final = finalResult(p, value);
  const lastStep = steps[steps.length - 1];
  if (final.rounded) {
    push('round', `round_${p.rounding}(${lastStep?.formula ?? str(last)}, ${p.scale})`, `round_${p.rounding}(${fmt(value)}, ${p.scale})`, value);
    steps[steps.length - 1]!.value = final.result;
  } else if (!lastStep || lastStep.value !== final.result) {
    steps.push({ op: 'result', formula: str(last), substituted: final.result, value: final.result });
  }
  return {
    expression: input.expression,
    result: final.result,
    type: final.type,
    precision: p.precision,
    rounding: p.rounding,
    scale: p.scale ?? null,
    steps,
    explanation_markdown: markdown(input.expression, steps, final.result, p),
  };
}

function constantHandler(e: Engine) {
  return (node: MathNode) => {
    if (node.type !== 'ConstantNode') return undefined;
    const v = (node as unknown as { value: unknown }).value;
    if (!isDecimal(e, v)) return undefined;
    const s = decimalString(v);
    return s.startsWith('-') ? `(${s})` : s;
  };
}

function markdown(expression: string, steps: StepT[], result: string, p: Prepared): string {
  const lines = [`**Expression:** \`${expression}\``, '', `Exact decimal arithmetic, ${p.precision} significant digits, rounding ${p.rounding}.`, ''];
  steps.forEach((s, i) => {
    const word = OP_WORDS[s.op] ?? s.op;
    const shown = s.substituted !== s.formula ? ` → \`${s.substituted}\`` : '';
    lines.push(`${i + 1}. ${word}: \`${s.formula}\`${shown} = **${s.value}**`);
  });
  lines.push('', `**Result:** ${result}${p.scale !== undefined ? ` (rounded to ${p.scale} decimal places, ${p.rounding})` : ''}`);
  return lines.join('\n');
}

export const bcalcWhy = defineTool({
  name: 'bcalc_why',
  description:
    'bcalc with every step shown: each operation of the expression, its formula, its values substituted and its exact result, from a walk of the syntax tree.',
  tier: 'enterprise',
  priceCents: 10,
  family: 'math',
  input: BcalcInput,
  qField: 'expression',
  qParse: 'text',
  output: '{expression, result, type, precision, rounding, scale, steps[{op, formula, substituted, value}], explanation_markdown}',
  outputSchema: BcalcWhyOutput,
  examples: [
    { expression: '(0.1 + 0.2) * 3' },
    { expression: 'net = 1250; net + vat(net, 19)', scale: 2 },
    { expression: 'pmt(0.04 / 12, 60, 25000)', scale: 2, rounding: 'half_up' },
  ],
  isolated: import.meta.url,
  limits: { timeMs: 10000, memoryMb: 256 },
  largestInput: () => ({
    expression: ('irr([-1000, 300, 420, 680, 100, 50], 0.1) + ' + 'amort(1e6, 0.004, 1200) + ')
      .repeat(30)
      .slice(0, 1998)
      .replace(/ \+ [^+]*$/, ''),
    precision: 500,
  }),
  handler: async (input) => runBcalcWhy(input),
});
