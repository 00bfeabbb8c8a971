import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool, type ToolContext } from '../types.js';
import { runTask } from '../tasks.js';
import { webUrl } from './grabr-input.js';
import { itemError } from './grabr-page.js';
import { entriesOf, sameSite, siteOf, type SitemapEntry } from './sitemap-task.js';
import { assertPageOk, createRobots, grabrFetch } from './robots.js';
import { jsonBytes } from './answer-size.js';

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
/** Room kept in the answer for everything but the entries and sources ({"sources":..., "total", "truncated", "next_offset"}). */
const ANSWER_OVERHEAD = 1_024;
/** A source's JSON at most, besides its URL: {"url","via","kind","urls","error":{"code","message"}} (messages are short). */
const SOURCE_OVERHEAD = 1_024;

const Input = z.object({
  url: webUrl.describe('The site (any page of it), or a sitemap URL (a path ending in .xml or .xml.gz); a bare host is fetched over https.'),
  max_urls: z.number().int().min(1).max(MAX_URLS).default(5_000).describe('URLs to return at most (1-50,000, default 5,000)'),
  offset: z
    .number()
    .int()
    .min(0)
    .max(10_000_000)
    .default(0)
    .describe("Skip this many URLs of the flattened list first: pass the previous answer's next_offset to get the next page"),
  path_prefix: z.string().max(500).regex(/^\//, 'a path starting with "/"').optional().describe('Keep only URLs whose path starts with this, e.g. "/blog/"'),
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
  /** Where the next page starts (pass it as `offset`) when max_urls or the answer's size cap left URLs out; else null. */
  next_offset: z.number().int().nullable(),
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
  // The answer is held to TOOL_MAX_RESULT_BYTES of JSON (the runner refuses a larger one): entries stop
  // when the next one would not fit, leaving room for every source read so far and the one being read.
  const budget = ctx.config.TOOL_MAX_RESULT_BYTES - ANSWER_OVERHEAD;
  let urlsBytes = 0;
  let sourcesBytes = 0;
  /** URLs of the flattened list passed over for `offset`. */
  let skipped = 0;
  /** Stopped by max_urls or the size cap with URLs left: the next page starts after the last one returned. */
  let paged = false;
  let full = false;

  for (;;) {
    // robots.txt named sitemaps and none could be read: /sitemap.xml is still worth a try.
    if (!queue.length && discovering && !queued.has(fallback) && !sources.some((s) => s.error === null)) enqueue(fallback, 'default', 0);
    if (!queue.length) break;
    if (sources.length >= MAX_SITEMAP_FILES) {
      truncated = true;
      break;
    }
    // No room left for another source's entry in the answer: what is left is for the next page.
    if (urlsBytes + sourcesBytes + Buffer.byteLength(queue[0]!.url) * 2 + SOURCE_OVERHEAD > budget) full = true;
    if (urls.length >= input.max_urls || full) {
      // Full: files left unread may hold more.
      truncated = true;
      paged = true;
      break;
    }
    const { url, via, depth } = queue.shift()!;
    await ctx.progress({ stage: 'sitemaps', done: sources.length, total: sources.length + queue.length + 1, unit: 'files', message: url });
    const source: Source = { url, via, kind: null, urls: 0, error: null };
    sources.push(source);
    const sourceRoom = Buffer.byteLength(url) * 2 + SOURCE_OVERHEAD;
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
        const take = Math.max(0, input.offset + input.max_urls - (skipped + urls.length));
        const out = await runTask(ctx, 'sitemap_file', {
          body: res.body,
          maxBytes: ctx.config.GRABR_SITEMAP_MAX_BYTES,
          siteHost,
          siteDomain,
          pathPrefix: input.path_prefix ?? null,
          sinceMs,
          skip,
          take,
          budgetBytes: Math.max(4_096, Math.min(chunkBudget(ctx.config.TOOL_MAX_RESULT_BYTES), budget - urlsBytes - sourcesBytes)),
        });
        source.kind = out.kind;
        if (out.kind === 'index') {
          for (const child of out.sitemaps) if (depth < MAX_INDEX_DEPTH) enqueue(child, 'index', depth + 1);
          source.urls = 0;
          break;
        }
        const taken = entriesOf(out);
        let used = 0;
        for (const e of taken) {
          if (seenLocs.has(e.loc)) {
            used++;
            continue;
          }
          if (skipped < input.offset) {
            seenLocs.add(e.loc);
            skipped++;
            used++;
            continue;
          }
          const bytes = jsonBytes(e) + 1;
          if (urlsBytes + bytes + sourcesBytes + sourceRoom > budget) {
            full = true;
            break;
          }
          seenLocs.add(e.loc);
          urlsBytes += bytes;
          urls.push(e);
          source.urls++;
          used++;
        }
        if (full) {
          // The answer is as large as it may be: the rest of this file (and the files after it) is for the next page.
          overflow += Math.max(0, out.matched - (skip + used));
          truncated = true;
          paged = true;
          break;
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
          paged = true;
        }
        break;
      }
    } catch (e) {
      if (ctx.signal.aborted) throw e;
      if (!(e instanceof AppError)) throw e;
      source.error = itemError(e);
      failures.set(source, e);
    }
    sourcesBytes += jsonBytes(source) + 1;
  }
  await ctx.progress({ stage: 'sitemaps', done: sources.length, total: sources.length, unit: 'files' });
  if (!sources.some((s) => s.error === null)) {
    // Nothing could be read: the call fails (uncharged) with the most telling reason.
    const errors = sources.map((s) => failures.get(s)!);
    throw (
      errors.find((e) => e.code !== 'not_found') ??
      new AppError('not_found', `no sitemap found for ${new URL(input.url).origin}`, { tried: sources.map((s) => s.url) })
    );
  }
  return { sources, urls, total: skipped + urls.length + overflow, truncated, next_offset: paged && urls.length ? skipped + urls.length : null };
}

export const grabrSitemap = defineTool({
  name: TOOL,
  description:
    "Discover and flatten a site's sitemaps (robots.txt Sitemap: lines, then /sitemap.xml; indexes followed, .gz inflated with a cap): URLs with lastmod and priority, paged (offset, next_offset) so an answer stays within the service's size limit. Honours robots.txt.",
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
    'truncated: max_urls, the file cap or the answer size limit (TOOL_MAX_RESULT_BYTES, 1 MB by default) left entries out; ' +
    'next_offset: pass it as offset to get the next page (null when nothing is left or only the file cap cut)',
  outputSchema: SitemapResultSchema,
  limits: { timeMs: 20_000, memoryMb: 512 },
  handler: async (input, ctx) => flatten(input, ctx),
});
