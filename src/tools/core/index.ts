import type { AnyTool } from '../types.js';
import { compute } from './compute.js';
import { checkBalance } from './check-balance.js';
import { passportTools } from './passports.js';

export const coreTools: AnyTool[] = [compute, checkBalance, ...passportTools];
