import type { AnyTool } from '../types.js';
import { textToolsA } from './group-a.js';
import { textToolsB } from './group-b.js';

/** The text family: CPU work on caller text, no upstream (each tool runs in the sandbox pool). */
export const textTools: AnyTool[] = [...textToolsA, ...textToolsB];
