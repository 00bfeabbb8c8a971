import type { AnyTool } from '../types.js';
import { mathToolsA } from './group-a.js';
import { mathToolsB } from './group-b.js';

/** The math family: exact and numerical computation on caller input (each tool runs in the sandbox pool). */
export const mathTools: AnyTool[] = [...mathToolsA, ...mathToolsB];
