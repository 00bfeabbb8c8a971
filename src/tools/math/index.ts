import type { AnyTool } from '../types.js';
import { bcalc } from './bcalc.js';
import { bcalcWhy } from './bcalc-why.js';
import { ficoScore } from './fico-score.js';
import { echoSequence } from './echo-sequence.js';
import { primeResidue } from './prime-residue.js';
import { resonance } from './resonance.js';
import { chaosFingerprint } from './chaos-fingerprint.js';
import { dependencyDag } from './dependency-dag.js';

/** The math family: exact and numerical computation on caller input (each tool runs in the sandbox pool). */
export const mathTools: AnyTool[] = [bcalc, bcalcWhy, ficoScore, echoSequence, primeResidue, resonance, chaosFingerprint, dependencyDag] as AnyTool[];
