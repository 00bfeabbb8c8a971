/** Messages between the pool (src/sandbox/pool.ts) and its threads (src/sandbox/thread.ts). */
import type { Config } from '../config.js';
import type { ToolProgress } from '../tools/types.js';

/** What a thread runs: a tool's handler found by name among a module's exports, or one exported task function. */
export type Work =
  | { kind: 'tool'; module: string; name: string; input: unknown; context: ThreadToolContext }
  | { kind: 'task'; module: string; export: string; input: unknown };

/** The per-call part of a ToolContext that crosses into a thread (the config is sent once per thread). */
export interface ThreadToolContext {
  sandbox: boolean;
  accountId: string;
  keyId: string | null;
}

export interface ThreadData {
  config: Config;
  /** Modules to import as soon as the thread starts, before it takes work. */
  preload: string[];
}

export type ToThread = { type: 'run'; id: number; work: Work; maxResultBytes: number };

export type SerializedFault =
  | { app: true; code: string; message: string; details: Record<string, unknown>; retryable: boolean }
  | { app: false; name: string; message: string };

export type FromThread =
  /** The preload modules are imported: the thread takes work. */
  | { type: 'ready' }
  /** The module is loaded and the handler starts: the call's time limit counts from here. */
  | { type: 'started'; id: number }
  | { type: 'progress'; id: number; progress: ToolProgress }
  | { type: 'log'; id: number; line: string }
  /** `json`: {value, usage} as JSON, already measured against the size limit. */
  | { type: 'done'; id: number; json: string }
  | { type: 'too_large'; id: number; bytes: number }
  | { type: 'failed'; id: number; error: SerializedFault };
