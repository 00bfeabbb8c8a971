import type { AnyTool } from '../types.js';

/** mind_opener, idea_fold, hints_parade, genius_plus, skeptic_pov. */
export const llmToolsB: AnyTool[] = [];
