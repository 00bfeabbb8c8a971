import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool } from '../types.js';

/**
 * web_search: the configured SearXNG instance's results (ctx.search), nothing added and nothing
 * invented. No upstream, or one that is down, answers 403/429/5xx or garbage: 503 tool_unavailable,
 * uncharged (the tool is free anyway), never fallback results.
 */

const Input = z.object({
  query: z.string().trim().min(1).max(400).describe('What to search for (up to 400 characters)'),
  limit: z.number().int().min(1).max(20).default(10).describe('Results wanted, 1-20 (default 10)'),
  page: z.number().int().min(1).max(50).default(1).describe('Result page to start from, 1-based (default 1)'),
  language: z
    .string()
    .regex(/^(?:all|auto|[a-zA-Z]{2,3}(?:-[a-zA-Z0-9]{2,4})?)$/, 'a language code such as "en", "de-DE", "all" or "auto"')
    .optional()
    .describe('Result language, e.g. "en" or "de-DE" (default: the instance\u2019s own)'),
  time_range: z.enum(['day', 'week', 'month', 'year']).optional().describe('Only results from the last day, week, month or year'),
  safesearch: z
    .union([z.literal(0), z.literal(1), z.literal(2)])
    .optional()
    .describe('0 off, 1 moderate, 2 strict'),
});

const Hit = z.object({
  rank: z.number().int().min(1),
  title: z.string(),
  url: z.string(),
  snippet: z.string(),
  engines: z.array(z.string()),
  published_at: z.string().nullable(),
});

export const WebSearchOutput = z.object({
  query: z.string(),
  results: z.array(Hit),
  suggestions: z.array(z.string()),
  answers: z.array(z.string()),
});
export type WebSearchOutput = z.infer<typeof WebSearchOutput>;

export const webSearch = defineTool({
  name: 'web_search',
  description:
    'Search the web through the operator\u2019s SearXNG instance: ranked results with title, URL, snippet and engines, plus suggestions and direct answers.',
  tier: 'free',
  priceCents: 0,
  family: 'web',
  qField: 'query',
  needs: ['search'],
  input: Input,
  examples: [{ query: 'rfc 9110 http semantics' }, { query: 'postgres logical replication', limit: 5, language: 'en', time_range: 'year' }],
  output: '{query, results: [{rank, title, url, snippet, engines, published_at}], suggestions: [], answers: []}',
  outputSchema: WebSearchOutput,
  handler: async (input, ctx): Promise<WebSearchOutput> => {
    if (!ctx.search)
      throw new AppError('tool_unavailable', 'web_search needs a search upstream (SEARCH_BASE_URL), which is not configured here. Nothing was charged.', {
        needs: ['search'],
      });
    await ctx.progress({ stage: 'searching', message: input.query });
    const answer = await ctx.search.search({
      query: input.query,
      limit: input.limit,
      page: input.page,
      ...(input.language ? { language: input.language } : {}),
      ...(input.time_range ? { time_range: input.time_range } : {}),
      ...(input.safesearch !== undefined ? { safesearch: input.safesearch } : {}),
    });
    await ctx.progress({ stage: 'done', done: answer.results.length, total: input.limit, unit: 'results' });
    return { query: input.query, ...answer };
  },
});
