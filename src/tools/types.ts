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

/** Upstreams a tool may need; unconfigured, the tool is 503 tool_unavailable at admission, uncharged. */
export const NEEDS = ['llm', 'search', 'wayback', 'youtube'] as const;
export type Need = (typeof NEEDS)[number];

/**
 * How the root protocol's `q` string becomes the tool's `qField`: as is (`text`), one item per
 * non-empty line (`lines`), numbers separated by commas, spaces or new lines (`numbers`; integers
 * beyond 2^53 stay digit strings so BigInt tools lose nothing), or parsed JSON (`json`).
 */
export const Q_PARSES = ['text', 'lines', 'numbers', 'json'] as const;
export type QParse = (typeof Q_PARSES)[number];

/**
 * Account-scoped state that outlives a call (cvi_loop's rounds): JSON values in Redis under the
 * account (sandbox keys in a namespace of their own) and the tool's name, each with a TTL. Another
 * account never sees them. Only on the event loop's context (isolated tools do not get it).
 */
export interface ToolStore {
  get<T = unknown>(key: string): Promise<T | null>;
  /** `ttlSeconds` from 1 to 30 days; values up to STORE_MAX_BYTES of JSON. */
  set(key: string, value: unknown, ttlSeconds: number): Promise<void>;
  delete(key: string): Promise<void>;
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
  /** Account-scoped state with a TTL (see ToolStore); absent in sandbox threads and direct handler calls. */
  store?: ToolStore;
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
  /** How `q` becomes that field's value (default `text`); see QParse. */
  qParse?: QParse;
  /** Upstreams the tool cannot work without (see NEEDS). */
  needs?: readonly Need[];
  /** Reports progress while it works (slow tools): shown by GET /tools/{name}. */
  progress?: boolean;
  /** Changes things outside the service (cf_* writes): MCP destructiveHint, dry run for sandbox keys. */
  sideEffects?: boolean;
  /** Needs the caller's edge-network token (X-Edge-Token). */
  needsEdgeToken?: boolean;
  /** Documented output shape, one line, for GET /tools/{name}. */
  output: string;
  /**
   * The result's schema: GET /tools/{name} and the OpenAPI document show it as JSON Schema, and the
   * registry test checks every example's result against it. Every catalogue tool declares one.
   */
  outputSchema?: z.ZodTypeAny;
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
  /**
   * The largest input its caps allow (the worst case a caller can send): `npm run bench` times it
   * against `limits.timeMs`, and a test checks it finishes inside its limits.
   */
  largestInput?: () => z.input<S>;
  handler(input: z.output<S>, ctx: ToolContext): Promise<R>;
}

/** Helper that keeps the schema's type flowing into the handler. */
export function defineTool<S extends z.ZodTypeAny, R>(def: ToolDefinition<S, R>): ToolDefinition<S, R> {
  return def;
}

export type AnyTool = ToolDefinition<z.ZodTypeAny, unknown>;
