import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { gzipSync } from 'node:zlib';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { startFixtureSite, type FixtureSite } from '../helpers/fixture-site.js';
import { findTool } from '../../src/tools/index.js';

let h: Harness;
let site: FixtureSite;
/** A second site whose robots.txt names a missing sitemap (relative) and serves /sitemap.xml gzip-encoded. */
let site2: FixtureSite;
/** An HTTPS site with a self-signed certificate: the guard does not trust it. */
let tls: FixtureSite;
let key: string;
let accountId: string;

const PAGE = `<!doctype html><html lang="en"><head><title> Acme  Widgets </title>
<link rel="canonical" href="/widgets">
<meta property="og:title" content="Acme OG"><meta property="og:type" content="website">
<script type="application/ld+json">{"@context":"https://schema.org","@type":"Product","name":"Widget","offers":{"price":"9.99"}}</script>
<script type="application/ld+json">not json</script>
</head><body><h1>Widgets</h1>
<ul><li class="item"><a href="/w/1">One</a></li><li class="item"><a href="/w/2">Two</a></li></ul>
<p class="price" data-sku="W-1">$9.99</p><img src="img/w.png"></body></html>`;

/** A gunzipped sitemap may be at most this big in these tests (GRABR_SITEMAP_MAX_BYTES). */
const SITEMAP_CAP = 8_000_000;

/** Cloudflare's email obfuscation: a key byte, then the address XOR the key, in hex. */
const cfEncode = (key: number, email: string) => key.toString(16).padStart(2, '0') + Buffer.from(Buffer.from(email).map((b) => b ^ key)).toString('hex');

function routeContactSite(): void {
  site.route('/c/', {
    body: `<html><body><nav><a href="/c/about">About us</a> <a href="/c/team">Team</a> <a href="/w/1">Products</a>
      <a href="http://elsewhere.example/contact">Partner contact</a> <a href="/c/support">Support</a></nav>
      <footer><a href="mailto:hello@acme.test?subject=Hi">Mail</a> <a href="tel:+49 30 1234567">Call</a>
      <a href="https://twitter.com/acmewidgets">X</a> <a href="https://twitter.com/intent/tweet?text=hi">share</a>
      <a href="https://www.linkedin.com/company/acme">LinkedIn</a> <img src="logo@2x.png"></footer></body></html>`,
  });
  site.route('/c/about', {
    body: `<html><body><p>Press: press [at] acme [dot] test</p>
      <p>Support: <a href="/cdn-cgi/l/email-protection" class="__cf_email__" data-cfemail="${cfEncode(0x42, 'info@acme.test')}">[email&#160;protected]</a></p>
      <a href="/c/imprint">Imprint</a> <a href="mailto:hello@acme.test">Mail</a></body></html>`,
  });
  site.route('/c/imprint', {
    body: `<html><head><script type="application/ld+json">{"@context":"https://schema.org","@type":"Organization","name":"Acme",
      "address":{"@type":"PostalAddress","streetAddress":"Hauptstr. 1","postalCode":"10115","addressLocality":"Berlin","addressCountry":"DE"},
      "telephone":"+49 30 5550000"}</script></head>
      <body><h1>Impressum</h1><p>E-Mail: legal@acme.test</p><p>Telefon: 030 98765432</p>
      <form action="/c/send" method="post"><input name="email"><textarea name="message"></textarea><input type="hidden" name="token"></form></body></html>`,
  });
  site.route('/c/team', { body: '<html><body>team@acme.test</body></html>' });
  site.route('/c/support', { status: 301, headers: { location: '/c/' } });
}

const xmlUrlset = (locs: Array<string | { loc: string; lastmod?: string; priority?: string }>) =>
  `<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">` +
  locs
    .map((l) => (typeof l === 'string' ? { loc: l } : l))
    .map((l) => `<url><loc>${l.loc}</loc>${l.lastmod ? `<lastmod>${l.lastmod}</lastmod>` : ''}${l.priority ? `<priority>${l.priority}</priority>` : ''}</url>`)
    .join('') +
  '</urlset>';

function routeSitemaps(): void {
  const gz = { 'content-type': 'application/gzip' };
  site.route('/sm/index.xml', {
    headers: { 'content-type': 'application/xml' },
    body: `<?xml version="1.0"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
      <sitemap><loc>${site.url('/sm/a.xml.gz')}</loc></sitemap><sitemap><loc>${site.url('/sm/b.xml.gz')}</loc></sitemap>
      <sitemap><loc>http://elsewhere.example/sm.xml</loc></sitemap></sitemapindex>`,
  });
  site.route('/sm/a.xml.gz', {
    headers: gz,
    body: gzipSync(
      xmlUrlset([
        { loc: site.url('/blog/1'), lastmod: '2025-03-01', priority: '0.8' },
        { loc: site.url('/blog/2'), lastmod: '2024-01-01' },
        site.url('/about'),
        'http://elsewhere.example/x',
      ]),
    ),
  });
  site.route('/sm/b.xml.gz', {
    headers: gz,
    body: gzipSync(
      xmlUrlset([site.url('/p/1?a=1&amp;b=2'), site.url('/p/2'), site.url('/p/3'), { loc: site.url('/blog/3'), lastmod: '2025-06-30T10:00:00Z' }]),
    ),
  });
  site.route('/sm/lol.xml', {
    headers: { 'content-type': 'application/xml' },
    body:
      '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">' +
      Array.from({ length: 9 }, (_, i) => `<!ENTITY lol${i + 1} "${`&lol${i || ''};`.repeat(10)}">`).join('') +
      ']><urlset><url><loc>&lol9;</loc></url></urlset>',
  });
  // 100 MB of zeros, about 100 KB gzipped: far past SITEMAP_CAP once inflated.
  site.route('/sm/bomb.xml.gz', { headers: gz, body: gzipSync(Buffer.alloc(100_000_000), { level: 9 }) });
  site.route('/big/sitemap.xml', {
    headers: { 'content-type': 'application/xml' },
    body: xmlUrlset(Array.from({ length: 50_000 }, (_, i) => site.url(`/item/${i}`))),
  });
}

function validates(tool: string, result: unknown): void {
  const schema = findTool(tool)!.outputSchema!;
  const r = schema.safeParse(result);
  if (!r.success) throw new Error(`${tool} result fails its outputSchema: ${r.error.message}`);
}

beforeAll(async () => {
  site = await startFixtureSite();
  site2 = await startFixtureSite();
  tls = await startFixtureSite({ https: true });
  h = await startHarness(
    { FETCH_ALLOWED_HOSTS: `${site.hostPort},${site2.hostPort},${tls.hostPort}`, GRABR_SITEMAP_MAX_BYTES: String(SITEMAP_CAP) },
    { workers: ['web'] },
  );
  const acct = await h.account('enterprise', 1000);
  key = acct.apiKey;
  accountId = acct.accountId;
  site.route('/robots.txt', {
    headers: { 'content-type': 'text/plain' },
    body: `User-agent: *\nDisallow: /private\nDisallow: /c/team\n\nUser-agent: OtherBot\nDisallow: /\n\nSitemap: ${site.url('/sm/index.xml')}\nSitemap: http://elsewhere.example/sitemap.xml\n`,
  });
  site.route('/', { body: PAGE });
  routeContactSite();
  routeSitemaps();
});
afterAll(async () => {
  await h?.close();
  await site?.close();
  await site2?.close();
  await tls?.close();
});

describe('catalogue', () => {
  it('GET /tools/{name} and /openapi.json describe the four tools with input and output schemas', async () => {
    for (const name of ['grabr_scrape', 'grabr_contact', 'grabr_sitemap', 'grabr_batch']) {
      const res = await h.request({ method: 'GET', url: `/tools/${name}` });
      expect(res.statusCode, `${name}: ${res.body}`).toBe(200);
      const body = json(res);
      expect(body.input_schema, name).toBeTruthy();
      expect(body.output_schema, name).toBeTruthy();
    }
    const api = await h.request({ method: 'GET', url: '/openapi.json' });
    expect(api.statusCode).toBe(200);
    expect(api.body).toContain('grabr_batch');
  });
});

describe('grabr_scrape', () => {
  it('returns the exact fixture values, as GRABR_USER_AGENT', async () => {
    const res = await h.call(
      'grabr_scrape',
      {
        url: site.url('/'),
        fields: {
          heading: { selector: 'h1' },
          items: { selector: 'li.item a', attr: 'href', all: true },
          names: { selector: 'li.item', all: true },
          sku: { selector: '.price', attr: 'data-sku' },
          image: { selector: 'img', attr: 'src' },
          missing: 'h6',
        },
      },
      key,
    );
    expect(res.statusCode).toBe(200);
    const { result } = json(res);
    validates('grabr_scrape', result);
    expect(result.final_url).toBe(site.url('/'));
    expect(result.status).toBe(200);
    expect(result.fields).toEqual({
      heading: 'Widgets',
      items: [site.url('/w/1'), site.url('/w/2')],
      names: ['One', 'Two'],
      sku: 'W-1',
      image: site.url('/img/w.png'),
      missing: null,
    });
    expect(result.metadata).toEqual({ title: 'Acme Widgets', canonical: site.url('/widgets'), og: { 'og:title': 'Acme OG', 'og:type': 'website' } });
    expect(result.jsonld).toEqual([{ '@context': 'https://schema.org', '@type': 'Product', name: 'Widget', offers: { price: '9.99' } }]);
    expect(result.links).toEqual([
      { url: site.url('/w/1'), text: 'One' },
      { url: site.url('/w/2'), text: 'Two' },
    ]);
    expect(result.text).toContain('Widgets');
    expect(result.truncated).toBe(false);
    const pageReq = site.requestsFor('/').at(-1)!;
    expect(pageReq.headers['user-agent']).toBe(h.config.GRABR_USER_AGENT);
    expect(site.requestsFor('/robots.txt')[0]!.headers['user-agent']).toBe(h.config.GRABR_USER_AGENT);
  }, 30_000);

  it('an HTTPS site with an untrusted certificate is 502 fetch_failed (tls_error), uncharged', async () => {
    tls.route('/', { body: PAGE });
    const res = await h.call('grabr_scrape', { url: tls.url('/') }, key);
    expect(res.statusCode).toBe(502);
    expect(json(res).error).toMatchObject({ code: 'fetch_failed', reason: 'tls_error' });
    expect(await h.credits(accountId)).toBe(1000);
  });

  it('a bad selector is 400 invalid_input before anything is fetched', async () => {
    const before = site.requests.length;
    const res = await h.call('grabr_scrape', { url: site.url('/'), fields: { x: { selector: 'a[' } } }, key);
    expect(res.statusCode).toBe(400);
    expect(json(res).error.code).toBe('invalid_input');
    const res2 = await h.call('grabr_scrape', { url: site.url('/'), fields: { x: 'div:nosuchpseudo' } }, key);
    expect(res2.statusCode).toBe(400);
    expect(site.requests.length).toBe(before);
  });

  it('a 100 MB page stops at the byte cap and a deeply nested one at the parse cap: truncated results, no freeze', async () => {
    site.route('/huge', async (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.write('<html><head><title>Huge</title></head><body><h1>Big</h1>');
      const chunk = Buffer.from('<p>lorem ipsum dolor sit amet</p>'.repeat(32_768)); // ~1 MB
      for (let sent = 0; sent < 100_000_000 && !res.destroyed; sent += chunk.length) {
        if (!res.write(chunk))
          await new Promise<void>((r) => {
            res.once('drain', r);
            res.once('close', r);
          });
      }
      res.end();
    });
    site.route('/deep', {
      body: `<html><head><title>Deep</title></head><body><h1>Top</h1>${'<div>'.repeat(100_000)}x${'</div>'.repeat(100_000)}</body></html>`,
    });
    const t0 = Date.now();
    const huge = await h.call('grabr_scrape', { url: site.url('/huge'), fields: { h: 'h1' } }, key);
    expect(huge.statusCode, huge.body).toBe(200);
    expect(json(huge).result).toMatchObject({ fields: { h: 'Big' }, metadata: { title: 'Huge' }, truncated: true });
    const deep = await h.call('grabr_scrape', { url: site.url('/deep'), fields: { h: 'h1' } }, key);
    expect(deep.statusCode, deep.body).toBe(200);
    expect(json(deep).result).toMatchObject({ fields: { h: 'Top' }, metadata: { title: 'Deep' }, truncated: true });
    expect(Date.now() - t0).toBeLessThan(25_000);
  }, 40_000);

  it('a path robots.txt disallows is 403 robots_disallowed, never requested, not charged', async () => {
    site.route('/private/page', { body: '<html><body>secret</body></html>' });
    const res = await h.call('grabr_scrape', { url: site.url('/private/page') }, key);
    expect(res.statusCode).toBe(403);
    expect(json(res).error.code).toBe('robots_disallowed');
    expect(site.requestsFor('/private/page')).toHaveLength(0);
    expect(await h.credits(accountId)).toBe(1000);
    // The same for every grabr tool whose first request is disallowed.
    site.route('/private/sitemap.xml', { headers: { 'content-type': 'application/xml' }, body: '<urlset></urlset>' });
    for (const [tool, body] of [
      ['grabr_contact', { url: site.url('/private/page') }],
      ['grabr_sitemap', { url: site.url('/private/sitemap.xml') }],
    ] as const) {
      const r = await h.call(tool, body, key);
      expect(r.statusCode, tool).toBe(403);
      expect(json(r).error.code, tool).toBe('robots_disallowed');
    }
    expect(site.requestsFor('/private/page')).toHaveLength(0);
    expect(site.requestsFor('/private/sitemap.xml')).toHaveLength(0);
  });
});

describe('grabr_contact', () => {
  it('finds emails (mailto, [at], data-cfemail, two pages deep), E.164 phones, socials, JSON-LD address and forms, with their pages', async () => {
    const res = await h.call('grabr_contact', { url: site.url('/c/'), max_pages: 5, country: 'DE' }, key);
    expect(res.statusCode, res.body).toBe(200);
    const { result } = json(res);
    validates('grabr_contact', result);
    const home = site.url('/c/');
    const about = site.url('/c/about');
    const imprint = site.url('/c/imprint');
    expect(result.pages.map((p: any) => [p.url, p.status, p.error?.code ?? null])).toEqual([
      [home, 200, null],
      [about, 200, null],
      [site.url('/c/team'), null, 'robots_disallowed'],
      [site.url('/c/support'), 200, 'duplicate'],
      [imprint, 200, null],
    ]);
    expect(site.requestsFor('/c/team')).toHaveLength(0);
    expect(result.emails).toEqual([
      { value: 'hello@acme.test', sources: [home, about] },
      { value: 'info@acme.test', sources: [about] },
      { value: 'press@acme.test', sources: [about] },
      { value: 'legal@acme.test', sources: [imprint] },
    ]);
    expect(result.phones).toEqual([
      { e164: '+49301234567', sources: [home] },
      { e164: '+49305550000', sources: [imprint] },
      { e164: '+493098765432', sources: [imprint] },
    ]);
    expect(result.socials).toEqual([
      { network: 'x', url: 'https://twitter.com/acmewidgets', sources: [home] },
      { network: 'linkedin', url: 'https://www.linkedin.com/company/acme', sources: [home] },
    ]);
    expect(result.addresses).toEqual([
      {
        street: 'Hauptstr. 1',
        locality: 'Berlin',
        region: null,
        postal_code: '10115',
        country: 'DE',
        text: 'Hauptstr. 1, 10115 Berlin, DE',
        sources: [imprint],
      },
    ]);
    expect(result.forms).toEqual([{ action: site.url('/c/send'), method: 'POST', fields: ['email', 'message'], sources: [imprint] }]);
  }, 30_000);

  it('max_pages bounds the crawl', async () => {
    const res = await h.call('grabr_contact', { url: site.url('/c/'), max_pages: 1 }, key);
    const { result } = json(res);
    expect(result.pages).toHaveLength(1);
    expect(result.emails.map((e: any) => e.value)).toEqual(['hello@acme.test']);
  });
});

describe('grabr_sitemap', () => {
  it('robots.txt Sitemap: → index → two gzipped sitemaps: the exact URLs, foreign ones dropped', async () => {
    const res = await h.call('grabr_sitemap', { url: site.url('/') }, key);
    expect(res.statusCode, res.body).toBe(200);
    const { result } = json(res);
    validates('grabr_sitemap', result);
    expect(result.total).toBe(7);
    expect(result.truncated).toBe(false);
    expect(result.urls.map((u: any) => u.loc)).toEqual([
      site.url('/blog/1'),
      site.url('/blog/2'),
      site.url('/about'),
      site.url('/p/1?a=1&b=2'),
      site.url('/p/2'),
      site.url('/p/3'),
      site.url('/blog/3'),
    ]);
    expect(result.urls[0]).toEqual({ loc: site.url('/blog/1'), lastmod: '2025-03-01', priority: 0.8 });
    expect(result.sources).toEqual([
      { url: site.url('/sm/index.xml'), via: 'robots', kind: 'index', urls: 0, error: null },
      { url: site.url('/sm/a.xml.gz'), via: 'index', kind: 'urlset', urls: 3, error: null },
      { url: site.url('/sm/b.xml.gz'), via: 'index', kind: 'urlset', urls: 4, error: null },
    ]);
  }, 30_000);

  it('robots.txt names only missing sitemaps (one relative): /sitemap.xml is tried, its Content-Encoding decoded', async () => {
    site2.route('/robots.txt', { headers: { 'content-type': 'text/plain' }, body: 'User-agent: *\nAllow: /\nSitemap: /maps/gone.xml\n' });
    site2.route('/sitemap.xml', {
      headers: { 'content-type': 'application/xml', 'content-encoding': 'gzip' },
      body: gzipSync(xmlUrlset([site2.url('/a'), site2.url('/b')])),
    });
    const res = await h.call('grabr_sitemap', { url: site2.url('/') }, key);
    expect(res.statusCode, res.body).toBe(200);
    const { result } = json(res);
    validates('grabr_sitemap', result);
    expect(result.sources.map((s: any) => [s.url, s.via, s.error?.code ?? null])).toEqual([
      [site2.url('/maps/gone.xml'), 'robots', 'not_found'],
      [site2.url('/sitemap.xml'), 'default', null],
    ]);
    expect(result.urls.map((u: any) => u.loc)).toEqual([site2.url('/a'), site2.url('/b')]);
    expect(result.total).toBe(2);
  });

  it('path_prefix and since filter', async () => {
    const res = await h.call('grabr_sitemap', { url: site.url('/'), path_prefix: '/blog/', since: '2025-01-01' }, key);
    const { result } = json(res);
    expect(result.urls.map((u: any) => u.loc)).toEqual([site.url('/blog/1'), site.url('/blog/3')]);
    expect(result.total).toBe(2);
  });

  it('a billion-laughs sitemap is refused with 400, fast', async () => {
    const t0 = Date.now();
    const res = await h.call('grabr_sitemap', { url: site.url('/sm/lol.xml') }, key);
    expect(res.statusCode).toBe(400);
    expect(json(res).error).toMatchObject({ code: 'invalid_input', reason: 'doctype_refused' });
    expect(Date.now() - t0).toBeLessThan(5_000);
  });

  it('a gzip bomb stops at GRABR_SITEMAP_MAX_BYTES: 422 limit_exceeded, uncharged', async () => {
    const res = await h.call('grabr_sitemap', { url: site.url('/sm/bomb.xml.gz') }, key);
    expect(res.statusCode).toBe(422);
    expect(json(res).error).toMatchObject({ code: 'limit_exceeded', reason: 'decompressed_too_large', limit_value: SITEMAP_CAP });
    expect(await h.credits(accountId)).toBe(1000);
  });

  it('a 50,000-URL sitemap is truncated at max_urls, and the total still counts every entry', async () => {
    const res = await h.call('grabr_sitemap', { url: site.url('/big/sitemap.xml'), max_urls: 1000 }, key);
    expect(res.statusCode, res.body).toBe(200);
    const { result } = json(res);
    validates('grabr_sitemap', result);
    expect(result.urls).toHaveLength(1000);
    expect(result.urls[999].loc).toBe(site.url('/item/999'));
    expect(result.total).toBe(50_000);
    expect(result.truncated).toBe(true);
  }, 30_000);

  it('all 50,000 URLs come back when max_urls allows, in pages within TOOL_MAX_RESULT_BYTES (offset, next_offset)', async () => {
    const seen = new Set<string>();
    let offset = 0;
    let pages = 0;
    for (;;) {
      const res = await h.call('grabr_sitemap', { url: site.url('/big/sitemap.xml'), max_urls: 50_000, offset }, key);
      expect(res.statusCode, res.body.slice(0, 300)).toBe(200);
      const { result } = json(res);
      validates('grabr_sitemap', result);
      expect(Buffer.byteLength(JSON.stringify(result))).toBeLessThanOrEqual(h.config.TOOL_MAX_RESULT_BYTES);
      expect(result.total).toBe(50_000);
      expect(result.urls[0].loc).toBe(site.url(`/item/${offset}`));
      for (const u of result.urls) seen.add(u.loc);
      pages++;
      if (result.next_offset === null) {
        expect(result.truncated).toBe(false);
        break;
      }
      expect(result.truncated).toBe(true);
      expect(result.next_offset).toBe(offset + result.urls.length);
      offset = result.next_offset;
    }
    expect(pages).toBeGreaterThan(1);
    expect(seen.size).toBe(50_000);
    expect(seen.has(site.url('/item/49999'))).toBe(true);
  }, 120_000);

  it('no sitemap at all is 404 not_found', async () => {
    const other = await startFixtureSite();
    try {
      // Not admitted by FETCH_ALLOWED_HOSTS: the guard refuses it (400), nothing reaches it.
      const res = await h.call('grabr_sitemap', { url: other.url('/') }, key);
      expect(res.statusCode).toBe(400);
      expect(other.requests).toHaveLength(0);
    } finally {
      await other.close();
    }
    const res = await h.call('grabr_sitemap', { url: site.url('/nosuch/sitemap.xml') }, key);
    expect(res.statusCode).toBe(404);
    expect(json(res).error.code).toBe('not_found');
  });
});

describe('grabr_batch', () => {
  it('a 500, a private address and a robots-blocked URL fail as items; the others succeed, in input order', async () => {
    site.route('/err500', { status: 500, body: 'boom' });
    site.route('/w/1', { body: '<html><head><title>One</title></head><body><p>Widget one text.</p></body></html>' });
    site.route('/notes.txt', { headers: { 'content-type': 'text/plain' }, body: 'plain notes' });
    const urls = [site.url('/w/1'), site.url('/err500'), 'http://10.0.0.1/', site.url('/private/x'), site.url('/notes.txt'), site.url('/')];
    // Through the root protocol: q is one URL per line (qParse 'lines').
    const res = await h.request({
      method: 'POST',
      url: '/',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      payload: JSON.stringify({ m: 'grabr_batch', q: urls.join('\n') }),
    });
    expect(res.statusCode, res.body).toBe(200);
    const { result } = json(res);
    validates('grabr_batch', result);
    expect(result.items.map((i: any) => [i.url, i.ok, i.ok ? i.result.title : i.error.code])).toEqual([
      [site.url('/w/1'), true, 'One'],
      [site.url('/err500'), false, 'fetch_failed'],
      ['http://10.0.0.1/', false, 'invalid_input'],
      [site.url('/private/x'), false, 'robots_disallowed'],
      [site.url('/notes.txt'), true, null],
      [site.url('/'), true, 'Acme Widgets'],
    ]);
    expect(result.items[0].result.text).toContain('Widget one text.');
    expect(result.items[4].result.text).toBe('plain notes');
    expect(site.requestsFor('/private/x')).toHaveLength(0);
  }, 30_000);

  it('reports progress once per URL (replayed from the job events)', async () => {
    const urls = [site.url('/w/1'), site.url('/err500'), site.url('/')];
    const res = await h.call('grabr_batch', { urls, concurrency: 1 }, key);
    expect(res.statusCode).toBe(200);
    const jobId = res.headers['x-job-id'] as string;
    expect(jobId).toBeTruthy();
    const events = await h.request({ method: 'GET', url: `/jobs/${jobId}/events`, headers: { authorization: `Bearer ${key}`, accept: 'text/event-stream' } });
    const progress = events.body
      .split('\n\n')
      .filter((block) => /^event: progress$/m.test(block))
      .map((block) => JSON.parse(/^data: (.*)$/m.exec(block)![1]!));
    expect(progress.map((p: any) => [p.done, p.total, p.message ?? null])).toEqual([
      [0, 3, null],
      [1, 3, urls[0]],
      [2, 3, urls[1]],
      [3, 3, urls[2]],
    ]);
  });

  it('meta and scrape modes', async () => {
    const meta = json(await h.call('grabr_batch', { urls: [site.url('/')], mode: 'meta' }, key)).result;
    validates('grabr_batch', meta);
    expect(meta.items[0].result).toMatchObject({
      kind: 'meta',
      title: 'Acme Widgets',
      canonical: site.url('/widgets'),
      lang: 'en',
      og: { 'og:title': 'Acme OG', 'og:type': 'website' },
      jsonld_types: ['Product'],
    });
    const scrape = json(await h.call('grabr_batch', { urls: [site.url('/'), site.url('/w/1')], mode: 'scrape', fields: { h: 'h1' } }, key)).result;
    validates('grabr_batch', scrape);
    expect(scrape.items.map((i: any) => i.result.fields.h)).toEqual(['Widgets', null]);
  });

  it('fields outside scrape mode, or more than 50 URLs, are 400', async () => {
    expect((await h.call('grabr_batch', { urls: [site.url('/')], fields: { h: 'h1' } }, key)).statusCode).toBe(400);
    expect((await h.call('grabr_batch', { urls: Array.from({ length: 51 }, (_, i) => site.url(`/${i}`)) }, key)).statusCode).toBe(400);
  });
});
