import type { CheerioAPI } from 'cheerio';
import { parsePhoneNumberFromString, searchPhoneNumbersInText, type CountryCode } from 'libphonenumber-js';
import { htmlCapOffset } from './extract.js';
import { absolute, collapse, cut, MAX_URL_CHARS, readJsonLd } from './scrape-html.js';
import { cheerio } from '../heavy.js';

/** Loads cheerio while the sandbox thread loads this module (src/tools/heavy.ts). */
export const warm = (): void => void cheerio();

/**
 * grabr_contact's pool task: the published contact points of one page. Loads without side effects.
 *
 * - emails: mailto: links, Cloudflare-protected addresses (`data-cfemail`, /cdn-cgi/l/email-protection#...),
 *   addresses in the page's text, also written "name [at] example [dot] com" / "(at)" / "{at}", and
 *   JSON-LD `email`; lower-cased; image names such as logo@2x.png are not addresses.
 * - phones: tel: links, JSON-LD `telephone`, and numbers in the text (libphonenumber-js; `country` is the
 *   default region for numbers written without +); only valid numbers, in E.164.
 * - socials: links to profile pages of known networks (share/intent links are not profiles).
 * - addresses: JSON-LD PostalAddress objects.
 * - forms: each <form> with its absolute action, method and named fields.
 * - candidates: same-page links that look like contact/about/imprint pages, for the crawl.
 */

/** Characters of page text searched for emails and phone numbers. */
export const MAX_SCAN_CHARS = 500_000;
const MAX_ITEMS = 200;
const MAX_ADDRESSES = 50;
/** Address parts and form field names are cut here. */
const MAX_PART_CHARS = 300;

export interface ContactPageInput {
  body: Uint8Array;
  baseUrl: string;
  headerCharset: string | null;
  country: string | null;
}

export interface PostalAddress {
  street: string | null;
  locality: string | null;
  region: string | null;
  postal_code: string | null;
  country: string | null;
  text: string;
}

export interface ContactPageOutput {
  emails: string[];
  phones: string[];
  socials: Array<{ network: string; url: string }>;
  addresses: PostalAddress[];
  forms: Array<{ action: string; method: string; fields: string[] }>;
  candidates: Array<{ url: string; text: string }>;
  truncated: boolean;
}

const EMAIL = /[a-z0-9][a-z0-9._%+-]{0,63}@(?:[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?\.){1,8}[a-z]{2,24}/gi;
const NOT_TLD = new Set(['png', 'jpg', 'jpeg', 'gif', 'webp', 'svg', 'avif', 'bmp', 'ico', 'css', 'js', 'mp4', 'webm']);
// Applied to text whose whitespace runs are single spaces (no nested whitespace quantifiers: linear time).
const AT = / ?(?:\[ ?at ?\]|\( ?at ?\)|\{ ?at ?\}) ?| at (?=[a-z0-9-]{1,63} ?(?:\[|\(|\{) ?dot)/gi;
const DOT = / ?(?:\[ ?dot ?\]|\( ?dot ?\)|\{ ?dot ?\}) ?/gi;

/** Pages worth reading for contact points, by their URL path or link text. */
export const CANDIDATE =
  /contact|kontakt|contacto|contatti|about|ueber-uns|uber-uns|über-uns|impressum|imprint|legal|mentions-legales|team|company|support|get-in-touch/i;

const NETWORKS: Array<[RegExp, string]> = [
  [/^(?:www\.|mobile\.)?(?:twitter|x)\.com$/, 'x'],
  [/^(?:www\.|m\.|[a-z]{2}-[a-z]{2}\.)?facebook\.com$/, 'facebook'],
  [/^(?:[a-z]{2,3}\.)?linkedin\.com$/, 'linkedin'],
  [/^(?:www\.)?instagram\.com$/, 'instagram'],
  [/^(?:www\.|m\.)?youtube\.com$/, 'youtube'],
  [/^(?:www\.)?github\.com$/, 'github'],
  [/^(?:www\.)?tiktok\.com$/, 'tiktok'],
  [/^(?:[a-z]{2}\.)?pinterest\.com$/, 'pinterest'],
  [/^(?:www\.)?threads\.(?:net|com)$/, 'threads'],
  [/^bsky\.app$/, 'bluesky'],
  [/^(?:www\.)?xing\.com$/, 'xing'],
  [/^(?:www\.)?mastodon\.social$/, 'mastodon'],
];
const SHARE_PATH = /^\/(?:intent|share|sharer|sharer\.php|dialog|home\?status|shareArticle|pin\/create)/i;

/** Decodes Cloudflare's email obfuscation: hex, first byte the XOR key of the rest. */
export function decodeCfEmail(hex: string): string | null {
  if (!/^(?:[0-9a-f]{2}){2,256}$/i.test(hex)) return null;
  const key = parseInt(hex.slice(0, 2), 16);
  const bytes = new Uint8Array(hex.length / 2 - 1);
  for (let i = 2; i < hex.length; i += 2) bytes[i / 2 - 1] = parseInt(hex.slice(i, i + 2), 16) ^ key;
  // The bytes are UTF-8.
  const out = new TextDecoder('utf-8').decode(bytes);
  return out;
}

/** Emails written in text, including "[at]"/"(at)" and "[dot]" obfuscation. */
export function emailsInText(text: string): string[] {
  const plain = text.replace(/\s+/g, ' ').replace(AT, '@').replace(DOT, '.');
  const out: string[] = [];
  for (const m of plain.matchAll(EMAIL)) {
    const e = cleanEmail(m[0]);
    if (e && !out.includes(e)) out.push(e);
  }
  return out;
}

export function cleanEmail(raw: string): string | null {
  // An address has at most 254 characters: longer input is not one (and never reaches a regex).
  if (raw.length > 300) return null;
  const e = raw
    .trim()
    .replace(/^mailto:/i, '')
    .replace(/[.,;:]+$/, '')
    .toLowerCase();
  if (!/^[a-z0-9][a-z0-9._%+-]{0,63}@(?:[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?\.){1,8}[a-z]{2,24}$/.test(e)) return null;
  const tld = e.slice(e.lastIndexOf('.') + 1);
  if (NOT_TLD.has(tld)) return null;
  return e;
}

export function toE164(raw: string, country: string | null): string | null {
  if (raw.length > 100) return null;
  try {
    const p = parsePhoneNumberFromString(raw, country ? { defaultCountry: country as CountryCode } : {});
    return p && p.isValid() ? p.number : null;
  } catch {
    return null;
  }
}

function socialOf(url: string): string | null {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return null;
  }
  if (u.pathname === '/' || u.pathname === '' || SHARE_PATH.test(u.pathname)) return null;
  const host = u.hostname.toLowerCase();
  for (const [re, name] of NETWORKS) if (re.test(host)) return name;
  return null;
}

/** Text of the document, elements separated by spaces, scripts and styles left out; iterative (no recursion on nesting). */
function pageText($: CheerioAPI): string {
  type N = { type: string; name?: string; data?: string; children?: N[] };
  const root = $.root()[0] as unknown as N;
  const out: string[] = [];
  let length = 0;
  const todo: N[] = [root];
  while (todo.length && length < MAX_SCAN_CHARS) {
    const n = todo.pop()!;
    if (n.type === 'text') {
      out.push(n.data ?? '');
      length += (n.data ?? '').length;
      continue;
    }
    if (n.type === 'script' || n.type === 'style' || n.name === 'noscript' || n.name === 'template') continue;
    if (n.children) {
      out.push(' ');
      for (let i = n.children.length - 1; i >= 0; i--) todo.push(n.children[i]!);
    }
  }
  return out.join('').slice(0, MAX_SCAN_CHARS);
}

function str(v: unknown): string | null {
  if (typeof v === 'string') return cut(collapse(v), MAX_PART_CHARS) || null;
  if (typeof v === 'number') return String(v);
  if (v && typeof v === 'object' && typeof (v as Record<string, unknown>)['name'] === 'string') return str((v as Record<string, string>)['name']);
  return null;
}

/** Walks JSON-LD (depth ≤ 16, ≤ 10,000 nodes) for PostalAddress objects, `email` and `telephone`. */
function walkJsonLd(blocks: unknown[], found: { addresses: PostalAddress[]; emails: string[]; phones: string[] }): void {
  const todo: Array<{ v: unknown; depth: number }> = blocks.map((v) => ({ v, depth: 0 }));
  let visited = 0;
  while (todo.length && visited < 10_000) {
    const { v, depth } = todo.shift()!;
    visited++;
    if (!v || typeof v !== 'object' || depth > 16) continue;
    if (Array.isArray(v)) {
      for (const x of v) todo.push({ v: x, depth: depth + 1 });
      continue;
    }
    const o = v as Record<string, unknown>;
    const type = o['@type'];
    const types = Array.isArray(type) ? type : [type];
    if (types.includes('PostalAddress')) {
      const a: PostalAddress = {
        street: str(o['streetAddress']),
        locality: str(o['addressLocality']),
        region: str(o['addressRegion']),
        postal_code: str(o['postalCode']),
        country: str(o['addressCountry']),
        text: '',
      };
      a.text = [a.street, [a.postal_code, a.locality].filter(Boolean).join(' '), a.region, a.country].filter(Boolean).join(', ');
      if (a.text && found.addresses.length < MAX_ADDRESSES && !found.addresses.some((x) => x.text === a.text)) found.addresses.push(a);
    } else if (typeof o['address'] === 'string' && collapse(o['address'])) {
      const text = str(o['address'])!;
      if (found.addresses.length < MAX_ADDRESSES && !found.addresses.some((x) => x.text === text)) {
        found.addresses.push({ street: null, locality: null, region: null, postal_code: null, country: null, text });
      }
    }
    for (const e of [o['email']].flat()) if (typeof e === 'string' && found.emails.length < MAX_ITEMS) found.emails.push(e);
    for (const t of [o['telephone']].flat()) if (typeof t === 'string' && found.phones.length < MAX_ITEMS) found.phones.push(t);
    for (const [k, x] of Object.entries(o)) if (k !== '@context' && x && typeof x === 'object') todo.push({ v: x, depth: depth + 1 });
  }
}

export function contactPageTask(input: ContactPageInput): ContactPageOutput {
  const body = Buffer.from(input.body.buffer, input.body.byteOffset, input.body.byteLength);
  const capAt = htmlCapOffset(body, input.headerCharset);
  const $ = cheerio().loadBuffer(
    capAt === null ? body : body.subarray(0, capAt),
    input.headerCharset ? { encoding: { transportLayerEncodingLabel: input.headerCharset } } : {},
  );
  const base = input.baseUrl;
  const emails: string[] = [];
  const phones: string[] = [];
  const addEmail = (raw: string | null) => {
    const e = raw ? cleanEmail(raw) : null;
    if (e && !emails.includes(e) && emails.length < MAX_ITEMS) emails.push(e);
  };
  const addPhone = (raw: string) => {
    const p = toE164(raw, input.country);
    if (p && !phones.includes(p) && phones.length < MAX_ITEMS) phones.push(p);
  };

  // Cloudflare first: its placeholders ("[email&#160;protected]") are not addresses.
  $('[data-cfemail]').each((_, el) => {
    addEmail(decodeCfEmail($(el).attr('data-cfemail') ?? ''));
    $(el).text(' ');
  });
  const socials: ContactPageOutput['socials'] = [];
  const candidates: ContactPageOutput['candidates'] = [];
  $('a[href]').each((_, el) => {
    const href = ($(el).attr('href') ?? '').trim();
    const cf = /\/cdn-cgi\/l\/email-protection#([0-9a-f]+)/i.exec(href);
    if (cf) return void addEmail(decodeCfEmail(cf[1]!));
    if (/^mailto:/i.test(href)) {
      let addr = href.slice(7).split('?')[0] ?? '';
      try {
        addr = decodeURIComponent(addr);
      } catch {
        // as written
      }
      for (const a of addr.split(',')) addEmail(a);
      return;
    }
    if (/^tel:/i.test(href)) {
      let num = href.slice(4);
      try {
        num = decodeURIComponent(num);
      } catch {
        // as written
      }
      return void addPhone(num);
    }
    if (href.length > MAX_URL_CHARS) return;
    const url = absolute(href, base);
    if (!url || url.length > MAX_URL_CHARS || !/^https?:/i.test(url)) return;
    const clean = url.replace(/#.*$/, '');
    const network = socialOf(clean);
    if (network) {
      if (!socials.some((s) => s.url === clean) && socials.length < MAX_ITEMS) socials.push({ network, url: clean });
      return;
    }
    const text = collapse($(el).text()).slice(0, 200);
    if ((CANDIDATE.test(new URL(clean).pathname) || CANDIDATE.test(text)) && !candidates.some((c) => c.url === clean) && candidates.length < MAX_ITEMS) {
      candidates.push({ url: clean, text });
    }
  });

  const jsonld = { addresses: [] as PostalAddress[], emails: [] as string[], phones: [] as string[] };
  walkJsonLd(readJsonLd($, 50).blocks, jsonld);
  jsonld.emails.forEach(addEmail);
  jsonld.phones.forEach(addPhone);

  const text = pageText($);
  for (const e of emailsInText(text)) addEmail(e);
  try {
    // An iterator: the search stops once MAX_ITEMS numbers are in.
    for (const found of searchPhoneNumbersInText(text, input.country ? { defaultCountry: input.country as CountryCode } : undefined)) {
      if (phones.length >= MAX_ITEMS) break;
      if (found.number.isValid() && !phones.includes(found.number.number)) phones.push(found.number.number);
    }
  } catch {
    // an unknown region: only tel: links and international numbers count
  }

  const forms: ContactPageOutput['forms'] = [];
  $('form').each((_, el) => {
    if (forms.length >= 50) return false;
    const $f = $(el);
    const rawAction = $f.attr('action') ?? '';
    const resolved = rawAction.length <= MAX_URL_CHARS ? absolute(rawAction, base) : null;
    const action = resolved && resolved.length <= MAX_URL_CHARS ? resolved : base;
    const method = ($f.attr('method') ?? 'get').trim().toUpperCase() === 'POST' ? 'POST' : 'GET';
    const fields: string[] = [];
    $f.find('input[name], textarea[name], select[name]').each((_, f) => {
      const type = ($(f).attr('type') ?? '').toLowerCase();
      const name = cut($(f).attr('name')!.trim(), MAX_PART_CHARS);
      if (type !== 'hidden' && name && !fields.includes(name) && fields.length < 50) fields.push(name);
    });
    forms.push({ action, method, fields });
    return undefined;
  });

  return { emails, phones, socials, addresses: jsonld.addresses, forms, candidates, truncated: capAt !== null };
}
