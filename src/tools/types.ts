import type { z } from 'zod';
import type { Logger } from 'pino';
import type { Config, Family } from '../config.js';

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
  handler(input: z.output<S>, ctx: ToolContext): Promise<R>;
}

/** Helper that keeps the schema's type flowing into the handler. */
export function defineTool<S extends z.ZodTypeAny, R>(def: ToolDefinition<S, R>): ToolDefinition<S, R> {
  return def;
}

export type AnyTool = ToolDefinition<z.ZodTypeAny, unknown>;
