import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool, type ToolContext } from '../types.js';
import { runTask } from '../tasks.js';
import { webUrl } from './grabr-input.js';
import { fetchPage, isHtml, itemError } from './grabr-page.js';
import { normalisePlainText } from './extract.js';
import { createRobots, type Robots } from './robots.js';
import { FieldsSchema, scrapePage, ScrapeResultSchema } from './grabr-scrape.js';
import type { FieldSpec } from './scrape-html.js';
import { cutToJsonBytes, jsonBytes } from './answer-size.js';

/**
 * grabr_batch: many pages in one call. Each URL is read through robots.txt and the guard like the
 * single-page tools (at most WEB_PER_HOST requests at once per host, whatever `concurrency` says);
 * a URL that fails (an HTTP error, a refused private address, robots.txt, not HTML) is an item with
 * `ok: false` and its error's code and message, never the call's failure. Items keep input order.
 * Per item, text is cut at ITEM_TEXT_CHARS characters, scrape links at ITEM_LINKS and a scrape item at
 * ITEM_SCRAPE_BYTES of JSON.
 */

const TOOL = 'grabr_batch';
export const MAX_BATCH_URLS = 50;
export const ITEM_TEXT_CHARS = 20_000;
export const ITEM_LINKS = 100;
/** JSON bytes of one scrape item at most (50 items stay within about 10 MB). */
export const ITEM_SCRAPE_BYTES = 200_000;

const Input = z
  .object({
    urls: z.array(webUrl).min(1).max(MAX_BATCH_URLS).describe('Pages to read, 1-50 (q: one URL per line)'),
    mode: z
      .enum(['text', 'scrape', 'meta'])
      .default('text')
      .describe('text: readable text; scrape: grabr_scrape per page (fields, metadata, JSON-LD, links, text); meta: title, description, canonical, og:*'),
    fields: FieldsSchema.optional().describe('scrape mode: fields as in grabr_scrape'),
    concurrency: z.number().int().min(1).max(8).default(4).describe('Pages fetched at once (1-8, default 4; never more than WEB_PER_HOST per host)'),
  })
  .refine((i) => i.fields === undefined || i.mode === 'scrape', { message: 'fields are for mode "scrape"', path: ['fields'] });

const TextResult = z.object({
  kind: z.literal('text'),
  final_url: z.string(),
  status: z.number().int(),
  content_type: z.string().nullable(),
  title: z.string().nullable(),
  text: z.string(),
  truncated: z.boolean(),
});
const MetaResult = z.object({
  kind: z.literal('meta'),
  final_url: z.string(),
  status: z.number().int(),
  title: z.string().nullable(),
  description: z.string().nullable(),
  canonical: z.string().nullable(),
  lang: z.string().nullable(),
  og: z.record(z.string(), z.string()),
  jsonld_types: z.array(z.string()),
  links_count: z.number().int(),
  truncated: z.boolean(),
});
const ScrapeItem = ScrapeResultSchema.extend({ kind: z.literal('scrape') });

const Item = z.union([
  z.object({ url: z.string(), ok: z.literal(true), result: z.discriminatedUnion('kind', [TextResult, MetaResult, ScrapeItem]) }),
  z.object({ url: z.string(), ok: z.literal(false), error: z.object({ code: z.string(), message: z.string() }) }),
]);
export const BatchResultSchema = z.object({ items: z.array(Item) });
type Item = z.infer<typeof Item>;
type ItemResult = Extract<Item, { ok: true }>['result'];

/** Room kept in the answer besides its items ({"items":[...]}). */
const ANSWER_OVERHEAD = 1_024;

/**
 * Holds the answer to `budget` JSON bytes (the service refuses a larger one): when the items take more,
 * the longest text items are cut to a common length (each one's text ends earlier, `truncated: true`),
 * so short pages stay whole. Scrape items got their share of the budget beforehand.
 */
export function fitItems(items: Item[], budget: number): void {
  const sizes = items.map((i) => jsonBytes(i) + 1);
  const total = sizes.reduce((a, b) => a + b, 0);
  if (total <= budget) return;
  const cuttable = items.flatMap((it, i) => (it.ok && it.result.kind === 'text' ? [i] : []));
  if (!cuttable.length) return;
  let room = budget - (total - cuttable.reduce((a, i) => a + sizes[i]!, 0));
  // The level every text item is cut down to: the cuttable sizes up to it sum to the room left.
  const asc = cuttable.map((i) => sizes[i]!).sort((a, b) => a - b);
  let level = 0;
  for (let k = 0; k < asc.length; k++) {
    const share = Math.floor(room / (asc.length - k));
    if (asc[k]! <= share) {
      room -= asc[k]!;
      level = asc[k]!;
    } else {
      level = Math.max(0, share);
      break;
    }
  }
  for (const i of cuttable) {
    const excess = sizes[i]! - level;
    if (excess <= 0) continue;
    const r = (items[i] as Extract<Item, { ok: true }>).result as Extract<ItemResult, { kind: 'text' }>;
    const textBytes = jsonBytes(r.text);
    r.text = cutToJsonBytes(r.text, Math.max(0, textBytes - excess - 16));
    r.truncated = true;
  }
}

async function readOne(
  ctx: ToolContext,
  robots: Robots,
  url: string,
  mode: 'text' | 'scrape' | 'meta',
  fields: Record<string, FieldSpec>,
  scrapeBytes: number,
): Promise<ItemResult> {
  if (mode === 'scrape')
    return { kind: 'scrape', ...(await scrapePage(ctx, robots, url, fields, { textMax: ITEM_TEXT_CHARS, linksMax: ITEM_LINKS, maxResultBytes: scrapeBytes })) };
  const res = await fetchPage(ctx, robots, url, { requireHtml: mode === 'meta' });
  if (mode === 'meta') {
    const m = await runTask(ctx, 'page_meta', { body: res.body, baseUrl: res.final_url, headerCharset: res.charset });
    return { kind: 'meta', final_url: res.final_url, status: res.status, ...m, truncated: m.truncated || res.truncated };
  }
  let title: string | null = null;
  let text: string;
  let truncated = res.truncated;
  if (isHtml(res)) {
    const page = await runTask(ctx, 'extract_html', { body: res.body, baseUrl: res.final_url, headerCharset: res.charset });
    title = page.title;
    text = page.text;
    truncated ||= page.capped || page.text_truncated;
  } else if (res.body.length) {
    const plain = normalisePlainText(res.text().slice(0, ITEM_TEXT_CHARS * 4));
    text = plain.text;
    truncated ||= plain.truncated;
  } else {
    throw new AppError('invalid_input', `${res.final_url} is not a text page (${res.content_type ?? 'no content type'})`, { reason: 'not_text' });
  }
  if (text.length > ITEM_TEXT_CHARS) {
    text = text.slice(0, ITEM_TEXT_CHARS);
    truncated = true;
  }
  return { kind: 'text', final_url: res.final_url, status: res.status, content_type: res.content_type, title, text, truncated };
}

async function batch(input: z.output<typeof Input>, ctx: ToolContext): Promise<{ items: Item[] }> {
  const robots = createRobots(ctx, TOOL);
  const n = input.urls.length;
  const items: Item[] = new Array<Item>(n);
  // The whole answer is held to TOOL_MAX_RESULT_BYTES: a scrape item gets its share of it at most.
  const budget = ctx.config.TOOL_MAX_RESULT_BYTES - ANSWER_OVERHEAD;
  const scrapeBytes = Math.max(1_024, Math.min(ITEM_SCRAPE_BYTES, Math.floor(budget / n) - 256));
  let next = 0;
  let done = 0;
  await ctx.progress({ stage: 'fetching', done: 0, total: n, unit: 'urls' });
  const worker = async () => {
    while (next < n) {
      const i = next++;
      const url = input.urls[i]!;
      try {
        items[i] = { url, ok: true, result: await readOne(ctx, robots, url, input.mode, input.fields ?? {}, scrapeBytes) };
      } catch (e) {
        if (ctx.signal.aborted) throw e;
        items[i] = { url, ok: false, error: itemError(e) };
      }
      done++;
      await ctx.progress({ stage: 'fetching', done, total: n, unit: 'urls', message: url });
    }
  };
  await Promise.all(Array.from({ length: Math.min(input.concurrency, n) }, worker));
  fitItems(items, budget);
  return { items };
}

export const grabrBatch = defineTool({
  name: TOOL,
  description:
    'Read up to 50 pages in one call (text, scrape or meta mode); each URL succeeds or fails on its own, results in input order. Honours robots.txt.',
  tier: 'enterprise',
  priceCents: 0,
  family: 'web',
  qField: 'urls',
  qParse: 'lines',
  progress: true,
  input: Input,
  examples: [
    { urls: ['https://example.com/', 'https://example.org/'] },
    { urls: ['https://example.com/'], mode: 'scrape', fields: { heading: { selector: 'h1' } }, concurrency: 2 },
    { urls: ['https://example.com/', 'https://example.net/'], mode: 'meta' },
  ],
  output:
    '{items: [{url, ok: true, result} | {url, ok: false, error: {code, message}}]} in input order; result by mode: ' +
    'text {kind, final_url, status, content_type, title, text, truncated}, meta {kind, final_url, status, title, description, canonical, lang, og, jsonld_types, links_count, truncated}, ' +
    `scrape {kind, ...grabr_scrape's result}; at most ${MAX_BATCH_URLS} URLs, ${ITEM_TEXT_CHARS.toLocaleString('en')} characters of text and ${ITEM_LINKS} links per item, ` +
    `a scrape item at most ${ITEM_SCRAPE_BYTES.toLocaleString('en')} JSON bytes (cut like grabr_scrape's answer); ` +
    'the whole answer stays within the size limit on answers (TOOL_MAX_RESULT_BYTES, 1 MB by default): a scrape item gets its share of it, and the longest texts are cut to fit (truncated: true)',
  outputSchema: BatchResultSchema,
  limits: { timeMs: 10_000, memoryMb: 384 },
  handler: async (input, ctx) => batch(input, ctx),
});
