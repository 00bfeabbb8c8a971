import type { z } from 'zod';
import type { Logger } from 'pino';
import type { Config, Family } from '../config.js';
import type { ToolLimits } from '../sandbox/limits.js';
import type { TaskInput, TaskName, TaskOutput } from '../sandbox/tasks.js';

export const PLANS = ['free', 'starter', 'pro', 'enterprise'] as const;
export type Plan = (typeof PLANS)[number];

export function planRank(plan: Plan): number {
  return PLANS.indexOf(plan);
}

/**
 * Progress a tool reports while it works. It becomes a BullMQ progress event and, for streaming
 * callers, an SSE `progress` event. Report real figures (bytes fetched, steps done, tokens).
 */
export interface ToolProgress {
  /** What the tool is doing now, e.g. "resolving", "fetching", "generating". */
  stage: string;
  done?: number;
  total?: number;
  unit?: string;
  /** Newly generated text (language-model tools stream tokens through this). */
  delta?: string;
  message?: string;
}

export interface BalanceView {
  credits: number;
  plan: Plan;
  used_this_month: number;
}

/** What a handler may use besides its input. Everything here is per call. */
export interface ToolContext {
  config: Config;
  log: Logger;
  /** Aborted when the job's time is up or the worker is shutting down. */
  signal: AbortSignal;
  progress(p: ToolProgress): Promise<void>;
  /** Sandbox (cv_test_) call: tools with outside side effects must not perform them. */
  sandbox: boolean;
  accountId: string;
  /** Sub-key id when the call was made with a sub-key, for balance views. */
  keyId: string | null;
  /** The caller's edge-network token, decrypted in memory for this call only (cf_* tools). */
  edgeToken?: string;
  /** Reads the caller's balance (check_balance). */
  balance(): Promise<BalanceView>;
  /** Records upstream usage (e.g. model tokens) with the call's ledger entry. */
  recordUsage(usage: Record<string, number>): void;
  /**
   * Runs one named CPU task (src/sandbox/tasks.ts) in the sandbox pool under this tool's `limits`,
   * so parsing caller-controlled data never blocks the event loop. Set by the runner; absent only when
   * a handler is called directly (unit tests), where `runTask` (src/sandbox/tasks.ts) runs it inline.
   */
  isolate?<K extends TaskName>(task: K, payload: TaskInput<K>): Promise<TaskOutput<K>>;
}

export interface ToolDefinition<S extends z.ZodTypeAny = z.ZodTypeAny, R = unknown> {
  name: string;
  /** One line for catalogues, MCP and the manifest. */
  description: string;
  tier: Plan;
  priceCents: number;
  family: Family;
  input: S;
  /** Valid inputs, shown by GET /tools/{name}; tests parse each one. */
  examples: Array<z.input<S>>;
  /** The input field that the root protocol's `q` fills (chain, parallel, direct, stream). */
  qField: string;
  /** Changes things outside the service (cf_* writes): MCP destructiveHint, dry run for sandbox keys. */
  sideEffects?: boolean;
  /** Needs the caller's edge-network token (X-Edge-Token). */
  needsEdgeToken?: boolean;
  /** Documented output shape, one line, for GET /tools/{name}. */
  output: string;
  /**
   * The handler is CPU work on caller input: it runs in the sandbox pool, never on the worker's event
   * loop. Set it to `import.meta.url` of the module that exports this definition; a pool thread imports
   * that module (and nothing else) and finds the tool by name among its exports. The module must load
   * without side effects (no test runner calls). In a thread the context has no `balance()` and no
   * `edgeToken`.
   */
  isolated?: string;
  /** Per-call limits of this tool's pool work (defaults: TOOL_TIME_MS, TOOL_MEMORY_MB). */
  limits?: ToolLimits;
  handler(input: z.output<S>, ctx: ToolContext): Promise<R>;
}

/** Helper that keeps the schema's type flowing into the handler. */
export function defineTool<S extends z.ZodTypeAny, R>(def: ToolDefinition<S, R>): ToolDefinition<S, R> {
  return def;
}

export type AnyTool = ToolDefinition<z.ZodTypeAny, unknown>;
