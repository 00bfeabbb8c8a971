import { z } from 'zod';
import { AppError } from '../../errors.js';
import { runTask } from '../tasks.js';
import { defineTool, type SearchHit } from '../types.js';
import { guardedHttpOf } from './web-common.js';

/**
 * discovery_collision: does an idea collide with existing work? Queries come from the idea's noun
 * phrases (compromise, in the sandbox pool), each runs through the search upstream, the top pages may
 * be read through the guarded client, and every hit is scored against the idea by stemmed TF-IDF
 * cosine (pool). Collisions are ranked by score (ties in the order found). Search failures are 503
 * (nothing charged); a page that cannot be read is only noted.
 */

const TOOL = 'discovery_collision';
const PAGE_MAX_BYTES = 1024 * 1024;
const PAGE_TEXT_CHARS = 20_000;
const MAX_COLLISIONS = 20;

export const CAVEAT =
  'Scores compare your idea with what the search upstream returned for a few queries, by shared vocabulary. ' +
  'Few or no collisions is not proof of novelty: prior art may use other words, sit behind logins, in patents or papers the engine does not index, or simply rank lower.';

/** Score bands of collision_risk (of the best match). */
export const RISK_BANDS = { high: 0.5, medium: 0.3, low: 0.15 } as const;

const Input = z.object({
  idea: z.string().trim().min(20).max(4000).describe('The idea, product or feature to check, in plain words (20-4,000 characters)'),
  queries: z.number().int().min(1).max(5).default(3).describe('Search queries to derive from the idea (1-5, default 3)'),
  results_per_query: z.number().int().min(1).max(20).default(10).describe('Search results per query (1-20, default 10)'),
  read_pages: z
    .union([z.number().int().min(0).max(5), z.boolean()])
    .default(0)
    .describe('Also read the text of this many top results (0-5; true means 3, false 0; default 0) for a fuller comparison')
    .transform((v) => (v === true ? 3 : v === false ? 0 : v)),
  language: z
    .string()
    .regex(/^(?:all|[a-zA-Z]{2,3}(?:-[a-zA-Z0-9]{2,4})?)$/, 'a language code such as "en"')
    .optional()
    .describe('Search language, e.g. "en"'),
});

const Collision = z.object({
  rank: z.number().int().min(1),
  url: z.string(),
  title: z.string(),
  snippet: z.string(),
  score: z.number().min(0).max(1),
  shared_terms: z.array(z.string()),
  /** Index into `queries` of the first query that found it. */
  query: z.number().int().min(0),
  page_read: z.boolean(),
});

export const DiscoveryCollisionOutput = z.object({
  queries: z.array(z.string()),
  phrases: z.array(z.string()),
  searched: z.number().int(),
  collisions: z.array(Collision),
  collision_risk: z.enum(['none', 'low', 'medium', 'high']),
  /** 1 - the best score (1: nothing found shares the idea's vocabulary). */
  novelty: z.number().min(0).max(1),
  pages_unread: z.array(z.object({ url: z.string(), reason: z.string() })),
  caveat: z.string(),
});
export type DiscoveryCollisionOutput = z.infer<typeof DiscoveryCollisionOutput>;

export function riskOf(best: number): DiscoveryCollisionOutput['collision_risk'] {
  return best >= RISK_BANDS.high ? 'high' : best >= RISK_BANDS.medium ? 'medium' : best >= RISK_BANDS.low ? 'low' : 'none';
}

export const discoveryCollision = defineTool({
  name: TOOL,
  description:
    'Prior-art check for an idea: searches the web with queries drawn from its noun phrases, scores each hit by stemmed TF-IDF similarity, and ranks the collisions with a risk level and a novelty score.',
  tier: 'enterprise',
  priceCents: 15,
  family: 'web',
  qField: 'idea',
  needs: ['search'],
  progress: true,
  input: Input,
  examples: [
    { idea: 'A browser extension that summarises long legal contracts for freelancers and highlights risky payment clauses.' },
    { idea: 'Usage-based billing for HTTP tools where each successful call is charged in credits and failures are free.', queries: 5, read_pages: 2 },
  ],
  output:
    "{queries, phrases, searched, collisions: [{rank, url, title, snippet, score, shared_terms, query, page_read}], collision_risk: 'none'|'low'|'medium'|'high', novelty, pages_unread: [{url, reason}], caveat}",
  outputSchema: DiscoveryCollisionOutput,
  limits: { timeMs: 10_000, memoryMb: 256 },
  largestInput: () => ({
    idea: 'A collaborative tool for mapping supply chain emissions across suppliers and products. '.repeat(46).slice(0, 4000),
    queries: 5,
    results_per_query: 20,
    read_pages: 5,
  }),
  handler: async (input, ctx): Promise<DiscoveryCollisionOutput> => {
    if (!ctx.search)
      throw new AppError('tool_unavailable', `${TOOL} needs a search upstream (SEARCH_BASE_URL), which is not configured here. Nothing was charged.`, {
        needs: ['search'],
      });
    const steps = input.queries + 2 + input.read_pages;
    let done = 0;
    const step = (stage: string, message?: string) => ctx.progress({ stage, done: ++done, total: steps, unit: 'steps', ...(message ? { message } : {}) });

    const { queries, phrases } = await runTask(ctx, 'collision_queries', { idea: input.idea, max: input.queries });
    await step('planning', `${queries.length} queries`);

    // Hits in the order found: by query, then rank; a URL found twice keeps its first place.
    const hits: Array<SearchHit & { query: number }> = [];
    const seen = new Set<string>();
    for (const [i, query] of queries.entries()) {
      const answer = await ctx.search.search({ query, limit: input.results_per_query, ...(input.language ? { language: input.language } : {}) });
      for (const h of answer.results) {
        if (seen.has(h.url)) continue;
        seen.add(h.url);
        hits.push({ ...h, query: i });
      }
      await step('searching', query);
    }

    const pages = new Map<number, string>();
    const unread: DiscoveryCollisionOutput['pages_unread'] = [];
    if (input.read_pages > 0 && hits.length) {
      const http = guardedHttpOf(ctx, TOOL);
      // Read at once (ctx.http still holds each host to WEB_PER_HOST); outcomes are kept in hit order.
      const outcomes = await Promise.all(
        hits.slice(0, input.read_pages).map(async (h): Promise<{ text: string } | { reason: string }> => {
          try {
            const res = await http.fetch(h.url, {
              maxBytes: PAGE_MAX_BYTES,
              skipBody: (mime) => mime !== null && mime !== 'application/xhtml+xml' && !mime.startsWith('text/'),
            });
            if (res.status >= 400) return { reason: `answered ${res.status}` };
            if (res.content_type === 'text/html' || res.content_type === 'application/xhtml+xml' || res.content_type === null) {
              const page = await runTask(ctx, 'extract_html', { body: res.body, baseUrl: res.final_url, headerCharset: res.charset });
              return { text: page.text.slice(0, PAGE_TEXT_CHARS) };
            }
            if (res.content_type.startsWith('text/')) return { text: res.text().slice(0, PAGE_TEXT_CHARS) };
            return { reason: `not text (${res.content_type})` };
          } catch (e) {
            if (e instanceof AppError && e.code === 'timeout') throw e;
            return { reason: e instanceof AppError ? e.message : 'could not be read' };
          } finally {
            await step('reading', h.url);
          }
        }),
      );
      outcomes.forEach((o, i) => {
        if ('text' in o) pages.set(i, o.text);
        else unread.push({ url: hits[i]!.url, reason: o.reason });
      });
    }
    while (done < steps - 1) await step('reading');

    const docs = hits.map((h, i) => {
      const short = `${h.title}\n${h.snippet}`;
      const page = pages.get(i);
      return page ? [short, `${short}\n${page}`] : [short];
    });
    const { results } = await runTask(ctx, 'collision_score', { idea: input.idea, docs });
    await step('scoring', `${hits.length} results`);

    const ranked = hits
      .map((h, i) => ({ h, i, r: results[i]! }))
      .filter((x) => x.r.score > 0)
      .sort((a, b) => b.r.score - a.r.score || a.i - b.i)
      .slice(0, MAX_COLLISIONS);
    const best = ranked[0]?.r.score ?? 0;
    return {
      queries,
      phrases,
      searched: hits.length,
      collisions: ranked.map((x, k) => ({
        rank: k + 1,
        url: x.h.url,
        title: x.h.title,
        snippet: x.h.snippet,
        score: x.r.score,
        shared_terms: x.r.shared_terms,
        query: x.h.query,
        page_read: pages.has(x.i),
      })),
      collision_risk: riskOf(best),
      novelty: Math.round((1 - best) * 1000) / 1000,
      pages_unread: unread,
      caveat: CAVEAT,
    };
  },
});
