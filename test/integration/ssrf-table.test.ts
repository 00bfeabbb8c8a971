import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TOOLS } from '../../src/tools/index.js';
import { startFakeDns, type FakeDnsServer } from '../helpers/dns-server.js';
import { startFakeSearxng, type FakeSearxng } from '../helpers/fake-searxng.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { routes, startHttpTarget, type HttpTarget } from '../helpers/http-targets.js';

/**
 * One SSRF table: every tool that reads the web for a caller, against every way of spelling or reaching
 * loopback. A canary listens on loopback (not in FETCH_ALLOWED_HOSTS); after the whole table it must
 * have seen no connection at all. The other private ranges are covered by the guard's own tests
 * (test/unit/web/net-guard.test.ts, page-fetch-guard.test.ts): every tool goes through that guard.
 */

let h: Harness;
let acct: TestAccount;
let canary: net.Server;
let canaryPort: number;
let canaryHits = 0;
let site: HttpTarget;
let dns: FakeDnsServer;
let searx: FakeSearxng;
let flip = 0;

/** How each tool takes a URL (tools reading a domain get the URL's host). */
const INPUT: Record<string, (url: string) => Record<string, unknown>> = {
  page_fetch: (url) => ({ url }),
  deploy_verify: (url) => ({ url, attempts: 1 }),
  grabr_scrape: (url) => ({ url }),
  grabr_contact: (url) => ({ url, max_pages: 1 }),
  grabr_sitemap: (url) => ({ url }),
  grabr_batch: (url) => ({ urls: [url] }),
  cvi_verify: (url) => ({ claims: ['The canary sings.'], urls: [url] }),
};
/** Web tools that never connect to a caller's URL themselves (search and archive upstreams are the operator's). */
const NO_CALLER_URL = new Set(['web_search', 'domain_check', 'grabr_wayback', 'grabr_intel', 'discovery_collision']);

beforeAll(async () => {
  canary = net.createServer((sock) => {
    canaryHits += 1;
    sock.destroy();
  });
  await new Promise<void>((r) => canary.listen(0, '127.0.0.1', r));
  canaryPort = (canary.address() as net.AddressInfo).port;
  const to = `http://127.0.0.1:${canaryPort}/secret`;
  site = await startHttpTarget(
    routes({
      '/robots.txt': [200, { 'content-type': 'text/plain' }, 'User-agent: *\nAllow: /\n'],
      '/r301': [301, { location: to }, ''],
      '/r302': [302, { location: to }, ''],
      '/r303': [303, { location: to }, ''],
      '/r307': [307, { location: to }, ''],
      '/r308': [308, { location: to }, ''],
      '/r-decimal': [302, { location: `http://2130706433:${canaryPort}/` }, ''],
      '/r-name': [302, { location: `http://loop.test:${canaryPort}/` }, ''],
    }),
  );
  dns = await startFakeDns({ 'loop.test': { A: ['127.0.0.1'] }, 'mapped.test': { AAAA: ['::ffff:127.0.0.1'] } });
  // Rebinding: the first answer is public, the next loopback, and so on.
  const zone = dns.zone;
  dns.zone = new Proxy(zone, {
    get: (target, name: string) => (name === 'rebind.test' ? { A: [flip++ % 2 === 0 ? '93.184.216.34' : '127.0.0.1'] } : target[name]),
    has: (target, name: string) => name === 'rebind.test' || name in target,
  });
  searx = await startFakeSearxng();
  searx.respond(() => [{ url: `http://127.0.0.1:${canaryPort}/prior-art`, title: 'prior art', content: 'the canary sings' }]);
  h = await startHarness(
    { FETCH_ALLOWED_HOSTS: site.hostPort, DNS_SERVERS: dns.address, DNS_TIMEOUT_MS: '1000', SEARCH_BASE_URL: searx.url, WEB_FETCH_TIMEOUT_MS: '3000' },
    { workers: ['web', 'text', 'media', 'llm'] },
  );
  acct = await h.account('enterprise', 1_000_000, { rpm: 100_000, maxInFlight: 100 });
});

afterAll(async () => {
  await h?.close();
  await site?.close();
  await dns?.close();
  await searx?.close();
  await new Promise((r) => canary?.close(r));
});

const tricks = () => [
  `http://127.0.0.1:${canaryPort}/`,
  `http://2130706433:${canaryPort}/`,
  `http://0x7f000001:${canaryPort}/`,
  `http://0177.0.0.1:${canaryPort}/`,
  `http://127.1:${canaryPort}/`,
  `http://[::ffff:127.0.0.1]:${canaryPort}/`,
  `http://[::ffff:7f00:1]:${canaryPort}/`,
  `http://[::1]:${canaryPort}/`,
  `http://localhost:${canaryPort}/`,
  `http://user:pw@127.0.0.1:${canaryPort}/`,
  `http://loop.test:${canaryPort}/`,
  `http://mapped.test:${canaryPort}/`,
  `http://rebind.test:${canaryPort}/`,
  ...['/r301', '/r302', '/r303', '/r307', '/r308', '/r-decimal', '/r-name'].map((p) => site.url(p)),
];

describe('SSRF table', () => {
  it('covers every tool of the web and media families that reads a caller URL', () => {
    const web = TOOLS.filter((t) => t.family === 'web' || t.family === 'media').map((t) => t.name);
    const uncovered = web.filter((n) => !INPUT[n] && !NO_CALLER_URL.has(n) && !n.startsWith('grabr_transcript') && !n.startsWith('grabr_video'));
    expect(uncovered).toEqual([]);
  });

  it('no tool reaches the loopback canary, however the address is spelled or reached', async () => {
    const rows: string[] = [];
    for (const [tool, build] of Object.entries(INPUT)) {
      if (!TOOLS.some((t) => t.name === tool)) continue;
      for (const url of tricks()) {
        const res = await h.call(tool, build(url), acct.apiKey);
        const body = json(res);
        // Refused (4xx/5xx), or for a batch an item that failed: never a page read from the canary.
        const items: Array<{ ok: boolean }> = body.result?.items ?? [];
        const ok = res.statusCode >= 400 || (items.length > 0 && items.every((i) => i.ok === false));
        if (!ok) rows.push(`${tool} ${url} -> ${res.statusCode} ${res.body.slice(0, 200)}`);
      }
    }
    expect(rows).toEqual([]);
    expect(canaryHits).toBe(0);
  }, 300_000);

  it('a domain that resolves to loopback is refused before anything connects (grabr_intel)', async () => {
    for (const domain of ['localhost', '127.0.0.1', 'loop.test', 'mapped.test', `http://loop.test:${canaryPort}/`, `https://127.1:${canaryPort}/`]) {
      const res = await h.call('grabr_intel', { domain }, acct.apiKey);
      // Refused, or (a name the resolver does not know) answered with nothing read from it.
      const nothingRead = res.statusCode === 200 && json(res).result.http === null && json(res).result.tls === null;
      expect(res.statusCode === 400 || nothingRead, `${domain}: ${res.statusCode} ${res.body.slice(0, 200)}`).toBe(true);
    }
    expect(canaryHits).toBe(0);
  });

  it('search results that point at loopback are not read (discovery_collision)', async () => {
    if (!TOOLS.some((t) => t.name === 'discovery_collision')) return;
    const res = await h.call('discovery_collision', { idea: 'A canary that sings when the mine fills with gas, as a service.', read_pages: 3 }, acct.apiKey);
    expect(res.statusCode).toBeLessThan(500);
    expect(canaryHits).toBe(0);
  });
});
