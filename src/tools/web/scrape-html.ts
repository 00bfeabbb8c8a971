import type { CheerioAPI } from 'cheerio';
import { AppError } from '../../errors.js';
import { extractHtml, htmlCapOffset, MAX_TEXT_CHARS } from './extract.js';
import { jsonBytes } from './answer-size.js';
import { cheerio } from '../heavy.js';

/** Loads cheerio while the sandbox thread loads this module (src/tools/heavy.ts). */
export const warm = (): void => void cheerio();

/**
 * HTML pool tasks of the grabr_* tools (grabr_scrape, grabr_batch's scrape and meta modes). Parsing
 * is CPU work on bytes a site chose, so it runs in the sandbox pool. Every task first applies
 * page_fetch's parse caps (htmlCapOffset: MAX_HTML_ELEMENTS elements, MAX_HTML_DEPTH levels): past
 * them only the part before is parsed and the result says `truncated`. Loads without side effects.
 */

export const MAX_FIELDS = 50;
export const MAX_SELECTOR_CHARS = 500;
/** Values one `all` field returns at most. */
export const MAX_VALUES_PER_FIELD = 500;
/** Characters of one field value at most (longer values are cut). */
export const MAX_VALUE_CHARS = 10_000;
/** Characters of all field values together: past it the remaining values are dropped (`truncated`). */
export const MAX_FIELD_CHARS_TOTAL = 300_000;
export const MAX_LINKS = 500;
export const MAX_JSONLD_BLOCKS = 20;
/** A JSON-LD block longer than this is skipped. */
export const MAX_JSONLD_CHARS = 100_000;
/** URLs longer than this (links, canonical) are left out. */
export const MAX_URL_CHARS = 2_048;
/** Title, description and og:* values are cut here; at most MAX_OG og:* properties. */
export const MAX_META_CHARS = 2_000;
export const MAX_OG = 50;

/** Cuts a string to `max` characters (never inside a surrogate pair). */
export function cut(s: string, max: number): string {
  if (s.length <= max) return s;
  const end = /[\uD800-\uDBFF]/.test(s[max - 1] ?? '') ? max - 1 : max;
  return s.slice(0, end);
}

export interface FieldSpec {
  selector: string;
  /** An attribute to read; "text" (default) reads the element's text, "html" its inner HTML. href/src/action are made absolute. */
  attr?: string | undefined;
  all?: boolean | undefined;
}

export type FieldValue = string | null | string[];

export interface PageMeta {
  title: string | null;
  description: string | null;
  canonical: string | null;
  lang: string | null;
  og: Record<string, string>;
}

export interface ScrapeTaskInput {
  body: Uint8Array;
  baseUrl: string;
  headerCharset: string | null;
  fields: Record<string, FieldSpec>;
  textMax: number;
  linksMax: number;
  /** JSON bytes the answer may take (pool answers are capped by TOOL_MAX_RESULT_BYTES): past it, parts are cut. */
  maxResultBytes: number;
}

export interface ScrapeTaskOutput {
  fields: Record<string, FieldValue>;
  metadata: { title: string | null; canonical: string | null; og: Record<string, string> };
  jsonld: unknown[];
  links: Array<{ url: string; text: string }>;
  text: string;
  /** A parse cap cut the page, or a field, text, link or JSON-LD cap dropped something. */
  truncated: boolean;
}

/**
 * Checks a CSS selector the way cheerio will run it (css-what syntax plus cheerio-select's pseudos):
 * an error message, or null when it compiles. Cheap: it runs against an empty document.
 */
let emptyDoc: CheerioAPI | undefined;
export function selectorError(selector: string): string | null {
  emptyDoc ??= cheerio().load('');
  try {
    emptyDoc(selector);
    return null;
  } catch (e) {
    return e instanceof Error ? e.message : String(e);
  }
}

function toBuffer(body: Uint8Array): Buffer {
  return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

/** The page within the parse caps, and whether it was cut. */
function capped(body: Uint8Array, headerCharset: string | null): { buf: Buffer; cut: boolean } {
  const buf = toBuffer(body);
  const cut = htmlCapOffset(buf, headerCharset);
  return { buf: cut === null ? buf : buf.subarray(0, cut), cut: cut !== null };
}

function parse(buf: Buffer, headerCharset: string | null): CheerioAPI {
  return cheerio().loadBuffer(buf, headerCharset ? { encoding: { transportLayerEncodingLabel: headerCharset } } : {});
}

export function collapse(s: string): string {
  return s.replace(/\s+/g, ' ').trim();
}

export function absolute(href: string, base: string): string | null {
  try {
    const u = new URL(href.trim(), base);
    return u.href;
  } catch {
    return null;
  }
}

const URL_ATTRS = new Set(['href', 'src', 'action', 'poster', 'data-src', 'cite']);

export function readMeta($: CheerioAPI, baseUrl: string): PageMeta {
  const og: Record<string, string> = {};
  let description: string | null = null;
  $('meta').each((_, el) => {
    const $el = $(el);
    const key = ($el.attr('property') ?? $el.attr('name') ?? '').trim().toLowerCase();
    const content = $el.attr('content')?.trim();
    if (!key || !content) return;
    if (key.startsWith('og:') && og[key] === undefined && Object.keys(og).length < MAX_OG && key.length <= 100) og[key] = cut(content, MAX_META_CHARS);
    if (key === 'description' && description === null) description = cut(content, MAX_META_CHARS);
  });
  const canonicalHref = $('link[rel~=canonical i]').first().attr('href');
  const canonical = canonicalHref && canonicalHref.length <= MAX_URL_CHARS ? absolute(canonicalHref, baseUrl) : null;
  const title = cut(collapse($('title').first().text()), MAX_META_CHARS) || null;
  return {
    title,
    description: description ?? og['og:description'] ?? null,
    canonical: canonical && canonical.length <= MAX_URL_CHARS ? canonical : null,
    lang: cut($('html').attr('lang')?.trim() ?? '', 35) || null,
    og,
  };
}

/** Parsed JSON-LD blocks (a block that is not valid JSON, or too long, is skipped). */
export function readJsonLd($: CheerioAPI, maxBlocks = MAX_JSONLD_BLOCKS): { blocks: unknown[]; dropped: boolean } {
  const blocks: unknown[] = [];
  let dropped = false;
  $('script[type="application/ld+json" i]').each((_, el) => {
    const raw = $(el).text();
    if (raw.length > MAX_JSONLD_CHARS || blocks.length >= maxBlocks) {
      dropped = true;
      return;
    }
    try {
      blocks.push(JSON.parse(raw.trim()) as unknown);
    } catch {
      // not JSON: skipped, like a crawler does
    }
  });
  return { blocks, dropped };
}

/** Links with an http(s) target, absolute, first occurrence of each URL, in document order. */
export function readLinks($: CheerioAPI, baseUrl: string, max: number): { links: Array<{ url: string; text: string }>; dropped: boolean } {
  const seen = new Set<string>();
  const links: Array<{ url: string; text: string }> = [];
  let dropped = false;
  $('a[href]').each((_, el) => {
    const href = $(el).attr('href') ?? '';
    if (href.length > MAX_URL_CHARS || /^\s*(#|javascript:|mailto:|tel:|data:)/i.test(href)) return;
    const url = absolute(href, baseUrl);
    if (!url || url.length > MAX_URL_CHARS || !/^https?:/i.test(url)) return;
    const key = url.replace(/#.*$/, '');
    if (seen.has(key)) return;
    seen.add(key);
    if (links.length >= max) {
      dropped = true;
      return false;
    }
    links.push({ url: key, text: collapse($(el).text()).slice(0, 300) });
    return undefined;
  });
  return { links, dropped };
}

export function scrapeTask(input: ScrapeTaskInput): ScrapeTaskOutput {
  const { buf, cut } = capped(input.body, input.headerCharset);
  const $ = parse(buf, input.headerCharset);
  let truncated = cut;
  let budget = MAX_FIELD_CHARS_TOTAL;
  const fields: Record<string, FieldValue> = {};
  for (const [name, spec] of Object.entries(input.fields)) {
    let selection;
    try {
      selection = $(spec.selector);
    } catch (e) {
      throw new AppError('invalid_input', `field "${name}": invalid CSS selector: ${e instanceof Error ? e.message : String(e)}`, {
        field: name,
        selector: spec.selector,
      });
    }
    const values: string[] = [];
    const limit = spec.all ? MAX_VALUES_PER_FIELD : 1;
    for (let i = 0; i < selection.length && values.length < limit; i++) {
      const $el = selection.eq(i);
      const attr = spec.attr?.toLowerCase();
      let v: string | null | undefined;
      if (!attr || attr === 'text') v = collapse($el.text());
      else if (attr === 'html') v = $el.html();
      else {
        v = $el.attr(spec.attr!);
        if (v !== undefined && URL_ATTRS.has(attr)) v = absolute(v, input.baseUrl) ?? v.trim();
        else v = v?.trim();
      }
      if (v === undefined || v === null) continue;
      if (v.length > MAX_VALUE_CHARS) {
        v = v.slice(0, MAX_VALUE_CHARS);
        truncated = true;
      }
      if (v.length > budget) {
        truncated = true;
        break;
      }
      budget -= v.length;
      values.push(v);
    }
    if (spec.all && selection.length > MAX_VALUES_PER_FIELD) truncated = true;
    fields[name] = spec.all ? values : (values[0] ?? null);
  }
  const meta = readMeta($, input.baseUrl);
  const jsonld = readJsonLd($);
  const links = readLinks($, input.baseUrl, input.linksMax);
  const page = extractHtml(buf, input.baseUrl, input.headerCharset);
  let text = page.text;
  if (text.length > input.textMax) {
    text = text.slice(0, input.textMax);
    truncated = true;
  }
  return fitBudget(
    {
      fields,
      metadata: { title: meta.title, canonical: meta.canonical, og: meta.og },
      jsonld: jsonld.blocks,
      links: links.links,
      text,
      truncated: truncated || jsonld.dropped || links.dropped || page.text_truncated,
    },
    input.maxResultBytes,
  );
}

/**
 * Keeps a scrape answer within `max` JSON bytes (multi-byte text can triple a character cap's size):
 * the text is cut first, then JSON-LD blocks, links and field values are dropped from the end.
 */
export function fitBudget(out: ScrapeTaskOutput, max: number): ScrapeTaskOutput {
  let size = jsonBytes(out);
  if (size <= max) return out;
  out.truncated = true;
  const textBytes = Buffer.byteLength(out.text);
  if (size - textBytes <= max) {
    // Cut the text in proportion, then by tenths until it fits.
    let keep = Math.floor(out.text.length * ((max - (size - textBytes)) / Math.max(1, textBytes)) * 0.95);
    out.text = cut(out.text, Math.max(0, keep));
    while (jsonBytes(out) > max && out.text.length) {
      keep = Math.floor(out.text.length * 0.9);
      out.text = cut(out.text, keep);
    }
    return out;
  }
  out.text = '';
  size = jsonBytes(out);
  while (size > max && out.jsonld.length) {
    out.jsonld.pop();
    size = jsonBytes(out);
  }
  while (size > max && out.links.length) {
    out.links.length = Math.floor(out.links.length / 2);
    size = jsonBytes(out);
  }
  for (const name of Object.keys(out.fields).reverse()) {
    if (size <= max) break;
    const v = out.fields[name];
    out.fields[name] = Array.isArray(v) ? [] : null;
    size = jsonBytes(out);
  }
  return out;
}

export interface MetaTaskInput {
  body: Uint8Array;
  baseUrl: string;
  headerCharset: string | null;
}

export interface MetaTaskOutput extends PageMeta {
  /** @type values of the page's JSON-LD blocks (top level and @graph), first occurrence order. */
  jsonld_types: string[];
  links_count: number;
  truncated: boolean;
}

export function metaTask(input: MetaTaskInput): MetaTaskOutput {
  const { buf, cut } = capped(input.body, input.headerCharset);
  const $ = parse(buf, input.headerCharset);
  const meta = readMeta($, input.baseUrl);
  const types: string[] = [];
  const add = (t: unknown) => {
    for (const v of Array.isArray(t) ? t : [t]) if (typeof v === 'string' && v.length <= 200 && !types.includes(v) && types.length < 50) types.push(v);
  };
  for (const block of readJsonLd($).blocks) {
    for (const node of Array.isArray(block) ? block : [block]) {
      if (!node || typeof node !== 'object') continue;
      const n = node as Record<string, unknown>;
      add(n['@type']);
      if (Array.isArray(n['@graph'])) for (const g of n['@graph'] as unknown[]) if (g && typeof g === 'object') add((g as Record<string, unknown>)['@type']);
    }
  }
  const links_count = $('a[href]').length;
  return { ...meta, jsonld_types: types, links_count, truncated: cut };
}

export { MAX_TEXT_CHARS };
