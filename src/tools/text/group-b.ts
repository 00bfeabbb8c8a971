import type { AnyTool } from '../types.js';
import { contextHealth } from './context-health.js';
import { contextCompress } from './context-compress.js';
import { conversationDiagnostic } from './conversation-diagnostic.js';
import { contextExtract } from './context-extract.js';
import { cviVerify } from './cvi-verify.js';
import { handoff } from './handoff.js';
import { cviLoop } from './cvi-loop.js';

/** Part of the text family (see index.ts); one engineer's tools per file. */
export const textToolsB: AnyTool[] = [contextHealth as AnyTool, contextCompress as AnyTool, conversationDiagnostic as AnyTool, contextExtract as AnyTool, cviVerify as AnyTool, handoff as AnyTool, cviLoop as AnyTool];
