import type { AnyTool } from '../types.js';
import { compute } from './compute.js';
import { checkBalance } from './check-balance.js';

export const coreTools: AnyTool[] = [compute, checkBalance];
