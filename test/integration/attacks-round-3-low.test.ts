import http from 'node:http';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { sql } from '../../src/db/pool.js';
import { createPartner } from '../../src/money/partners.js';
import { clearWaybackCache } from '../../src/tools/web/grabr-wayback.js';
import { startFakeDns, type FakeDnsServer } from '../helpers/dns-server.js';
import { startHttpTarget, type HttpTarget } from '../helpers/http-targets.js';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { waitUntil } from '../helpers/wait.js';

/**
 * The third round of attacks, its low findings (issue 26, point 8): each case held on the code before
 * it. NUL bytes at the door and in stored answers; refusals that echoed what a name resolves to;
 * sign-up telling which emails have accounts; /subscribe tried unthrottled and naming the partner;
 * /metrics public by default; grabr_wayback following `..` out of WAYBACK_BASE_URL. (The Host-header
 * finding and webhook signing have their own files.)
 */

const INTERNAL_ADDRESS = '10.1.2.3';
const PARTNER_NAME = `Secret Partner ${Math.random().toString(36).slice(2, 8)}`;
const PARTNER_CODE = `LOW-${Math.random().toString(36).slice(2, 8)}`;

/** A fake Wayback Machine whose CDX data climbs out of /web, and a page outside it that must never be read. */
interface FakeArchive {
  origin: string;
  paths: string[];
  close(): Promise<void>;
}

async function startFakeArchive(original: string): Promise<FakeArchive> {
  const paths: string[] = [];
  const server = http.createServer((req, res) => {
    paths.push(req.url ?? '');
    const u = new URL(req.url ?? '/', 'http://fake');
    if (u.pathname === '/cdx') {
      const rows = [
        ['timestamp', 'original', 'statuscode', 'mimetype', 'digest', 'length'],
        ['20200101000000', original, '200', 'text/plain', 'AAA', '10'],
      ];
      return void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(rows));
    }
    if (u.pathname === '/private/secret') return void res.writeHead(200, { 'content-type': 'text/plain' }).end('TOP SECRET operator page');
    res.writeHead(404, { 'content-type': 'text/plain' }).end('not archived');
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as AddressInfo;
  return {
    origin: `http://127.0.0.1:${port}`,
    paths,
    close: async () => {
      server.closeAllConnections();
      server.close();
      await once(server, 'close');
    },
  };
}

let h: Harness;
let dns: FakeDnsServer;
let site: HttpTarget;
let archive: FakeArchive;
/** Webhook deliveries the site received (POST /hook). */
const hooks: string[] = [];

beforeAll(async () => {
  dns = await startFakeDns({ 'internal.test': { A: [INTERNAL_ADDRESS] } });
  site = await startHttpTarget((req, res) => {
    if (req.url === '/nul') return void res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8' }).end('before\u0000after');
    if (req.url === '/hook' && req.method === 'POST') {
      let raw = '';
      req.on('data', (c: Buffer) => (raw += c.toString('utf8')));
      req.on('end', () => {
        hooks.push(raw);
        res.writeHead(200).end();
      });
      return;
    }
    res.writeHead(404).end();
  });
  // Five `..` after the capture's own host climb past /web/{timestamp}id_/https:/ and /web itself.
  archive = await startFakeArchive('https://w.test/../../../../../private/secret');
  h = await startHarness(
    {
      DNS_SERVERS: dns.address,
      FETCH_ALLOWED_HOSTS: site.hostPort,
      WEBHOOK_ALLOWED_HOSTS: site.hostPort,
      WAYBACK_CDX_URL: `${archive.origin}/cdx`,
      WAYBACK_BASE_URL: `${archive.origin}/web`,
      SIGNUP_ENABLED: 'true',
      SIGNUP_PER_HOUR: '5',
      SUBSCRIBE_PER_MINUTE: '3',
    },
    { workers: ['core', 'web', 'text'] },
  );
  await createPartner(h.container.pool, PARTNER_NAME, PARTNER_CODE);
}, 60_000);

afterAll(async () => {
  await h?.close();
  await site?.close();
  await archive?.close();
  await dns?.close();
});

const auth = (key: string) => ({ authorization: `Bearer ${key}` });

/** Log lines at error level or above (pino: level >= 50) written since `from`. */
function errorLines(from: number): string[] {
  return h.logs.slice(from).filter((l) => {
    try {
      return (JSON.parse(l) as { level: number }).level >= 50;
    } catch {
      return false;
    }
  });
}

function expectUnsupported(res: { statusCode: number; body: string }) {
  expect(res.statusCode, res.body).toBe(400);
  expect(json(res as never).error).toMatchObject({ code: 'invalid_input', reason: 'unsupported_character', request_id: expect.any(String) });
}

describe('issue 26, low findings', () => {
  it('(a) NUL in /jobs/{id}, ?tool= or a sub-key name is 400 invalid_input at the door, with nothing logged at error level; a NUL in a tool answer is stored', async () => {
    const a = await h.account('enterprise', 1000);
    const from = h.logs.length;
    expectUnsupported(await h.request({ method: 'GET', url: '/jobs/abc%00def', headers: auth(a.apiKey) }));
    expectUnsupported(await h.request({ method: 'GET', url: '/jobs?tool=compute%00', headers: auth(a.apiKey) }));
    expectUnsupported(await h.request({ method: 'DELETE', url: '/jobs/%00', headers: auth(a.apiKey) }));
    expectUnsupported(
      await h.request({
        method: 'POST',
        url: '/subkeys/create',
        headers: { ...auth(a.apiKey), 'content-type': 'application/json' },
        payload: JSON.stringify({ name: 'bot\u0000one', monthly_limit: 100, allowed_tools: ['compute'] }),
      }),
    );
    // Bodies: U+0000 and an unpaired surrogate (which jsonb refuses) in a tool input or a key.
    expectUnsupported(await h.call('compute', { expression: '1 + 1\u0000' }, a.apiKey));
    expectUnsupported(
      await h.request({
        method: 'POST',
        url: '/tools/compute',
        headers: { ...auth(a.apiKey), 'content-type': 'application/json' },
        payload: '{"expression":"1 + \\ud800"}',
      }),
    );
    expectUnsupported(
      await h.request({
        method: 'POST',
        url: '/tools/compute',
        headers: { ...auth(a.apiKey), 'content-type': 'application/json' },
        payload: '{"expression":"1","\\u0000":1}',
      }),
    );
    // MCP answers in JSON-RPC: an Invalid Request, the tool never called.
    const mcp = await h.request({
      method: 'POST',
      url: '/mcp',
      headers: { ...auth(a.apiKey), 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-03-26' },
      payload: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'compute', arguments: { expression: '1\u0000' } } }),
    });
    expect(mcp.statusCode, mcp.body).toBe(400);
    expect(json(mcp).error).toMatchObject({ code: -32600, message: expect.stringContaining('U+0000') });
    // A surrogate pair is a character like any other, and an escaped backslash before "u0000" is text.
    expect((await h.call('compute', { expression: '"\u{1F600}"' }, a.apiKey)).statusCode).not.toBe(500);
    expect((await h.request({ method: 'GET', url: '/jobs?tool=%5Cu0000', headers: auth(a.apiKey) })).statusCode).toBe(200);
    expect(errorLines(from)).toEqual([]);

    // A tool's answer that carries U+0000 (a page's text) is stored and read back (as U+FFFD in Postgres).
    const res = await h.call('page_fetch', { url: site.url('/nul') }, a.apiKey);
    expect(res.statusCode, res.body).toBe(200);
    const jobId = res.headers['x-job-id'] as string;
    expect(jobId).toBeTruthy();
    const row = () =>
      h.container.pool.maybeOne(sql.type(z.object({ status: z.string(), body: z.record(z.unknown()) }))`
        SELECT status, body FROM job_results WHERE job_id = ${jobId}`);
    await waitUntil(async () => (await row()) !== null, 10_000, 50);
    const stored = (await row())!;
    expect(stored.status).toBe('completed');
    expect(JSON.stringify(stored.body)).toContain('before\uFFFDafter');
    const read = await h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: auth(a.apiKey) });
    expect(read.statusCode, read.body).toBe(200);
    expect(read.body).toContain('before');
    expect(read.body).toContain('after');
    const listed = await h.request({ method: 'GET', url: '/jobs?tool=page_fetch', headers: auth(a.apiKey) });
    expect(listed.statusCode, listed.body).toBe(200);
    expect(json(listed).jobs.map((j: { job_id: string }) => j.job_id)).toContain(jobId);
    expect(errorLines(from)).toEqual([]);
  });

  it('(a) a chain whose result carries U+0000 is stored for its webhook and delivered, not retried forever', async () => {
    const a = await h.account('enterprise', 1000);
    const res = await h.request({
      method: 'POST',
      url: '/',
      headers: { ...auth(a.apiKey), 'content-type': 'application/json', prefer: 'respond-async', 'callback-url': site.url('/hook') },
      payload: { chain: ['page_fetch', 'beacon_compress'], q: site.url('/nul') },
    });
    expect(res.statusCode, res.body).toBe(202);
    const rootId = json(res).job_id as string;
    // Its outbox row is written (body null) before the flow is queued; the body once the request ended.
    const kept = () =>
      h.container.pool.maybeOneFirst(sql.type(z.object({ body: z.record(z.unknown()).nullable() }))`SELECT body FROM webhook_jobs WHERE job_id = ${rootId}`);
    // The watch re-checks a running request at growing intervals (250 ms doubling, up to 30 s).
    await waitUntil(async () => (await kept()) != null, 60_000, 100);
    // Stored sealed; opened, the U+0000 is a replacement character.
    expect(JSON.stringify(await kept())).not.toContain('before');
    expect(JSON.stringify(await h.container.webhooks!.body(rootId))).toContain('before\uFFFDafter');
    await waitUntil(() => hooks.some((raw) => raw.includes(rootId)), 30_000, 100);
  }, 120_000);

  it('(b) a refused Callback-Url or page names the host it was given, never what the name resolves to', async () => {
    const a = await h.account('pro', 1000);
    const hooked = await h.call('compute', { expression: '1 + 1' }, a.apiKey, { 'callback-url': 'https://internal.test/hook' });
    expect(hooked.statusCode, hooked.body).toBe(400);
    expect(json(hooked).error).toMatchObject({ code: 'invalid_input', reason: 'blocked_address' });
    expect(json(hooked).error.message).toContain('internal.test');
    expect(hooked.body).not.toContain(INTERNAL_ADDRESS);
    expect(hooked.body).not.toMatch(/resolves to|private/);

    const fetched = await h.call('page_fetch', { url: 'http://internal.test/admin' }, a.apiKey);
    expect(fetched.statusCode, fetched.body).toBe(400);
    expect(json(fetched).error).toMatchObject({ code: 'invalid_input', reason: 'blocked_address' });
    expect(json(fetched).error.message).toContain('internal.test');
    expect(fetched.body).not.toContain(INTERNAL_ADDRESS);
    expect(fetched.body).not.toMatch(/resolves to|private/);
  });

  it('(c) sign-up answers an email used before exactly as a new one', async () => {
    const email = `taken-${Math.random().toString(36).slice(2, 10)}@example.com`;
    const signup = (address: string, remoteAddress: string) =>
      h.request({
        method: 'POST',
        url: '/signup',
        remoteAddress,
        headers: { 'content-type': 'application/json' },
        payload: JSON.stringify({ email: address }),
      });
    const first = await signup(email, '10.26.0.1');
    const again = await signup(email.toUpperCase(), '10.26.0.2');
    const fresh = await signup(`new-${email}`, '10.26.0.3');
    const shape = (res: { statusCode: number; body: string }) => {
      const body = json(res as never);
      return {
        status: res.statusCode,
        keys: Object.keys(body).sort(),
        types: Object.keys(body)
          .sort()
          .map((k) => typeof body[k]),
      };
    };
    expect(shape(again)).toEqual(shape(first));
    expect(shape(fresh)).toEqual(shape(first));
    expect(first.statusCode, first.body).toBe(201);
    // Each is a working account of its own: nothing about the first is handed to the second.
    expect(json(again).account_id).not.toBe(json(first).account_id);
    for (const res of [first, again]) {
      expect((await h.request({ method: 'GET', url: '/balance', headers: auth(json(res).api_key) })).statusCode).toBe(200);
    }
  });

  it('(d) /subscribe names no partner and is throttled per client address (429 with Retry-After)', async () => {
    const page = (remoteAddress: string, accept?: string) =>
      h.request({ method: 'GET', url: `/subscribe?attribution_code=${PARTNER_CODE}`, remoteAddress, headers: accept ? { accept } : {} });
    const html = await page('10.26.1.1');
    expect(html.statusCode).toBe(200);
    expect(html.body).toContain(PARTNER_CODE);
    expect(html.body).not.toContain(PARTNER_NAME);
    const asJson = await page('10.26.1.1', 'application/json');
    expect(asJson.statusCode).toBe(200);
    expect(json(asJson).attribution).toMatchObject({ code: PARTNER_CODE, known: true });
    expect(asJson.body).not.toContain(PARTNER_NAME);
    expect((await page('10.26.1.1')).statusCode).toBe(200);
    // SUBSCRIBE_PER_MINUTE is 3 here: the fourth from one address is refused before any look-up.
    const limited = await h.request({ method: 'GET', url: '/subscribe?attribution_code=GUESS-1', remoteAddress: '10.26.1.1' });
    expect(limited.statusCode).toBe(429);
    expect(json(limited).error).toMatchObject({ code: 'rate_limited', retry_after: expect.any(Number), request_id: expect.any(String) });
    expect(Number(limited.headers['retry-after'])).toBeGreaterThan(0);
    expect(Number(limited.headers['retry-after'])).toBeLessThanOrEqual(60);
    expect((await page('10.26.1.2')).statusCode).toBe(200);
  });

  it('(e) /metrics is not public: 404 on the API port without METRICS_TOKEN, the bearer with it, and METRICS_PORT serves it apart', async () => {
    const open = await h.request({ method: 'GET', url: '/metrics' });
    expect(open.statusCode).toBe(404);
    expect(json(open).error.code).toBe('not_found');
    expect(open.body).not.toContain('tollgate_cents_charged_total');

    const token = 'low-metrics-token-0123456789';
    const probe = http.createServer();
    probe.listen(0, '127.0.0.1');
    await once(probe, 'listening');
    const metricsPort = (probe.address() as AddressInfo).port;
    probe.close();
    await once(probe, 'close');
    const m = await startHarness({ METRICS_TOKEN: token, METRICS_PORT: String(metricsPort), HOST: '127.0.0.1' }, { workers: [] });
    try {
      expect((await m.request({ method: 'GET', url: '/metrics' })).statusCode).toBe(401);
      expect((await m.request({ method: 'GET', url: '/metrics', headers: { authorization: 'Bearer wrong' } })).statusCode).toBe(401);
      const ok = await m.request({ method: 'GET', url: '/metrics', headers: { authorization: `Bearer ${token}` } });
      expect(ok.statusCode).toBe(200);
      expect(ok.body).toContain('tollgate_cents_charged_total');
      // Once the API listens, its metrics are on METRICS_PORT too (with the token).
      await m.app.listen({ port: 0, host: '127.0.0.1' });
      const apart = `http://127.0.0.1:${metricsPort}/metrics`;
      expect((await fetch(apart)).status).toBe(401);
      const scraped = await fetch(apart, { headers: { authorization: `Bearer ${token}` } });
      expect(scraped.status).toBe(200);
      expect(await scraped.text()).toContain('tollgate_http_requests_total');
    } finally {
      await m.close();
    }
    // Closed with the app.
    await expect(fetch(`http://127.0.0.1:${metricsPort}/metrics`)).rejects.toThrow();
  });

  it('(f) grabr_wayback never leaves WAYBACK_BASE_URL, whatever `..` the archive data carries', async () => {
    clearWaybackCache();
    const a = await h.account('enterprise', 1000);
    const res = await h.call('grabr_wayback', { url: 'https://w.test/', snapshot: true }, a.apiKey);
    expect(res.statusCode, res.body).toBe(200);
    const body = json(res).result;
    expect(body.captures).toHaveLength(1);
    expect(res.body).not.toContain('TOP SECRET');
    expect(archive.paths.filter((p) => !p.startsWith('/cdx') && !p.startsWith('/web/'))).toEqual([]);
    expect(archive.paths.some((p) => p.startsWith('/private'))).toBe(false);
    for (const c of body.captures as Array<{ archive_url: string }>) {
      expect(c.archive_url === '' || c.archive_url.startsWith(`${archive.origin}/web/`)).toBe(true);
      if (c.archive_url) expect(new URL(c.archive_url).pathname.startsWith('/web/')).toBe(true);
    }
    if (body.snapshot) expect(new URL(body.snapshot.url).pathname.startsWith('/web/')).toBe(true);
  });
});
