import { z } from 'zod';
import { defineTool } from '../types.js';
import { countTokensA as countTokens } from './tiktoken-count.js';
import { EncodingField, MAX_TEXT_CHARS, round } from './text-kit.js';
import { bm25, codeTerms } from './bm25.js';
import { largeReportA } from './worst-cases.js';

/**
 * beacon_focus: the passages of code, logs or documents that matter for a query, within a token budget.
 * The text is cut into lines (a line longer than 1,000 characters into segments of at most 1,000,
 * at white space where there is some, so minified files still give small passages). Each segment is
 * scored by BM25+ against the query, with camelCase and snake_case identifiers split into their parts
 * as well. Every matching segment opens a window of `context_lines` segments either side; overlapping
 * or touching windows merge into one passage scored by the sum of its segments. Passages are taken best
 * first (ties: earlier first) while their tokens fit the budget; a passage that does not fit is tried
 * again as its best segment alone. The result lists them in document order; each `text` is the exact
 * slice text.slice(start, end), lines are 1-based. `coverage` is the share of the query's terms that
 * occur in the passages kept.
 */

const MAX_SEGMENT = 1_000;

const Input = z.object({
  text: z.string().min(1).max(MAX_TEXT_CHARS).describe('Code, logs or a document (up to 400,000 characters)'),
  query: z.string().min(1).max(1_000).describe('What to look for: words, identifiers, error messages'),
  budget_tokens: z.number().int().min(32).max(32_000).default(1_024).describe('Token budget of all passages together, 32 to 32,000 (default 1024)'),
  context_lines: z.number().int().min(0).max(20).default(2).describe('Lines of context kept either side of a matching line, 0 to 20 (default 2)'),
  encoding: EncodingField,
});

const Output = z.object({
  passages: z.array(
    z.object({
      start_line: z.number().int().min(1),
      end_line: z.number().int().min(1),
      start: z.number().int(),
      end: z.number().int(),
      text: z.string(),
      score: z.number(),
      tokens: z.number().int(),
    }),
  ),
  coverage: z.number().min(0).max(1),
  query_terms: z.array(z.string()),
  tokens: z.number().int(),
  budget_tokens: z.number().int(),
  matched_lines: z.number().int(),
});

interface Segment {
  line: number;
  start: number;
  end: number;
}

export const beaconFocus = defineTool({
  name: 'beacon_focus',
  description: 'Finds the passages of code, logs or documents relevant to a query, verbatim with line numbers, within a token budget.',
  tier: 'pro',
  priceCents: 2,
  family: 'text',
  input: Input,
  qField: 'query',
  qParse: 'text',
  output: '{passages[{start_line,end_line,start,end,text,score,tokens}], coverage, query_terms, tokens, budget_tokens, matched_lines}',
  outputSchema: Output,
  examples: [
    {
      text: 'import { db } from "./db";\n\nexport async function getUser(id) {\n  const row = await db.query("select * from users where id = $1", [id]);\n  if (!row) throw new NotFound("user");\n  return row;\n}\n\nexport function formatPrice(cents) {\n  return (cents / 100).toFixed(2);\n}\n',
      query: 'user not found',
      context_lines: 1,
    },
    {
      text: '10:00:01 INFO worker started\n10:00:02 INFO job 41 done\n10:00:03 ERROR job 42 timeout after 5000 ms\n10:00:04 WARN retrying job 42\n10:00:05 INFO job 43 done\n',
      query: 'timeout error',
      budget_tokens: 64,
      context_lines: 0,
    },
  ],
  isolated: import.meta.url,
  progress: true,
  limits: { timeMs: 20_000, memoryMb: 512 },
  largestInput: () => ({ text: largeReportA(MAX_TEXT_CHARS), query: 'queue timeout billing worker ledger lock', budget_tokens: 32_000, context_lines: 20 }),
  handler: async ({ text, query, budget_tokens: budget, context_lines: context, encoding }, ctx) => {
    await ctx.progress({ stage: 'indexing' });
    const segs = segments(text, ctx.signal);
    const { scores } = bm25(
      segs.map((s) => text.slice(s.start, s.end)),
      query,
      codeTerms,
    );
    if (ctx.signal.aborted) throw new Error('aborted');
    await ctx.progress({ stage: 'selecting' });
    // Windows around matching segments, merged when they overlap or touch.
    const windows: Array<{ from: number; to: number; score: number; best: number }> = [];
    let matchedLines = 0;
    for (let i = 0; i < segs.length; i++) {
      if (scores[i]! <= 0) continue;
      matchedLines++;
      const from = Math.max(0, i - context);
      const to = Math.min(segs.length - 1, i + context);
      const last = windows[windows.length - 1];
      if (last && from <= last.to + 1) {
        last.to = Math.max(last.to, to);
        last.score += scores[i]!;
        if (scores[i]! > scores[last.best]!) last.best = i;
      } else windows.push({ from, to, score: scores[i]!, best: i });
    }
    const order = windows.map((_, k) => k).sort((a, b) => windows[b]!.score - windows[a]!.score || a - b);
    const kept: Array<{ from: number; to: number; score: number; tokens: number }> = [];
    let used = 0;
    for (let r = 0; r < order.length && used < budget; r++) {
      if ((r & 0xff) === 0 && ctx.signal.aborted) throw new Error('aborted');
      const w = windows[order[r]!]!;
      const left = budget - used;
      for (const [from, to] of [
        [w.from, w.to],
        [w.best, w.best],
      ] as const) {
        const start = segs[from]!.start;
        const end = segs[to]!.end;
        // Over 64 characters per token left: skipped uncounted (real text is never that dense, and counting
        // very long runs is slow). Skipping can only leave a passage out, never break the budget.
        if (end - start > left * 64) continue;
        const tokens = countTokens(text.slice(start, end), encoding);
        if (tokens <= left) {
          kept.push({ from, to, score: from === w.from && to === w.to ? w.score : scores[w.best]!, tokens });
          used += tokens;
          break;
        }
      }
    }
    kept.sort((a, b) => a.from - b.from);
    const passages = kept.map((k) => {
      const start = segs[k.from]!.start;
      const end = segs[k.to]!.end;
      return {
        start_line: segs[k.from]!.line,
        end_line: segs[k.to]!.line,
        start,
        end,
        text: text.slice(start, end),
        score: round(k.score, 4),
        tokens: k.tokens,
      };
    });
    const queryTerms = [...new Set(codeTerms(query))].sort();
    const found = new Set(passages.flatMap((p) => codeTerms(p.text)));
    const coverage = queryTerms.length ? round(queryTerms.filter((t) => found.has(t)).length / queryTerms.length, 4) : 0;
    return { passages, coverage, query_terms: queryTerms, tokens: used, budget_tokens: budget, matched_lines: matchedLines };
  },
});

/** Lines (1-based), lines over 1,000 characters cut into segments at white space where possible. */
function segments(text: string, signal: AbortSignal): Segment[] {
  const out: Segment[] = [];
  let pos = 0;
  for (let line = 1; pos <= text.length; line++) {
    if ((line & 0xfff) === 0 && signal.aborted) throw new Error('aborted');
    const nl = text.indexOf('\n', pos);
    let end = nl === -1 ? text.length : nl;
    if (end > pos && text[end - 1] === '\r') end--;
    let s = pos;
    while (end - s > MAX_SEGMENT) {
      let cut = text.lastIndexOf(' ', s + MAX_SEGMENT);
      if (cut <= s + MAX_SEGMENT / 2) cut = s + MAX_SEGMENT;
      // Do not cut a surrogate pair in half.
      if (/[\uD800-\uDBFF]/.test(text[cut - 1]!)) cut--;
      out.push({ line, start: s, end: cut });
      s = cut;
    }
    out.push({ line, start: s, end });
    if (nl === -1) break;
    pos = nl + 1;
  }
  return out;
}
