import { createRequire } from 'node:module';
import type * as MathJs from 'mathjs';
import type Compromise from 'compromise';
import type * as Cheerio from 'cheerio';

/**
 * The libraries that cost seconds and tens of MiB to load (mathjs about 2 s, compromise about 1 s,
 * cheerio about 0.5 s on this machine), loaded on first use instead of with the tool registry: the API process and
 * every worker import every tool's definition, but only the threads that run compute, bcalc, an
 * entity extraction or an HTML parse need the libraries. A module that uses one exports `warm`, which the sandbox
 * thread calls while it loads the module, so a call never pays the load inside its time limit.
 */
const require = createRequire(import.meta.url);
let mathjsLib: typeof MathJs | undefined;
let nlpLib: typeof Compromise | undefined;
let cheerioLib: typeof Cheerio | undefined;

export function mathjs(): typeof MathJs {
  mathjsLib ??= require('mathjs') as typeof MathJs;
  return mathjsLib;
}

export function nlp(): typeof Compromise {
  nlpLib ??= require('compromise') as typeof Compromise;
  return nlpLib;
}

export function cheerio(): typeof Cheerio {
  cheerioLib ??= require('cheerio') as typeof Cheerio;
  return cheerioLib;
}
