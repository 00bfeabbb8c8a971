import type { AnyTool } from '../types.js';
import { hintsPlus } from './hints-plus.js';
import { intentToSpec } from './intent-to-spec.js';
import { nameIt } from './name-it.js';
import { oneLiner } from './one-liner.js';
import { priceIt } from './price-it.js';

/** intent_to_spec, hints_plus, one_liner, name_it, price_it. */
export const llmToolsA: AnyTool[] = [intentToSpec, hintsPlus, oneLiner, nameIt, priceIt] as AnyTool[];
