import type { AnyTool } from '../types.js';
import { genius } from './genius.js';
import { hints } from './hints.js';
import { roast } from './roast.js';
import { chatModelName } from './llm-client.js';

export const llmTools: AnyTool[] = [genius, hints, roast];

/** Chat-completions model name -> the tool behind it (svc-genius -> genius), derived from the tools. */
export const llmChatModels: ReadonlyMap<string, AnyTool> = new Map(llmTools.map((t) => [chatModelName(t), t]));
