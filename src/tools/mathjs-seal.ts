import type { MathJsInstance } from 'mathjs';

/**
 * Functions that reach the parser or change a mathjs instance. Tools refuse them when they parse a
 * caller's expression; sealing also makes them throw if anything reaches them at run time.
 */
export const INSTANCE_CHANGERS = ['import', 'createUnit', 'evaluate', 'parse', 'simplify', 'derivative', 'resolve', 'reviver', 'compile', 'config'] as const;

/**
 * Names refused anywhere in a caller's expression (compute, bcalc): functions that reach the parser,
 * change the instance or build new functions or types. Checked in the parsed expression, so
 * `x = config` is refused as well as `config(...)`.
 */
export const REFUSED_IN_EXPRESSIONS = [
  'config',
  'import',
  'createUnit',
  'evaluate',
  'parse',
  'compile',
  'parser',
  'simplify',
  'simplifyConstant',
  'simplifyCore',
  'derivative',
  'rationalize',
  'resolve',
  'leafCount',
  'symbolicEqual',
  'help',
  'chain',
  'reviver',
  'replacer',
  'typed',
  'create',
  'factory',
  'on',
  'off',
  'once',
  'emit',
  'expression',
] as const;

/**
 * Seals a fresh mathjs instance for caller expressions (compute, bcalc): imports `guarded` over the
 * originals, makes INSTANCE_CHANGERS and `extra` throw `refuse(name)`, and returns a handle whose
 * parse, typeOf, format and config are the bound originals, which expressions cannot reach.
 */
export function sealMathjs(
  math: MathJsInstance,
  guarded: Record<string, unknown>,
  refuse: (name: string) => Error,
  extra: readonly string[] = [],
): MathJsInstance {
  for (const name of [...INSTANCE_CHANGERS, ...extra]) {
    guarded[name] = () => {
      throw refuse(name);
    };
  }
  const parse = math.parse.bind(math);
  const typeOf = math.typeOf.bind(math);
  const format = math.format.bind(math);
  const config = math.config.bind(math);
  math.import(guarded, { override: true });
  return Object.assign(Object.create(math) as MathJsInstance, { parse, typeOf, format, config });
}
