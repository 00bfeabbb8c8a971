import zlib from 'node:zlib';
import { XMLParser } from 'fast-xml-parser';
import { getDomain } from 'tldts';
import { AppError } from '../../errors.js';

/**
 * grabr_sitemap's pool task: one sitemap file, gunzipped (a gzip stream, recognised by its magic
 * bytes whatever the server calls it, is inflated to at most `maxBytes`: a gzip bomb stops there with
 * limit_exceeded), refused when it holds a DOCTYPE or ENTITY declaration (billion laughs, external
 * entities), then parsed by fast-xml-parser with entity processing off. Returns the `<sitemap>`
 * children of an index, or the `<url>` entries of a urlset that pass the filters, from `skip` on,
 * as many as fit `take` and `budgetBytes` (pool results are size-capped: the handler asks again from
 * `next`). Loads without side effects.
 */

export interface SitemapTaskInput {
  body: Uint8Array;
  /** Largest decompressed size, in bytes. */
  maxBytes: number;
  /** The site's host name and registrable domain (null for IP addresses and hosts without one). */
  siteHost: string;
  siteDomain: string | null;
  pathPrefix: string | null;
  /** Keep only entries whose lastmod is at or after this instant (ms since the epoch); entries without lastmod are dropped. */
  sinceMs: number | null;
  skip: number;
  take: number;
  budgetBytes: number;
}

export interface SitemapEntry {
  loc: string;
  lastmod: string | null;
  priority: number | null;
}

export interface SitemapTaskOutput {
  kind: 'urlset' | 'index';
  /** An index's child sitemaps on the same site (at most MAX_INDEX_CHILDREN). */
  sitemaps: string[];
  /** The entries taken, in columns (a smaller pool result than one object per entry): loc, lastmod, priority 0..1. */
  locs: string[];
  lastmods: Array<string | null>;
  priorities: Array<number | null>;
  /** Entries passing the filters in the whole file. */
  matched: number;
  /** Where the next call continues (an index into the matching entries), or null when done. */
  next: number | null;
  /** Entries on another site, dropped. */
  foreign: number;
  bytes: number;
}

export const MAX_INDEX_CHILDREN = 1_000;
/** The sitemap protocol's limit on a URL's length: longer <loc> values are skipped. */
export const MAX_LOC_CHARS = 2_048;

/** The entries of a task's answer as objects. */
export function entriesOf(out: Pick<SitemapTaskOutput, 'locs' | 'lastmods' | 'priorities'>): SitemapEntry[] {
  return out.locs.map((loc, i) => ({ loc, lastmod: out.lastmods[i] ?? null, priority: out.priorities[i] ?? null }));
}

/** Same registrable domain (tldts), or the same host for IP addresses and hosts without a public suffix. */
export function sameSite(url: string, siteHost: string, siteDomain: string | null): boolean {
  let host: string;
  try {
    const u = new URL(url);
    if (u.protocol !== 'http:' && u.protocol !== 'https:') return false;
    host = u.hostname.toLowerCase();
  } catch {
    return false;
  }
  if (host === siteHost) return true;
  if (!siteDomain) return false;
  return getDomain(host) === siteDomain;
}

/** The site's identity for sameSite. */
export function siteOf(url: string): { siteHost: string; siteDomain: string | null } {
  const host = new URL(url).hostname.toLowerCase();
  return { siteHost: host, siteDomain: getDomain(host) ?? null };
}

const ENTITY = /&(?:#(\d{1,7})|#x([0-9a-f]{1,6})|(amp|lt|gt|quot|apos));/gi;
const NAMED: Record<string, string> = { amp: '&', lt: '<', gt: '>', quot: '"', apos: "'" };

/** XML's predefined entities and character references (the parser leaves them: entity processing is off). */
function decodeXml(s: string): string {
  return s.replace(ENTITY, (m, dec: string | undefined, hex: string | undefined, name: string | undefined) => {
    if (name) return NAMED[name.toLowerCase()] ?? m;
    const cp = dec ? Number(dec) : parseInt(hex!, 16);
    return cp > 0 && cp <= 0x10ffff ? String.fromCodePoint(cp) : m;
  });
}

function text(v: unknown): string | null {
  if (typeof v === 'string') return decodeXml(v.trim()) || null;
  if (typeof v === 'number') return String(v);
  if (v && typeof v === 'object' && '#text' in (v as Record<string, unknown>)) return text((v as Record<string, unknown>)['#text']);
  return null;
}

export function inflateCapped(buf: Buffer, maxBytes: number): Buffer {
  if (!(buf.length >= 2 && buf[0] === 0x1f && buf[1] === 0x8b)) {
    if (buf.length > maxBytes)
      throw new AppError('limit_exceeded', `the sitemap is larger than ${maxBytes} bytes`, { limit: 'size', limit_value: maxBytes, reason: 'too_large' });
    return buf;
  }
  try {
    return zlib.gunzipSync(buf, { maxOutputLength: maxBytes });
  } catch (e) {
    if ((e as { code?: string }).code === 'ERR_BUFFER_TOO_LARGE' || e instanceof RangeError) {
      throw new AppError('limit_exceeded', `the gzipped sitemap inflates past ${maxBytes} bytes and was not read`, {
        limit: 'size',
        limit_value: maxBytes,
        reason: 'decompressed_too_large',
      });
    }
    throw new AppError('fetch_failed', 'the sitemap is not a valid gzip file', { reason: 'invalid_response' });
  }
}

/** A DOCTYPE or ENTITY declaration anywhere (case-insensitive): such a sitemap is refused before parsing. */
export function hasDoctype(xml: Buffer): boolean {
  // Markup is ASCII in UTF-8 and latin1; UTF-16 sitemaps are not used in practice (and are refused below).
  return /<!\s*(?:doctype|entity)/i.test(xml.toString('latin1'));
}

export function sitemapTask(input: SitemapTaskInput): SitemapTaskOutput {
  const raw = Buffer.from(input.body.buffer, input.body.byteOffset, input.body.byteLength);
  const xml = inflateCapped(raw, input.maxBytes);
  if (hasDoctype(xml)) {
    throw new AppError('invalid_input', 'the sitemap declares a DOCTYPE or ENTITY and was refused (entity expansion is never performed)', {
      reason: 'doctype_refused',
    });
  }
  if ((xml[0] === 0xff && xml[1] === 0xfe) || (xml[0] === 0xfe && xml[1] === 0xff)) {
    throw new AppError('invalid_input', 'UTF-16 sitemaps are not read', { reason: 'unsupported_encoding' });
  }
  const parser = new XMLParser({
    ignoreAttributes: true,
    removeNSPrefix: true,
    processEntities: false,
    htmlEntities: false,
    parseTagValue: false,
    trimValues: true,
    ignoreDeclaration: true,
    ignorePiTags: true,
    isArray: (name) => name === 'url' || name === 'sitemap',
  });
  let doc: Record<string, unknown>;
  try {
    doc = parser.parse(xml.toString('utf8')) as Record<string, unknown>;
  } catch (e) {
    throw new AppError('fetch_failed', `the sitemap is not well-formed XML: ${e instanceof Error ? e.message : String(e)}`, { reason: 'invalid_response' });
  }
  const out: SitemapTaskOutput = {
    kind: 'urlset',
    sitemaps: [],
    locs: [],
    lastmods: [],
    priorities: [],
    matched: 0,
    next: null,
    foreign: 0,
    bytes: xml.length,
  };
  const index = doc['sitemapindex'] as Record<string, unknown> | undefined;
  if (index && typeof index === 'object') {
    out.kind = 'index';
    for (const s of (index['sitemap'] as unknown[] | undefined) ?? []) {
      const loc = text((s as Record<string, unknown> | null)?.['loc']);
      if (!loc || loc.length > MAX_LOC_CHARS) continue;
      if (!sameSite(loc, input.siteHost, input.siteDomain)) {
        out.foreign++;
        continue;
      }
      if (out.sitemaps.length < MAX_INDEX_CHILDREN && !out.sitemaps.includes(loc)) out.sitemaps.push(loc);
    }
    return out;
  }
  const set = doc['urlset'] as Record<string, unknown> | undefined;
  if (!set || typeof set !== 'object') {
    if (set === undefined) throw new AppError('fetch_failed', 'the document is neither a <urlset> nor a <sitemapindex>', { reason: 'not_a_sitemap' });
    return out; // <urlset/> with no entries
  }
  let budget = input.budgetBytes;
  // Most entries share a host: decide each host once.
  const hostVerdict = new Map<string, boolean>();
  for (const u of (set['url'] as unknown[] | undefined) ?? []) {
    const e = u as Record<string, unknown> | null;
    const loc = text(e?.['loc']);
    if (!loc || loc.length > MAX_LOC_CHARS) continue;
    let parsed: URL;
    try {
      parsed = new URL(loc);
    } catch {
      continue;
    }
    let same = hostVerdict.get(parsed.host);
    if (same === undefined) {
      same = sameSite(parsed.href, input.siteHost, input.siteDomain);
      hostVerdict.set(parsed.host, same);
    }
    if (!same || (parsed.protocol !== 'http:' && parsed.protocol !== 'https:')) {
      out.foreign++;
      continue;
    }
    if (input.pathPrefix && !parsed.pathname.startsWith(input.pathPrefix)) continue;
    const rawLastmod = text(e?.['lastmod']);
    const lastmod = rawLastmod && rawLastmod.length <= 64 ? rawLastmod : null;
    if (input.sinceMs !== null) {
      const t = lastmod ? Date.parse(lastmod) : NaN;
      if (!(t >= input.sinceMs)) continue;
    }
    const position = out.matched++;
    if (position < input.skip || out.next !== null) continue;
    const rawPriority = text(e?.['priority']);
    const p = rawPriority === null ? NaN : Number(rawPriority);
    const priority = Number.isFinite(p) && p >= 0 && p <= 1 ? p : null;
    // The entry's JSON size in the columnar result (see SitemapTaskOutput).
    const cost = JSON.stringify(loc).length + (lastmod ? JSON.stringify(lastmod).length : 4) + (priority === null ? 4 : String(priority).length) + 3;
    if (out.locs.length >= input.take || cost > budget) {
      out.next = position;
      continue;
    }
    budget -= cost;
    out.locs.push(loc);
    out.lastmods.push(lastmod);
    out.priorities.push(priority);
  }
  // Nothing more is wanted: no continuation.
  if (out.next !== null && out.locs.length >= input.take) out.next = null;
  return out;
}
