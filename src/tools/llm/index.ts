import type { AnyTool } from '../types.js';
import { genius } from './genius.js';
import { hints } from './hints.js';
import { roast } from './roast.js';
import { chatModelName } from './llm-client.js';
import { intentToSpec } from './intent-to-spec.js';
import { hintsPlus } from './hints-plus.js';
import { oneLiner } from './one-liner.js';
import { nameIt } from './name-it.js';
import { priceIt } from './price-it.js';
import { mindOpener } from './mind-opener.js';
import { ideaFold } from './idea-fold.js';
import { hintsParade } from './hints-parade.js';
import { geniusPlus } from './genius-plus.js';
import { skepticPov } from './skeptic-pov.js';

/** The tools the chat endpoint offers as models (svc-genius, svc-hints, svc-roast). */
const chatTools: AnyTool[] = [genius, hints, roast];

/** Then the structured tools (strict JSON from the model, checked in code: tool-kit.ts, structured.ts). */
export const llmTools: AnyTool[] = [
  ...chatTools,
  ...([intentToSpec, hintsPlus, oneLiner, nameIt, priceIt, mindOpener, ideaFold, hintsParade, geniusPlus, skepticPov] as AnyTool[]),
];

/** Chat-completions model name -> the tool behind it (svc-genius -> genius). */
export const llmChatModels: ReadonlyMap<string, AnyTool> = new Map(chatTools.map((t) => [chatModelName(t), t]));
