import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TOOLS } from '../../src/tools/index.js';
import { webTools } from '../../src/tools/web/index.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { startFakeSearxng, type FakeSearxng } from '../helpers/fake-searxng.js';
import { startFakeDns, type FakeDnsServer } from '../helpers/dns-server.js';
import { startFakeCdx, type FakeCdx } from '../helpers/fake-cdx.js';
import { routes, startHttpTarget, type HttpTarget } from '../helpers/http-targets.js';

/** The tools under test here, from the family's registry. */
const webToolsA = webTools.filter((t) => ['web_search', 'deploy_verify', 'discovery_collision', 'grabr_intel', 'grabr_wayback'].includes(t.name));

/**
 * Web group A through the whole service (HTTP, queue, web workers, sandbox pool for parsing and
 * scoring, settlement) against local fakes: SearXNG, a DNS server, the CDX API, and fixture sites
 * admitted through FETCH_ALLOWED_HOSTS. Free tools cost nothing; discovery_collision costs 15 cents
 * when it answers, nothing when it fails.
 */

const IDEA = 'A browser extension that summarises long legal contracts for freelancers and highlights risky payment clauses.';

let h: Harness;
let bare: Harness;
let acct: TestAccount;
let search: FakeSearxng;
let dns: FakeDnsServer;
let cdx: FakeCdx;
let site: HttpTarget;
let tlsSite: HttpTarget;
let forbidden: HttpTarget;
/** A self-signed HTTPS site on 127.0.0.2:443 for the examples' hosts, when this machine lets the test bind it. */
let examples: HttpTarget | null = null;

beforeAll(async () => {
  [search, dns, cdx] = await Promise.all([startFakeSearxng(), startFakeDns({}), startFakeCdx()]);
  site = await startHttpTarget(
    routes({
      '/': [200, { 'content-type': 'text/html', server: 'Caddy' }, '<html lang="en"><head><title>Site A</title></head><body><h1>Hi</h1></body></html>'],
      '/robots.txt': [404, {}, ''],
      '/slow': (_req, res) => void setTimeout(() => res.writeHead(200, { 'content-type': 'text/plain' }).end('ok'), 250),
    }),
  );
  tlsSite = await startHttpTarget(routes({ '/': [200, { 'content-type': 'text/plain' }, 'deployed v7'] }), { tls: true });
  forbidden = await startHttpTarget(routes({ '/': [200, {}, 'secret'] }));
  dns.set('site-a.test', {
    A: ['127.0.0.1'],
    MX: [{ exchange: 'mail.site-a.test', priority: 5 }],
    NS: ['ns.site-a.test'],
    TXT: ['v=spf1 mx ~all', 'hello=world'],
  });
  dns.set('_dmarc.site-a.test', { TXT: ['v=DMARC1; p=reject; rua=mailto:r@site-a.test'] });
  dns.set('inside.test', { A: ['192.168.1.20'] });
  // The examples' hosts resolve to 127.0.0.2, admitted on 443, where a self-signed site answers if it could bind.
  try {
    examples = await startHttpTarget(
      routes({ '/': [200, { 'content-type': 'text/html' }, '<html><head><title>Example Domain</title></head><body><h1>Example Domain</h1></body></html>'] }),
      {
        host: '127.0.0.2',
        port: 443,
        tls: true,
      },
    );
  } catch {
    examples = null;
  }
  for (const name of ['example.com', 'www.iana.org', 'www.rfc-editor.org']) dns.set(name, { A: ['127.0.0.2'] });
  search.respond((q) => [
    { url: 'https://recipes.test/bread', title: 'Sourdough at home', content: 'A long cold proof makes better bread.' },
    { url: 'https://copy.test/contracts', title: 'Contract summariser', content: IDEA },
    { url: `https://misc.test/${q.length}`, title: 'Freelance invoices', content: 'Invoice templates for freelancers.' },
  ]);
  cdx.captures = [
    { timestamp: '20200102030405', original: 'https://w.test/', digest: 'AAA' },
    { timestamp: '20230102030405', original: 'https://w.test/', digest: 'BBB' },
  ];
  h = await startHarness(
    {
      SEARCH_BASE_URL: search.url,
      DNS_SERVERS: dns.address,
      FETCH_ALLOWED_HOSTS: [site.hostPort, tlsSite.hostPort, `site-a.test:${site.port}`, 'example.com:443', 'www.iana.org:443', 'site-a.test:443'].join(','),
      WAYBACK_CDX_URL: cdx.cdxUrl,
      WAYBACK_BASE_URL: cdx.baseUrl,
      WEB_FETCH_TIMEOUT_MS: '3000',
    },
    { workers: ['web'] },
  );
  bare = await startHarness({ WAYBACK_CDX_URL: '' }, { workers: [] });
  acct = await h.account('enterprise', 1000, { rpm: 10_000, maxInFlight: 20 });
}, 60_000);

afterAll(async () => {
  await Promise.all([h?.close(), bare?.close()]);
  await Promise.all([search?.close(), dns?.close(), cdx?.close(), site?.close(), tlsSite?.close(), forbidden?.close(), examples?.close()]);
});

function resultOf(tool: string, res: Awaited<ReturnType<Harness['call']>>) {
  expect(res.statusCode, res.body).toBe(200);
  const result = json(res).result;
  const schema = TOOLS.find((t) => t.name === tool)!.outputSchema!;
  const parsed = schema.safeParse(result);
  expect(parsed.success, parsed.success ? '' : JSON.stringify(parsed.error.issues.slice(0, 3))).toBe(true);
  return result;
}

describe('web group A through the service', () => {
  it('registers its five tools with output schemas and parseable examples', () => {
    expect(webToolsA.map((t) => t.name)).toEqual(['web_search', 'deploy_verify', 'discovery_collision', 'grabr_intel', 'grabr_wayback']);
    for (const t of webToolsA) {
      expect(TOOLS).toContain(t);
      expect(t.outputSchema, t.name).toBeDefined();
      for (const ex of t.examples) expect(t.input.safeParse(ex).success, `${t.name} ${JSON.stringify(ex)}`).toBe(true);
    }
  });

  it("web_search: the fake's results, the fake saw the query, free", async () => {
    search.requests.length = 0;
    const before = await h.credits(acct.accountId);
    const result = resultOf('web_search', await h.call('web_search', { query: 'contract summariser extension', limit: 3 }, acct.apiKey));
    expect(result.results.map((r: { url: string }) => r.url)).toEqual([
      'https://recipes.test/bread',
      'https://copy.test/contracts',
      `https://misc.test/${'contract summariser extension'.length}`,
    ]);
    expect(search.requests[0]!.params['q']).toBe('contract summariser extension');
    expect(await h.credits(acct.accountId)).toBe(before);
  });

  it('without SEARCH_BASE_URL (or with the CDX API disabled) the tools are 503 at admission, uncharged', async () => {
    const a = await bare.account('enterprise', 100);
    for (const [tool, body] of [
      ['web_search', { query: 'x' }],
      ['discovery_collision', { idea: IDEA }],
      ['grabr_wayback', { url: 'https://w.test/' }],
    ] as const) {
      const res = await bare.call(tool, body, a.apiKey);
      expect(res.statusCode, `${tool}: ${res.body}`).toBe(503);
      expect(json(res).error.code).toBe('tool_unavailable');
      expect(res.headers['x-job-id']).toBeUndefined();
    }
    expect(await bare.credits(a.accountId)).toBe(100);
    expect(await bare.ledgerCharges(a.accountId)).toBe(0);
  });

  it('discovery_collision: the copy ranks first with high risk; 15 cents charged', async () => {
    const a = await h.account('enterprise', 1000);
    const result = resultOf('discovery_collision', await h.call('discovery_collision', { idea: IDEA, queries: 2 }, a.apiKey));
    expect(result.collisions[0].url).toBe('https://copy.test/contracts');
    expect(result.collision_risk).toBe('high');
    expect(result.caveat).toMatch(/not proof of novelty/);
    expect(await h.credits(a.accountId)).toBe(985);
  });

  it('discovery_collision: a search upstream that fails is 503 and not charged', async () => {
    const a = await h.account('enterprise', 1000);
    search.failWith = 502;
    try {
      const res = await h.call('discovery_collision', { idea: IDEA }, a.apiKey);
      expect(res.statusCode, res.body).toBe(503);
      expect(json(res).error.code).toBe('tool_unavailable');
    } finally {
      search.failWith = null;
    }
    expect(await h.credits(a.accountId)).toBe(1000);
    expect(await h.ledgerCharges(a.accountId)).toBe(0);
  });

  it('deploy_verify: a self-signed fixture is authorized:false with days_left; a delayed one has ttfb >= the delay', async () => {
    const tls = resultOf('deploy_verify', await h.call('deploy_verify', { url: tlsSite.url('/'), expect_text: 'deployed v7' }, acct.apiKey));
    expect(tls.status).toBe(200);
    expect(tls.tls).toMatchObject({ authorized: false, error: 'DEPTH_ZERO_SELF_SIGNED_CERT' });
    expect(tls.tls.days_left).toBeGreaterThan(1000);
    expect(tls.checks.find((c: { name: string }) => c.name === 'expect_text').pass).toBe(true);
    const slow = resultOf('deploy_verify', await h.call('deploy_verify', { url: site.url('/slow'), expect_status: 200, max_ms: 10_000 }, acct.apiKey));
    expect(slow.ok).toBe(true);
    expect(slow.timings_ms.ttfb).toBeGreaterThanOrEqual(250);
  });

  it('grabr_intel: the DNS fake\u2019s records verbatim, SPF and DMARC parsed', async () => {
    const r = resultOf('grabr_intel', await h.call('grabr_intel', { domain: `http://site-a.test:${site.port}/` }, acct.apiKey));
    expect(r.dns).toEqual({
      A: ['127.0.0.1'],
      AAAA: [],
      MX: [{ exchange: 'mail.site-a.test', priority: 5 }],
      NS: ['ns.site-a.test'],
      TXT: expect.arrayContaining(['v=spf1 mx ~all', 'hello=world']),
      DMARC_TXT: ['v=DMARC1; p=reject; rua=mailto:r@site-a.test'],
    });
    expect(r.dns.TXT).toHaveLength(2);
    expect(r.email_auth.spf).toMatchObject({ all: '~all', dns_lookups: 1 });
    expect(r.email_auth.dmarc).toMatchObject({ policy: 'reject' });
    expect(r.seo.title).toBe('Site A');
    expect(r.tech.map((t: { name: string }) => t.name)).toEqual(['Caddy']);
    expect(r.robots).toMatchObject({ status: 404, found: false, homepage_allowed: true });
    expect(r.unavailable.map((u: { part: string }) => u.part)).toEqual(['tls']);
  });

  it('grabr_wayback: the fake received the mapped parameters; an upstream that is down is 503', async () => {
    cdx.cdxRequests.length = 0;
    const r = resultOf(
      'grabr_wayback',
      await h.call('grabr_wayback', { url: 'https://w.test/', match: 'prefix', from: '2020', limit: 5, order: 'oldest' }, acct.apiKey),
    );
    expect(cdx.cdxRequests).toEqual([
      { url: 'https://w.test/', output: 'json', matchType: 'prefix', fl: 'timestamp,original,statuscode,mimetype,digest,length', from: '2020', limit: '5' },
    ]);
    expect(r).toMatchObject({ total: 2, distinct_versions: 2, first: '20200102030405', last: '20230102030405' });
    cdx.failWith = 503;
    try {
      const res = await h.call('grabr_wayback', { url: 'https://w.test/', match: 'host' }, acct.apiKey);
      expect(res.statusCode, res.body).toBe(503);
      expect(json(res).error.code).toBe('tool_unavailable');
    } finally {
      cdx.failWith = null;
    }
  });

  it('a loopback or private destination not in FETCH_ALLOWED_HOSTS is refused with 400, and the target sees no connection', async () => {
    forbidden.requests.length = 0;
    const a = await h.account('enterprise', 100);
    for (const [tool, body] of [
      ['deploy_verify', { url: forbidden.url('/') }],
      ['grabr_intel', { domain: `http://127.0.0.1:${forbidden.port}/` }],
      ['grabr_intel', { domain: 'inside.test' }],
    ] as const) {
      const res = await h.call(tool, body, a.apiKey);
      // grabr_intel takes a domain name: an IP address is a schema error; both are 400 invalid_input.
      expect(res.statusCode, `${tool}: ${res.body}`).toBe(400);
      expect(json(res).error.code).toBe('invalid_input');
    }
    expect(forbidden.requests).toHaveLength(0);
    expect(await h.credits(a.accountId)).toBe(100);
  });

  it('every example answers 200 and its result matches the output schema', async () => {
    const a = await h.account('enterprise', 1000, { rpm: 10_000, maxInFlight: 20 });
    for (const tool of webToolsA) {
      for (const ex of tool.examples) {
        const res = await h.call(tool.name, ex, a.apiKey);
        // Without the 443 site, deploy_verify gets no answer at all: 502, as any unreachable target.
        if (tool.name === 'deploy_verify' && !examples) expect(json(res).error?.code, res.body).toBe('fetch_failed');
        else resultOf(tool.name, res);
      }
    }
    if (examples) expect(examples.requests.length).toBeGreaterThan(0);
  }, 60_000);

  it('deploy_verify: no answer at all is 502 fetch_failed, uncharged', async () => {
    const res = await h.call('deploy_verify', { url: 'http://site-a.test:1/' }, acct.apiKey);
    // site-a.test:1 is not admitted: refused before connecting.
    expect(res.statusCode).toBe(400);
    const dead = await h.call('deploy_verify', { url: 'http://nowhere.test/' }, acct.apiKey);
    expect(dead.statusCode, dead.body).toBe(502);
    expect(json(dead).error).toMatchObject({ code: 'fetch_failed', reason: 'dns_not_found' });
  });
});
