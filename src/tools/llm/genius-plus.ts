import { z } from 'zod';
import { AppError, isAppError } from '../../errors.js';
import { runTask } from '../tasks.js';
import { normalisePlainText } from '../web/extract.js';
import { defineTool, type SearchHit, type ToolContext } from '../types.js';
import { MetaSchema, llmOf, unusableReply, verbatimIndex } from './tool-kit.js';

/**
 * genius_plus: an answer grounded in live sources, with citations checked in code.
 * 1. ctx.search (SearXNG) finds pages; search unset, down or failing is 503 before any model call.
 * 2. The top results are fetched through ctx.http (the SSRF guard, byte and time caps), HTML made
 *    readable by page_fetch's `extract_html` pool task; unreadable results are skipped (and listed), the
 *    next results take their place, up to `max_sources`. None readable: 502 fetch_failed, no model call.
 * 3. Passages relevant to the problem are chosen within the model's context (LLM_CONTEXT_TOKENS less
 *    the answer and the prompt) by the `genius_plus_passages` pool task (BM25+, exact token counts).
 * 4. The model answers with numbered citations `{n, quote}`. Code assigns each its source URL and
 *    checks the quote verbatim (white space runs as one space) against that source's whole fetched
 *    text: `verified`. A quote under MIN_QUOTE characters, or naming no source, is never verified.
 *    The first MAX_CITATIONS distinct citations are kept, ordered by source number. Inline [n] markers
 *    in the answer that name no source are listed in `unknown_refs`.
 */

const TOOL = 'genius_plus';
const PROMPT_VERSION = 'genius_plus/1';
const ANSWER_TOKENS = 2_500;
/** Tokens kept for the instructions, delimiters and per-source headers. */
const PROMPT_OVERHEAD_TOKENS = 1_200;
const MIN_QUOTE = 8;
/** Citations kept (the first ones the model gave); more would only repeat the answer's sources. */
const MAX_CITATIONS = 50;
const PAGE_MAX_BYTES = 2_000_000;
const PAGE_TIMEOUT_MS = 12_000;
const MIN_TEXT_CHARS = 40;
const HTML_TYPES = new Set(['text/html', 'application/xhtml+xml']);

const Input = z.object({
  problem: z.string().trim().min(1).max(4_000).describe('The question or problem to answer from live sources (up to 4,000 characters)'),
  query: z.string().trim().min(1).max(400).optional().describe('The web search query (default: the problem, shortened to 300 characters)'),
  max_sources: z.number().int().min(1).max(8).default(4).describe('Pages to read, 1 to 8 (default 4)'),
});

const Reply = z.object({
  answer: z.string().describe('The answer, citing sources inline as [n]'),
  citations: z.array(
    z.object({
      n: z.number().int().describe('The number of the source block quoted (source_<n>)'),
      quote: z.string().describe('A short passage copied exactly, character for character, from that source'),
    }),
  ),
});

const Output = z.object({
  answer: z.string(),
  citations: z.array(z.object({ n: z.number().int(), url: z.string().nullable(), quote: z.string(), verified: z.boolean() })),
  sources: z.array(
    z.object({ n: z.number().int().min(1), url: z.string(), title: z.string().nullable(), passages: z.number().int().min(0), tokens: z.number().int().min(0) }),
  ),
  unknown_refs: z.array(z.number().int()),
  skipped: z.array(z.object({ url: z.string(), reason: z.string() })),
  verified_ratio: z.number().min(0).max(1).nullable(),
  search_query: z.string(),
  meta: MetaSchema,
});

interface ReadSource {
  url: string;
  title: string | null;
  text: string;
}

export const geniusPlus = defineTool({
  name: TOOL,
  description:
    'A researched answer grounded in live web sources: search, fetch, passage selection, then the model answers with numbered citations whose quotes are checked verbatim.',
  tier: 'enterprise',
  priceCents: 65,
  family: 'llm',
  input: Input,
  qField: 'problem',
  needs: ['llm', 'search'],
  progress: true,
  limits: { timeMs: 20_000, memoryMb: 256 },
  output:
    '{answer, citations[{n,url,quote,verified}], unknown_refs, sources[{n,url,title,passages,tokens}], skipped[{url,reason}], verified_ratio, search_query, meta}; verified: the quote is verbatim in the fetched text of source n; unknown_refs: [n] markers in the answer that name no source',
  outputSchema: Output,
  examples: [
    { problem: 'What changed in the HTTP/2 prioritisation scheme in RFC 9113 compared to RFC 7540?' },
    { problem: 'Is it safe to run PostgreSQL VACUUM FULL on a busy production table?', query: 'postgresql vacuum full lock production', max_sources: 3 },
  ],
  handler: async ({ problem, query, max_sources: maxSources }, ctx) => {
    const llm = llmOf(ctx, TOOL);
    if (!ctx.search)
      throw new AppError('tool_unavailable', `${TOOL} needs a search upstream: set SEARCH_BASE_URL. Nothing was charged.`, { needs: ['search'] });
    if (!ctx.http) throw new AppError('tool_unavailable', `${TOOL} needs the guarded HTTP client`);
    const searchQuery = query ?? shorten(problem, 300);

    await ctx.progress({ stage: 'searching' });
    const found = await ctx.search.search({ query: searchQuery, limit: Math.min(20, maxSources * 3) });
    const candidates = dedupe(found.results);
    if (!candidates.length)
      throw new AppError('not_found', `the search for "${searchQuery}" found no pages to read. Nothing was charged.`, { query: searchQuery });

    // Read pages in rank order, a batch at a time, until max_sources are read or the results run out.
    const read: ReadSource[] = [];
    const skipped: Array<{ url: string; reason: string }> = [];
    let next = 0;
    while (read.length < maxSources && next < candidates.length) {
      const batch = candidates.slice(next, next + (maxSources - read.length));
      next += batch.length;
      await ctx.progress({ stage: 'fetching', done: read.length, total: maxSources, unit: 'pages' });
      const got = await Promise.all(batch.map((hit) => readPage(hit, ctx)));
      for (let i = 0; i < batch.length; i++) {
        const r = got[i]!;
        if ('reason' in r) skipped.push({ url: batch[i]!.url, reason: r.reason });
        else read.push(r);
      }
    }
    await ctx.progress({ stage: 'fetching', done: read.length, total: maxSources, unit: 'pages' });
    if (!read.length) {
      throw new AppError('fetch_failed', `none of the ${candidates.length} pages found could be read. Nothing was charged.`, {
        reason: 'no_readable_source',
        skipped,
      });
    }

    await ctx.progress({ stage: 'selecting' });
    const budget = Math.max(300, ctx.config.LLM_CONTEXT_TOKENS - ANSWER_TOKENS - PROMPT_OVERHEAD_TOKENS - Math.ceil(problem.length / 2));
    const { passages } = await runTask(ctx, 'genius_plus_passages', {
      query: `${searchQuery}\n${problem}`,
      sources: read.map((s, i) => ({ n: i + 1, text: s.text })),
      budgetTokens: budget,
    });
    const sources = read.map((s, i) => {
      const mine = passages.filter((p) => p.n === i + 1);
      return {
        n: i + 1,
        url: s.url,
        title: s.title,
        passages: mine.length,
        tokens: mine.reduce((t, p) => t + p.tokens, 0),
        text: s.text,
        excerpt: mine.map((p) => p.text).join('\n[...]\n'),
      };
    });
    const shown = sources.filter((s) => s.passages > 0);

    const { value, meta } = await llm.structured({
      name: TOOL,
      promptVersion: PROMPT_VERSION,
      instructions:
        'Answer the question in the data block "problem" using the numbered sources in the blocks source_<n> (each starts with its URL and ' +
        'title, then passages from the page; "[...]" marks text left out). Rules:\n' +
        '- Base every factual statement on the sources and cite them inline as [n]. Where the sources do not settle something, say so ' +
        'plainly instead of guessing; you may add general knowledge only when marked as such.\n' +
        '- citations: for each [n] you use, give n and a short quote (one sentence or less) copied exactly, character for character, ' +
        'from the passages of source_<n>, that supports the statement. Never paraphrase inside a quote.\n' +
        '- Be concise and precise; use Markdown. Write in the language of the problem.',
      data: [
        { name: 'problem', text: problem },
        ...shown.map((s) => ({ name: `source_${s.n}`, text: `URL: ${s.url}\nTitle: ${s.title ?? '(none)'}\n\n${s.excerpt}` })),
      ],
      schema: Reply,
      maxTokens: ANSWER_TOKENS,
      temperature: 0.2,
    });

    await ctx.progress({ stage: 'verifying' });
    const answer = value.answer.trim();
    if (!answer) throw unusableReply(TOOL, 'an empty answer');
    const byN = new Map(sources.map((s) => [s.n, { ...s, find: verbatimIndex(s.text) }]));
    const seen = new Set<string>();
    const citations = value.citations
      .map((c, i) => ({ n: c.n, quote: c.quote.trim(), i }))
      .filter((c) => {
        const key = `${c.n}\u0000${c.quote}`;
        if (!c.quote || seen.has(key)) return false;
        seen.add(key);
        return true;
      })
      .slice(0, MAX_CITATIONS)
      .sort((a, b) => a.n - b.n || a.i - b.i)
      .map(({ n, quote }) => {
        const source = byN.get(n);
        const verified = source !== undefined && quote.replace(/\s+/g, ' ').length >= MIN_QUOTE && source.find(quote) !== null;
        return { n, url: source?.url ?? null, quote, verified };
      });
    // Inline markers [n] (or [n, m]) that name no source read: the answer cites something it was not given.
    const markers = [...answer.matchAll(/\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\]/g)].flatMap((m) => m[1]!.split(',').map((x) => Number(x.trim())));
    const unknownRefs = [...new Set(markers.filter((n) => !byN.has(n)))].sort((a, b) => a - b);
    return {
      answer,
      citations,
      unknown_refs: unknownRefs,
      sources: sources.map(({ n, url, title, passages: count, tokens }) => ({ n, url, title, passages: count, tokens })),
      skipped,
      verified_ratio: citations.length ? Math.round((citations.filter((c) => c.verified).length / citations.length) * 1000) / 1000 : null,
      search_query: searchQuery,
      meta,
    };
  },
});

function shorten(text: string, max: number): string {
  const flat = text.replace(/\s+/g, ' ').trim();
  if (flat.length <= max) return flat;
  const cut = flat.lastIndexOf(' ', max);
  return flat.slice(0, cut > max / 2 ? cut : max);
}

/** http(s) results, first occurrence of each URL (without its fragment), in rank order. */
function dedupe(hits: readonly SearchHit[]): SearchHit[] {
  const seen = new Set<string>();
  const out: SearchHit[] = [];
  for (const h of hits) {
    let key: string;
    try {
      const u = new URL(h.url);
      if (u.protocol !== 'http:' && u.protocol !== 'https:') continue;
      u.hash = '';
      key = u.href;
    } catch {
      continue;
    }
    if (seen.has(key)) continue;
    seen.add(key);
    out.push({ ...h, url: key });
  }
  return out;
}

function isText(mime: string): boolean {
  return mime.startsWith('text/') || mime === 'application/json' || mime.endsWith('+json') || mime.endsWith('+xml') || mime === 'application/xml';
}

/** One page's readable text, or why it was skipped. Guard refusals and fetch failures skip the page. */
async function readPage(hit: SearchHit, ctx: ToolContext): Promise<ReadSource | { reason: string }> {
  try {
    const res = await ctx.http!.fetch(hit.url, {
      maxBytes: PAGE_MAX_BYTES,
      timeoutMs: PAGE_TIMEOUT_MS,
      skipBody: (mime, status) => status >= 400 || (mime !== null && !HTML_TYPES.has(mime) && !isText(mime)),
    });
    if (res.status >= 400) return { reason: `http ${res.status}` };
    const mime = res.content_type;
    let title: string | null = hit.title.trim() || null;
    let text: string;
    if (mime === null || HTML_TYPES.has(mime)) {
      const page = await runTask(ctx, 'extract_html', { body: res.body, baseUrl: res.final_url, headerCharset: res.charset });
      text = page.text;
      title = page.title?.trim() || title;
    } else if (isText(mime)) {
      text = normalisePlainText(res.text()).text;
    } else {
      return { reason: `unreadable content type ${mime}` };
    }
    if (text.trim().length < MIN_TEXT_CHARS) return { reason: 'no readable text' };
    return { url: res.final_url, title, text };
  } catch (e) {
    if (ctx.signal.aborted) throw e;
    if (isAppError(e)) return { reason: `${e.code}: ${e.message}`.slice(0, 300) };
    throw e;
  }
}
