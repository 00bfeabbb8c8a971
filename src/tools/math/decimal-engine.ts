import { z } from 'zod';
import type { MathJsInstance, MathNode } from 'mathjs';
import { AppError } from '../../errors.js';
import { REFUSED_IN_EXPRESSIONS, sealMathjs } from '../mathjs-seal.js';
import { mathjs } from '../heavy.js';

/** Loads mathjs while the sandbox thread loads bcalc or bcalc_why (src/tools/heavy.ts). */
export const warm = (): void => void mathjs();

/**
 * The exact decimal engine behind bcalc and bcalc_why: mathjs on BigNumber (decimal.js) with a
 * sealed instance per thread, precision and rounding set per call, and the business functions
 * (pct, margin, vat, cagr, npv, irr, pmt, fv, amort) written in decimal arithmetic.
 * Loading this module does nothing: the instance is made on first use.
 */

type Decimal = import('decimal.js').Decimal;
type DecimalCtor = typeof import('decimal.js').Decimal;

export const ROUNDINGS = ['half_even', 'half_up', 'half_down', 'up', 'down', 'ceil', 'floor'] as const;
export type Rounding = (typeof ROUNDINGS)[number];
/** decimal.js rounding constants. */
const ROUNDING_CODE: Record<Rounding, number> = { up: 0, down: 1, ceil: 2, floor: 3, half_up: 4, half_down: 5, half_even: 6 };

export const MAX_EXPRESSION = 2000;
export const MAX_PRECISION = 500;
export const DEFAULT_PRECISION = 34;
export const MAX_VARIABLES = 50;
export const MAX_AMORT_PERIODS = 1200;
/** factorial, gamma, combinations and permutations refuse arguments past this (their loops grow with it). */
export const MAX_COMBINATORIAL = 10_000;

const VARIABLE_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,31}$/;
const DECIMAL = /^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d{1,4})?$/;

export const BcalcInput = z
  .object({
    expression: z
      .string()
      .min(1)
      .max(MAX_EXPRESSION)
      .describe(
        'A decimal expression: + - * / ^ %, parentheses, math functions, variables set with ; between statements, and business functions pct, margin, vat, cagr, npv, irr, pmt, fv, amort',
      ),
    precision: z
      .number()
      .int()
      .min(1)
      .max(MAX_PRECISION)
      .optional()
      .describe(`Significant digits every operation keeps (default ${DEFAULT_PRECISION}, max ${MAX_PRECISION})`),
    rounding: z
      .enum(ROUNDINGS)
      .optional()
      .describe(
        "Rounding mode for precision and scale: half_even (banker's, default), half_up, half_down, up (away from zero), down (toward zero), ceil, floor",
      ),
    scale: z
      .number()
      .int()
      .min(0)
      .max(100)
      .optional()
      .describe(
        'Decimal places the result is rounded to with the rounding mode (default: not rounded beyond precision); also the places of the amort schedule (default 2)',
      ),
    variables: z
      .record(
        z.string().regex(VARIABLE_NAME, 'a name: a letter or _, then letters, digits or _, up to 32'),
        z.union([z.number().finite(), z.string().max(100).regex(DECIMAL, 'a decimal number such as "1234.50"')]),
      )
      .optional()
      .refine((v) => !v || Object.keys(v).length <= MAX_VARIABLES, `at most ${MAX_VARIABLES} variables`)
      .describe('Named decimal values the expression can use, e.g. {"price": "19.99"}; strings keep every digit'),
  })
  .strict();
export type BcalcInputT = z.output<typeof BcalcInput>;

export const ScheduleRow = z.object({
  period: z.number().int(),
  payment: z.string(),
  interest: z.string(),
  principal: z.string(),
  balance: z.string(),
});

/** Refused anywhere in an expression: they reach the parser, change the instance or build things unboundedly. */
const REFUSED = new Set<string>([
  ...REFUSED_IN_EXPRESSIONS,
  // Randomness (results must repeat) and collections whose size the arguments choose.
  'random',
  'randomInt',
  'pickRandom',
  'range',
  'zeros',
  'ones',
  'identity',
  'resize',
  'diag',
  'kron',
  'matrixFromFunction',
  'matrix',
  'sparse',
]);
const COMBINATORIAL = [
  'factorial',
  'gamma',
  'combinations',
  'permutations',
  'combinationsWithRep',
  'bellNumbers',
  'catalan',
  'stirlingS2',
  'composition',
  'multinomial',
];

export function inputError(message: string, path = 'expression'): AppError {
  return new AppError('invalid_input', message, { issues: [{ path: [path], message }] });
}

export function asInputError(e: unknown): AppError {
  if (e instanceof AppError) return e;
  if (e instanceof RangeError && /call stack/i.test(e.message)) return inputError('Expression is nested too deeply');
  const message = e instanceof Error ? e.message : String(e);
  return inputError(`Cannot evaluate expression: ${message}`);
}

interface CallState {
  schedule?: Array<z.infer<typeof ScheduleRow>>;
  scheduleScale: number;
  rounding: number;
}

export interface Engine {
  math: MathJsInstance;
  D: DecimalCtor;
  /** Per-call state the business functions write (amort's schedule). */
  state: CallState;
}

let shared: Engine | undefined;

function engine(): Engine {
  if (shared) return shared;
  const { create, all } = mathjs();
  const math = create(all!, { number: 'BigNumber', precision: DEFAULT_PRECISION });
  const D = (math as unknown as { BigNumber: DecimalCtor }).BigNumber;
  const state: CallState = { scheduleScale: 2, rounding: 6 };
  const fns = businessFunctions(math, D, state);
  const guarded: Record<string, unknown> = { ...fns };
  for (const name of COMBINATORIAL) {
    const original = (math as unknown as Record<string, ((...a: unknown[]) => unknown) | undefined>)[name];
    if (!original) continue;
    guarded[name] = function (this: unknown, ...args: unknown[]) {
      for (const a of args) {
        const n = toDec(D, a, name, true);
        if (n && n.abs().gt(MAX_COMBINATORIAL)) throw inputError(`${name} allows arguments up to ${MAX_COMBINATORIAL} in bcalc`);
      }
      return original.apply(this, args);
    };
  }
  // Belt and braces behind the parse-time check.
  const handle = sealMathjs(math, guarded, (name) => inputError(`${name} is not available in bcalc`), [
    'random',
    'randomInt',
    'pickRandom',
    'range',
    'zeros',
    'ones',
  ]);
  shared = { math: handle, D, state };
  return shared;
}

/** Walks the parsed expression before anything runs and refuses what bcalc does not allow. */
export function inspect(math: MathJsInstance, root: MathNode): void {
  const namespace = math as unknown as Record<string, unknown>;
  root.traverse((node) => {
    if (node.type === 'FunctionAssignmentNode') {
      throw inputError(`Defining a function (${(node as unknown as { name: string }).name}(...) = ...) is not allowed in bcalc`);
    }
    if (node.type === 'RangeNode') throw inputError('Ranges (a:b) are not available in bcalc');
    if (node.type === 'SymbolNode') {
      const name = (node as unknown as { name: string }).name;
      if (REFUSED.has(name) || (/^[A-Z]/.test(name) && typeof namespace[name] === 'function')) {
        throw inputError(`The function ${name} is not allowed in bcalc`);
      }
    }
  });
}

export interface Prepared {
  engine: Engine;
  node: MathNode;
  scope: Map<string, unknown>;
  precision: number;
  rounding: Rounding;
  scale: number | undefined;
}

/** Sets the call's precision and rounding, parses and inspects the expression and builds the scope. */
export function prepare(input: BcalcInputT): Prepared {
  const e = engine();
  const precision = input.precision ?? DEFAULT_PRECISION;
  const rounding = input.rounding ?? 'half_even';
  e.math.config({ precision });
  e.D.config({ precision, rounding: ROUNDING_CODE[rounding] as never });
  e.state.schedule = undefined;
  e.state.scheduleScale = input.scale ?? 2;
  e.state.rounding = ROUNDING_CODE[rounding];
  let node: MathNode;
  try {
    node = e.math.parse(input.expression);
    inspect(e.math, node);
  } catch (err) {
    throw asInputError(err);
  }
  const scope = new Map<string, unknown>();
  for (const [name, value] of Object.entries(input.variables ?? {})) {
    if (REFUSED.has(name)) throw inputError(`${name} cannot be a variable name`, 'variables');
    scope.set(name, new e.D(typeof value === 'number' ? String(value) : value));
  }
  return { engine: e, node, scope, precision, rounding, scale: input.scale };
}

/** The last value of a block of statements (a ResultSet) or the value itself. */
export function lastValue(value: unknown): unknown {
  if (value && typeof value === 'object' && 'entries' in value && Array.isArray((value as { entries: unknown[] }).entries)) {
    const entries = (value as { entries: unknown[] }).entries;
    return entries[entries.length - 1];
  }
  return value;
}

/** A plain decimal string with no exponent while it stays short; exponent form past 10^±1000. */
export function decimalString(d: Decimal): string {
  if (!d.isFinite()) return d.toString();
  const exp = d.isZero() ? 0 : d.e;
  if (Math.abs(exp) > 1000) return d.toString();
  const s = d.toFixed();
  return s === '-0' ? '0' : s;
}

export function isDecimal(engine: Engine, v: unknown): v is Decimal {
  return v instanceof engine.D;
}

/** Any value as the string bcalc shows: decimals exactly, the rest as mathjs formats them. */
export function formatValue(engine: Engine, v: unknown, precision: number): string {
  if (isDecimal(engine, v)) return decimalString(v);
  if (typeof v === 'number') return engine.math.format(v, { precision: 15 });
  if (typeof v === 'function') return '(function)';
  return engine.math.format(v as never, { precision });
}

/** The final result: rounded to `scale` places with the rounding mode when a scale is given. */
export function finalResult(p: Prepared, value: unknown): { result: string; display: string; type: string; rounded: boolean } {
  const { engine: e } = p;
  const type = e.math.typeOf(value);
  if (isDecimal(e, value)) {
    if (!value.isFinite()) {
      throw inputError(value.isNaN() ? 'The result is not a number (e.g. 0/0)' : 'The result is infinite (e.g. a division by zero)');
    }
    const rounded = p.scale !== undefined ? value.toDecimalPlaces(p.scale, ROUNDING_CODE[p.rounding] as never) : value;
    const result = p.scale !== undefined && Math.abs(rounded.isZero() ? 0 : rounded.e) <= 1000 ? fixed(rounded.toFixed(p.scale)) : decimalString(rounded);
    return { result, display: group(result), type, rounded: p.scale !== undefined };
  }
  if (value === undefined || typeof value === 'function') throw inputError('Expression does not produce a value');
  const result = formatValue(e, value, p.precision);
  return { result, display: result, type, rounded: false };
}

function fixed(s: string): string {
  return /^-0(\.0*)?$/.test(s) ? s.slice(1) : s;
}

/** Thousands separators in the integer part of a plain decimal string. */
export function group(s: string): string {
  const m = /^(-?)(\d+)(\.\d+)?$/.exec(s);
  if (!m) return s;
  return m[1]! + m[2]!.replace(/\B(?=(\d{3})+(?!\d))/g, ',') + (m[3] ?? '');
}

export function roundingName(code: number): Rounding {
  return (Object.entries(ROUNDING_CODE).find(([, c]) => c === code)?.[0] ?? 'half_even') as Rounding;
}

// ---------------------------------------------------------------- business functions

function toDec(D: DecimalCtor, a: unknown, fn: string, lenient = false): Decimal | undefined {
  if (a instanceof D) return a;
  if (typeof a === 'number' && Number.isFinite(a)) return new D(a);
  if (typeof a === 'boolean') return new D(a ? 1 : 0);
  if (lenient) return undefined;
  throw inputError(`${fn}: expected numbers, got ${typeof a === 'object' && a ? ((a as { type?: string }).type ?? 'a value') : typeof a}`);
}

function flatten(D: DecimalCtor, args: unknown[], fn: string): Decimal[] {
  const out: Decimal[] = [];
  const visit = (a: unknown): void => {
    if (Array.isArray(a)) a.forEach(visit);
    else if (a && typeof a === 'object' && typeof (a as { toArray?: unknown }).toArray === 'function' && !(a instanceof D))
      visit((a as { toArray(): unknown }).toArray());
    else out.push(toDec(D, a, fn)!);
  };
  args.forEach(visit);
  return out;
}

function arity(fn: string, args: unknown[], min: number, max: number, usage: string): void {
  if (args.length < min || args.length > max) throw inputError(`${fn} takes ${usage}`);
}

function businessFunctions(_math: MathJsInstance, D: DecimalCtor, state: CallState): Record<string, (...args: unknown[]) => unknown> {
  const dec = (a: unknown, fn: string) => toDec(D, a, fn)!;
  const zero = () => new D(0);
  const one = () => new D(1);
  const nonZero = (d: Decimal, fn: string, what: string) => {
    if (d.isZero()) throw inputError(`${fn}: ${what} must not be zero`);
    return d;
  };
  const int = (d: Decimal, fn: string, what: string, max: number) => {
    if (!d.isInteger() || d.lt(0) || d.gt(max)) throw inputError(`${fn}: ${what} must be a whole number from 0 to ${max}`);
    return d.toNumber();
  };

  /** Excel PMT(rate, nper, pv, fv, type): the payment per period (negative: money paid out). */
  const pmtCore = (rate: Decimal, nper: Decimal, pv: Decimal, fv: Decimal, type: Decimal): Decimal => {
    if (nper.isZero()) throw inputError('pmt: nper must not be zero');
    if (rate.isZero()) return pv.plus(fv).neg().div(nper);
    const f = one().plus(rate).pow(nper);
    return rate
      .times(pv.times(f).plus(fv))
      .neg()
      .div(one().plus(rate.times(type)).times(f.minus(1)));
  };
  const fvCore = (rate: Decimal, nper: Decimal, pmt: Decimal, pv: Decimal, type: Decimal): Decimal => {
    if (rate.isZero()) return pv.plus(pmt.times(nper)).neg();
    const f = one().plus(rate).pow(nper);
    return pv
      .times(f)
      .plus(
        pmt
          .times(one().plus(rate.times(type)))
          .times(f.minus(1))
          .div(rate),
      )
      .neg();
  };
  const npvCore = (rate: Decimal, flows: Decimal[], from: number): Decimal => {
    let sum = zero();
    let factor = one();
    const base = one().plus(rate);
    if (base.isZero()) throw inputError('npv: rate must not be -1');
    flows.forEach((cf, i) => {
      factor = i === 0 && from === 0 ? one() : factor.times(base);
      sum = sum.plus(cf.div(factor));
    });
    return sum;
  };

  return {
    /** pct(x, p): p percent of x. */
    pct: (...a) => {
      arity('pct', a, 2, 2, 'pct(x, percent)');
      return dec(a[0], 'pct').times(dec(a[1], 'pct')).div(100);
    },
    /** margin(price, cost): gross margin as a percent of the price. */
    margin: (...a) => {
      arity('margin', a, 2, 2, 'margin(price, cost)');
      const price = nonZero(dec(a[0], 'margin'), 'margin', 'price');
      return price.minus(dec(a[1], 'margin')).div(price).times(100);
    },
    /** vat(net, rate_percent): the tax amount on a net amount. */
    vat: (...a) => {
      arity('vat', a, 2, 2, 'vat(net, rate_percent)');
      return dec(a[0], 'vat').times(dec(a[1], 'vat')).div(100);
    },
    /** cagr(begin, end, years): compound annual growth rate as a fraction (0.1 = 10 %). */
    cagr: (...a) => {
      arity('cagr', a, 3, 3, 'cagr(begin_value, end_value, years)');
      const begin = nonZero(dec(a[0], 'cagr'), 'cagr', 'begin_value');
      const years = nonZero(dec(a[2], 'cagr'), 'cagr', 'years');
      const ratio = dec(a[1], 'cagr').div(begin);
      if (ratio.lt(0)) throw inputError('cagr: begin and end values must have the same sign');
      return ratio.pow(one().div(years)).minus(1);
    },
    /** npv(rate, cf1, cf2, ... | [cf...]): Excel NPV, the first flow discounted one period. */
    npv: (...a) => {
      if (a.length < 2) throw inputError('npv takes npv(rate, cashflow1, cashflow2, ...) or npv(rate, [cashflows])');
      const flows = flatten(D, a.slice(1), 'npv');
      if (flows.length > 1000) throw inputError('npv: at most 1000 cash flows');
      return npvCore(dec(a[0], 'npv'), flows, 1);
    },
    /** irr([cf0, cf1, ...], guess?) or irr(cf0, cf1, ...): Excel IRR. */
    irr: (...a) => {
      let flows: Decimal[];
      let guess = new D('0.1');
      const first = a[0];
      if (a.length >= 1 && first !== null && typeof first === 'object' && !(first instanceof D)) {
        if (a.length > 2) throw inputError('irr takes irr([cashflows], guess) or irr(cf0, cf1, ...)');
        flows = flatten(D, [first], 'irr');
        if (a.length === 2) guess = dec(a[1], 'irr');
      } else flows = flatten(D, a, 'irr');
      if (flows.length < 2 || flows.length > 1000) throw inputError('irr: give 2 to 1000 cash flows');
      if (!flows.some((f) => f.gt(0)) || !flows.some((f) => f.lt(0))) throw inputError('irr: the cash flows need at least one positive and one negative value');
      return irrSolve(D, flows, guess);
    },
    /** pmt(rate, nper, pv, fv?, type?): Excel PMT. */
    pmt: (...a) => {
      arity('pmt', a, 3, 5, 'pmt(rate, nper, pv, fv = 0, type = 0)');
      return pmtCore(
        dec(a[0], 'pmt'),
        dec(a[1], 'pmt'),
        dec(a[2], 'pmt'),
        a[3] === undefined ? zero() : dec(a[3], 'pmt'),
        a[4] === undefined ? zero() : dec(a[4], 'pmt'),
      );
    },
    /** fv(rate, nper, pmt, pv?, type?): Excel FV. */
    fv: (...a) => {
      arity('fv', a, 3, 5, 'fv(rate, nper, pmt, pv = 0, type = 0)');
      return fvCore(
        dec(a[0], 'fv'),
        dec(a[1], 'fv'),
        dec(a[2], 'fv'),
        a[3] === undefined ? zero() : dec(a[3], 'fv'),
        a[4] === undefined ? zero() : dec(a[4], 'fv'),
      );
    },
    /**
     * amort(principal, rate_per_period, periods): the level payment (positive), and the schedule
     * (`schedule` in the result), each row rounded to the scale; the last payment clears the balance.
     */
    amort: (...a) => {
      arity('amort', a, 3, 3, 'amort(principal, rate_per_period, periods)');
      const principal = dec(a[0], 'amort');
      const rate = dec(a[1], 'amort');
      const n = int(dec(a[2], 'amort'), 'amort', 'periods', MAX_AMORT_PERIODS);
      if (n === 0) throw inputError('amort: periods must be at least 1');
      if (principal.lte(0)) throw inputError('amort: principal must be positive');
      if (rate.lte(-1)) throw inputError('amort: rate must be more than -1');
      const payment = pmtCore(rate, new D(n), principal, zero(), zero()).neg();
      const places = state.scheduleScale;
      const r = (d: Decimal) => d.toDecimalPlaces(places, state.rounding as never);
      const pay = r(payment);
      let balance = principal;
      const rows: Array<z.infer<typeof ScheduleRow>> = [];
      for (let k = 1; k <= n; k++) {
        const interest = r(balance.times(rate));
        let payK = pay;
        let principalPart = payK.minus(interest);
        if (k === n) {
          principalPart = balance;
          payK = balance.plus(interest);
        }
        balance = balance.minus(principalPart);
        rows.push({
          period: k,
          payment: payK.toFixed(places),
          interest: interest.toFixed(places),
          principal: principalPart.toFixed(places),
          balance: fixed(balance.toFixed(places)),
        });
      }
      state.schedule = rows;
      return payment;
    },
  };
}

/** IRR: Newton's method in decimals from the guess, then bisection over a bracket if Newton fails. */
function irrSolve(D: DecimalCtor, flows: Decimal[], guess: Decimal): Decimal {
  const npv = (r: Decimal): { f: Decimal; df: Decimal } => {
    let f = new D(0);
    let df = new D(0);
    const base = new D(1).plus(r);
    let pow = new D(1);
    flows.forEach((cf, t) => {
      if (t > 0) pow = pow.times(base);
      f = f.plus(cf.div(pow));
      if (t > 0) df = df.minus(cf.times(t).div(pow.times(base)));
    });
    return { f, df };
  };
  const precision = D.precision;
  const tol = new D(10).pow(-(precision - 4));
  let r = guess;
  for (let i = 0; i < 200; i++) {
    if (r.lte(-1)) break;
    const { f, df } = npv(r);
    if (df.isZero()) break;
    const next = r.minus(f.div(df));
    if (
      next
        .minus(r)
        .abs()
        .lte(tol.times(next.abs().plus(1)))
    )
      return next;
    r = next;
  }
  // Bisection between -0.9999 and an upper bound where the NPV changes sign.
  let lo = new D('-0.9999');
  let hi = new D(1);
  let flo = npv(lo).f;
  let fhi = npv(hi).f;
  for (let i = 0; i < 60 && flo.s === fhi.s; i++) {
    hi = hi.times(2);
    fhi = npv(hi).f;
  }
  if (flo.s === fhi.s) throw inputError('irr: no rate makes the NPV zero; try another guess');
  for (let i = 0; i < precision * 4 + 20; i++) {
    const mid = lo.plus(hi).div(2);
    const fm = npv(mid).f;
    if (fm.isZero()) return mid;
    if (fm.s === flo.s) {
      lo = mid;
      flo = fm;
    } else hi = mid;
  }
  return lo.plus(hi).div(2);
}
