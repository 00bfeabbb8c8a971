import type { AnyTool } from '../types.js';
import { domainCheck } from './domain-check.js';
import { pageFetch } from './page-fetch.js';
import { webToolsA } from './group-a.js';
import { webToolsB } from './group-b.js';

export const webTools: AnyTool[] = [pageFetch as AnyTool, domainCheck as AnyTool, ...webToolsA, ...webToolsB];
