import type { AnyTool } from '../types.js';
import { geniusPlus } from './genius-plus.js';
import { hintsParade } from './hints-parade.js';
import { ideaFold } from './idea-fold.js';
import { mindOpener } from './mind-opener.js';
import { skepticPov } from './skeptic-pov.js';

/** mind_opener, idea_fold, hints_parade, genius_plus, skeptic_pov. */
export const llmToolsB: AnyTool[] = [mindOpener, ideaFold, hintsParade, geniusPlus, skepticPov] as AnyTool[];
