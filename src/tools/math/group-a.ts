import type { AnyTool } from '../types.js';
import { bcalc } from './bcalc.js';
import { bcalcWhy } from './bcalc-why.js';
import { ficoScore } from './fico-score.js';
import { echoSequence } from './echo-sequence.js';

/** Part of the math family (see index.ts); one engineer's tools per file. */
export const mathToolsA: AnyTool[] = [bcalc, bcalcWhy, ficoScore, echoSequence] as AnyTool[];
