import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool, type ToolContext } from '../types.js';
import { runTask } from '../../sandbox/tasks.js';
import { webUrl } from './grabr-input.js';
import { itemError } from './grabr-page.js';
import { entriesOf, sameSite, siteOf, type SitemapEntry } from './sitemap-task.js';
import { assertPageOk, createRobots, grabrFetch } from './robots.js';

/**
 * grabr_sitemap: discovers and flattens a site's sitemaps. Starting points: the URL itself when its
 * path ends in .xml or .xml.gz, else the site's robots.txt `Sitemap:` lines (relative ones resolved),
 * and /sitemap.xml when there are none or none of them could be read. Sitemap indexes are followed
 * (depth ≤ MAX_INDEX_DEPTH, ≤ MAX_SITEMAP_FILES files in all). Each file is fetched through robots.txt and the guard (ctx.http decodes Content-Encoding
 * within WEB_FETCH_MAX_BYTES) and handed to the pool (sitemap-task.ts): a gzip file is inflated to
 * at most GRABR_SITEMAP_MAX_BYTES, a DOCTYPE/ENTITY declaration is refused, and only entries on the
 * same registrable domain (tldts; the same host for IP addresses) are kept.
 */

const TOOL = 'grabr_sitemap';
export const MAX_URLS = 50_000;
export const MAX_SITEMAP_FILES = 50;
export const MAX_INDEX_DEPTH = 3;
/** JSON bytes of entries one pool call returns: pool results are capped by TOOL_MAX_RESULT_BYTES, less room for the rest. */
const chunkBudget = (maxResultBytes: number) => Math.max(4_096, Math.floor(maxResultBytes * 0.9) - 8_192);

const Input = z.object({
  url: webUrl.describe('The site (any page of it), or a sitemap URL (a path ending in .xml or .xml.gz); a bare host is fetched over https.'),
  max_urls: z.number().int().min(1).max(MAX_URLS).default(5_000).describe('URLs to return at most (1-50,000, default 5,000)'),
  path_prefix: z
    .string()
    .max(500)
    .regex(/^\//, 'a path starting with "/"')
    .optional()
    .describe('Keep only URLs whose path starts with this, e.g. "/blog/"'),
  since: z
    .string()
    .max(40)
    .refine((s) => Number.isFinite(Date.parse(s)), 'an ISO 8601 date or date-time')
    .optional()
    .describe('Keep only URLs whose lastmod is at or after this date (URLs without lastmod are dropped)'),
});

const SourceSchema = z.object({
  url: z.string(),
  via: z.enum(['input', 'robots', 'default', 'index']),
  kind: z.enum(['urlset', 'index']).nullable(),
  urls: z.number().int(),
  error: z.object({ code: z.string(), message: z.string() }).nullable(),
});

export const SitemapResultSchema = z.object({
  sources: z.array(SourceSchema),
  urls: z.array(z.object({ loc: z.string(), lastmod: z.string().nullable(), priority: z.number().nullable() })),
  total: z.number().int(),
  truncated: z.boolean(),
});
type SitemapResult = z.infer<typeof SitemapResultSchema>;
type Source = z.infer<typeof SourceSchema>;

/** A Sitemap: line as an absolute http(s) URL without fragment (relative lines resolve against the site). */
function resolve(line: string, base: string): string | null {
  try {
    const u = new URL(line, base);
    u.hash = '';
    return u.protocol === 'http:' || u.protocol === 'https:' ? u.href : null;
  } catch {
    return null;
  }
}

function namesSitemap(url: string): boolean {
  const path = new URL(url).pathname.toLowerCase();
  return /\.xml(\.gz)?$/.test(path);
}

async function flatten(input: z.output<typeof Input>, ctx: ToolContext): Promise<SitemapResult> {
  const robots = createRobots(ctx, TOOL);
  const { siteHost, siteDomain } = siteOf(input.url);
  const sinceMs = input.since ? Date.parse(input.since) : null;
  const queue: Array<{ url: string; via: Source['via']; depth: number }> = [];
  const queued = new Set<string>();
  const enqueue = (url: string, via: Source['via'], depth: number) => {
    if (queued.has(url)) return;
    queued.add(url);
    queue.push({ url, via, depth });
  };
  const fallback = new URL('/sitemap.xml', input.url).href;
  const discovering = !namesSitemap(input.url);
  if (!discovering) enqueue(input.url, 'input', 0);
  else {
    const fromRobots = (await robots.sitemaps(input.url))
      .map((s) => resolve(s, input.url))
      .filter((s): s is string => s !== null && sameSite(s, siteHost, siteDomain));
    for (const s of fromRobots) enqueue(s, 'robots', 0);
    if (!fromRobots.length) enqueue(fallback, 'default', 0);
  }

  const sources: Source[] = [];
  const urls: SitemapEntry[] = [];
  const seenLocs = new Set<string>();
  const failures = new Map<Source, AppError>();
  let overflow = 0;
  let truncated = false;

  for (;;) {
    // robots.txt named sitemaps and none could be read: /sitemap.xml is still worth a try.
    if (!queue.length && discovering && !queued.has(fallback) && !sources.some((s) => s.error === null)) enqueue(fallback, 'default', 0);
    if (!queue.length) break;
    if (sources.length >= MAX_SITEMAP_FILES) {
      truncated = true;
      break;
    }
    if (urls.length >= input.max_urls) {
      // Full: files left unread may hold more.
      truncated = true;
      break;
    }
    const { url, via, depth } = queue.shift()!;
    await ctx.progress({ stage: 'sitemaps', done: sources.length, total: sources.length + queue.length + 1, unit: 'files', message: url });
    const source: Source = { url, via, kind: null, urls: 0, error: null };
    sources.push(source);
    try {
      const res = await grabrFetch(ctx, robots, url, { accept: 'application/xml,text/xml;q=0.9,*/*;q=0.5' });
      assertPageOk(res);
      if (res.truncated) {
        throw new AppError('limit_exceeded', `the sitemap is larger than ${ctx.config.WEB_FETCH_MAX_BYTES} bytes and was not read`, {
          limit: 'size',
          limit_value: ctx.config.WEB_FETCH_MAX_BYTES,
        });
      }
      let skip = 0;
      for (;;) {
        const take = Math.max(0, input.max_urls - urls.length);
        const out = await runTask(ctx, 'sitemap_file', {
          body: res.body,
          maxBytes: ctx.config.GRABR_SITEMAP_MAX_BYTES,
          siteHost,
          siteDomain,
          pathPrefix: input.path_prefix ?? null,
          sinceMs,
          skip,
          take,
          budgetBytes: chunkBudget(ctx.config.TOOL_MAX_RESULT_BYTES),
        });
        source.kind = out.kind;
        if (out.kind === 'index') {
          for (const child of out.sitemaps) if (depth < MAX_INDEX_DEPTH) enqueue(child, 'index', depth + 1);
          source.urls = 0;
          break;
        }
        const taken = entriesOf(out);
        for (const e of taken) {
          if (seenLocs.has(e.loc)) continue;
          seenLocs.add(e.loc);
          urls.push(e);
          source.urls++;
        }
        if (out.next !== null && urls.length < input.max_urls) {
          skip = out.next;
          continue;
        }
        // Matching entries of this file beyond what was taken.
        const rest = out.matched - (skip + taken.length);
        if (rest > 0) {
          overflow += rest;
          truncated = true;
        }
        break;
      }
    } catch (e) {
      if (ctx.signal.aborted) throw e;
      if (!(e instanceof AppError)) throw e;
      source.error = itemError(e);
      failures.set(source, e);
    }
  }
  await ctx.progress({ stage: 'sitemaps', done: sources.length, total: sources.length, unit: 'files' });
  if (!sources.some((s) => s.error === null)) {
    // Nothing could be read: the call fails (uncharged) with the most telling reason.
    const errors = sources.map((s) => failures.get(s)!);
    throw errors.find((e) => e.code !== 'not_found') ?? new AppError('not_found', `no sitemap found for ${new URL(input.url).origin}`, { tried: sources.map((s) => s.url) });
  }
  return { sources, urls, total: urls.length + overflow, truncated };
}

export const grabrSitemap = defineTool({
  name: TOOL,
  description:
    "Discover and flatten a site's sitemaps (robots.txt Sitemap: lines, then /sitemap.xml; indexes followed, .gz inflated with a cap): URLs with lastmod and priority. Honours robots.txt.",
  tier: 'enterprise',
  priceCents: 0,
  family: 'web',
  qField: 'url',
  progress: true,
  input: Input,
  examples: [{ url: 'https://example.com/' }, { url: 'https://example.com/sitemap.xml', max_urls: 1000, path_prefix: '/blog/', since: '2025-01-01' }],
  output:
    '{sources: [{url, via: input|robots|default|index, kind: urlset|index|null, urls, error: {code, message}|null}], urls: [{loc, lastmod, priority}], total, truncated}; ' +
    `at most ${MAX_URLS.toLocaleString('en')} URLs and ${MAX_SITEMAP_FILES} sitemap files, indexes ${MAX_INDEX_DEPTH} deep; same registrable domain only; ` +
    'a sitemap declaring a DOCTYPE/ENTITY is refused; total counts matching entries read (duplicates among the returned ones removed); ' +
    'truncated: max_urls or the file cap left entries out',
  outputSchema: SitemapResultSchema,
  limits: { timeMs: 20_000, memoryMb: 512 },
  handler: async (input, ctx) => flatten(input, ctx),
});
