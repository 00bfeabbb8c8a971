import { createHash } from 'node:crypto';
import { z } from 'zod';
import type { MathJsInstance, MathNode } from 'mathjs';
import { AppError } from '../../errors.js';
import { defineTool } from '../types.js';
import { REFUSED_IN_EXPRESSIONS, sealMathjs } from '../mathjs-seal.js';
import { mathjs } from '../heavy.js';

/** Loads mathjs while the sandbox thread loads this module (src/tools/heavy.ts). */
export const warm = (): void => void mathjs();

/**
 * compute is a pure function of its expression: it runs in the sandbox pool (`isolated`), each call
 * gets a fresh scope, nothing an expression does can change the mathjs instance, and random numbers
 * are seeded from the expression. Sizes are checked before evaluation where the arguments are
 * constants and again while it runs; the pool's time and memory limits are the last line of defence.
 */

/**
 * Functions that reach the parser, change the instance or build new functions or types. Checked in
 * the parsed expression, so `x = config` is refused as well as `config(...)`. Capitalised functions
 * of the instance (classes: Parser, Chain, Unit, the *Node types...) are refused the same way.
 */
const REFUSED = new Set<string>(REFUSED_IN_EXPRESSIONS);

/** Functions whose results would otherwise repeat nothing: seeded from the expression. */
const RANDOM = new Set(['random', 'randomInt', 'pickRandom']);

/** Functions that build collections whose size their arguments decide (see elementCount). */
const SIZED = ['range', 'zeros', 'ones', 'identity', 'matrix', 'random', 'randomInt', 'pickRandom', 'resize', 'diag', 'kron', 'matrixFromFunction'] as const;
type Sized = (typeof SIZED)[number];
const SIZED_SET: ReadonlySet<string> = new Set(SIZED);

const ComputeInput = z.object({
  expression: z
    .string()
    .min(1)
    .max(2000)
    .describe('A math expression: arithmetic, functions (sqrt, sin, log...), units (5 cm to inch), matrices, variables set with ; between statements'),
  precision: z.number().int().min(1).max(64).optional().describe('Significant digits for the formatted result (default 14)'),
});

const ComputeOutput = z.object({
  expression: z.string(),
  result: z.string().describe('The value as mathjs formats it, to the requested precision'),
  value: z
    .union([z.number(), z.array(z.unknown())])
    .nullable()
    .describe('The value itself when it is a finite number, the nested arrays of a matrix, otherwise null (units, complex numbers, strings...)'),
  type: z.string().describe("mathjs's name for the value's type: number, Matrix, Unit, Complex, boolean, string..."),
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
  outputSchema: ComputeOutput,
  examples: [{ expression: '2 * (3 + 4)' }, { expression: 'sqrt(2) * 10', precision: 6 }, { expression: '12.5 cm to inch' }],
  isolated: import.meta.url,
  handler: async ({ expression, precision }, ctx) => {
    const math = instance(ctx.config.COMPUTE_MAX_ELEMENTS);
    let value: unknown;
    try {
      const node = math.parse(expression);
      const { random } = inspect(math, node, ctx.config.COMPUTE_MAX_ELEMENTS);
      if (random) {
        // Setting the same seed twice keeps the generator where it was: clear it first.
        math.config({ randomSeed: null });
        math.config({ randomSeed: createHash('sha256').update(expression).digest('hex') });
      }
      value = node.compile().evaluate(new Map());
    } catch (e) {
      throw asInputError(e);
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

function inputError(message: string): AppError {
  return new AppError('invalid_input', message, { issues: [{ path: ['expression'], message }] });
}

function asInputError(e: unknown): AppError {
  if (e instanceof AppError) return e;
  if (e instanceof RangeError && /call stack/i.test(e.message)) return inputError('Expression is nested too deeply');
  const message = e instanceof Error ? e.message : String(e);
  return new AppError('invalid_input', `Cannot evaluate expression: ${message}`, { issues: [{ path: ['expression'], message }] });
}

let shared: { math: MathJsInstance; maxElements: number } | undefined;

/**
 * One instance per thread, made on first use. Expressions cannot change it (REFUSED is checked
 * before anything runs), and the sized functions are wrapped so sizes computed from variables are
 * refused at run time as well.
 */
function instance(maxElements: number): MathJsInstance {
  if (shared?.maxElements === maxElements) return shared.math;
  const { create, all } = mathjs();
  const math = create(all!, { number: 'number', precision: 64 });
  const guarded: Record<string, unknown> = {};
  for (const name of SIZED) {
    const original = (math as unknown as Record<string, (...args: unknown[]) => unknown>)[name]!;
    const transform = (math.expression.transform as unknown as Record<string, ((...args: unknown[]) => unknown) | undefined>)[name];
    const guard = (fn: (...args: unknown[]) => unknown) =>
      function (this: unknown, ...args: unknown[]) {
        checkCount(name, args, maxElements);
        return fn.apply(this, args);
      };
    // Expressions call the transform when there is one (range's inclusive end), code the function.
    guarded[name] = Object.assign(guard(original), transform ? { transform: guard(transform) } : {});
  }
  // Belt and braces behind the parse-time check: these fail even if something reaches them.
  const handle = sealMathjs(math, guarded, (name) => inputError(`${name} is not available in compute`));
  shared = { math: handle, maxElements };
  return handle;
}

/**
 * Walks the parsed expression before it runs: refuses REFUSED names, capitalised classes and
 * function definitions, and sized calls whose constant arguments already pass the cap.
 */
function inspect(math: MathJsInstance, root: MathNode, maxElements: number): { random: boolean } {
  let random = false;
  const namespace = math as unknown as Record<string, unknown>;
  root.traverse((node) => {
    if (node.type === 'FunctionAssignmentNode') {
      const name = (node as unknown as { name: string }).name;
      throw inputError(`Defining a function (${name}(...) = ...) is not allowed in compute`);
    }
    if (node.type === 'SymbolNode') {
      const name = (node as unknown as { name: string }).name;
      if (REFUSED.has(name) || (/^[A-Z]/.test(name) && typeof namespace[name] === 'function')) {
        throw inputError(`The function ${name} is not allowed in compute`);
      }
      if (RANDOM.has(name)) random = true;
    }
    if (node.type === 'RangeNode') {
      const r = node as unknown as { start: MathNode; end: MathNode; step?: MathNode };
      const parts = r.step ? [r.start, r.end, r.step] : [r.start, r.end];
      if (parts.every(isConstant)) checkCount('range', parts.map(constantValue), maxElements);
    }
    if (node.type === 'FunctionNode') {
      const f = node as unknown as { fn: MathNode & { name?: string }; args: MathNode[] };
      const name = f.fn.type === 'SymbolNode' ? f.fn.name : undefined;
      if (name && SIZED_SET.has(name) && f.args.every(isConstant)) checkCount(name as Sized, f.args.map(constantValue), maxElements);
    }
  });
  return { random };
}

/** Built from literals and operators only (no names, calls or ranges), so evaluating it is cheap and safe. */
function isConstant(node: MathNode): boolean {
  let constant = true;
  node.traverse((n) => {
    if (!['ConstantNode', 'OperatorNode', 'ParenthesisNode', 'ArrayNode'].includes(n.type)) constant = false;
  });
  return constant;
}

function constantValue(node: MathNode): unknown {
  return node.compile().evaluate();
}

function checkCount(name: string, args: unknown[], maxElements: number): void {
  const count = elementCount(name as Sized, args);
  if (count > maxElements) {
    throw inputError(`${name}(...) would build ${formatCount(count)} elements; compute allows at most ${formatCount(maxElements)} (COMPUTE_MAX_ELEMENTS)`);
  }
}

function formatCount(n: number): string {
  return Number.isFinite(n) && n < 1e15 ? Math.round(n).toLocaleString('en') : n.toExponential(2);
}

/** How many elements a call would build; NaN when the arguments say nothing clear (the call decides). */
export function elementCount(name: Sized, args: unknown[]): number {
  const sizes = args.filter((a) => !isFlag(a));
  switch (name) {
    case 'range': {
      if (typeof args[0] === 'string') {
        const parts = args[0].split(':').map((p) => Number(p.trim()));
        if (parts.length === 2) return stepsBetween(parts[0]!, parts[1]!, 1);
        if (parts.length === 3) return stepsBetween(parts[0]!, parts[2]!, parts[1]!);
        return NaN;
      }
      const [start, end, step] = sizes.map(toNumber);
      return start === undefined || end === undefined ? NaN : stepsBetween(start, end, step ?? 1);
    }
    case 'zeros':
    case 'ones':
    case 'matrixFromFunction':
      return product(sizes.filter((a) => typeof a !== 'function'));
    case 'identity': {
      const dims = dimensions(sizes);
      return dims.length === 1 ? dims[0]! * dims[0]! : product(sizes);
    }
    case 'random':
    case 'randomInt':
      // A size comes first as an array or matrix; two plain numbers are a min and a max.
      return isCollection(args[0]) ? product([args[0]]) : 1;
    case 'pickRandom':
      return typeof toNumber(args[1]) === 'number' && !isCollection(args[1]) ? toNumber(args[1])! : 1;
    case 'resize':
      return product([args[1]]);
    case 'matrix':
      return isCollection(args[0]) ? elements(args[0]) : 1;
    case 'diag': {
      const dims = shape(args[0]);
      const k = Math.abs(toNumber(args[1]) ?? 0);
      return dims.length === 1 ? (dims[0]! + k) ** 2 : 1;
    }
    case 'kron':
      return elements(args[0]) * elements(args[1]);
  }
}

function stepsBetween(start: number, end: number, step: number): number {
  if (![start, end, step].every(Number.isFinite) || step === 0) return NaN;
  if ((end - start) / step < 0) return 0;
  return Math.floor(Math.abs(end - start) / Math.abs(step)) + 1;
}

function isFlag(a: unknown): boolean {
  return typeof a === 'string' || typeof a === 'boolean';
}

function isCollection(a: unknown): boolean {
  return Array.isArray(a) || (!!a && typeof a === 'object' && typeof (a as { toArray?: unknown }).toArray === 'function');
}

function toArray(a: unknown): unknown {
  return a && typeof a === 'object' && typeof (a as { toArray?: unknown }).toArray === 'function' ? (a as { toArray(): unknown }).toArray() : a;
}

function toNumber(a: unknown): number | undefined {
  if (typeof a === 'number') return a;
  if (a && typeof a === 'object' && !isCollection(a)) {
    const n = Number((a as { valueOf(): unknown }).valueOf());
    return Number.isNaN(n) ? undefined : n;
  }
  return undefined;
}

/** Sizes given as numbers or as arrays/matrices of numbers, flattened. */
function dimensions(sizes: unknown[]): number[] {
  const out: number[] = [];
  for (const s of sizes) {
    const v = toArray(s);
    if (Array.isArray(v)) for (const d of v.flat(Infinity)) out.push(toNumber(d) ?? NaN);
    else out.push(toNumber(v) ?? NaN);
  }
  return out;
}

function product(sizes: unknown[]): number {
  return dimensions(sizes).reduce((p, d) => p * Math.max(0, d), 1);
}

function shape(a: unknown): number[] {
  const dims: number[] = [];
  let v = toArray(a);
  while (Array.isArray(v)) {
    dims.push(v.length);
    v = v[0];
  }
  return dims;
}

function elements(a: unknown): number {
  const dims = shape(a);
  return dims.length ? dims.reduce((p, d) => p * d, 1) : 1;
}
