import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.js';
import { createSearch } from '../../../src/tools/web/search-client.js';
import { webSearch, WebSearchOutput } from '../../../src/tools/web/web-search.js';
import { deployVerify, DeployVerifyOutput } from '../../../src/tools/web/deploy-verify.js';
import { discoveryCollision, DiscoveryCollisionOutput } from '../../../src/tools/web/discovery-collision.js';
import { grabrIntel, GrabrIntelOutput } from '../../../src/tools/web/grabr-intel.js';
import { clearWaybackCache, grabrWayback, GrabrWaybackOutput } from '../../../src/tools/web/grabr-wayback.js';
import type { AnyTool } from '../../../src/tools/types.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { startFakeSearxng, type FakeSearxng } from '../../helpers/fake-searxng.js';
import { startFakeDns, type FakeDnsServer } from '../../helpers/dns-server.js';
import { startFakeCdx, type FakeCdx } from '../../helpers/fake-cdx.js';
import { closedPort, routes, startHttpTarget, type HttpTarget } from '../../helpers/http-targets.js';

/** Web group A's handlers called directly, against local fakes (search, DNS, CDX) and fixture sites. */

const IDEA = 'A browser extension that summarises long legal contracts for freelancers and highlights risky payment clauses.';
const HOME = `<!doctype html><html lang="en"><head><title>Intel Test</title><meta name="description" content="A test site">
<meta name="generator" content="Hugo 0.120.0"><link rel="canonical" href="/"></head><body><h1>Hello</h1><p>Welcome to v2.</p></body></html>`;

let search: FakeSearxng;
let dns: FakeDnsServer;
let cdx: FakeCdx;
let site: HttpTarget;
let tlsSite: HttpTarget;
let closed: HttpTarget;
let forbidden: HttpTarget;
let rdap: HttpTarget;
let deadPort: number;
let flaky = 0;
let inFlight = 0;
let maxInFlight = 0;

beforeAll(async () => {
  [search, dns, cdx] = await Promise.all([startFakeSearxng(), startFakeDns({}), startFakeCdx()]);
  site = await startHttpTarget(
    routes({
      '/': [200, { 'content-type': 'text/html; charset=utf-8', server: 'nginx/1.25.3', 'x-content-type-options': 'nosniff', 'x-version': 'v2.3.1' }, HOME],
      '/robots.txt': [200, { 'content-type': 'text/plain' }, 'User-agent: *\nDisallow: /admin\nSitemap: http://intel.test/sitemap.xml\n'],
      '/slow': (_req, res) => void setTimeout(() => res.writeHead(200, { 'content-type': 'text/plain' }).end('late'), 300),
      '/hop': [302, { location: '/' }, ''],
      '/flaky': (_req, res) => void (++flaky < 3 ? res.writeHead(503).end('warming up') : res.writeHead(200, { 'content-type': 'text/plain' }).end('ready')),
      '/to-forbidden': (_req, res) => void res.writeHead(302, { location: forbidden.url('/') }).end(),
      '/busy': (_req, res) => {
        inFlight += 1;
        maxInFlight = Math.max(maxInFlight, inFlight);
        setTimeout(() => {
          inFlight -= 1;
          res.writeHead(200, { 'content-type': 'text/plain' }).end('ok');
        }, 60);
      },
      '/article': [200, { 'content-type': 'text/html' }, `<html><head><title>Our contract tool</title></head><body><main><p>${IDEA}</p></main></body></html>`],
    }),
  );
  tlsSite = await startHttpTarget(routes({ '/': [200, { 'content-type': 'text/plain', 'strict-transport-security': 'max-age=63072000' }, 'secure hello'] }), {
    tls: true,
  });
  // Not in FETCH_ALLOWED_HOSTS: nothing may ever connect to it.
  forbidden = await startHttpTarget(routes({ '/': [200, {}, 'secret'] }));
  closed = await startHttpTarget(routes({ '/robots.txt': [200, { 'content-type': 'text/plain' }, 'User-agent: *\nDisallow: /\n'], '/': [200, {}, 'home'] }));
  rdap = await startHttpTarget(
    routes({
      '/domain/intel.test': [
        200,
        { 'content-type': 'application/rdap+json' },
        JSON.stringify({
          ldhName: 'intel.test',
          events: [{ eventAction: 'registration', eventDate: '2001-02-03T00:00:00Z' }],
          entities: [{ roles: ['registrar'], vcardArray: ['vcard', [['fn', {}, 'text', 'Test Registrar']]] }],
        }),
      ],
    }),
  );
  deadPort = await closedPort();
  dns.set('intel.test', {
    A: ['127.0.0.1'],
    MX: [
      { exchange: 'mx2.intel.test', priority: 20 },
      { exchange: 'mx1.intel.test', priority: 10 },
    ],
    NS: ['ns1.intel.test', 'ns2.intel.test'],
    TXT: ['v=spf1 ip4:192.0.2.0/24 include:_spf.mail.test -all', 'verification=abc "quoted" text', `long=${'x'.repeat(300)}`],
  });
  dns.set('_dmarc.intel.test', { TXT: ['v=DMARC1; p=quarantine; rua=mailto:dmarc@intel.test'] });
  dns.set('closed.test', { A: ['127.0.0.1'] });
  dns.set('private.test', { A: ['10.0.0.7'] });
});

afterAll(async () => {
  await Promise.all([search?.close(), dns?.close(), cdx?.close(), site?.close(), tlsSite?.close(), forbidden?.close(), closed?.close(), rdap?.close()]);
});

function ctxFor(extra: Record<string, string> = {}, withSearch = true) {
  const env = {
    DNS_SERVERS: dns.address,
    FETCH_ALLOWED_HOSTS: [site.hostPort, tlsSite.hostPort, `intel.test:${site.port}`, `closed.test:${closed.port}`, `127.0.0.1:${deadPort}`].join(','),
    SEARCH_BASE_URL: search.url,
    WAYBACK_CDX_URL: cdx.cdxUrl,
    WAYBACK_BASE_URL: cdx.baseUrl,
    ...(withSearch ? {} : { SEARCH_BASE_URL: '' }),
    ...extra,
  };
  const made = makeToolContext({ env });
  if (withSearch) made.ctx.search ??= createSearch(made.ctx.config, made.ctx.signal);
  else expect(made.ctx.search).toBeUndefined();
  return made;
}

async function run<T>(tool: AnyTool, input: unknown, made = ctxFor()): Promise<T> {
  const parsed = tool.input.parse(input);
  const out = await tool.handler(parsed, made.ctx);
  const check = tool.outputSchema!.safeParse(out);
  expect(check.success, check.success ? '' : JSON.stringify(check.error.issues.slice(0, 3))).toBe(true);
  return out as T;
}

async function failure(p: Promise<unknown>): Promise<AppError> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(AppError);
  return e as AppError;
}

describe('web_search', () => {
  it("returns the fake's results, and the fake saw the query and options", async () => {
    search.respond((q) => [
      { url: 'https://a.test/1', title: `First for ${q}`, content: 'one', engines: ['duckduckgo', 'brave'] },
      { url: 'https://a.test/2', title: 'Second', content: 'two', publishedDate: '2024-05-01T00:00:00' },
    ]);
    search.requests.length = 0;
    const out = await run<WebSearchOutput>(webSearch as AnyTool, { query: 'tollgate credits', limit: 2, language: 'en', time_range: 'month', safesearch: 1 });
    expect(out).toEqual({
      query: 'tollgate credits',
      results: [
        { rank: 1, title: 'First for tollgate credits', url: 'https://a.test/1', snippet: 'one', engines: ['duckduckgo', 'brave'], published_at: null },
        { rank: 2, title: 'Second', url: 'https://a.test/2', snippet: 'two', engines: ['fakeengine'], published_at: '2024-05-01T00:00:00' },
      ],
      suggestions: [],
      answers: [],
    });
    expect(search.requests[0]!.params).toMatchObject({
      q: 'tollgate credits',
      format: 'json',
      pageno: '1',
      language: 'en',
      time_range: 'month',
      safesearch: '1',
    });
  });

  it('without a search upstream, or with one that fails: tool_unavailable', async () => {
    expect((await failure(run(webSearch as AnyTool, { query: 'x' }, ctxFor({}, false)))).code).toBe('tool_unavailable');
    search.failWith = 500;
    try {
      expect(await failure(run(webSearch as AnyTool, { query: 'x' }))).toMatchObject({ code: 'tool_unavailable', status: 503 });
    } finally {
      search.failWith = null;
    }
  });

  it('rejects bad input with a 400', () => {
    expect(webSearch.input.safeParse({ query: '' }).success).toBe(false);
    expect(webSearch.input.safeParse({ query: 'x'.repeat(401) }).success).toBe(false);
    expect(webSearch.input.safeParse({ query: 'x', limit: 21 }).success).toBe(false);
    expect(webSearch.input.safeParse({ query: 'x', language: 'en; rm -rf' }).success).toBe(false);
  });
});

describe('deploy_verify', () => {
  it('reports a self-signed certificate as authorized:false with days_left, read from the same socket', async () => {
    const out = await run<DeployVerifyOutput>(deployVerify as AnyTool, { url: tlsSite.url('/'), expect_text: 'secure hello', min_tls_days: 30 });
    expect(out.status).toBe(200);
    expect(out.tls).toMatchObject({
      authorized: false,
      error: 'DEPTH_ZERO_SELF_SIGNED_CERT',
      issuer: 'localhost',
      san: ['IP Address:127.0.0.1', 'DNS:localhost'],
    });
    expect(out.tls!.days_left).toBeGreaterThan(30_000);
    expect(out.security_headers!['strict-transport-security']).toBe('max-age=63072000');
    expect(out.checks.find((c) => c.name === 'tls_trusted')).toMatchObject({ pass: false });
    expect(out.checks.find((c) => c.name === 'min_tls_days')).toMatchObject({ pass: true });
    expect(out.checks.find((c) => c.name === 'expect_text')).toMatchObject({ pass: true });
    expect(out.ok).toBe(false);
    for (const k of ['dns', 'connect', 'tls', 'ttfb'] as const) expect(out.timings_ms[k], k).toBeGreaterThanOrEqual(0);
  });

  it('a delayed answer gives ttfb of at least the delay', async () => {
    const out = await run<DeployVerifyOutput>(deployVerify as AnyTool, { url: site.url('/slow') });
    expect(out.ok).toBe(true);
    expect(out.timings_ms.ttfb).toBeGreaterThanOrEqual(300);
    expect(out.timings_ms.total).toBeGreaterThanOrEqual(out.timings_ms.ttfb!);
    expect(out.timings_ms.tls).toBeNull();
    expect(out.tls).toBeNull();
  });

  it('expect_* checks pass when they hold and fail when they do not; redirects are followed', async () => {
    const good = await run<DeployVerifyOutput>(deployVerify as AnyTool, {
      url: site.url('/hop'),
      expect_status: 200,
      expect_text: 'Welcome to v2',
      expect_headers: { 'X-Version': 'v2.3', server: 'nginx' },
      max_ms: 10_000,
    });
    expect(good.ok).toBe(true);
    expect(good.redirects).toEqual([{ url: site.url('/hop'), status: 302, location: site.url('/') }]);
    expect(good.final_url).toBe(site.url('/'));
    expect(good.checks.every((c) => c.pass)).toBe(true);
    expect(good.security_headers!['x-content-type-options']).toBe('nosniff');
    const bad = await run<DeployVerifyOutput>(deployVerify as AnyTool, {
      url: site.url('/'),
      expect_status: [201, 204],
      expect_text: 'welcome TO v2',
      expect_headers: { 'x-version': 'v3' },
      max_ms: 1,
    });
    expect(bad.ok).toBe(false);
    expect(Object.fromEntries(bad.checks.map((c) => [c.name, c.pass]))).toEqual({
      status: false,
      expect_text: false,
      'expect_headers:x-version': false,
      max_ms: false,
    });
  });

  it('polls until the checks pass, reporting progress per attempt', async () => {
    flaky = 0;
    const made = ctxFor();
    const out = await run<DeployVerifyOutput>(deployVerify as AnyTool, { url: site.url('/flaky'), attempts: 5, interval_ms: 20, expect_text: 'ready' }, made);
    expect(out.ok).toBe(true);
    expect(out.attempts.map((a) => [a.attempt, a.ok, a.status])).toEqual([
      [1, false, 503],
      [2, false, 503],
      [3, true, 200],
    ]);
    expect(made.progress.filter((p) => p.stage === 'checking').map((p) => p.done)).toEqual([1, 2, 3]);
  });

  it('sends at most WEB_PER_HOST requests at once to one host', async () => {
    maxInFlight = 0;
    const made = ctxFor({ WEB_PER_HOST: '1' });
    const outs = await Promise.all([1, 2, 3].map(() => run<DeployVerifyOutput>(deployVerify as AnyTool, { url: site.url('/busy') }, made)));
    expect(outs.every((o) => o.ok)).toBe(true);
    expect(maxInFlight).toBe(1);
    maxInFlight = 0;
    await Promise.all([1, 2, 3].map(() => run<DeployVerifyOutput>(deployVerify as AnyTool, { url: site.url('/busy') }, ctxFor({ WEB_PER_HOST: '3' }))));
    expect(maxInFlight).toBe(3);
  });

  it('a failed TLS handshake (https to a plain-http port) is 502 fetch_failed with its reason', async () => {
    const e = await failure(run(deployVerify as AnyTool, { url: `https://${site.hostPort}/` }));
    expect(e).toMatchObject({ code: 'fetch_failed', status: 502 });
    expect(String(e.details['reason'])).toMatch(/tls_error|connection_reset|invalid_response/);
  });

  it('no answer on any attempt is 502 fetch_failed listing each attempt; a name that does not resolve too', async () => {
    const e = await failure(run(deployVerify as AnyTool, { url: `http://127.0.0.1:${deadPort}/`, attempts: 2, interval_ms: 10 }));
    expect(e).toMatchObject({ code: 'fetch_failed', status: 502, details: { reason: 'connection_refused' } });
    expect((e.details['attempts'] as Array<{ attempt: number; ok: boolean; status: null }>).map((a) => [a.attempt, a.ok, a.status])).toEqual([
      [1, false, null],
      [2, false, null],
    ]);
    const nx = await failure(run(deployVerify as AnyTool, { url: 'http://nowhere.test/' }));
    expect(nx).toMatchObject({ code: 'fetch_failed', details: { reason: 'dns_not_found' } });
  });

  it('refuses a loopback URL not in FETCH_ALLOWED_HOSTS (400) and a redirect to one; the target sees no connection', async () => {
    forbidden.requests.length = 0;
    const direct = await failure(run(deployVerify as AnyTool, { url: forbidden.url('/') }));
    expect(direct).toMatchObject({ code: 'invalid_input', status: 400 });
    expect(direct.message).toMatch(/loopback/);
    const viaRedirect = await failure(run(deployVerify as AnyTool, { url: site.url('/to-forbidden') }));
    expect(viaRedirect.code).toBe('invalid_input');
    expect(forbidden.requests).toHaveLength(0);
    expect(deployVerify.input.safeParse({ url: 'ftp://example.com/' }).success).toBe(false);
    expect(deployVerify.input.safeParse({ url: 'https://example.com/', attempts: 11 }).success).toBe(false);
  });
});

describe('grabr_wayback', () => {
  beforeEach(() => {
    clearWaybackCache();
    cdx.cdxRequests.length = 0;
    cdx.snapshotRequests.length = 0;
    cdx.failWith = null;
    cdx.captures = [
      { timestamp: '20190101000000', original: 'https://w.test/', digest: 'D1' },
      { timestamp: '20200101000000', original: 'https://w.test/', digest: 'D1' },
      { timestamp: '20210101000000', original: 'https://w.test/', digest: 'D2', statuscode: '404' },
      { timestamp: '20220101000000', original: 'https://w.test/', digest: 'D3' },
    ];
    cdx.snapshots.set('20220101000000/https://w.test/', {
      contentType: 'text/html; charset=utf-8',
      body: '<html><head><title>Old W</title></head><body><p>Archived words.</p></body></html>',
    });
  });

  it('maps the request onto CDX parameters and counts distinct versions', async () => {
    const out = await run<GrabrWaybackOutput>(grabrWayback as AnyTool, { url: 'w.test', match: 'host', from: '2019', to: '2021', limit: 10, order: 'oldest' });
    expect(cdx.cdxRequests).toEqual([
      {
        url: 'https://w.test/',
        output: 'json',
        matchType: 'host',
        fl: 'timestamp,original,statuscode,mimetype,digest,length',
        from: '2019',
        to: '2021',
        limit: '10',
      },
    ]);
    expect(out.captures.map((c) => [c.timestamp, c.status, c.digest])).toEqual([
      ['20190101000000', 200, 'D1'],
      ['20200101000000', 200, 'D1'],
      ['20210101000000', 404, 'D2'],
    ]);
    expect(out.captures[0]!.archive_url).toBe(`${cdx.baseUrl}/20190101000000/https://w.test/`);
    expect(out).toMatchObject({ total: 3, distinct_versions: 2, first: '20190101000000', last: '20210101000000', snapshot: null, cached: false });
  });

  it('reads the newest 200 capture as text from {base}/{ts}id_/{url}, and caches the answer', async () => {
    const input = { url: 'https://w.test/', snapshot: true, limit: 2 };
    const out = await run<GrabrWaybackOutput>(grabrWayback as AnyTool, input);
    expect(cdx.cdxRequests[0]!['limit']).toBe('-2');
    expect(out.captures.map((c) => c.timestamp)).toEqual(['20210101000000', '20220101000000']);
    expect(cdx.snapshotRequests).toEqual(['/web/20220101000000id_/https://w.test/']);
    expect(out.snapshot).toMatchObject({ timestamp: '20220101000000', status: 200, title: 'Old W', content_type: 'text/html' });
    expect(out.snapshot!.text).toContain('Archived words.');
    const again = await run<GrabrWaybackOutput>(grabrWayback as AnyTool, input);
    expect(again.cached).toBe(true);
    expect({ ...again, cached: false }).toEqual(out);
    expect(cdx.cdxRequests).toHaveLength(1);
  });

  it('an upstream that is down or erroring is 503 tool_unavailable', async () => {
    cdx.failWith = 502;
    expect(await failure(run(grabrWayback as AnyTool, { url: 'https://w.test/' }))).toMatchObject({ code: 'tool_unavailable', status: 503 });
    const dead = await failure(run(grabrWayback as AnyTool, { url: 'https://w.test/' }, ctxFor({ WAYBACK_CDX_URL: `http://127.0.0.1:${deadPort}/cdx` })));
    expect(dead.code).toBe('tool_unavailable');
    expect(dead.message).toMatch(/unreachable/);
    expect((await failure(run(grabrWayback as AnyTool, { url: 'https://w.test/' }, ctxFor({ WAYBACK_CDX_URL: '' })))).code).toBe('tool_unavailable');
  });

  it('validates its input', () => {
    expect(grabrWayback.input.safeParse({ url: 'https://w.test/', limit: 1001 }).success).toBe(false);
    expect(grabrWayback.input.safeParse({ url: 'https://w.test/', from: '2020-01' }).success).toBe(false);
    expect(grabrWayback.input.safeParse({ url: 'https://w.test/', match: 'regex' }).success).toBe(false);
  });

  it('from after to is a 400 before any upstream call', async () => {
    const e = await failure(run(grabrWayback as AnyTool, { url: 'https://w.test/', from: '2021', to: '2020' }));
    expect(e).toMatchObject({ code: 'invalid_input', status: 400 });
    expect(cdx.cdxRequests).toHaveLength(0);
    // Same-year bounds are a valid range.
    await run(grabrWayback as AnyTool, { url: 'https://w.test/', from: '2020', to: '2020' });
    expect(cdx.cdxRequests).toHaveLength(1);
    expect(grabrWayback.input.safeParse({ url: 'https://w.test/', match: 'regex' }).success).toBe(false);
  });
});

describe('grabr_intel', () => {
  it("reports the DNS fake's records verbatim, SPF and DMARC parsed, headers, tech, SEO, robots and RDAP", async () => {
    site.requests.length = 0;
    const made = ctxFor({ RDAP_BASE_URL: rdap.url('/') });
    const out = await run<GrabrIntelOutput>(grabrIntel as AnyTool, { domain: `http://intel.test:${site.port}/` }, made);
    expect(out.domain).toBe('intel.test');
    expect(out.dns).toEqual({
      A: ['127.0.0.1'],
      AAAA: [],
      MX: [
        { exchange: 'mx1.intel.test', priority: 10 },
        { exchange: 'mx2.intel.test', priority: 20 },
      ],
      NS: ['ns1.intel.test', 'ns2.intel.test'],
      TXT: expect.arrayContaining(['v=spf1 ip4:192.0.2.0/24 include:_spf.mail.test -all', 'verification=abc "quoted" text', `long=${'x'.repeat(300)}`]),
      DMARC_TXT: ['v=DMARC1; p=quarantine; rua=mailto:dmarc@intel.test'],
    });
    expect(out.email_auth.spf).toMatchObject({ all: '-all', includes: ['_spf.mail.test'], valid: true });
    expect(out.email_auth.dmarc).toMatchObject({ policy: 'quarantine', rua: ['mailto:dmarc@intel.test'], valid: true });
    expect(out.http).toMatchObject({ status: 200, server: 'nginx/1.25.3', content_type: 'text/html' });
    expect(out.http!.security_headers['x-content-type-options']).toBe('nosniff');
    expect(out.tech.map((t) => t.name)).toEqual(['nginx', 'Hugo']);
    expect(out.seo).toMatchObject({ title: 'Intel Test', description: 'A test site', h1_count: 1, lang: 'en', canonical: `http://intel.test:${site.port}/` });
    expect(out.robots).toMatchObject({ found: true, homepage_allowed: true, sitemaps: ['http://intel.test/sitemap.xml'], disallow_rules: 1 });
    expect(out.rdap).toMatchObject({ found: true, registrar: 'Test Registrar', registered: '2001-02-03T00:00:00Z' });
    // The certificate is looked for on 443, which is not an admitted destination here.
    expect(out.tls).toBeNull();
    expect(out.unavailable.map((u) => u.part)).toEqual(['tls']);
    // robots.txt was read as GRABR_USER_AGENT before the home page.
    expect(site.requests.map((r) => r.path)).toEqual(['/robots.txt', '/']);
    expect(site.requests[0]!.headers['user-agent']).toBe(made.ctx.config.GRABR_USER_AGENT);
    expect(made.progress.at(-1)).toMatchObject({ done: 5, total: 5 });
  });

  it('reads the certificate when the origin is https (self-signed: authorized false)', async () => {
    dns.set('tls.test', { A: ['127.0.0.1'] });
    const out = await run<GrabrIntelOutput>(
      grabrIntel as AnyTool,
      { domain: `https://tls.test:${tlsSite.port}/` },
      ctxFor({ FETCH_ALLOWED_HOSTS: `tls.test:${tlsSite.port}` }),
    );
    expect(out.tls).toMatchObject({ authorized: false, error: 'DEPTH_ZERO_SELF_SIGNED_CERT' });
    expect(out.tls!.days_left).toBeGreaterThan(1000);
    // The guarded client verifies certificates, so the page itself is unavailable.
    expect(out.unavailable.map((u) => u.part)).toEqual(expect.arrayContaining(['http', 'tech', 'seo']));
  });

  it('a home page robots.txt disallows is robots_disallowed (403) and never fetched', async () => {
    closed.requests.length = 0;
    const e = await failure(run(grabrIntel as AnyTool, { domain: `http://closed.test:${closed.port}/` }));
    expect(e).toMatchObject({ code: 'robots_disallowed', status: 403 });
    expect(closed.requests.map((r) => r.path)).toEqual(['/robots.txt']);
  });

  it('robots.txt is asked before every redirect hop of the home page: a hop into a disallowed path is robots_disallowed and never requested', async () => {
    const redir = await startHttpTarget(
      routes({
        '/robots.txt': [200, { 'content-type': 'text/plain' }, 'User-agent: *\nDisallow: /members\n'],
        '/': [302, { location: '/members/home' }, ''],
        '/members/home': [200, { 'content-type': 'text/html' }, '<title>members</title>'],
        '/open': [200, { 'content-type': 'text/html' }, '<title>open</title>'],
      }),
    );
    try {
      dns.set('redir.test', { A: ['127.0.0.1'] });
      const made = ctxFor({ FETCH_ALLOWED_HOSTS: `redir.test:${redir.port}` });
      const e = await failure(run(grabrIntel as AnyTool, { domain: `http://redir.test:${redir.port}/` }, made));
      expect(e).toMatchObject({ code: 'robots_disallowed', status: 403 });
      expect(redir.requests.map((r) => r.path)).not.toContain('/members/home');
      expect(redir.requests.map((r) => r.path)).toContain('/');
    } finally {
      await redir.close();
    }
  });

  it('a home page that redirects within what robots.txt allows is followed, hops listed', async () => {
    const hop = await startHttpTarget(
      routes({
        '/robots.txt': [404, {}, ''],
        '/': [301, { location: '/en/' }, ''],
        '/en/': [200, { 'content-type': 'text/html' }, '<html><head><title>English</title></head></html>'],
      }),
    );
    try {
      dns.set('hop.test', { A: ['127.0.0.1'] });
      const out = await run<GrabrIntelOutput>(
        grabrIntel as AnyTool,
        { domain: `http://hop.test:${hop.port}/` },
        ctxFor({ FETCH_ALLOWED_HOSTS: `hop.test:${hop.port}` }),
      );
      expect(out.http).toMatchObject({
        url: `http://hop.test:${hop.port}/`,
        final_url: `http://hop.test:${hop.port}/en/`,
        status: 200,
        redirects: [{ url: `http://hop.test:${hop.port}/`, status: 301, location: `http://hop.test:${hop.port}/en/` }],
      });
      expect(out.seo!.title).toBe('English');
    } finally {
      await hop.close();
    }
  });

  it('a domain resolving to a private address is refused before anything connects', async () => {
    const e = await failure(run(grabrIntel as AnyTool, { domain: 'private.test' }));
    expect(e).toMatchObject({ code: 'invalid_input', status: 400 });
    expect(grabrIntel.input.safeParse({ domain: '10.0.0.1' }).success).toBe(false);
    expect(grabrIntel.input.safeParse({ domain: 'ftp://x.test' }).success).toBe(false);
  });

  it('a bare domain whose https port refuses falls back to http for the web parts', async () => {
    dns.set('plain.test', { A: ['127.0.0.1'] });
    const made = ctxFor({ FETCH_ALLOWED_HOSTS: 'plain.test:443,plain.test:80' });
    const asked: string[] = [];
    // The guarded client stands in for a site listening on port 80 only.
    made.ctx.http = {
      fetch: async (url) => {
        const u = String(url);
        asked.push(u);
        if (u.startsWith('https:')) throw new AppError('fetch_failed', 'plain.test:443 refused the connection', { reason: 'connection_refused' });
        const html = u.endsWith('/robots.txt') ? 'User-agent: *\nAllow: /\n' : '<html><head><title>Plain</title></head><body></body></html>';
        const body = Buffer.from(html);
        const type = u.endsWith('/robots.txt') ? 'text/plain' : 'text/html';
        return {
          url: u,
          final_url: u,
          status: 200,
          headers: { 'content-type': type },
          content_type: type,
          charset: null,
          body,
          bytes: body.length,
          truncated: false,
          redirects: [],
          text: () => html,
        };
      },
    };
    const out = await run<GrabrIntelOutput>(grabrIntel as AnyTool, { domain: 'plain.test' }, made);
    expect(asked).toEqual(['https://plain.test/robots.txt', 'http://plain.test/robots.txt', 'http://plain.test/']);
    expect(out.origin).toBe('http://plain.test');
    expect(out.robots).toMatchObject({ url: 'http://plain.test/robots.txt', homepage_allowed: true });
    expect(out.seo!.title).toBe('Plain');
    expect(out.unavailable.map((u) => u.part)).toEqual(['tls']);
    // Given a scheme, the caller's choice stands: no fallback.
    asked.length = 0;
    const strict = await run<GrabrIntelOutput>(grabrIntel as AnyTool, { domain: 'https://plain.test/' }, made);
    expect(asked).toEqual(['https://plain.test/robots.txt', 'https://plain.test/']);
    expect(strict.http).toBeNull();
  });

  it('a DNS resolver that does not answer is 503 tool_unavailable', async () => {
    const e = await failure(run(grabrIntel as AnyTool, { domain: 'intel.test' }, ctxFor({ DNS_SERVERS: `127.0.0.1:${deadPort}`, DNS_TIMEOUT_MS: '300' })));
    expect(e).toMatchObject({ code: 'tool_unavailable', status: 503 });
  });

  it('a name that does not exist still answers, with the web parts unavailable', async () => {
    const out = await run<GrabrIntelOutput>(grabrIntel as AnyTool, { domain: 'nowhere.test' });
    expect(out.dns.A).toEqual([]);
    expect(out.http).toBeNull();
    expect(out.unavailable.map((u) => u.part)).toEqual(['tls', 'http', 'tech', 'seo', 'robots']);
    expect(out.unavailable[0]!.reason).toMatch(/no such domain/);
  });
});

describe('discovery_collision', () => {
  it('a result copying the idea ranks first with high risk; unrelated ones rank below', async () => {
    search.respond((q) => [
      { url: 'https://bread.test/', title: 'Sourdough basics', content: 'How to bake bread with a long cold proof.' },
      { url: `https://copy.test/${encodeURIComponent(q.split(' ')[0]!)}`, title: 'Contract helper', content: IDEA },
      { url: 'https://legal.test/', title: 'Legal templates for freelancers', content: 'Contract templates and invoices for freelance work.' },
    ]);
    search.requests.length = 0;
    const made = ctxFor();
    const out = await run<DiscoveryCollisionOutput>(discoveryCollision as AnyTool, { idea: IDEA, queries: 2 }, made);
    expect(out.queries).toHaveLength(2);
    // The search client asks for a second page when the first has fewer results than wanted.
    expect(search.requests.filter((r) => r.params['pageno'] === '1').map((r) => r.params['q'])).toEqual(out.queries);
    expect(out.collisions[0]!.url).toMatch(/^https:\/\/copy\.test\//);
    expect(out.collisions[0]!.score).toBeGreaterThan(0.9);
    expect(out.collision_risk).toBe('high');
    expect(out.novelty).toBeLessThan(0.1);
    expect(out.collisions[0]!.shared_terms).toEqual(expect.arrayContaining(['contracts', 'browser']));
    expect(out.collisions[0]!.shared_terms.length).toBeLessThanOrEqual(10);
    const bread = out.collisions.find((c) => c.url === 'https://bread.test/');
    expect(bread === undefined || bread.score < 0.1).toBe(true);
    expect(out.caveat).toMatch(/not proof of novelty/);
    expect(made.progress.at(-1)).toMatchObject({ stage: 'scoring' });
  });

  it('no hits: no collisions, risk none, novelty 1, and the caveat', async () => {
    search.respond(() => []);
    const out = await run<DiscoveryCollisionOutput>(discoveryCollision as AnyTool, { idea: IDEA, queries: 1 });
    expect(out).toMatchObject({ collisions: [], collision_risk: 'none', novelty: 1, searched: 0 });
    expect(out.caveat).toMatch(/not proof of novelty/);
  });

  it('reads top pages through the guarded client; a blocked page is noted, not fatal', async () => {
    forbidden.requests.length = 0;
    search.respond(() => [
      { url: site.url('/article'), title: 'Article', content: 'something else entirely' },
      { url: forbidden.url('/'), title: 'Private', content: 'hidden' },
    ]);
    const out = await run<DiscoveryCollisionOutput>(discoveryCollision as AnyTool, { idea: IDEA, queries: 1, read_pages: 2 });
    const article = out.collisions.find((c) => c.url === site.url('/article'))!;
    expect(article.page_read).toBe(true);
    expect(article.score).toBeGreaterThan(0.5);
    expect(out.pages_unread).toEqual([{ url: forbidden.url('/'), reason: expect.stringMatching(/loopback/) }]);
    expect(forbidden.requests).toHaveLength(0);
  });

  it('needs search; the idea must be 20-4,000 characters', async () => {
    expect((await failure(run(discoveryCollision as AnyTool, { idea: IDEA }, ctxFor({}, false)))).code).toBe('tool_unavailable');
    expect(discoveryCollision.input.safeParse({ idea: 'too short' }).success).toBe(false);
    expect(discoveryCollision.input.safeParse({ idea: 'x'.repeat(4001) }).success).toBe(false);
    expect(discoveryCollision.input.safeParse({ idea: IDEA, queries: 6 }).success).toBe(false);
    expect(discoveryCollision.input.safeParse({ idea: IDEA, read_pages: 6 }).success).toBe(false);
    expect(discoveryCollision.input.parse({ idea: IDEA, read_pages: true }).read_pages).toBe(3);
    expect(discoveryCollision.input.parse({ idea: IDEA, read_pages: false }).read_pages).toBe(0);
  });
});
