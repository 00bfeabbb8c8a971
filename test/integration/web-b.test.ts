import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { startFixtureSite, type FixtureSite } from '../helpers/fixture-site.js';
import { findTool } from '../../src/tools/index.js';

let h: Harness;
let site: FixtureSite;
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

function validates(tool: string, result: unknown): void {
  const schema = findTool(tool)!.outputSchema!;
  const r = schema.safeParse(result);
  if (!r.success) throw new Error(`${tool} result fails its outputSchema: ${r.error.message}`);
}

beforeAll(async () => {
  site = await startFixtureSite();
  h = await startHarness({ FETCH_ALLOWED_HOSTS: site.hostPort }, { workers: ['web'] });
  const acct = await h.account('enterprise', 1000);
  key = acct.apiKey;
  accountId = acct.accountId;
  site.route('/robots.txt', { headers: { 'content-type': 'text/plain' }, body: 'User-agent: *\nDisallow: /private\n' });
  site.route('/', { body: PAGE });
});
afterAll(async () => {
  await h?.close();
  await site?.close();
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

  it('a bad selector is 400 invalid_input before anything is fetched', async () => {
    const before = site.requests.length;
    const res = await h.call('grabr_scrape', { url: site.url('/'), fields: { x: { selector: 'a[' } } }, key);
    expect(res.statusCode).toBe(400);
    expect(json(res).error.code).toBe('invalid_input');
    const res2 = await h.call('grabr_scrape', { url: site.url('/'), fields: { x: 'div:nosuchpseudo' } }, key);
    expect(res2.statusCode).toBe(400);
    expect(site.requests.length).toBe(before);
  });

  it('a path robots.txt disallows is 403 robots_disallowed, never requested, not charged', async () => {
    site.route('/private/page', { body: '<html><body>secret</body></html>' });
    const res = await h.call('grabr_scrape', { url: site.url('/private/page') }, key);
    expect(res.statusCode).toBe(403);
    expect(json(res).error.code).toBe('robots_disallowed');
    expect(site.requestsFor('/private/page')).toHaveLength(0);
    expect(await h.credits(accountId)).toBe(1000);
  });
});
