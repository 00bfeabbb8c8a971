import type { AnyTool } from '../types.js';
import { primeResidue } from './prime-residue.js';
import { resonance } from './resonance.js';
import { chaosFingerprint } from './chaos-fingerprint.js';
import { dependencyDag } from './dependency-dag.js';

/** Part of the math family (see index.ts); one engineer's tools per file. */
export const mathToolsB: AnyTool[] = [primeResidue, resonance, chaosFingerprint, dependencyDag];
