import { describe, expect, it } from 'vitest';
import { porterStem } from '../../../src/tools/web/stem.js';
import { parseDmarc, parseSpf } from '../../../src/tools/web/email-auth.js';
import { collisionQueriesTask, collisionScoreTask, nounPhrases } from '../../../src/tools/web/collision-nlp.js';
import { intelPageTask, matchFingerprints } from '../../../src/tools/web/intel-page.js';
import { robotsTask } from '../../../src/tools/web/intel-robots.js';
import { FINGERPRINTS, FINGERPRINTS_VERSION } from '../../../src/tools/web/fingerprints.js';
import { cdxQuery, parseCdxRows } from '../../../src/tools/web/grabr-wayback.js';
import { evaluate } from '../../../src/tools/web/deploy-verify.js';
import { parseRdap } from '../../../src/tools/web/grabr-intel.js';
import { riskOf } from '../../../src/tools/web/discovery-collision.js';
import { AppError } from '../../../src/errors.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

describe('porterStem', () => {
  it("gives Porter's published stems", () => {
    const cases: Array<[string, string]> = [
      ['caresses', 'caress'],
      ['ponies', 'poni'],
      ['cats', 'cat'],
      ['feed', 'feed'],
      ['agreed', 'agre'],
      ['plastered', 'plaster'],
      ['motoring', 'motor'],
      ['hopping', 'hop'],
      ['filing', 'file'],
      ['happy', 'happi'],
      ['relational', 'relat'],
      ['conditional', 'condit'],
      ['generalizations', 'gener'],
      ['oscillators', 'oscil'],
      ['controlling', 'control'],
      ['adjustment', 'adjust'],
      ['electricity', 'electr'],
    ];
    for (const [word, stem] of cases) expect(porterStem(word), word).toBe(stem);
  });

  it('joins inflections of one word and leaves short or non-ASCII words alone', () => {
    expect(porterStem('colliding')).toBe(porterStem('collides'));
    expect(porterStem('summarises')).toBe(porterStem('summarising'));
    expect(porterStem('go')).toBe('go');
    expect(porterStem('café')).toBe('café');
  });
});

describe('SPF and DMARC', () => {
  it('parses an SPF record: mechanisms, includes, all, lookup count', () => {
    const spf = parseSpf(['google-site-verification=abc', 'v=spf1 ip4:192.0.2.0/24 include:_spf.example.net mx a/24 ~all'])!;
    expect(spf.record).toBe('v=spf1 ip4:192.0.2.0/24 include:_spf.example.net mx a/24 ~all');
    expect(spf.valid).toBe(true);
    expect(spf.all).toBe('~all');
    expect(spf.includes).toEqual(['_spf.example.net']);
    expect(spf.mechanisms).toEqual([
      { qualifier: '+', type: 'ip4', value: '192.0.2.0/24' },
      { qualifier: '+', type: 'include', value: '_spf.example.net' },
      { qualifier: '+', type: 'mx', value: null },
      { qualifier: '+', type: 'a', value: '/24' },
      { qualifier: '~', type: 'all', value: null },
    ]);
    expect(spf.dns_lookups).toBe(3);
    expect(spf.warnings).toEqual([]);
  });

  it('flags two SPF records, too many lookups and +all; none is null', () => {
    expect(parseSpf(['v=spf1 -all', 'v=spf1 ~all'])!.valid).toBe(false);
    const many = parseSpf([`v=spf1 ${Array.from({ length: 11 }, (_, i) => `include:s${i}.example`).join(' ')} +all`])!;
    expect(many.valid).toBe(false);
    expect(many.dns_lookups).toBe(11);
    expect(many.warnings.join(' ')).toMatch(/more than the 10/);
    expect(many.warnings.join(' ')).toMatch(/\+all lets any server/);
    expect(parseSpf(['v=spf10 nope', 'hello'])).toBeNull();
  });

  it('parses DMARC tags and warns about monitoring-only policies', () => {
    const d = parseDmarc(['v=DMARC1; p=reject; sp=quarantine; pct=50; rua=mailto:a@example.com,mailto:b@example.com; adkim=s'])!;
    expect(d).toMatchObject({
      valid: true,
      policy: 'reject',
      subdomain_policy: 'quarantine',
      pct: 50,
      rua: ['mailto:a@example.com', 'mailto:b@example.com'],
      ruf: [],
      adkim: 's',
      aspf: null,
    });
    expect(d.warnings).toEqual(['pct=50: the policy applies to only 50% of failing mail']);
    const none = parseDmarc(['v=DMARC1; p=none'])!;
    expect(none.policy).toBe('none');
    expect(none.warnings.join(' ')).toMatch(/only monitors/);
    expect(parseDmarc(['v=DMARC1; rua=mailto:x@example.com'])!.valid).toBe(false);
    expect(parseDmarc([])).toBeNull();
  });
});

describe('discovery_collision scoring', () => {
  const idea = 'A browser extension that summarises long legal contracts for freelancers and highlights risky payment clauses.';

  it('derives queries from noun phrases, deterministically and within the maximum', () => {
    expect(nounPhrases(idea)).toEqual(['browser extension', 'long legal contracts', 'freelancers', 'risky payment clauses']);
    const a = collisionQueriesTask({ idea, max: 3 });
    expect(a.queries).toEqual([
      'browser extension long legal contracts freelancers',
      'browser extension long legal contracts',
      'long legal contracts freelancers',
    ]);
    expect(collisionQueriesTask({ idea, max: 3 })).toEqual(a);
    expect(collisionQueriesTask({ idea, max: 1 }).queries).toHaveLength(1);
    expect(collisionQueriesTask({ idea: 'quickly and slowly, then again and again', max: 3 }).queries.length).toBeLessThanOrEqual(1);
  });

  it('scores a copy of the idea 1 and an unrelated text near 0; inflections match through stemming', () => {
    const { results } = collisionScoreTask({
      idea,
      docs: [
        [`Unrelated\nA recipe for sourdough bread with a long cold proof.`],
        [`Contract summariser\n${idea}`],
        [`Summarising contracts\nThis extension summarised legal contract clauses.`],
      ],
    });
    expect(results[1]!.score).toBeGreaterThan(0.9);
    expect(results[0]!.score).toBeLessThan(0.1);
    expect(results[2]!.score).toBeGreaterThan(0.2);
    expect(results[2]!.shared_terms).toEqual(expect.arrayContaining(['contracts', 'legal', 'extension']));
    expect(riskOf(results[1]!.score)).toBe('high');
    expect(riskOf(0)).toBe('none');
    expect(riskOf(0.2)).toBe('low');
    expect(riskOf(0.35)).toBe('medium');
  });

  it('takes the better of a candidate\u2019s texts, and an empty text scores 0', () => {
    const { results } = collisionScoreTask({ idea, docs: [['nothing here'], ['nothing here', idea], ['']] });
    expect(results[0]!.score).toBeLessThan(results[1]!.score);
    expect(results[2]).toEqual({ score: 0, shared_terms: [] });
  });
});

describe('grabr_intel pieces', () => {
  const html = `<!doctype html><html lang="en"><head><title>Acme Widgets</title>
    <meta name="description" content="Widgets for everyone">
    <meta name="generator" content="WordPress 6.4.2">
    <meta name="robots" content="noindex, follow">
    <link rel="canonical" href="/home">
    <script src="https://www.googletagmanager.com/gtag/js?id=G-1"></script>
    <script src="/wp-includes/js/jquery/jquery.min.js"></script>
    </head><body><h1>One</h1><h1>Two</h1></body></html>`;

  it('reads SEO basics and matches fingerprints with their evidence and version', () => {
    const out = intelPageTask({
      body: Buffer.from(html),
      baseUrl: 'https://acme.test/',
      headerCharset: 'utf-8',
      headers: { server: 'nginx/1.25.3', 'set-cookie': 'PHPSESSID=abc; Path=/\n__cf_bm=x', 'cf-ray': '8a-LHR' },
      html: true,
    });
    expect(out.fingerprints_version).toBe(FINGERPRINTS_VERSION);
    expect(out.seo).toMatchObject({
      title: 'Acme Widgets',
      description: 'Widgets for everyone',
      canonical: 'https://acme.test/home',
      h1_count: 2,
      robots_meta: 'noindex, follow',
      lang: 'en',
      viewport: false,
    });
    expect(out.seo!.issues).toEqual(expect.arrayContaining(['2 h1 headings', 'robots meta says noindex', 'no viewport meta (not mobile-friendly)']));
    const names = out.tech.map((t) => t.name);
    expect(names).toEqual(['nginx', 'PHP', 'Cloudflare', 'WordPress', 'jQuery', 'Google Analytics']);
    expect(out.tech.find((t) => t.name === 'nginx')).toEqual({
      name: 'nginx',
      category: 'server',
      version: '1.25.3',
      evidence: ['header server: nginx/1.25.3'],
    });
    expect(out.tech.find((t) => t.name === 'WordPress')!.version).toBe('6.4.2');
    expect(out.tech.find((t) => t.name === 'PHP')!.evidence).toEqual(['cookie PHPSESSID']);
  });

  it('fingerprints headers only for a non-HTML page, and every table entry has a detector', () => {
    const out = intelPageTask({ body: Buffer.from('{}'), baseUrl: 'https://a.test/', headerCharset: null, headers: { 'x-vercel-id': 'x' }, html: false });
    expect(out.seo).toBeNull();
    expect(out.tech.map((t) => t.name)).toEqual(['Vercel']);
    for (const fp of FINGERPRINTS) expect(!!(fp.headers || fp.cookies || fp.meta || fp.scripts || fp.html), fp.name).toBe(true);
    expect(new Set(FINGERPRINTS.map((f) => f.name)).size).toBe(FINGERPRINTS.length);
    expect(matchFingerprints({ headers: {}, meta: {}, scripts: [], html: '' })).toEqual([]);
  });

  it('robots: rules for the user agent, summary, and RFC 9309 for 4xx/5xx', () => {
    const text =
      'User-agent: TollgateGrabr\nDisallow: /private\n\nUser-agent: *\nDisallow: /\nAllow: /public\nCrawl-delay: 5\nSitemap: https://a.test/sitemap.xml\n';
    const out = robotsTask({
      url: 'https://a.test/robots.txt',
      status: 200,
      text,
      userAgent: 'TollgateGrabr/0.1',
      urls: ['https://a.test/', 'https://a.test/private/x'],
    });
    expect(out).toEqual({
      allowed: [true, false],
      found: true,
      sitemaps: ['https://a.test/sitemap.xml'],
      crawl_delay: null,
      user_agents: ['TollgateGrabr', '*'],
      disallow_rules: 2,
      allow_rules: 1,
    });
    expect(robotsTask({ url: 'https://a.test/robots.txt', status: 200, text, userAgent: 'Other', urls: ['https://a.test/'] }).allowed).toEqual([false]);
    expect(robotsTask({ url: 'https://a.test/robots.txt', status: 404, text: '', userAgent: 'X', urls: ['https://a.test/'] }).allowed).toEqual([true]);
    expect(robotsTask({ url: 'https://a.test/robots.txt', status: 503, text: '', userAgent: 'X', urls: ['https://a.test/'] }).allowed).toEqual([false]);
  });

  it('RDAP: registrar, events, status and name servers', () => {
    const r = parseRdap({
      objectClassName: 'domain',
      handle: '2336799_DOMAIN_COM-VRSN',
      ldhName: 'EXAMPLE.COM',
      status: ['client delete prohibited'],
      events: [
        { eventAction: 'registration', eventDate: '1995-08-14T04:00:00Z' },
        { eventAction: 'expiration', eventDate: '2026-08-13T04:00:00Z' },
      ],
      entities: [
        {
          roles: ['registrar'],
          handle: '376',
          vcardArray: [
            'vcard',
            [
              ['version', {}, 'text', '4.0'],
              ['fn', {}, 'text', 'RESERVED-IANA'],
            ],
          ],
        },
      ],
      nameservers: [{ ldhName: 'A.IANA-SERVERS.NET' }],
    });
    expect(r).toEqual({
      found: true,
      handle: '2336799_DOMAIN_COM-VRSN',
      ldh_name: 'EXAMPLE.COM',
      registrar: 'RESERVED-IANA',
      status: ['client delete prohibited'],
      registered: '1995-08-14T04:00:00Z',
      expires: '2026-08-13T04:00:00Z',
      last_changed: null,
      nameservers: ['a.iana-servers.net'],
    });
    expect(parseRdap('garbage').registrar).toBeNull();
  });
});

describe('grabr_wayback pieces', () => {
  it('maps the request onto CDX parameters', () => {
    const q = cdxQuery('https://cdx.test/cdx', { url: 'https://a.test/', match: 'prefix', from: '2019', to: '2020', limit: 25, order: 'newest' });
    expect(Object.fromEntries(q.searchParams)).toEqual({
      url: 'https://a.test/',
      output: 'json',
      matchType: 'prefix',
      fl: 'timestamp,original,statuscode,mimetype,digest,length',
      from: '2019',
      to: '2020',
      limit: '-25',
    });
    expect(cdxQuery('https://cdx.test/cdx', { url: 'https://a.test/', match: 'exact', limit: 5, order: 'oldest' }).searchParams.get('limit')).toBe('5');
  });

  it('reads rows by the header row, oldest first, "-" as null', () => {
    const rows = [
      ['timestamp', 'original', 'statuscode', 'digest'],
      ['20200101000000', 'https://a.test/', '200', 'AAA'],
      ['20190101000000', 'https://a.test/', '-', 'BBB'],
    ];
    expect(parseCdxRows(rows, 'https://arch.test/web/')).toEqual([
      {
        timestamp: '20190101000000',
        original: 'https://a.test/',
        status: null,
        mimetype: null,
        digest: 'BBB',
        length: null,
        archive_url: 'https://arch.test/web/20190101000000/https://a.test/',
      },
      {
        timestamp: '20200101000000',
        original: 'https://a.test/',
        status: 200,
        mimetype: null,
        digest: 'AAA',
        length: null,
        archive_url: 'https://arch.test/web/20200101000000/https://a.test/',
      },
    ]);
    expect(parseCdxRows([], 'x')).toEqual([]);
    expect(() => parseCdxRows({ not: 'rows' }, 'x')).toThrow(AppError);
    expect(() => parseCdxRows([[1, 2]], 'x')).toThrow(/header/);
  });
});

describe('deploy_verify checks', () => {
  const base = {
    final_url: 'https://a.test/',
    status: 200,
    redirects: [],
    hop: { dns: 1, connect: 1, tls: 1, ttfb: 1 },
    total: 120,
    tls: { protocol: 'TLSv1.3', issuer: 'X', subject: 'a.test', san: [], valid_from: null, valid_to: null, days_left: 20, authorized: true, error: null },
    headers: { 'content-type': 'text/html; charset=utf-8', 'x-version': 'v2.3.1' },
    body: '<h1>Welcome to v2</h1>',
    error: null,
  };
  const by = (checks: Array<{ name: string; pass: boolean }>) => Object.fromEntries(checks.map((c) => [c.name, c.pass]));

  it('passes what holds and fails what does not', () => {
    expect(
      by(
        evaluate(
          {
            expect_status: [200, 204],
            expect_text: 'Welcome to v2',
            expect_headers: { 'Content-Type': 'TEXT/HTML', 'x-version': '' },
            max_ms: 500,
            min_tls_days: 14,
          },
          base,
        ),
      ),
    ).toEqual({
      status: true,
      tls_trusted: true,
      expect_text: true,
      'expect_headers:content-type': true,
      'expect_headers:x-version': true,
      max_ms: true,
      min_tls_days: true,
    });
    expect(
      by(
        evaluate(
          { expect_status: 201, expect_text: 'welcome to v2', expect_headers: { 'x-version': 'v3', 'x-missing': '' }, max_ms: 100, min_tls_days: 30 },
          base,
        ),
      ),
    ).toEqual({
      status: false,
      tls_trusted: true,
      expect_text: false,
      'expect_headers:x-version': false,
      'expect_headers:x-missing': false,
      max_ms: false,
      min_tls_days: false,
    });
  });

  it('an unreachable target fails reachability and every expectation; default status is 2xx/3xx', () => {
    const down = { ...base, status: null, headers: null, body: null, tls: null, error: { reason: 'connection_refused', message: 'refused' } };
    expect(by(evaluate({ expect_text: 'x', max_ms: 10_000 }, down))).toEqual({ reachable: false, expect_text: false, max_ms: false });
    expect(by(evaluate({}, { ...base, status: 503 }))).toEqual({ status: false, tls_trusted: true });
    expect(by(evaluate({}, { ...base, status: 301 }))).toEqual({ status: true, tls_trusted: true });
  });
});

describe('inputs', () => {
  it('are plain object schemas whose q field is described', async () => {
    const webToolsA = (await import('../../../src/tools/web/index.js')).webTools.filter((t) =>
      ['web_search', 'deploy_verify', 'discovery_collision', 'grabr_intel', 'grabr_wayback'].includes(t.name),
    );
    const { z } = await import('zod');
    for (const tool of webToolsA) {
      expect(tool.input, tool.name).toBeInstanceOf(z.ZodObject);
      const shape = (tool.input as InstanceType<typeof z.ZodObject>).shape as Record<string, { description?: string }>;
      expect(shape[tool.qField]?.description, tool.name).toBeTruthy();
    }
  });

  it('parse to values that parse to themselves (the service parses at admission and again in the worker)', async () => {
    const webToolsA = (await import('../../../src/tools/web/index.js')).webTools.filter((t) =>
      ['web_search', 'deploy_verify', 'discovery_collision', 'grabr_intel', 'grabr_wayback'].includes(t.name),
    );
    const extra: Record<string, unknown[]> = {
      grabr_intel: [{ domain: 'HTTPS://Bücher.example:8443/path?q=1' }, { domain: 'Example.COM.' }],
      deploy_verify: [{ url: 'example.com/health#top' }],
      grabr_wayback: [{ url: 'example.com', from: '2019', to: '2019' }],
      discovery_collision: [{ idea: 'An idea that is long enough to check.', read_pages: true }],
    };
    for (const tool of webToolsA) {
      for (const ex of [...tool.examples, ...(extra[tool.name] ?? [])]) {
        const once = tool.input.parse(ex);
        expect(tool.input.parse(once), `${tool.name} ${JSON.stringify(ex)}`).toEqual(once);
      }
    }
    const { grabrIntel, splitDomain } = await import('../../../src/tools/web/grabr-intel.js');
    expect(splitDomain(grabrIntel.input.parse({ domain: 'HTTPS://Bücher.example:8443/path?q=1' }).domain)).toEqual({
      domain: 'xn--bcher-kva.example',
      origin: 'https://xn--bcher-kva.example:8443',
    });
    expect(splitDomain(grabrIntel.input.parse({ domain: 'Example.COM.' }).domain)).toEqual({ domain: 'example.com', origin: 'https://example.com' });
  });
});

describe('worst cases of the pool tasks finish inside the tools\u2019 limits', () => {
  const words = 'supply chain emissions mapping supplier product carbon ledger audit trail scope three reporting'.split(' ');
  const text = (n: number, seed: number) => Array.from({ length: n }, (_, i) => words[(i * 7 + seed) % words.length]).join(' ');

  it('discovery_collision: a 4,000-character idea, 100 hits, 5 of them with 20,000 characters of page text', async () => {
    const { discoveryCollision } = await import('../../../src/tools/web/discovery-collision.js');
    const input = discoveryCollision.input.parse(discoveryCollision.largestInput!());
    const started = cpuNow();
    const q = collisionQueriesTask({ idea: input.idea, max: input.queries });
    const docs = Array.from({ length: 100 }, (_, i) => (i < 5 ? [text(40, i), `${text(40, i)}\n${'x'.repeat(10)} ${text(3000, i)}`] : [text(40, i)]));
    const s = collisionScoreTask({ idea: input.idea, docs });
    const ms = cpuNow() - started;
    expect(q.queries.length).toBeGreaterThan(0);
    expect(s.results).toHaveLength(100);
    expect(ms).toBeLessThan(discoveryCollision.limits!.timeMs!);
  });

  it('grabr_intel: a 2 MiB home page and a 512 KiB robots.txt', async () => {
    const { grabrIntel } = await import('../../../src/tools/web/grabr-intel.js');
    const row = '<div class="card"><h2>Item</h2><p>Some text <a href="/x">link</a></p><script src="/static/app.js"></script></div>\n';
    const html = `<html><head><title>Big</title></head><body>${row.repeat(Math.floor((2 * 1024 * 1024) / row.length))}</body></html>`;
    const robots = `User-agent: *\n${'Disallow: /*a*b*c*d*e*f*g*\n'.repeat(Math.floor((512 * 1024) / 28))}`;
    const started = cpuNow();
    const page = intelPageTask({ body: Buffer.from(html), baseUrl: 'https://big.test/', headerCharset: 'utf-8', headers: { server: 'nginx' }, html: true });
    const r = robotsTask({
      url: 'https://big.test/robots.txt',
      status: 200,
      text: robots,
      userAgent: 'TollgateGrabr/0.1',
      urls: [`https://big.test/${'a'.repeat(2000)}`],
    });
    const ms = cpuNow() - started;
    expect(page.seo!.title).toBe('Big');
    expect(r.found).toBe(true);
    expect(ms).toBeLessThan(grabrIntel.limits!.timeMs!);
  }, 30_000);
});
