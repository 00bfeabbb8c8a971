import type { CheerioAPI } from 'cheerio';
import { Tokenizer } from 'htmlparser2';
import { cheerio } from '../heavy.js';

/** Loads cheerio while the sandbox thread loads this module (src/tools/heavy.ts). */
export const warm = (): void => void cheerio();

export const MAX_TEXT_CHARS = 100_000;
/** Parse caps: HTML past the element that would exceed either is not parsed (the result is `truncated`). */
export const MAX_HTML_ELEMENTS = 100_000;
export const MAX_HTML_DEPTH = 256;

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
  'address',
  'article',
  'aside',
  'blockquote',
  'body',
  'dd',
  'details',
  'dialog',
  'div',
  'dl',
  'dt',
  'fieldset',
  'figcaption',
  'figure',
  'form',
  'h1',
  'h2',
  'h3',
  'h4',
  'h5',
  'h6',
  'header',
  'hr',
  'li',
  'main',
  'ol',
  'p',
  'pre',
  'section',
  'summary',
  'table',
  'tbody',
  'td',
  'tfoot',
  'th',
  'thead',
  'tr',
  'ul',
  'caption',
  'option',
]);

/** Never readable content, or page chrome around it. */
const CHROME =
  'script, style, noscript, template, svg, canvas, iframe, object, embed, select, button, nav, footer, aside, ' +
  '[role=navigation], [role=contentinfo], [role=banner], [role=complementary], [aria-hidden=true], [hidden]';

const PUBLISHED_KEYS = ['article:published_time', 'datepublished', 'date', 'dc.date', 'dcterms.created', 'pubdate'];
const MODIFIED_KEYS = ['article:modified_time', 'datemodified', 'dcterms.modified', 'og:updated_time'];

export interface ExtractHtmlInput {
  body: Uint8Array;
  baseUrl: string;
  headerCharset: string | null;
}

export interface ExtractHtmlOutput extends PageContent {
  /** The HTML passed MAX_HTML_ELEMENTS or MAX_HTML_DEPTH and only the part before that was read. */
  capped: boolean;
}

/**
 * page_fetch's pool task (src/tools/tasks.ts): the parse caps, then extraction of what is left.
 * Parsing is CPU work on bytes the caller chose, so it never runs on the worker's event loop.
 */
export function extractHtmlTask({ body, baseUrl, headerCharset }: ExtractHtmlInput): ExtractHtmlOutput {
  const buf = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  const cut = htmlCapOffset(buf, headerCharset);
  const page = extractHtml(cut === null ? buf : buf.subarray(0, cut), baseUrl, headerCharset);
  return { ...page, capped: cut !== null };
}

/** Elements that never hold children, and those a parser closes when a sibling of the same kind opens. */
const VOID_TAGS = new Set(['area', 'base', 'br', 'col', 'embed', 'hr', 'img', 'input', 'link', 'meta', 'param', 'source', 'track', 'wbr']);
const SELF_CLOSING_SIBLINGS = new Set(['p', 'li', 'dt', 'dd', 'option', 'optgroup', 'tr', 'td', 'th', 'rt', 'rp']);

/**
 * One linear pass of htmlparser2's tokenizer that estimates the element tree (void elements, implied
 * closing of p/li/td... and end tags that close what they match) and returns the byte offset of the
 * first tag that would pass MAX_HTML_ELEMENTS or MAX_HTML_DEPTH, or null when the page is within both.
 * Markup is ASCII in every charset pages use except UTF-16, so the bytes are scanned as latin1
 * (offsets are byte offsets) and UTF-16 as 2-byte units.
 */
export function htmlCapOffset(body: Buffer, headerCharset: string | null): number | null {
  const utf16 = /^utf-?16/i.test(headerCharset ?? '') || (body[0] === 0xff && body[1] === 0xfe) || (body[0] === 0xfe && body[1] === 0xff);
  const bigEndian = utf16 && (body[0] === 0xfe || /be$/i.test(headerCharset ?? ''));
  const text = utf16 ? (bigEndian ? Buffer.from(body).swap16() : body).toString('utf16le') : body.toString('latin1');
  const unit = utf16 ? 2 : 1;
  const stack: string[] = [];
  let elements = 0;
  let cut: number | null = null;
  let pending = '';
  const tokenizer = new Tokenizer(
    { decodeEntities: false },
    {
      onopentagname(start, end) {
        const name = text.slice(start, end).toLowerCase();
        elements += 1;
        if (SELF_CLOSING_SIBLINGS.has(name) && stack.at(-1) === name) stack.pop();
        const depth = stack.length + (VOID_TAGS.has(name) ? 0 : 1);
        if (elements > MAX_HTML_ELEMENTS || depth > MAX_HTML_DEPTH) {
          // `start` is the name's first character; the tag begins at its '<'.
          cut = (start - 1) * unit;
          tokenizer.pause();
          return;
        }
        pending = name;
      },
      onopentagend() {
        if (pending && !VOID_TAGS.has(pending)) stack.push(pending);
        pending = '';
      },
      onselfclosingtag() {
        // A trailing slash does not close an HTML element, but void ones never open.
        if (pending && !VOID_TAGS.has(pending)) stack.push(pending);
        pending = '';
      },
      onclosetag(start, end) {
        const i = stack.lastIndexOf(text.slice(start, end).toLowerCase());
        if (i >= 0) stack.length = i;
      },
      onattribdata() {},
      onattribentity() {},
      onattribend() {},
      onattribname() {},
      oncdata() {},
      oncomment() {},
      ondeclaration() {},
      onend() {},
      onprocessinginstruction() {},
      ontext() {},
      ontextentity() {},
    },
  );
  tokenizer.write(text);
  if (cut === null) tokenizer.end();
  return cut;
}

/** Parses HTML bytes (charset from the header, else sniffed from the document) into readable parts. */
export function extractHtml(body: Buffer, baseUrl: string, headerCharset: string | null): PageContent {
  const $ = cheerio().loadBuffer(body, headerCharset ? { encoding: { transportLayerEncodingLabel: headerCharset } } : {});
  const metadata = readMetadata($, baseUrl);
  const links_count = $('a[href]').filter((_, el) => !/^\s*(#|javascript:)/i.test($(el).attr('href') ?? '')).length;
  const title = collapse($('title').first().text()) || metadata['og:title'] || collapse($('h1').first().text()) || null;
  const description = $('meta[name=description i]').attr('content')?.trim() || metadata['og:description'] || metadata['twitter:description'] || null;

  $(CHROME).remove();
  // A site header outside the article is navigation; an article's own header holds its headline.
  $('header')
    .filter((_, el) => $(el).closest('main, article, [role=main]').length === 0)
    .remove();
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

/** Depth-first, with an explicit stack: a page's nesting must never become this thread's call depth. */
function collectText(root: DomNode, out: string[]): void {
  // A string entry is text to emit once the nodes pushed after it are done (a block's closing newline).
  const todo: Array<DomNode | string> = [root];
  while (todo.length) {
    const node = todo.pop()!;
    if (typeof node === 'string') {
      out.push(node);
      continue;
    }
    if (node.type === 'text') {
      out.push((node.data ?? '').replace(/\s+/g, ' '));
      continue;
    }
    if (node.type !== 'tag' && node.type !== 'root') continue;
    if (node.name === 'br') {
      out.push('\n');
      continue;
    }
    const block = node.name !== undefined && BLOCK_TAGS.has(node.name);
    if (block) {
      out.push('\n');
      todo.push('\n');
    }
    const children = node.children ?? [];
    for (let i = children.length - 1; i >= 0; i--) todo.push(children[i]!);
  }
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
