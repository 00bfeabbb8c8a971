import { z } from 'zod';
import { isSupportedCountry } from 'libphonenumber-js';
import { AppError } from '../../errors.js';
import { defineTool, type ToolContext } from '../types.js';
import { runTask } from '../tasks.js';
import { webUrl } from './grabr-input.js';
import { fetchPage, isHtml, itemError } from './grabr-page.js';
import type { PostalAddress } from './contact-parse.js';
import { createRobots } from './robots.js';
import { jsonBytes } from './answer-size.js';

/**
 * grabr_contact: the published contact points of a site. Reads the page asked for, then pages on the
 * same site (same host, "www." ignored) that look like contact, about, imprint, legal or team pages,
 * breadth-first in link order, up to max_pages in all. Each page is parsed in the sandbox pool
 * (contact-parse.ts: mailto, Cloudflare data-cfemail, "[at]"/"(at)" text, tel: and text phone numbers
 * through libphonenumber-js with `country` as the default region, social profiles, JSON-LD
 * addresses, forms). Every item lists the pages it was found on (`sources`, in crawl order).
 * robots.txt is honoured: the first page disallowed is 403; later pages it disallows are skipped
 * (listed in `pages` with error robots_disallowed, never requested). Published data only: nothing is stored.
 */

const TOOL = 'grabr_contact';
export const MAX_CONTACT_PAGES = 10;

const Input = z.object({
  url: webUrl.describe('The site page to start from (usually the home page); a bare host is fetched over https.'),
  max_pages: z.number().int().min(1).max(MAX_CONTACT_PAGES).default(5).describe('Pages to read in all, including the first (1-10, default 5)'),
  country: z
    .string()
    .trim()
    .length(2)
    .transform((c) => c.toUpperCase())
    .refine((c) => isSupportedCountry(c), 'an ISO 3166-1 alpha-2 region libphonenumber knows, e.g. "DE"')
    .optional()
    .describe('Default region for phone numbers written without a country code (ISO 3166-1 alpha-2)'),
});

const Sources = z.array(z.string());
const AddressSchema = z.object({
  street: z.string().nullable(),
  locality: z.string().nullable(),
  region: z.string().nullable(),
  postal_code: z.string().nullable(),
  country: z.string().nullable(),
  text: z.string(),
  sources: Sources,
});

export const ContactResultSchema = z.object({
  url: z.string(),
  pages: z.array(z.object({ url: z.string(), status: z.number().int().nullable(), error: z.object({ code: z.string(), message: z.string() }).nullable() })),
  emails: z.array(z.object({ value: z.string(), sources: Sources })),
  phones: z.array(z.object({ e164: z.string(), sources: Sources })),
  socials: z.array(z.object({ network: z.string(), url: z.string(), sources: Sources })),
  addresses: z.array(AddressSchema),
  forms: z.array(z.object({ action: z.string(), method: z.string(), fields: z.array(z.string()), sources: Sources })),
  truncated: z.boolean(),
});
type ContactResult = z.infer<typeof ContactResultSchema>;

function siteKey(u: URL): string {
  return `${u.protocol}//${u.hostname.toLowerCase().replace(/^www\./, '')}:${u.port}`;
}

/** Items keyed by identity, each with its sources in first-seen order. */
class Collected<T> {
  readonly items: Array<T & { sources: string[] }> = [];
  private readonly index = new Map<string, T & { sources: string[] }>();
  add(key: string, item: T, source: string): void {
    let entry = this.index.get(key);
    if (!entry) {
      entry = { ...item, sources: [] };
      this.index.set(key, entry);
      this.items.push(entry);
    }
    if (!entry.sources.includes(source)) entry.sources.push(source);
  }
}

async function crawl(input: z.output<typeof Input>, ctx: ToolContext): Promise<ContactResult> {
  const robots = createRobots(ctx, TOOL);
  const start = new URL(input.url);
  let site = siteKey(start);
  const queue: string[] = [start.href];
  const seen = new Set<string>([start.href]);
  /** Final URLs already parsed. */
  const read = new Set<string>();
  const pages: ContactResult['pages'] = [];
  const emails = new Collected<{ value: string }>();
  const phones = new Collected<{ e164: string }>();
  const socials = new Collected<{ network: string; url: string }>();
  const addresses = new Collected<Omit<PostalAddress, never>>();
  const forms = new Collected<{ action: string; method: string; fields: string[] }>();
  let truncated = false;

  while (queue.length && pages.length < input.max_pages) {
    const url = queue.shift()!;
    const first = pages.length === 0;
    await ctx.progress({ stage: 'crawling', done: pages.length, total: input.max_pages, unit: 'pages', message: url });
    let res;
    try {
      res = await fetchPage(ctx, robots, url, { requireHtml: first });
    } catch (e) {
      if (first || ctx.signal.aborted) throw e;
      pages.push({
        url,
        status: e instanceof AppError && typeof e.details['status'] === 'number' ? (e.details['status'] as number) : null,
        error: itemError(e),
      });
      continue;
    }
    const source = res.final_url;
    // The site is where the first page landed (http → https, a www. host...).
    if (first) site = siteKey(new URL(source));
    if (!first && (!isHtml(res) || siteKey(new URL(source)) !== site)) {
      pages.push({
        url,
        status: res.status,
        error: { code: 'invalid_input', message: isHtml(res) ? 'redirected off the site; not read' : 'not an HTML page; not read' },
      });
      continue;
    }
    if (read.has(source)) {
      pages.push({ url, status: res.status, error: { code: 'duplicate', message: `redirected to ${source}, already read` } });
      continue;
    }
    read.add(source);
    seen.add(source);
    pages.push({ url: source, status: res.status, error: null });
    truncated ||= res.truncated;
    const found = await runTask(ctx, 'contact_page', { body: res.body, baseUrl: source, headerCharset: res.charset, country: input.country ?? null });
    truncated ||= found.truncated;
    for (const value of found.emails) emails.add(value, { value }, source);
    for (const e164 of found.phones) phones.add(e164, { e164 }, source);
    for (const s of found.socials) socials.add(s.url, s, source);
    for (const a of found.addresses) addresses.add(a.text, a, source);
    for (const f of found.forms) forms.add(`${f.method} ${f.action}`, f, source);
    for (const c of found.candidates) {
      const u = new URL(c.url);
      u.hash = '';
      if (siteKey(u) !== site || seen.has(u.href)) continue;
      seen.add(u.href);
      queue.push(u.href);
    }
  }
  await ctx.progress({ stage: 'crawling', done: pages.length, total: pages.length, unit: 'pages' });
  return withinSize(
    {
      url: input.url,
      pages,
      emails: emails.items,
      phones: phones.items,
      socials: socials.items,
      addresses: addresses.items,
      forms: forms.items,
      truncated,
    },
    ctx.config.TOOL_MAX_RESULT_BYTES - 1_024,
  );
}

const LISTS = ['emails', 'phones', 'socials', 'addresses', 'forms'] as const;

/**
 * Holds the answer to `budget` JSON bytes (the service refuses a larger one; ten pages of long URLs
 * found on every page can make several MB): items are left out from the end of whichever list takes
 * the most bytes, and the answer says `truncated: true`.
 */
function withinSize(out: ContactResult, budget: number): ContactResult {
  let size = jsonBytes(out);
  if (size <= budget) return out;
  const sizes = Object.fromEntries(LISTS.map((k) => [k, (out[k] as unknown[]).map((i) => jsonBytes(i) + 1)])) as Record<(typeof LISTS)[number], number[]>;
  const total = (k: (typeof LISTS)[number]) => sizes[k].reduce((a, b) => a + b, 0);
  const totals = Object.fromEntries(LISTS.map((k) => [k, total(k)])) as Record<(typeof LISTS)[number], number>;
  while (size > budget) {
    const k = LISTS.reduce((a, b) => (totals[b] > totals[a] ? b : a));
    if (!sizes[k].length) break;
    const bytes = sizes[k].pop()!;
    (out[k] as unknown[]).pop();
    totals[k] -= bytes;
    size -= bytes;
    out.truncated = true;
  }
  return out;
}

export const grabrContact = defineTool({
  name: TOOL,
  description:
    'Published contact points of a site: emails (incl. [at] and Cloudflare-obfuscated), phones in E.164, social profiles, addresses and forms, from the page and its contact/about/imprint pages. Honours robots.txt.',
  tier: 'enterprise',
  priceCents: 0,
  family: 'web',
  qField: 'url',
  progress: true,
  input: Input,
  examples: [{ url: 'https://example.com/' }, { url: 'https://example.com/', max_pages: 3, country: 'DE' }],
  output:
    '{url, pages: [{url, status, error}], emails: [{value, sources}], phones: [{e164, sources}], socials: [{network, url, sources}], ' +
    'addresses: [{street, locality, region, postal_code, country, text, sources}], forms: [{action, method, fields, sources}], truncated}; ' +
    `at most ${MAX_CONTACT_PAGES} pages; sources are the pages (final URLs) an item was found on; ` +
    'the answer stays within the size limit on answers (TOOL_MAX_RESULT_BYTES, 1 MB by default): items are left out from the end of the largest lists (truncated: true)',
  outputSchema: ContactResultSchema,
  limits: { timeMs: 10_000, memoryMb: 384 },
  handler: async (input, ctx) => crawl(input, ctx),
});
