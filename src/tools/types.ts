import type { z } from 'zod';
import type { Logger } from 'pino';
import type { Config, Family } from '../config.js';

/**
 * Named CPU tasks a handler hands to the sandbox pool (`ctx.isolate`), by name: `{ input, output }`.
 * Empty here; src/tools/tasks.ts fills it by declaration merging from the families' task tables, so
 * this file, which every tool imports, imports none of them.
 */
export interface TaskTypes {}
export type TaskName = keyof TaskTypes & string;
export type TaskInput<K extends TaskName> = TaskTypes[K] extends { input: infer I } ? I : never;
export type TaskOutput<K extends TaskName> = TaskTypes[K] extends { output: infer O } ? O : never;

/** What a tool may declare (`limits` in its definition); the rest comes from the configuration. */
export interface ToolLimits {
  /** Wall-clock milliseconds one call may run in the pool (default TOOL_TIME_MS). */
  timeMs?: number;
  /** Heap (V8 old generation) megabytes of the thread running the call (default TOOL_MEMORY_MB). */
  memoryMb?: number;
}

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
  /**
   * Runs `fn` holding this account's and tool's lock named `key`, so calls that share a key run one
   * after another (cvi_loop's rounds of one loop). A lock whose holder died frees itself after
   * `holdMs`; a call that cannot take it within `waitMs` gets null and `fn` never runs.
   */
  exclusive<T>(key: string, opts: { holdMs: number; waitMs: number; signal?: AbortSignal }, fn: () => Promise<T>): Promise<{ value: T } | null>;
}

/** One request through the guarded client (ctx.http). */
export interface GuardedRequest {
  method?: 'GET' | 'HEAD' | 'POST';
  headers?: Record<string, string>;
  body?: string;
  /** Stop reading after this many decoded bytes (capped by WEB_FETCH_MAX_BYTES); the result says `truncated`. */
  maxBytes?: number;
  /** Deadline for the whole request including redirects (capped by WEB_FETCH_TIMEOUT_MS). */
  timeoutMs?: number;
  /** Follow up to 5 redirects, each re-checked by the guard (default true). */
  followRedirects?: boolean;
  /** Report `fetching` progress while the body arrives (default false: a tool fetching many pages reports its own). */
  reportProgress?: boolean;
  /** Leave the body unread for these answers (e.g. binary types): `body` is empty, `bytes` 0. */
  skipBody?: (contentType: string | null, status: number) => boolean;
}

export interface GuardedResponse {
  /** The URL asked for, and the one that answered after redirects. */
  url: string;
  final_url: string;
  status: number;
  /** Lower-case names; repeated headers joined with ", " (set-cookie with "\n"). */
  headers: Record<string, string>;
  content_type: string | null;
  charset: string | null;
  /** Decoded (gunzipped...) body, at most maxBytes. */
  body: Buffer;
  bytes: number;
  truncated: boolean;
  redirects: Array<{ url: string; status: number; location: string }>;
  /** The body as text in its declared charset (UTF-8 by default). */
  text(): string;
}

/**
 * page_fetch's guarded client, for every tool that reads the web for a caller: the destination is
 * resolved and vetted (no loopback, private, link-local or metadata addresses unless FETCH_ALLOWED_HOSTS
 * admits it), the connection is pinned to the vetted address, every redirect is vetted again, bodies
 * and time are capped, and at most WEB_PER_HOST requests run at once per target host in a process.
 * Failures are `fetch_failed` (502, uncharged) with a `reason`; a refused address is `invalid_input`.
 */
export interface GuardedHttp {
  fetch(url: string | URL, opts?: GuardedRequest): Promise<GuardedResponse>;
}

export interface SearchQuery {
  query: string;
  /** Results wanted, 1-20 (default 10). */
  limit?: number;
  page?: number;
  language?: string;
  time_range?: 'day' | 'week' | 'month' | 'year';
  safesearch?: 0 | 1 | 2;
}

export interface SearchHit {
  /** 1-based position across the pages asked for. */
  rank: number;
  title: string;
  url: string;
  snippet: string;
  engines: string[];
  published_at: string | null;
}

export interface SearchAnswer {
  results: SearchHit[];
  suggestions: string[];
  answers: string[];
}

/** The search upstream (SEARCH_BASE_URL, a SearXNG JSON API). Unset, down or failing: `tool_unavailable` (503). */
export interface SearchApi {
  search(q: SearchQuery): Promise<SearchAnswer>;
}

/** A block of caller-supplied text, sent to the model inside delimiters as data, never as instructions. */
export interface LlmDataBlock {
  name: string;
  text: string;
}

export interface LlmMeta {
  model: string;
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number } | null;
  prompt_version: string;
}

export interface LlmStructuredRequest<T> {
  /** Names the schema (letters, digits, _ and -) and prefixes log lines. */
  name: string;
  /** Bump when the instructions change: results carry it in `meta.prompt_version`. */
  promptVersion: string;
  /** The tool's instructions. Caller text never goes here. */
  instructions: string;
  /** Caller text, each in its own delimited block. */
  data: LlmDataBlock[];
  /** What the model must return; checked with zod. One repair prompt, then `tool_unavailable`. */
  schema: z.ZodType<T>;
  maxTokens: number;
  temperature?: number;
  /** The stage name of the token progress events (default "generating"). */
  stage?: string;
}

/**
 * The language-model upstream (LLM_BASE_URL): strict structured output validated with zod, tokens
 * streamed as progress, usage recorded with the call's ledger entry, at most LLM_MAX_INFLIGHT calls
 * at once per process. Every failure is `tool_unavailable` (503, uncharged).
 */
export interface LlmApi {
  structured<T>(req: LlmStructuredRequest<T>): Promise<{ value: T; meta: LlmMeta }>;
}

/** DNS lookups through DNS_SERVERS (or the system resolver), each bounded by DNS_TIMEOUT_MS. */
export type ToolDns = import('./web/resolver.js').DnsResolver;

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
  /** Guarded HTTP for tools that read the web (see GuardedHttp); absent in sandbox threads. */
  http?: GuardedHttp;
  /** The search upstream; present only when SEARCH_BASE_URL is set (tools declare needs: ['search']). */
  search?: SearchApi;
  /** The language-model upstream; present only when LLM_BASE_URL is set (tools declare needs: ['llm']). */
  llm?: LlmApi;
  /** DNS through the configured resolvers. */
  dns?: ToolDns;
  /** The caller's key (production, agent or sub-key id; null for x402 payers): passports address keys. */
  callerKeyId?: string | null;
  /** Passports of the caller's account (src/access/passports.ts); absent without an account or Redis. */
  passports?: import('./core/passport-api.js').PassportApi;
  /** Records upstream usage (e.g. model tokens) with the call's ledger entry. */
  recordUsage(usage: Record<string, number>): void;
  /**
   * Runs one named CPU task (src/tools/tasks.ts) in the sandbox pool under this tool's `limits`,
   * so parsing caller-controlled data never blocks the event loop. Set by the runner; absent only when
   * a handler is called directly (unit tests), where `runTask` (src/tools/tasks.ts) runs it inline.
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
  /**
   * The same call again (same input) changes nothing more than the first did: MCP idempotentHint.
   * Default: tools without side effects, which compute or read and keep nothing (see isIdempotent).
   * Declare it on the rest: `true` on writes that set a state or remove a thing (cf_update_dns,
   * cf_ssl_mode, cf_delete_worker...), `false` on a tool that keeps what each call makes (handoff).
   * Charging is apart from it: every successful call is charged (an Idempotency-Key prevents a repeat).
   */
  idempotent?: boolean;
  /** Needs the caller's edge-network token (X-Edge-Token). */
  needsEdgeToken?: boolean;
  /**
   * Its input or answer carries what a caller keeps secret (a passport's content): both are sealed
   * wherever the call leaves them (job data, return value, job records, event logs, job_results;
   * src/queue/job-seal.ts), and its progress carries figures only, never text. Other tools pay nothing.
   */
  sensitive?: boolean;
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
  /**
   * Runs on the worker's event loop before the handler, with the whole context (ctx.http...): an
   * isolated tool fetches what the caller named here (cvi_verify's urls) and returns the input its
   * handler then gets in the pool. Keep it to I/O; parsing belongs in the handler or a task.
   */
  prepare?(input: z.output<S>, ctx: ToolContext): Promise<z.output<S>>;
  /** Runs on the event loop after the handler, with the whole context (handoff stores its brief as a passport). */
  finish?(result: R, input: z.output<S>, ctx: ToolContext): Promise<R>;
  handler(input: z.output<S>, ctx: ToolContext): Promise<R>;
}

/** Helper that keeps the schema's type flowing into the handler. */
export function defineTool<S extends z.ZodTypeAny, R>(def: ToolDefinition<S, R>): ToolDefinition<S, R> {
  return def;
}

export type AnyTool = ToolDefinition<z.ZodTypeAny, unknown>;

/** Whether calling the tool again with the same input changes nothing more (see `idempotent`). */
export function isIdempotent(tool: Pick<AnyTool, 'idempotent' | 'sideEffects'>): boolean {
  return tool.idempotent ?? !tool.sideEffects;
}
