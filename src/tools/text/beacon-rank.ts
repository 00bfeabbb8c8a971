import { z } from 'zod';
import { defineTool } from '../types.js';
import { countTokensA as countTokens } from './tiktoken-count.js';
import { MAX_TEXT_CHARS, round, splitSentences, words } from './text-kit.js';
import { bm25 } from './bm25.js';
import { largeMarkdown } from './beacon-scan.js';

/**
 * beacon_rank: BM25+ ranking (MiniSearch, exact terms, English stop words left out) of documents, or
 * of a text cut into chunks of about `chunk_tokens` o200k_base tokens at sentence boundaries (a sentence
 * longer than a chunk is a chunk of its own). Only documents that contain a query term are ranked;
 * equal scores keep input order. The snippet is a verbatim slice of the document (up to 240
 * characters) around its first matched term; chunks also carry their offsets in the text.
 */

const MAX_DOCUMENTS = 1_000;

const Doc = z.union([
  z.string().min(1).max(MAX_TEXT_CHARS),
  z.object({ id: z.string().min(1).max(200).describe('Your id for the document'), text: z.string().min(1).max(MAX_TEXT_CHARS).describe('The document') }),
]);

const Input = z
  .object({
    query: z.string().min(1).max(1_000).describe('What to rank the documents by'),
    documents: z
      .array(Doc)
      .min(1)
      .max(MAX_DOCUMENTS)
      .optional()
      .describe('Up to 1,000 documents: strings (ids are their positions, "0", "1"...) or {id, text}; 400,000 characters in all'),
    text: z
      .string()
      .min(1)
      .max(MAX_TEXT_CHARS)
      .optional()
      .describe('Instead of documents: one text (up to 400,000 characters) cut into chunks of chunk_tokens'),
    chunk_tokens: z.number().int().min(16).max(4_096).default(256).describe('Chunk size in o200k_base tokens when ranking a text (default 256)'),
    top_k: z.number().int().min(1).max(100).default(10).describe('How many results to return (default 10)'),
  })
  .superRefine((v, ctx) => {
    if (!v.documents === !v.text) ctx.addIssue({ code: 'custom', path: ['documents'], message: 'Give either documents or text' });
    if (v.documents) {
      const total = v.documents.reduce((n, d) => n + (typeof d === 'string' ? d.length : d.text.length), 0);
      if (total > MAX_TEXT_CHARS)
        ctx.addIssue({ code: 'custom', path: ['documents'], message: `Documents hold ${total} characters; at most ${MAX_TEXT_CHARS} in all` });
      const ids = new Set<string>();
      v.documents.forEach((d, i) => {
        const id = typeof d === 'string' ? String(i) : d.id;
        if (ids.has(id)) ctx.addIssue({ code: 'custom', path: ['documents', i, 'id'], message: `Duplicate id ${id}` });
        ids.add(id);
      });
    }
  });

const Output = z.object({
  ranked: z.array(
    z.object({
      id: z.string(),
      rank: z.number().int().min(1),
      score: z.number(),
      snippet: z.string(),
      matched_terms: z.array(z.string()),
      start: z.number().int().optional(),
      end: z.number().int().optional(),
    }),
  ),
  total: z.number().int(),
  matched: z.number().int(),
});

export const beaconRank = defineTool({
  name: 'beacon_rank',
  description: 'Ranks documents, or chunks of one text, against a query with BM25 and returns the best with snippets and matched terms.',
  tier: 'pro',
  priceCents: 1,
  family: 'text',
  input: Input,
  qField: 'query',
  qParse: 'text',
  output: '{ranked[{id,rank,score,snippet,matched_terms,start?,end?}], total, matched}',
  outputSchema: Output,
  examples: [
    {
      query: 'refund policy',
      documents: [
        'Shipping takes three to five days.',
        { id: 'faq-refunds', text: 'Our refund policy: full refunds within 30 days of purchase.' },
        'Contact support for any policy questions.',
      ],
      top_k: 2,
    },
    {
      query: 'ledger retries',
      text: '# Billing\nThe ledger records every charge.\n\n# Queue\nFailed jobs are retried three times; retries are free.\n\n# Keys\nKeys can be rotated.',
      chunk_tokens: 16,
    },
  ],
  isolated: import.meta.url,
  progress: true,
  limits: { timeMs: 20_000, memoryMb: 512 },
  largestInput: () => ({ query: 'ledger settlement retries double-charges worker plan', text: largeMarkdown(MAX_TEXT_CHARS), chunk_tokens: 16, top_k: 100 }),
  handler: async ({ query, documents, text, chunk_tokens, top_k }, ctx) => {
    await ctx.progress({ stage: 'indexing' });
    let docs: Array<{ id: string; text: string; start?: number; end?: number }>;
    if (documents) {
      docs = documents.map((d, i) => (typeof d === 'string' ? { id: String(i), text: d } : { id: d.id, text: d.text }));
    } else {
      docs = chunk(text!, chunk_tokens, ctx.signal).map((c, i) => ({ id: String(i), text: text!.slice(c.start, c.end), start: c.start, end: c.end }));
    }
    if (ctx.signal.aborted) throw new Error('aborted');
    await ctx.progress({ stage: 'ranking', total: docs.length });
    const { scores, matched } = bm25(
      docs.map((d) => d.text),
      query,
    );
    const order = docs.map((_, i) => i).filter((i) => scores[i]! > 0);
    order.sort((a, b) => scores[b]! - scores[a]! || a - b);
    const ranked = order.slice(0, top_k).map((i, r) => {
      const d = docs[i]!;
      return {
        id: d.id,
        rank: r + 1,
        score: round(scores[i]!, 4),
        snippet: snippet(d.text, matched[i]!),
        matched_terms: matched[i]!,
        ...(d.start !== undefined ? { start: d.start, end: d.end } : {}),
      };
    });
    return { ranked, total: docs.length, matched: order.length };
  },
});

/** Sentences grouped into chunks of at most `size` tokens (a longer sentence is a chunk alone). */
export function chunk(text: string, size: number, signal?: AbortSignal): Array<{ start: number; end: number }> {
  const out: Array<{ start: number; end: number }> = [];
  let cur: { start: number; end: number; tokens: number } | null = null;
  splitSentences(text, signal).forEach((s, i) => {
    if ((i & 0x3ff) === 0 && signal?.aborted) throw new Error('aborted');
    const t = countTokens(text.slice(s.start, s.end));
    if (cur && cur.tokens + t <= size) {
      cur.end = s.end;
      cur.tokens += t;
    } else {
      if (cur) out.push({ start: cur.start, end: cur.end });
      cur = { start: s.start, end: s.end, tokens: t };
    }
  });
  if (cur) out.push({ start: (cur as { start: number }).start, end: (cur as { end: number }).end });
  return out;
}

/** Up to 240 characters of the document around its first matched term, cut at word boundaries. */
function snippet(text: string, terms: string[]): string {
  if (text.length <= 240) return text;
  const set = new Set(terms);
  const hit = words(text).find((w) => set.has(w.word));
  let start = Math.max(0, (hit?.start ?? 0) - 80);
  let end = Math.min(text.length, start + 240);
  if (start > 0) {
    const sp = text.indexOf(' ', start);
    if (sp !== -1 && sp < (hit?.start ?? start)) start = sp + 1;
  }
  if (end < text.length) {
    const sp = text.lastIndexOf(' ', end);
    if (sp > start + 120) end = sp;
  }
  return text.slice(start, end).trim();
}
