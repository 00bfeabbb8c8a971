import OpenAI, { APIConnectionError, APIConnectionTimeoutError, APIError, APIUserAbortError } from 'openai';
import type { ChatCompletionMessageParam } from 'openai/resources/chat/completions';
import { z } from 'zod';
import type { Config } from '../../config.js';
import { AppError } from '../../errors.js';
import { defineTool, type AnyTool, type Plan, type ToolContext, type ToolDefinition } from '../types.js';
import { TokenUsageSchema } from './tool-kit.js';

/**
 * Everything the language-model tools share: the upstream client, streaming tokens into progress,
 * error mapping, the common input fields, and the chat-message -> tool-input mapping that the
 * OpenAI-compatible chat endpoint uses. A tool file holds only its prompt and its schema.
 */

// ---------------------------------------------------------------------------------------------
// Shared input fields

export const MAX_INPUT_CHARS = 20_000;
const MAX_CONTEXT_TURNS = 40;
const MAX_CONTEXT_CHARS = 100_000;
export const MAX_COMPLETION_TOKENS = 16_384;

export const ChatTurnSchema = z.object({
  role: z.enum(['user', 'assistant']).describe('Who said it: the user, or the assistant in an earlier answer.'),
  content: z.string().min(1).max(MAX_INPUT_CHARS).describe('The text of the message.'),
});
export type ChatTurn = z.infer<typeof ChatTurnSchema>;

export const ContextSchema = z
  .array(ChatTurnSchema)
  .max(MAX_CONTEXT_TURNS)
  .refine((turns) => turns.reduce((n, t) => n + t.content.length, 0) <= MAX_CONTEXT_CHARS, {
    message: `context may hold at most ${MAX_CONTEXT_CHARS} characters in all`,
  })
  .optional()
  .describe('Earlier conversation, oldest first. It is sent to the model between the instructions and the new request.');

export function maxTokensField(defaultMaxTokens: number) {
  return z.number().int().min(16).max(MAX_COMPLETION_TOKENS).optional().describe(`Upper bound on generated tokens (default ${defaultMaxTokens}).`);
}

/** What every language-model tool's validated input carries besides its own fields. */
export interface LlmCommonInput {
  context?: ChatTurn[] | undefined;
  max_tokens?: number | undefined;
}

// ---------------------------------------------------------------------------------------------
// Output

export interface LlmUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export interface LlmResult {
  text: string;
  /** The model the upstream says answered (may differ from LLM_MODEL, e.g. a dated snapshot). */
  model: string;
  /** Null when the upstream did not report usage despite `include_usage`. */
  usage: LlmUsage | null;
  finish_reason: string;
}

export const LlmResultSchema = z.object({
  text: z.string().min(1).describe('The completion, as the model wrote it (never empty)'),
  model: z.string().describe('The model the upstream says answered (may differ from LLM_MODEL, e.g. a dated snapshot)'),
  usage: TokenUsageSchema.nullable().describe('Token usage, or null when the upstream did not report it'),
  finish_reason: z.string().describe('Why the model stopped, as the upstream says: stop, length, content_filter...'),
});

export const LLM_OUTPUT = '{text: string, model: string, usage: {prompt_tokens, completion_tokens, total_tokens} | null, finish_reason: string}';

// ---------------------------------------------------------------------------------------------
// Upstream client

/**
 * One client per Config object. Config is parsed once and never mutated, so its identity is a safe
 * cache key: production shares one client, and each test's config gets its own without leaking
 * (WeakMap). The client holds only options (connections are pooled by fetch's global dispatcher),
 * so caching just avoids rebuilding it and re-reading OPENAI_* env on every call.
 */
const clients = new WeakMap<Config, OpenAI>();

/**
 * The OpenAI-compatible API root of LLM_BASE_URL. A bare server address (`http://localhost:11434`,
 * nothing after the host) means its `/v1`, where Ollama, vLLM, llama.cpp's server, LM Studio and
 * hosted OpenAI-compatible services answer; a URL with a path is used as given (some hosts serve
 * elsewhere, e.g. `/v1beta/openai`).
 */
export function llmApiRoot(baseUrl: string): string {
  const url = new URL(baseUrl);
  if (url.pathname === '/' || url.pathname === '') url.pathname = '/v1';
  return url.toString().replace(/\/+$/, '');
}

function clientFor(config: Config, baseURL: string): OpenAI {
  let client = clients.get(config);
  if (!client) {
    client = new OpenAI({
      baseURL: llmApiRoot(baseURL),
      // Local servers (llama.cpp, vLLM, Ollama) often need no key, but the SDK insists on one.
      apiKey: config.LLM_API_KEY || 'none',
      // Null these explicitly: the SDK would otherwise pick OPENAI_* from the environment and send
      // OpenAI-specific headers to whatever upstream is configured.
      organization: null,
      project: null,
      // A retry would re-run a generation the caller may already have seen stream; the queue owns retries.
      maxRetries: 0,
      timeout: config.LLM_TIMEOUT_MS,
      // The SDK would print raw upstream chunks to the console on parse errors; we log our own summary.
      logLevel: 'off',
    });
    clients.set(config, client);
  }
  return client;
}

// ---------------------------------------------------------------------------------------------
// Prompt assembly and streaming

export interface CompletionRequest {
  /** Tool name, for error messages and logs. */
  tool: string;
  messages: ChatCompletionMessageParam[];
  maxTokens: number;
  temperature?: number;
  /** Chat-completions `response_format` (structured tools: json_schema or json_object). */
  responseFormat?: Record<string, unknown>;
  /** Stage name of the token progress events (default "generating"). */
  stage?: string;
}

/** What streaming needs of a tool's context (the structured client passes only these). */
export type LlmCallContext = Pick<ToolContext, 'config' | 'log' | 'signal' | 'progress' | 'recordUsage'>;

/** Instructions first, then the earlier conversation in order, then the new request. */
export function buildMessages(system: string, context: ChatTurn[] | undefined, user: string): ChatCompletionMessageParam[] {
  return [
    { role: 'system', content: system },
    ...(context ?? []).map((t): ChatCompletionMessageParam => ({ role: t.role, content: t.content })),
    { role: 'user', content: user },
  ];
}

/**
 * Streams one chat completion. Each content delta becomes a progress event as it arrives, so callers
 * that stream (SSE, chat `stream: true`) see tokens as the model produces them.
 */
export async function streamCompletion(ctx: LlmCallContext, req: CompletionRequest): Promise<LlmResult> {
  const { config } = ctx;
  if (!config.LLM_BASE_URL) {
    throw new AppError('tool_unavailable', `${req.tool} needs a language-model upstream: set LLM_BASE_URL`);
  }
  if (ctx.signal.aborted) throw cancelled(ctx, req.tool);
  const client = clientFor(config, config.LLM_BASE_URL);

  // The SDK's timeout stops at the response headers; a stream that then goes silent would hang until
  // the job's deadline. This idle timer bounds every gap between chunks by the same LLM_TIMEOUT_MS,
  // while a model that keeps producing tokens is never cut off.
  const upstream = new AbortController();
  const onCallerAbort = () => upstream.abort();
  ctx.signal.addEventListener('abort', onCallerAbort, { once: true });
  let idle: NodeJS.Timeout | undefined;
  let idledOut = false;
  const armIdle = () => {
    clearTimeout(idle);
    idle = setTimeout(() => {
      idledOut = true;
      upstream.abort();
    }, config.LLM_TIMEOUT_MS);
  };

  let text = '';
  let chunks = 0;
  let model = config.LLM_MODEL;
  let finishReason: string | null = null;
  let usage: LlmUsage | null = null;
  // A failing progress sink (e.g. Redis) is our fault, not the upstream's: keep it apart from the mapping.
  let progressError: { error: unknown } | null = null;

  try {
    armIdle();
    const stream = await client.chat.completions.create(
      {
        model: config.LLM_MODEL,
        messages: req.messages,
        stream: true,
        stream_options: { include_usage: true },
        // `max_tokens` rather than `max_completion_tokens`: every OpenAI-compatible server accepts it.
        max_tokens: req.maxTokens,
        ...(req.temperature !== undefined ? { temperature: req.temperature } : {}),
        ...(req.responseFormat ? { response_format: req.responseFormat as never } : {}),
      },
      { signal: upstream.signal },
    );
    for await (const chunk of stream) {
      armIdle();
      if (chunk.model) model = chunk.model;
      if (chunk.usage) usage = pickUsage(chunk.usage);
      const choice = chunk.choices[0]; // the final usage chunk has no choices
      if (!choice) continue;
      if (choice.finish_reason) finishReason = choice.finish_reason;
      const delta = choice.delta?.content;
      if (!delta) continue;
      text += delta;
      chunks += 1;
      try {
        await ctx.progress({ stage: req.stage ?? 'generating', delta, done: chunks, unit: 'tokens' });
      } catch (error) {
        progressError = { error };
        break; // leaving the loop aborts the upstream request
      }
    }
  } catch (e) {
    if (ctx.signal.aborted) throw cancelled(ctx, req.tool);
    throw upstreamFailure(ctx, req.tool, idledOut ? new IdleTimeout() : e);
  } finally {
    clearTimeout(idle);
    ctx.signal.removeEventListener('abort', onCallerAbort);
  }

  if (progressError) throw progressError.error;
  // The SDK ends the iteration quietly when its signal aborts, so check why the stream stopped.
  if (ctx.signal.aborted) throw cancelled(ctx, req.tool);
  if (idledOut) throw upstreamFailure(ctx, req.tool, new IdleTimeout());
  if (finishReason === null) {
    throw upstreamFailure(ctx, req.tool, new UpstreamProblem('stream ended before the completion finished'));
  }
  if (text.trim() === '') {
    throw upstreamFailure(ctx, req.tool, new UpstreamProblem(`empty completion (finish_reason: ${finishReason})`));
  }
  if (usage) ctx.recordUsage({ ...usage });
  return { text, model, usage, finish_reason: finishReason };
}

function pickUsage(u: { prompt_tokens?: number; completion_tokens?: number; total_tokens?: number }): LlmUsage {
  const prompt = u.prompt_tokens ?? 0;
  const completion = u.completion_tokens ?? 0;
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: u.total_tokens ?? prompt + completion };
}

// ---------------------------------------------------------------------------------------------
// Errors

class IdleTimeout extends Error {}
class UpstreamProblem extends Error {}

/**
 * The job was cancelled (its deadline passed or the worker is stopping). The worker decides what that
 * means; if it aborted with an AppError we pass that on, otherwise it is a timeout.
 */
function cancelled(ctx: LlmCallContext, tool: string): AppError {
  const reason: unknown = ctx.signal.reason;
  if (reason instanceof AppError) return reason;
  return new AppError('timeout', `${tool} was cancelled before the language model finished`);
}

/**
 * Every upstream failure is tool_unavailable (503, not charged). It is not retried: a 401 or a
 * malformed stream will not heal, and a retry of a half-streamed answer would show the caller the
 * tokens twice. The message says what went wrong in a few words and never carries the API key.
 */
function upstreamFailure(ctx: LlmCallContext, tool: string, e: unknown): AppError {
  const { reason, status } = describeFailure(e, ctx.config);
  const safe = redact(reason, ctx.config.LLM_API_KEY);
  ctx.log.warn({ tool, upstream_status: status, reason: safe }, 'language-model upstream failed');
  return new AppError('tool_unavailable', `language-model upstream failed: ${safe}`, status !== undefined ? { upstream_status: status } : {}, {
    retryable: false,
  });
}

function describeFailure(e: unknown, config: Config): { reason: string; status?: number } {
  if (e instanceof IdleTimeout) return { reason: `no data for ${config.LLM_TIMEOUT_MS} ms` };
  if (e instanceof UpstreamProblem) return { reason: e.message };
  if (e instanceof APIConnectionTimeoutError) return { reason: `timed out after ${config.LLM_TIMEOUT_MS} ms` };
  if (e instanceof APIUserAbortError) return { reason: 'request aborted' };
  if (e instanceof APIConnectionError) return { reason: `connection failed${errnoOf(e)}` };
  if (e instanceof APIError) {
    const body = e.error as { message?: unknown } | undefined;
    const msg = typeof body?.message === 'string' ? body.message : '';
    if (e.status === undefined) return { reason: `error inside the stream${msg ? `: ${short(msg)}` : ''}` };
    return { reason: `${e.status}${msg ? ` ${short(msg)}` : ''}`, status: e.status };
  }
  if (e instanceof SyntaxError) return { reason: 'malformed stream (a chunk was not valid JSON)' };
  // fetch reports a body cut short as TypeError('terminated'), caused by the socket error.
  if (e instanceof TypeError && e.message === 'terminated') return { reason: `connection dropped mid-stream${errnoOf(e)}` };
  return { reason: `unexpected ${e instanceof Error ? e.name : typeof e}` };
}

/** ECONNREFUSED, ECONNRESET...: the useful part of a network error is its code, a few causes deep. */
function errnoOf(e: unknown): string {
  for (let cur: unknown = e, depth = 0; cur && depth < 5; depth++) {
    const code = (cur as { code?: unknown }).code;
    if (typeof code === 'string' && /^[A-Z_]+$/.test(code)) return ` (${code})`;
    cur = (cur as { cause?: unknown }).cause;
  }
  return '';
}

function short(s: string): string {
  const one = s.replace(/\s+/g, ' ').trim();
  return one.length > 160 ? `${one.slice(0, 157)}...` : one;
}

/** Some upstreams echo the key they rejected; never pass it (or anything key-shaped) on. */
function redact(s: string, apiKey: string): string {
  let out = apiKey.length >= 4 ? s.split(apiKey).join('[redacted]') : s;
  out = out.replace(/\b(sk|pk|rk)-[A-Za-z0-9_-]{8,}/g, '[redacted]');
  return out;
}

// ---------------------------------------------------------------------------------------------
// Tool definition helper

export interface LlmPrompt {
  system: string;
  user: string;
}

export interface LlmToolSpec<S extends z.ZodType<LlmCommonInput, z.ZodTypeDef, unknown>> {
  name: string;
  description: string;
  tier: Plan;
  priceCents: number;
  qField: string;
  input: S;
  examples: Array<z.input<S>>;
  defaultMaxTokens: number;
  /** Sampling temperature suited to the job (low for reasoning, high for humour). */
  temperature: number;
  prompt(input: z.output<S>): LlmPrompt;
}

/** A language-model tool: the prompt and schema come from the tool file, the rest is shared. */
export function defineLlmTool<S extends z.ZodType<LlmCommonInput, z.ZodTypeDef, unknown>>(spec: LlmToolSpec<S>): ToolDefinition<S, LlmResult> {
  return defineTool({
    name: spec.name,
    description: spec.description,
    tier: spec.tier,
    priceCents: spec.priceCents,
    family: 'llm',
    input: spec.input,
    examples: spec.examples,
    qField: spec.qField,
    // Without LLM_BASE_URL: 503 tool_unavailable at admission, nothing held or charged.
    needs: ['llm'],
    progress: true,
    output: LLM_OUTPUT,
    outputSchema: LlmResultSchema,
    handler: async (input, ctx) => {
      const { system, user } = spec.prompt(input);
      return streamCompletion(ctx, {
        tool: spec.name,
        messages: buildMessages(system, input.context, user),
        maxTokens: input.max_tokens ?? spec.defaultMaxTokens,
        temperature: spec.temperature,
      });
    },
  });
}

// ---------------------------------------------------------------------------------------------
// Chat endpoint mapping

/** The models the chat endpoint offers are named after the tools: svc-genius -> genius. */
export const CHAT_MODEL_PREFIX = 'svc-';

export function chatModelName(tool: Pick<AnyTool, 'name'>): string {
  return `${CHAT_MODEL_PREFIX}${tool.name}`;
}

/** A chat-completions request message, loosely typed: the endpoint validates the envelope, not this. */
export interface ChatMessageLike {
  role: string;
  content?: unknown;
}

/**
 * Turns a chat-completions `messages` array into a tool input: the last message (which must be the
 * user's) fills the tool's qField, earlier user/assistant turns become `context` in order. System or
 * developer messages from the client cannot replace the tool's own instructions, so they travel as
 * user turns marked as the client's instructions. Tool-call plumbing carries no text and is dropped.
 * The result still goes through the tool's zod schema (invalid_input with paths on failure).
 */
export function chatToToolInput(tool: Pick<AnyTool, 'name' | 'qField'>, messages: ChatMessageLike[], maxTokens?: number | null): Record<string, unknown> {
  const last = messages.at(-1);
  const lastText = last ? textOf(last.content) : '';
  if (!last || last.role !== 'user' || lastText.trim() === '') {
    throw new AppError('invalid_input', 'the last message must be a user message with text content', { param: 'messages' });
  }
  const context: ChatTurn[] = [];
  for (const m of messages.slice(0, -1)) {
    const text = textOf(m.content);
    if (text.trim() === '') continue;
    if (m.role === 'user' || m.role === 'assistant') context.push({ role: m.role, content: text });
    else if (m.role === 'system' || m.role === 'developer') {
      context.push({ role: 'user', content: `Instructions from the calling application:\n${text}` });
    }
  }
  return {
    [tool.qField]: lastText,
    ...(context.length ? { context } : {}),
    ...(maxTokens != null ? { max_tokens: maxTokens } : {}),
  };
}

/** Chat content is a string or an array of parts; only text parts mean anything to these tools. */
function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content
    .map((p: unknown) => {
      const part = p as { type?: unknown; text?: unknown };
      return part?.type === 'text' && typeof part.text === 'string' ? part.text : '';
    })
    .filter(Boolean)
    .join('\n');
}
