import { FINGERPRINTS, FINGERPRINTS_VERSION, type Fingerprint } from './fingerprints.js';
import { htmlCapOffset } from './extract.js';
import { cheerio } from '../heavy.js';

/** Loads cheerio while the sandbox thread loads this module (src/tools/heavy.ts). */
export const warm = (): void => void cheerio();

/**
 * grabr_intel's pool task (tasks.ts `intel_page`): the home page's SEO basics and the technology
 * fingerprints matched against its headers, cookies and markup. Runs in a sandbox thread: the markup
 * is a stranger's. The module loads without side effects.
 */

/** Fingerprint HTML patterns run on at most this much of the page. */
const HTML_SCAN_CHARS = 512 * 1024;

export interface IntelPageInput {
  body: Uint8Array;
  baseUrl: string;
  headerCharset: string | null;
  /** Response headers, lower-case names (set-cookie lines joined with "\n"). */
  headers: Record<string, string>;
  /** Whether the body is HTML (otherwise only the headers are fingerprinted). */
  html: boolean;
}

export interface SeoBasics {
  title: string | null;
  title_length: number;
  description: string | null;
  description_length: number;
  canonical: string | null;
  h1_count: number;
  h1: string[];
  robots_meta: string | null;
  lang: string | null;
  viewport: boolean;
  og_title: string | null;
  og_image: string | null;
  hreflang: string[];
  /** Plain checks that failed: "missing title", "2 h1 headings", "noindex"... */
  issues: string[];
}

export interface TechHit {
  name: string;
  category: string;
  version: string | null;
  evidence: string[];
}

export interface IntelPageOutput {
  seo: SeoBasics | null;
  tech: TechHit[];
  fingerprints_version: string;
  /** The markup passed the parse caps and only the part before them was read. */
  capped: boolean;
}

const collapse = (s: string) => s.replace(/\s+/g, ' ').trim();
const clip = (s: string, n = 160) => (s.length > n ? `${s.slice(0, n - 3)}...` : s);

export function intelPageTask(input: IntelPageInput): IntelPageOutput {
  const buf = Buffer.from(input.body.buffer, input.body.byteOffset, input.body.byteLength);
  let seo: SeoBasics | null = null;
  let meta: Record<string, string> = {};
  let scripts: string[] = [];
  let html = '';
  let capped = false;
  if (input.html && buf.length) {
    const cut = htmlCapOffset(buf, input.headerCharset);
    capped = cut !== null;
    const $ = cheerio().loadBuffer(
      cut === null ? buf : buf.subarray(0, cut),
      input.headerCharset ? { encoding: { transportLayerEncodingLabel: input.headerCharset } } : {},
    );
    meta = {};
    $('meta[name]').each((_, el) => {
      const name = ($(el).attr('name') ?? '').trim().toLowerCase();
      const content = $(el).attr('content');
      if (name && content !== undefined && !(name in meta)) meta[name] = content.trim();
    });
    const prop = (p: string) => $(`meta[property="${p}"]`).first().attr('content')?.trim() || null;
    scripts = $('script[src]')
      .map((_, el) => $(el).attr('src') ?? '')
      .get()
      .filter(Boolean)
      .slice(0, 500);
    const abs = (href: string | undefined) => {
      if (!href) return null;
      try {
        return new URL(href.trim(), input.baseUrl).href;
      } catch {
        return href.trim();
      }
    };
    const title = collapse($('title').first().text()) || null;
    const description = meta['description'] ?? null;
    const h1 = $('h1')
      .map((_, el) => clip(collapse($(el).text())))
      .get();
    seo = {
      title,
      title_length: title?.length ?? 0,
      description,
      description_length: description?.length ?? 0,
      canonical: abs($('link[rel~="canonical" i]').first().attr('href')),
      h1_count: h1.length,
      h1: h1.slice(0, 10),
      robots_meta: meta['robots'] ?? null,
      lang: $('html').attr('lang')?.trim() || null,
      viewport: 'viewport' in meta,
      og_title: prop('og:title'),
      og_image: abs(prop('og:image') ?? undefined),
      hreflang: $('link[rel~="alternate" i][hreflang]')
        .map((_, el) => ($(el).attr('hreflang') ?? '').trim())
        .get()
        .filter(Boolean)
        .slice(0, 50),
      issues: [],
    };
    seo.issues = seoIssues(seo, input.headers['x-robots-tag'] ?? null);
    html = buf
      .subarray(0, cut ?? buf.length)
      .toString('latin1')
      .slice(0, HTML_SCAN_CHARS);
  }
  return { seo, tech: matchFingerprints({ headers: input.headers, meta, scripts, html }), fingerprints_version: FINGERPRINTS_VERSION, capped };
}

export function seoIssues(seo: SeoBasics, xRobots: string | null): string[] {
  const issues: string[] = [];
  if (!seo.title) issues.push('missing title');
  else if (seo.title_length > 60) issues.push(`title is ${seo.title_length} characters (over 60 may be cut in results)`);
  if (!seo.description) issues.push('missing meta description');
  else if (seo.description_length > 160) issues.push(`meta description is ${seo.description_length} characters (over 160 may be cut)`);
  if (seo.h1_count === 0) issues.push('no h1 heading');
  else if (seo.h1_count > 1) issues.push(`${seo.h1_count} h1 headings`);
  if (!seo.canonical) issues.push('no canonical link');
  if (!seo.lang) issues.push('no lang attribute on <html>');
  if (!seo.viewport) issues.push('no viewport meta (not mobile-friendly)');
  if (/\bnoindex\b/i.test(seo.robots_meta ?? '')) issues.push('robots meta says noindex');
  if (/\bnoindex\b/i.test(xRobots ?? '')) issues.push('X-Robots-Tag says noindex');
  return issues;
}

/** Matches the fingerprint table; results keep the table's order (deterministic). */
export function matchFingerprints(page: { headers: Record<string, string>; meta: Record<string, string>; scripts: string[]; html: string }): TechHit[] {
  const cookies = (page.headers['set-cookie'] ?? '')
    .split('\n')
    .map((c) => c.split('=')[0]!.trim())
    .filter(Boolean);
  const hits: TechHit[] = [];
  for (const fp of FINGERPRINTS) {
    const evidence: string[] = [];
    let version: string | null = null;
    const note = (what: string, m: RegExpExecArray | true) => {
      evidence.push(clip(what, 200));
      if (m !== true && m[1] && !version) version = m[1];
    };
    for (const [name, pattern] of Object.entries(fp.headers ?? {})) {
      const value = page.headers[name];
      if (value === undefined) continue;
      if (pattern === '') note(`header ${name}`, true);
      else {
        const m = pattern.exec(value);
        if (m) note(`header ${name}: ${value}`, m);
      }
    }
    if (fp.cookies) for (const c of cookies) if (fp.cookies.test(c)) note(`cookie ${c}`, true);
    for (const [name, pattern] of Object.entries(fp.meta ?? {})) {
      const value = page.meta[name];
      const m = value !== undefined ? pattern.exec(value) : null;
      if (m) note(`meta ${name}: ${value}`, m);
    }
    for (const pattern of fp.scripts ?? []) {
      for (const src of page.scripts) {
        const m = pattern.exec(src);
        if (m) {
          note(`script ${src}`, m);
          break;
        }
      }
    }
    for (const pattern of fp.html ?? []) {
      const m = page.html ? pattern.exec(page.html) : null;
      if (m) note(`html ${m[0]}`, m);
    }
    if (evidence.length) hits.push({ name: fp.name, category: fp.category, version, evidence: [...new Set(evidence)].slice(0, 5) });
  }
  return hits;
}

export type { Fingerprint };
