import type { AnyTool } from '../types.js';
import { domainCheck } from './domain-check.js';
import { pageFetch } from './page-fetch.js';

export const webTools: AnyTool[] = [pageFetch as AnyTool, domainCheck as AnyTool];
