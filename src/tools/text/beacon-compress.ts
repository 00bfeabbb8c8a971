import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool } from '../types.js';
import type { ExactEncoding } from './tokens.js';
import { countTokensA as countTokens } from './tiktoken-count.js';
import { EncodingField, MAX_TEXT_CHARS, splitSentences, type Span } from './text-kit.js';
import { bm25, textRank } from './bm25.js';
import { largeMarkdown } from './beacon-scan.js';

/**
 * beacon_compress: extractive compression to a token budget. The text is split into sentences
 * (text-kit.ts), each scored by BM25+ against `query` (ties and non-matching sentences by TextRank), or
 * by TextRank alone without a query (or when no query term occurs). Sentences are taken best first
 * while they fit, then written out in document order: consecutive kept sentences keep the original
 * text between them, others are joined by a new line (when one separated them) or a space. The
 * result is recounted and trimmed until it fits, so `tokens_after` ≤ `budget_tokens` always holds.
 * A text that already fits is returned unchanged. When not even one sentence fits, the best one's
 * longest prefix that fits is kept (a partial sentence, still a verbatim slice).
 */

const Input = z.object({
  text: z.string().min(1).max(MAX_TEXT_CHARS).describe('The text to compress (up to 400,000 characters)'),
  budget_tokens: z.number().int().min(32).max(32_000).default(512).describe('Token budget of the result, 32 to 32,000 (default 512)'),
  query: z.string().max(1_000).optional().describe('What the reader cares about: sentences are ranked by BM25 against it (TextRank without it)'),
  encoding: EncodingField,
});

const Output = z.object({
  text: z.string(),
  tokens_before: z.number().int(),
  tokens_after: z.number().int(),
  budget_tokens: z.number().int(),
  encoding: z.enum(['o200k_base', 'cl100k_base']),
  method: z.enum(['unchanged', 'bm25', 'textrank']),
  sentences: z.number().int(),
  kept: z.array(z.object({ start: z.number().int(), end: z.number().int() })),
});

export const beaconCompress = defineTool({
  name: 'beacon_compress',
  description: 'Compresses a text to a token budget by keeping its most relevant sentences verbatim, in document order (BM25 with a query, TextRank without).',
  tier: 'pro',
  priceCents: 2,
  family: 'text',
  input: Input,
  qField: 'text',
  qParse: 'text',
  output: '{text, tokens_before, tokens_after, budget_tokens, encoding, method, sentences, kept[{start,end}]}',
  outputSchema: Output,
  examples: [
    {
      text:
        'Tollgate runs tools over HTTP. Every call is a job in a queue. Calls are charged only when they succeed. ' +
        'Failed calls cost nothing, and retries are free. The dashboard shows usage per key. Webhooks report finished jobs. ' +
        'Prices are listed per tool in cents. Sandbox keys never touch real systems.',
      budget_tokens: 32,
      query: 'how are calls charged',
    },
    { text: 'A short note that already fits its budget.', budget_tokens: 64 },
  ],
  isolated: import.meta.url,
  progress: true,
  limits: { timeMs: 30_000, memoryMb: 512 },
  largestInput: () => ({ text: largeMarkdown(MAX_TEXT_CHARS), budget_tokens: 32_000, query: 'ledger settlement retries' }),
  handler: async ({ text, budget_tokens: budget, query, encoding }, ctx) => compress(text, budget, query, encoding, ctx.signal, ctx.progress),
});

export async function compress(
  text: string,
  budget: number,
  query: string | undefined,
  encoding: ExactEncoding,
  signal: AbortSignal,
  progress: (p: { stage: string; done?: number; total?: number }) => Promise<void>,
): Promise<z.infer<typeof Output>> {
  await progress({ stage: 'counting' });
  const before = countTokens(text, encoding);
  const spans = splitSentences(text, signal);
  if (before > budget && spans.length === 0) {
    // Nothing but white space, over the budget: no sentence to keep.
    return { text: '', tokens_before: before, tokens_after: 0, budget_tokens: budget, encoding, method: 'textrank', sentences: 0, kept: [] };
  }
  if (before <= budget) {
    return { text, tokens_before: before, tokens_after: before, budget_tokens: budget, encoding, method: 'unchanged', sentences: spans.length, kept: spans };
  }
  const slices = spans.map((s) => text.slice(s.start, s.end));
  await progress({ stage: 'scoring', done: 0, total: slices.length });
  const rank = textRank(slices, signal);
  let method: 'bm25' | 'textrank' = 'textrank';
  let primary: Float64Array | null = null;
  if (query && query.trim()) {
    const { scores } = bm25(slices, query);
    if (scores.some((s) => s > 0)) {
      primary = scores;
      method = 'bm25';
    }
  }
  const order = slices.map((_, i) => i);
  order.sort((a, b) => (primary ? primary[b]! - primary[a]! : 0) || rank[b]! - rank[a]! || a - b);
  await progress({ stage: 'selecting', done: 0, total: slices.length });
  const tokens = new Int32Array(slices.length);
  const chosen: number[] = [];
  let used = 0;
  for (let r = 0; r < order.length && used < budget; r++) {
    if ((r & 0x3ff) === 0 && signal.aborted) throw new Error('aborted');
    const i = order[r]!;
    // More than 64 characters per budget token: no real sentence compresses that well, and counting very
    // long runs is slow, so it is skipped uncounted.
    if (slices[i]!.length > budget * 64) continue;
    tokens[i] = countTokens(slices[i]!, encoding);
    if (used + tokens[i]! + 1 <= budget) {
      chosen.push(i);
      used += tokens[i]! + 1;
    }
  }
  const rankOf = new Int32Array(slices.length);
  order.forEach((i, r) => (rankOf[i] = r));
  chosen.sort((a, b) => a - b);
  let out = join(text, spans, chosen);
  let after = countTokens(out, encoding);
  // Joining can merge tokens differently: drop the weakest kept sentence until the recount fits.
  while (after > budget && chosen.length > 0) {
    let weakest = 0;
    for (let k = 1; k < chosen.length; k++) if (rankOf[chosen[k]!]! > rankOf[chosen[weakest]!]!) weakest = k;
    chosen.splice(weakest, 1);
    out = join(text, spans, chosen);
    after = countTokens(out, encoding);
  }
  let kept: Span[] = chosen.map((i) => spans[i]!);
  if (chosen.length === 0) {
    // Not one whole sentence fits: the best sentence's longest prefix that does.
    const best = spans[order[0]!]!;
    let lo = 0;
    let hi = Math.min(best.end - best.start, budget * 64);
    while (lo < hi) {
      const mid = Math.ceil((lo + hi) / 2);
      if (countTokens(text.slice(best.start, best.start + mid), encoding) <= budget) lo = mid;
      else hi = mid - 1;
    }
    // Do not cut a surrogate pair in half.
    if (lo > 0 && /[\uD800-\uDBFF]/.test(text[best.start + lo - 1]!)) lo--;
    out = text.slice(best.start, best.start + lo).trimEnd();
    kept = out ? [{ start: best.start, end: best.start + out.length }] : [];
    after = countTokens(out, encoding);
  }
  if (after > budget) throw new AppError('internal_error', 'beacon_compress could not fit the budget');
  return { text: out, tokens_before: before, tokens_after: after, budget_tokens: budget, encoding, method, sentences: spans.length, kept };
}

/** Kept sentences in order: the original text between neighbours, else a new line or a space. */
function join(text: string, spans: Span[], chosen: number[]): string {
  const parts: string[] = [];
  chosen.forEach((i, k) => {
    if (k > 0) {
      const prev = chosen[k - 1]!;
      if (prev === i - 1) parts.push(text.slice(spans[prev]!.end, spans[i]!.start));
      else parts.push(/\n/.test(text.slice(spans[i - 1]!.end, spans[i]!.start)) ? '\n' : ' ');
    }
    parts.push(text.slice(spans[i]!.start, spans[i]!.end));
  });
  return parts.join('');
}
