import type { AnyTool } from '../types.js';
import { genius } from './genius.js';
import { hints } from './hints.js';
import { roast } from './roast.js';
import { chatModelName } from './llm-client.js';
import { llmToolsA } from './group-a.js';
import { llmToolsB } from './group-b.js';

/** The tools the chat endpoint offers as models (svc-genius, svc-hints, svc-roast). */
const chatTools: AnyTool[] = [genius, hints, roast];

export const llmTools: AnyTool[] = [...chatTools, ...llmToolsA, ...llmToolsB];

/** Chat-completions model name -> the tool behind it (svc-genius -> genius). */
export const llmChatModels: ReadonlyMap<string, AnyTool> = new Map(chatTools.map((t) => [chatModelName(t), t]));
