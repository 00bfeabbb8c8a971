import { z } from 'zod';
import { defineTool, type ToolContext } from '../types.js';
import { runTask } from '../tasks.js';
import { webUrl } from './grabr-input.js';
import { MAX_FIELDS, MAX_LINKS, MAX_SELECTOR_CHARS, MAX_TEXT_CHARS, selectorError, type FieldSpec, type ScrapeTaskOutput } from './scrape-html.js';
import { fetchPage } from './grabr-page.js';
import { createRobots, type Robots } from './robots.js';
import { MAX_HTML_DEPTH, MAX_HTML_ELEMENTS } from './extract.js';

/**
 * grabr_scrape: structured fields from one page by CSS selector, plus its metadata (title, canonical,
 * og:*), JSON-LD blocks, links and readable text. robots.txt is honoured (403 robots_disallowed, the
 * page is not requested); the page is parsed in the sandbox pool within page_fetch's parse caps.
 * Pages that render their content in JavaScript show only their server-sent HTML.
 */

const TOOL = 'grabr_scrape';

export const FieldSpecSchema = z
  .union([
    z.string(),
    z
      .object({
        selector: z.string(),
        attr: z
          .string()
          .regex(/^[a-zA-Z_:][-a-zA-Z0-9_:.]*$/, 'an attribute name')
          .max(100)
          .optional()
          .describe('Attribute to read (href, src and action are made absolute); "text" (default) is the element\'s text, "html" its inner HTML'),
        all: z.boolean().optional().describe(`Every match (up to 500) as an array; default: the first match or null`),
      })
      .strict(),
  ])
  .transform((v): FieldSpec => (typeof v === 'string' ? { selector: v } : v))
  .superRefine((spec, ctx) => {
    const selector = spec.selector.trim();
    if (!selector) return void ctx.addIssue({ code: 'custom', message: 'the selector is empty', path: ['selector'] });
    if (selector.length > MAX_SELECTOR_CHARS)
      return void ctx.addIssue({ code: 'custom', message: `a selector has at most ${MAX_SELECTOR_CHARS} characters`, path: ['selector'] });
    const err = selectorError(selector);
    if (err) ctx.addIssue({ code: 'custom', message: `invalid CSS selector: ${err}`, path: ['selector'] });
  });

export const FieldsSchema = z
  .record(
    z
      .string()
      .regex(/^[A-Za-z_][A-Za-z0-9_.-]{0,63}$/, 'field names are 1-64 letters, digits, _ . - (starting with a letter or _)')
      .refine((k) => !k.startsWith('__') && k !== 'constructor' && k !== 'prototype', 'reserved field name'),
    FieldSpecSchema,
  )
  .refine((f) => Object.keys(f).length <= MAX_FIELDS, `at most ${MAX_FIELDS} fields`)
  .describe('Fields to extract: {name: {selector, attr?, all?}} or {name: "selector"}, at most 50');

const Input = z.object({
  url: webUrl.describe('The http(s) page to scrape; a bare host is fetched over https.'),
  fields: FieldsSchema.optional(),
});

export const ScrapeResultSchema = z.object({
  final_url: z.string(),
  status: z.number().int(),
  fields: z.record(z.string(), z.union([z.string(), z.null(), z.array(z.string())])),
  metadata: z.object({ title: z.string().nullable(), canonical: z.string().nullable(), og: z.record(z.string(), z.string()) }),
  jsonld: z.array(z.unknown()),
  links: z.array(z.object({ url: z.string(), text: z.string() })),
  text: z.string(),
  truncated: z.boolean(),
});
export type ScrapeResult = z.infer<typeof ScrapeResultSchema>;

/** Scrapes one page (grabr_scrape, and grabr_batch's scrape mode with smaller text/link caps). */
export async function scrapePage(
  ctx: ToolContext,
  robots: Robots,
  url: string,
  fields: Record<string, FieldSpec>,
  caps: { textMax: number; linksMax: number; maxResultBytes?: number },
): Promise<ScrapeResult> {
  const res = await fetchPage(ctx, robots, url, { requireHtml: true });
  const out: ScrapeTaskOutput = await runTask(ctx, 'scrape_html', {
    body: res.body,
    baseUrl: res.final_url,
    headerCharset: res.charset,
    fields,
    textMax: caps.textMax,
    linksMax: caps.linksMax,
    maxResultBytes: Math.min(caps.maxResultBytes ?? Infinity, Math.floor(ctx.config.TOOL_MAX_RESULT_BYTES * 0.9)),
  });
  return { final_url: res.final_url, status: res.status, ...out, truncated: out.truncated || res.truncated };
}

export const grabrScrape = defineTool({
  name: TOOL,
  description: 'Scrape one web page: CSS-selector fields, title/canonical/og metadata, JSON-LD, links and text. Honours robots.txt (403 robots_disallowed).',
  tier: 'enterprise',
  priceCents: 0,
  family: 'web',
  qField: 'url',
  input: Input,
  examples: [
    { url: 'https://example.com/' },
    { url: 'https://example.com/', fields: { heading: { selector: 'h1' }, links: { selector: 'a', attr: 'href', all: true } } },
  ],
  output:
    '{final_url, status, fields: {name: value|null|[values]}, metadata: {title, canonical, og}, jsonld: [blocks], links: [{url, text}], text, truncated}; ' +
    `at most ${MAX_LINKS} links, ${MAX_TEXT_CHARS.toLocaleString('en')} characters of text, 500 values per field, 10,000 characters per value; ` +
    `truncated: a cap dropped something or the HTML passed a parse cap (${MAX_HTML_ELEMENTS.toLocaleString('en')} elements, ${MAX_HTML_DEPTH} levels)`,
  outputSchema: ScrapeResultSchema,
  limits: { timeMs: 10_000, memoryMb: 384 },
  handler: async (input, ctx) => {
    const robots = createRobots(ctx, TOOL);
    return scrapePage(ctx, robots, input.url, input.fields ?? {}, { textMax: MAX_TEXT_CHARS, linksMax: MAX_LINKS });
  },
});
