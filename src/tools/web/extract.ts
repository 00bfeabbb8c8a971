import { loadBuffer, type CheerioAPI } from 'cheerio';

export const MAX_TEXT_CHARS = 100_000;

export interface PageContent {
  title: string | null;
  description: string | null;
  text: string;
  text_truncated: boolean;
  metadata: Record<string, string>;
  links_count: number;
}

/** Structural view of the parsed nodes; enough to walk the tree without importing domhandler. */
interface DomNode {
  type: string;
  name?: string;
  data?: string;
  children?: DomNode[];
}

const BLOCK_TAGS = new Set([
  'address', 'article', 'aside', 'blockquote', 'body', 'dd', 'details', 'dialog', 'div', 'dl', 'dt', 'fieldset',
  'figcaption', 'figure', 'form', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'header', 'hr', 'li', 'main', 'ol', 'p',
  'pre', 'section', 'summary', 'table', 'tbody', 'td', 'tfoot', 'th', 'thead', 'tr', 'ul', 'caption', 'option',
]);

/** Never readable content, or page chrome around it. */
const CHROME =
  'script, style, noscript, template, svg, canvas, iframe, object, embed, select, button, nav, footer, aside, ' +
  '[role=navigation], [role=contentinfo], [role=banner], [role=complementary], [aria-hidden=true], [hidden]';

const PUBLISHED_KEYS = ['article:published_time', 'datepublished', 'date', 'dc.date', 'dcterms.created', 'pubdate'];
const MODIFIED_KEYS = ['article:modified_time', 'datemodified', 'dcterms.modified', 'og:updated_time'];

/** Parses HTML bytes (charset from the header, else sniffed from the document) into readable parts. */
export function extractHtml(body: Buffer, baseUrl: string, headerCharset: string | null): PageContent {
  const $ = loadBuffer(body, headerCharset ? { encoding: { transportLayerEncodingLabel: headerCharset } } : {});
  const metadata = readMetadata($, baseUrl);
  const links_count = $('a[href]').filter((_, el) => !/^\s*(#|javascript:)/i.test($(el).attr('href') ?? '')).length;
  const title = collapse($('title').first().text()) || metadata['og:title'] || collapse($('h1').first().text()) || null;
  const description =
    $('meta[name=description i]').attr('content')?.trim() || metadata['og:description'] || metadata['twitter:description'] || null;

  $(CHROME).remove();
  // A site header outside the article is navigation; an article's own header holds its headline.
  $('header').filter((_, el) => $(el).closest('main, article, [role=main]').length === 0).remove();
  const main = $('main, [role=main]').first();
  const articles = $('article');
  const bodyEl = $('body');
  const roots = main.length ? main.toArray() : articles.length === 1 ? articles.toArray() : bodyEl.length ? bodyEl.toArray() : $.root().toArray();

  const pieces: string[] = [];
  for (const node of roots as unknown as DomNode[]) collectText(node, pieces);
  const full = normaliseText(pieces.join(''));
  const { text, truncated } = capText(full);
  return { title, description, text, text_truncated: truncated, metadata, links_count };
}

/** Plain-text bodies: keep their line structure, drop trailing spaces and long blank runs. */
export function normalisePlainText(raw: string): { text: string; truncated: boolean } {
  const text = raw
    .replace(/^\uFEFF/, '')
    .replace(/\r\n?/g, '\n')
    .replace(/[ \t]+$/gm, '')
    .replace(/\n{3,}/g, '\n\n')
    .trim();
  return capText(text);
}

function readMetadata($: CheerioAPI, baseUrl: string): Record<string, string> {
  const meta: Record<string, string> = {};
  const set = (k: string, v: string | undefined) => {
    const value = v?.trim();
    if (value && meta[k] === undefined) meta[k] = value;
  };
  set('lang', $('html').attr('lang'));
  const canonical = $('link[rel~=canonical i]').attr('href');
  if (canonical) set('canonical', absolute(canonical, baseUrl));

  const named: Record<string, string> = {};
  $('meta').each((_, el) => {
    const $el = $(el);
    const key = ($el.attr('property') ?? $el.attr('name') ?? $el.attr('itemprop') ?? '').trim().toLowerCase();
    const content = $el.attr('content')?.trim();
    if (!key || !content) return;
    if (named[key] === undefined) named[key] = content;
    if (key.startsWith('og:') || key.startsWith('twitter:')) set(key, content);
  });
  set('author', named['author'] ?? named['article:author'] ?? $('[rel~=author]').first().text().trim());
  set('published', PUBLISHED_KEYS.map((k) => named[k]).find(Boolean) ?? $('time[datetime]').first().attr('datetime'));
  set('modified', MODIFIED_KEYS.map((k) => named[k]).find(Boolean));
  set('keywords', named['keywords']);
  set('site_name', named['og:site_name'] ?? named['application-name']);
  return meta;
}

function collectText(node: DomNode, out: string[]): void {
  if (node.type === 'text') {
    out.push((node.data ?? '').replace(/\s+/g, ' '));
    return;
  }
  if (node.type !== 'tag' && node.type !== 'root') return;
  if (node.name === 'br') {
    out.push('\n');
    return;
  }
  const block = node.name !== undefined && BLOCK_TAGS.has(node.name);
  if (block) out.push('\n');
  for (const child of node.children ?? []) collectText(child, out);
  if (block) out.push('\n');
}

function normaliseText(s: string): string {
  return s
    .split('\n')
    .map((line) => line.replace(/\s+/g, ' ').trim())
    .filter(Boolean)
    .join('\n');
}

function collapse(s: string): string {
  return s.replace(/\s+/g, ' ').trim();
}

function capText(text: string): { text: string; truncated: boolean } {
  if (text.length <= MAX_TEXT_CHARS) return { text, truncated: false };
  let cut = MAX_TEXT_CHARS;
  // Don't split a surrogate pair.
  const code = text.charCodeAt(cut - 1);
  if (code >= 0xd800 && code <= 0xdbff) cut -= 1;
  return { text: text.slice(0, cut), truncated: true };
}

function absolute(href: string, base: string): string {
  try {
    return new URL(href.trim(), base).href;
  } catch {
    return href.trim();
  }
}
