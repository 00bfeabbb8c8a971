import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.js';
import { loadConfig } from '../../../src/config.js';
import { createGuardedHttp, hostLoad } from '../../../src/tools/web/guarded-http.js';
import { createResolver } from '../../../src/tools/web/resolver.js';
import { routes, startHttpTarget, type HttpTarget } from '../../helpers/http-targets.js';

/** ctx.http: the guard page_fetch uses, shared by every tool that reads the web for a caller. */

let site: HttpTarget;
let inFlight = 0;
let peak = 0;

beforeAll(async () => {
  site = await startHttpTarget(
    routes({
      '/ok': [200, { 'content-type': 'text/html; charset=utf-8' }, '<title>ok</title>'],
      '/to-ok': [302, { location: '/ok' }, ''],
      '/to-loopback': [301, { location: 'http://127.0.0.2:9/secret' }, ''],
      '/bomb': [200, { 'content-type': 'text/plain', 'content-encoding': 'gzip' }, gzipSync(Buffer.alloc(20_000_000, 0x61))],
      '/post': (req, res) => {
        let body = '';
        req.on('data', (c) => (body += c));
        req.on('end', () => res.writeHead(200, { 'content-type': 'text/plain' }).end(`${req.method} ${body}`));
      },
      '/slow': (_req, res) => {
        inFlight += 1;
        peak = Math.max(peak, inFlight);
        setTimeout(() => {
          inFlight -= 1;
          res.writeHead(200, { 'content-type': 'text/plain' }).end('slow');
        }, 150);
      },
    }),
  );
});
afterAll(async () => {
  await site.close();
});

function client(env: Record<string, string> = {}) {
  const config = loadConfig({}, { LOG_LEVEL: 'silent', FETCH_ALLOWED_HOSTS: site.hostPort, ...env });
  return createGuardedHttp({ config, resolver: createResolver(config), tool: 'test_tool', signal: new AbortController().signal });
}

async function failure(p: Promise<unknown>): Promise<AppError> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(AppError);
  return e as AppError;
}

describe('guarded http', () => {
  it('follows a redirect and reports it', async () => {
    const res = await client().fetch(site.url('/to-ok'));
    expect(res.status).toBe(200);
    expect(res.final_url).toBe(site.url('/ok'));
    expect(res.redirects).toEqual([{ url: site.url('/to-ok'), status: 302, location: site.url('/ok') }]);
    expect(res.text()).toBe('<title>ok</title>');
    expect(res.content_type).toBe('text/html');
    expect(res.charset).toBe('utf-8');
  });

  it('vets every redirect: a hop to another loopback address is refused before any connection', async () => {
    const e = await failure(client().fetch(site.url('/to-loopback')));
    expect(e.code).toBe('invalid_input');
    expect(e.details).toMatchObject({ reason: 'blocked_address' });
  });

  it('refuses loopback that FETCH_ALLOWED_HOSTS does not admit', async () => {
    const e = await failure(client({ FETCH_ALLOWED_HOSTS: '' }).fetch(site.url('/ok')));
    expect(e.code).toBe('invalid_input');
    expect(site.requests.filter((r) => r.path === '/ok').length).toBe(1); // only the first test's request
  });

  it('stops a gzip bomb at the byte cap', async () => {
    const res = await client().fetch(site.url('/bomb'), { maxBytes: 100_000 });
    expect(res.bytes).toBe(100_000);
    expect(res.truncated).toBe(true);
  });

  it('never reads past WEB_FETCH_MAX_BYTES whatever the request asks', async () => {
    const res = await client({ WEB_FETCH_MAX_BYTES: '50000' }).fetch(site.url('/bomb'), { maxBytes: 10_000_000 });
    expect(res.bytes).toBe(50_000);
  });

  it('sends a POST body; a refused connection is fetch_failed (502) with a reason', async () => {
    const res = await client().fetch(site.url('/post'), { method: 'POST', body: 'a=1' });
    expect(res.text()).toBe('POST a=1');
    const closed = await startHttpTarget(routes({}));
    const url = closed.url('/');
    const hostPort = closed.hostPort;
    await closed.close();
    const e = await failure(client({ FETCH_ALLOWED_HOSTS: hostPort }).fetch(url));
    expect(e.code).toBe('fetch_failed');
    expect(e.status).toBe(502);
    expect(e.details).toMatchObject({ reason: 'connection_refused' });
  });

  it('sends at most WEB_PER_HOST requests at once to one host', async () => {
    peak = 0;
    const http = client({ WEB_PER_HOST: '2' });
    const all = Promise.all(Array.from({ length: 6 }, () => http.fetch(site.url('/slow'))));
    await new Promise((r) => setTimeout(r, 50));
    expect(hostLoad(site.hostPort)).toBe(6);
    const answers = await all;
    expect(answers.map((a) => a.text())).toEqual(Array(6).fill('slow'));
    expect(peak).toBe(2);
    expect(hostLoad(site.hostPort)).toBe(0);
  });

  it('a deadline while waiting for a host slot is fetch_failed timeout', async () => {
    const http = client({ WEB_PER_HOST: '1' });
    const first = http.fetch(site.url('/slow'));
    await new Promise((r) => setTimeout(r, 20)); // the first holds the only slot (its answer takes 150 ms)
    const e = await failure(http.fetch(site.url('/slow'), { timeoutMs: 60 }));
    expect(e.code).toBe('fetch_failed');
    expect(e.details).toMatchObject({ reason: 'timeout' });
    expect(hostLoad(site.hostPort)).toBe(1); // the one that gave up left the queue
    expect((await first).text()).toBe('slow');
    expect(hostLoad(site.hostPort)).toBe(0);
  });
});
