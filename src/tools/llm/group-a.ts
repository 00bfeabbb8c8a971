import type { AnyTool } from '../types.js';

/** intent_to_spec, hints_plus, one_liner, name_it, price_it. */
export const llmToolsA: AnyTool[] = [];
