import { describe, expect, it } from 'vitest';
import { gzipSync } from 'node:zlib';
import { AppError } from '../../../src/errors.js';
import { entriesOf, sameSite, siteOf, sitemapTask, type SitemapTaskInput } from '../../../src/tools/web/sitemap-task.js';

const base = (body: string | Buffer, over: Partial<SitemapTaskInput> = {}): SitemapTaskInput => ({
  body: typeof body === 'string' ? Buffer.from(body) : body,
  maxBytes: 1_000_000,
  ...siteOf('https://www.example.co.uk/'),
  pathPrefix: null,
  sinceMs: null,
  skip: 0,
  take: 50_000,
  budgetBytes: 600_000,
  ...over,
});

const urlset = (n: number, host = 'https://www.example.co.uk') =>
  `<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">${Array.from(
    { length: n },
    (_, i) => `<url><loc>${host}/p/${i}</loc><lastmod>2025-01-${String((i % 28) + 1).padStart(2, '0')}</lastmod><priority>0.5</priority></url>`,
  ).join('')}</urlset>`;

/** The task's answer with its entry columns as objects. */
function run(input: SitemapTaskInput) {
  const out = sitemapTask(input);
  return { ...out, urls: entriesOf(out) };
}

function fails(input: SitemapTaskInput): AppError {
  try {
    sitemapTask(input);
  } catch (e) {
    if (e instanceof AppError) return e;
    throw e;
  }
  throw new Error('did not throw');
}

describe('sitemap pool task', () => {
  it('reads a urlset: entities decoded, priority a number, same registrable domain only', () => {
    const xml = `<urlset><url><loc>https://shop.example.co.uk/a?x=1&amp;y=2</loc><priority>0.9</priority></url>
      <url><loc>https://evil.co.uk/b</loc></url><url><loc>https://www.example.co.uk/c</loc><priority>7</priority></url></urlset>`;
    const out = run(base(xml));
    expect(out.kind).toBe('urlset');
    expect(out.urls).toEqual([
      { loc: 'https://shop.example.co.uk/a?x=1&y=2', lastmod: null, priority: 0.9 },
      { loc: 'https://www.example.co.uk/c', lastmod: null, priority: null },
    ]);
    expect(out.foreign).toBe(1);
    expect(out.matched).toBe(2);
  });

  it('reads an index (namespaced tags too) and keeps same-site children', () => {
    const xml = `<s:sitemapindex xmlns:s="http://www.sitemaps.org/schemas/sitemap/0.9"><s:sitemap><s:loc>https://example.co.uk/a.xml.gz</s:loc></s:sitemap>
      <s:sitemap><s:loc>https://other.example/b.xml</s:loc></s:sitemap></s:sitemapindex>`;
    const out = run(base(xml));
    expect(out).toMatchObject({ kind: 'index', sitemaps: ['https://example.co.uk/a.xml.gz'], foreign: 1 });
  });

  it('gunzips by magic bytes, and a gzip bomb stops at maxBytes with limit_exceeded', () => {
    expect(run(base(gzipSync(urlset(3)))).urls).toHaveLength(3);
    const t0 = Date.now();
    const err = fails(base(gzipSync(Buffer.alloc(50_000_000)), { maxBytes: 1_000_000 }));
    expect(err.code).toBe('limit_exceeded');
    expect(err.details).toMatchObject({ reason: 'decompressed_too_large', limit_value: 1_000_000 });
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect(fails(base(Buffer.from([0x1f, 0x8b, 1, 2, 3]))).code).toBe('fetch_failed');
  });

  it('refuses DOCTYPE and ENTITY declarations before parsing (billion laughs, XXE)', () => {
    const lol = '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;">]><urlset><url><loc>&lol2;</loc></url></urlset>';
    expect(fails(base(lol)).details).toMatchObject({ reason: 'doctype_refused' });
    expect(fails(base('<urlset><!eNtItY x SYSTEM "file:///etc/passwd"></urlset>')).code).toBe('invalid_input');
    expect(fails(base(gzipSync(lol))).code).toBe('invalid_input');
  });

  it('filters by path prefix and lastmod, and pages its answer by take, budget and skip', () => {
    const xml = urlset(100);
    const since = run(base(xml, { sinceMs: Date.parse('2025-01-27') }));
    expect(since.matched).toBe(6); // days 27 and 28: i = 26, 27, 54, 55, 82, 83
    expect(since.urls.every((u) => u.lastmod! >= '2025-01-27')).toBe(true);
    expect(run(base(xml, { pathPrefix: '/p/1' })).matched).toBe(11);
    const first = run(base(xml, { take: 10 }));
    expect(first.urls.map((u) => u.loc.split('/').pop())).toEqual(['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']);
    expect(first).toMatchObject({ matched: 100, next: null });
    const budgeted = run(base(xml, { budgetBytes: 1_000 }));
    expect(budgeted.next).toBe(budgeted.urls.length);
    expect(budgeted.urls.length).toBeGreaterThan(0);
    const rest = run(base(xml, { skip: budgeted.next! }));
    expect(budgeted.urls.length + rest.urls.length).toBe(100);
    expect(rest.next).toBeNull();
  });

  it('a document that is not a sitemap fails', () => {
    expect(fails(base('<html><body>hi</body></html>')).details).toMatchObject({ reason: 'not_a_sitemap' });
  });

  it('sameSite: registrable domain, or the exact host for IP addresses', () => {
    const s = siteOf('http://127.0.0.1:8080/');
    expect(sameSite('http://127.0.0.1:9/x', s.siteHost, s.siteDomain)).toBe(true);
    expect(sameSite('http://127.0.0.2/x', s.siteHost, s.siteDomain)).toBe(false);
    const e = siteOf('https://blog.example.com/');
    expect(sameSite('https://example.com/a', e.siteHost, e.siteDomain)).toBe(true);
    expect(sameSite('https://example.com.evil.net/a', e.siteHost, e.siteDomain)).toBe(false);
    expect(sameSite('ftp://example.com/a', e.siteHost, e.siteDomain)).toBe(false);
  });
});
