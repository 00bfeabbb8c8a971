import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pino from 'pino';
import { AppError } from '../../../src/errors.js';
import { loadConfig } from '../../../src/config.js';
import { SandboxPool } from '../../../src/sandbox/pool.js';
import { MAX_HTML_DEPTH, MAX_HTML_ELEMENTS, htmlCapOffset } from '../../../src/tools/web/extract.js';
import { pageFetch, PageFetchInput } from '../../../src/tools/web/page-fetch.js';
import { startFakeDns, type FakeDnsServer } from '../../helpers/dns-server.js';
import { closedPort, routes, startHttpTarget, type HttpTarget } from '../../helpers/http-targets.js';
import { makeToolContext } from '../../helpers/tool-context.js';

const ARTICLE = `<!doctype html>
<html lang="en-GB">
<head>
  <meta charset="utf-8">
  <title>  Tide tables
    for Brighton </title>
  <meta name="description" content="When the sea comes in and goes out.">
  <meta name="author" content="Ada Lovelace">
  <meta property="article:published_time" content="2024-05-01T08:00:00Z">
  <meta property="og:title" content="Tide tables (OG)">
  <meta property="og:type" content="article">
  <meta property="og:image" content="https://cdn.example.test/tide.png">
  <meta name="twitter:card" content="summary_large_image">
  <link rel="canonical" href="/tides/brighton">
  <style>body { color: red }</style>
  <script>var tracking = "do not show";</script>
</head>
<body>
  <header><a href="/">Home</a> <a href="/about">About</a></header>
  <nav><a href="/a">Menu item one</a><a href="/b">Menu item two</a></nav>
  <main>
    <h1>Brighton tides</h1>
    <p>High   water is at
       <b>06:12</b> and <i>18:40</i>.</p>
    <p>Low water&nbsp;follows six hours later.<br>Check locally.</p>
    <ul><li>Spring tides</li><li>Neap tides</li></ul>
    <script>document.write("nope")</script>
    <a href="#top">Back to top</a>
    <a href="javascript:void(0)">Print</a>
    <a href="https://other.example.test/">Source</a>
  </main>
  <aside>Related: weather</aside>
  <footer>Copyright footer text</footer>
</body>
</html>`;

let site: HttpTarget;
let dns: FakeDnsServer;

beforeAll(async () => {
  site = await startHttpTarget(
    routes({
      '/article': [200, { 'content-type': 'text/html; charset=utf-8' }, ARTICLE],
      '/missing': [404, { 'content-type': 'text/html' }, '<html><head><title>Not here</title></head><body><p>Gone.</p></body></html>'],
      '/plain': [200, { 'content-type': 'text/plain; charset=utf-8' }, 'line one  \r\nline two\n\n\n\nline three\n'],
      '/json': [200, { 'content-type': 'application/json' }, '{"ok": true}'],
      '/image': [200, { 'content-type': 'image/png', 'content-length': '4' }, Buffer.from([0x89, 0x50, 0x4e, 0x47])],
      '/latin1': [200, { 'content-type': 'text/html; charset=iso-8859-1' }, Buffer.from('<title>Caf\xe9 cr\xe8me</title><p>\xc0 bient\xf4t</p>', 'latin1')],
      '/sniffed': [200, {}, '<!DOCTYPE html><title>No header</title><p>Body text</p>'],
      '/gzip': [200, { 'content-type': 'text/html', 'content-encoding': 'gzip' }, gzipSync('<title>Compressed</title><p>Squeezed text</p>')],
      '/big': [200, { 'content-type': 'text/plain' }, 'x'.repeat(100_000)],
      '/exact': [200, { 'content-type': 'text/plain' }, 'y'.repeat(2048)],
      '/progress': [200, { 'content-type': 'text/plain', 'content-length': String(300 * 1024) }, 'z'.repeat(300 * 1024)],
      '/r1': [302, { location: '/r2' }, ''],
      '/r2': [301, { location: '/article' }, ''],
      '/loop': [302, { location: '/loop' }, ''],
      '/to-ftp': [302, { location: 'ftp://files.example.test/' }, ''],
      '/hang': () => {
        // Never answers: the fetch must give up on its own deadline.
      },
      '/fat-header': (_req, res) => {
        res.writeHead(200, { 'content-type': 'text/html', 'x-padding': 'p'.repeat(60 * 1024) }).end('<p>hi</p>');
      },
      '/deep': [200, { 'content-type': 'text/html' }, '<title>Deep</title><p>before</p>' + '<div>'.repeat(20_000) + 'inside'],
      '/slow-body': (_req, res) => {
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.write('partial');
      },
    }),
  );
  dns = await startFakeDns({ 'site.test': { A: ['127.0.0.1'] } });
});

afterAll(async () => {
  await site.close();
  await dns.close();
  await pool?.close();
});

// Parsing goes through a real sandbox pool, as it does under the runner.
let pool: SandboxPool | undefined;
function isolate() {
  pool ??= new SandboxPool(loadConfig({}, { LOG_LEVEL: 'silent' }), pino({ level: 'silent' }));
  const p = pool;
  return {
    isolate: ((task, payload) => p.runTask(task, payload, { owner: 'test', label: `page_fetch/${task}` })) as NonNullable<
      ReturnType<typeof makeToolContext>['ctx']['isolate']
    >,
  };
}

async function fetchPage(input: { url: string; max_bytes?: number }, env: Record<string, string> = {}, signal?: AbortSignal) {
  const tc = makeToolContext({ env: { FETCH_ALLOWED_HOSTS: site.hostPort, ...env }, ...(signal ? { signal } : {}), ...isolate() });
  const result = await pageFetch.handler(PageFetchInput.parse(input), tc.ctx);
  return { result, progress: tc.progress };
}

async function fetchError(input: { url: string; max_bytes?: number }, env: Record<string, string> = {}, signal?: AbortSignal) {
  const err = await fetchPage(input, env, signal).then(
    () => null,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(AppError);
  return err as AppError;
}

describe('page_fetch of a local page', () => {
  it('extracts title, description, readable text and metadata', async () => {
    const { result } = await fetchPage({ url: site.url('/article') });
    expect(result).toMatchObject({
      url: site.url('/article'),
      final_url: site.url('/article'),
      status: 200,
      content_type: 'text/html',
      title: 'Tide tables for Brighton',
      description: 'When the sea comes in and goes out.',
      links_count: 5,
      bytes: Buffer.byteLength(ARTICLE),
      truncated: false,
      text_truncated: false,
      redirects: [],
    });
    expect(result.text).toBe(
      [
        'Brighton tides',
        'High water is at 06:12 and 18:40.',
        'Low water follows six hours later.',
        'Check locally.',
        'Spring tides',
        'Neap tides',
        'Back to top Print Source',
      ].join('\n'),
    );
    expect(result.metadata).toEqual({
      lang: 'en-GB',
      canonical: `${site.origin}/tides/brighton`,
      author: 'Ada Lovelace',
      published: '2024-05-01T08:00:00Z',
      'og:title': 'Tide tables (OG)',
      'og:type': 'article',
      'og:image': 'https://cdn.example.test/tide.png',
      'twitter:card': 'summary_large_image',
    });
    for (const hidden of ['tracking', 'nope', 'Menu item', 'Copyright', 'Related', 'Home', 'color: red']) {
      expect(result.text).not.toContain(hidden);
    }
  });

  it('sends a descriptive User-Agent', async () => {
    await fetchPage({ url: site.url('/json') });
    expect(site.requests.at(-1)?.headers['user-agent']).toMatch(/TollgatePageFetch/);
  });

  it('returns a non-2xx answer as a normal result', async () => {
    const { result } = await fetchPage({ url: site.url('/missing') });
    expect(result).toMatchObject({ status: 404, title: 'Not here', text: 'Gone.' });
  });

  it('follows relative redirects and lists them', async () => {
    const { result } = await fetchPage({ url: site.url('/r1') });
    expect(result).toMatchObject({ status: 200, final_url: site.url('/article'), title: 'Tide tables for Brighton' });
    expect(result.redirects).toEqual([
      { url: site.url('/r1'), status: 302, location: site.url('/r2') },
      { url: site.url('/r2'), status: 301, location: site.url('/article') },
    ]);
  });

  it('gives up after five redirects', async () => {
    const err = await fetchError({ url: site.url('/loop') });
    expect(err).toMatchObject({ code: 'tool_failed', details: { reason: 'too_many_redirects' } });
    expect(err.retryable).toBe(false);
  });

  it('does not follow a redirect to a non-HTTP scheme', async () => {
    const err = await fetchError({ url: site.url('/to-ftp') });
    expect(err).toMatchObject({ code: 'tool_failed', details: { reason: 'bad_redirect' } });
  });

  it('returns text bodies as text and binary bodies as metadata only', async () => {
    const plain = (await fetchPage({ url: site.url('/plain') })).result;
    expect(plain).toMatchObject({ content_type: 'text/plain', title: null, text: 'line one\nline two\n\nline three' });
    const json = (await fetchPage({ url: site.url('/json') })).result;
    expect(json).toMatchObject({ content_type: 'application/json', text: '{"ok": true}' });
    const image = (await fetchPage({ url: site.url('/image') })).result;
    expect(image).toMatchObject({ status: 200, content_type: 'image/png', text: '', bytes: 0, metadata: { content_length: '4' } });
  });

  it('decodes the declared charset, sniffs HTML without a content type, and inflates gzip', async () => {
    expect((await fetchPage({ url: site.url('/latin1') })).result).toMatchObject({ title: 'Café crème', text: 'À bientôt' });
    expect((await fetchPage({ url: site.url('/sniffed') })).result).toMatchObject({ content_type: null, title: 'No header', text: 'Body text' });
    expect((await fetchPage({ url: site.url('/gzip') })).result).toMatchObject({ title: 'Compressed', text: 'Squeezed text' });
  });

  it('resolves names through DNS_SERVERS', async () => {
    const url = `http://site.test:${site.port}/json`;
    const { result } = await fetchPage({ url }, { DNS_SERVERS: dns.address, FETCH_ALLOWED_HOSTS: `site.test:${site.port}` });
    expect(result).toMatchObject({ status: 200, final_url: url, text: '{"ok": true}' });
    expect(site.requests.at(-1)?.headers.host).toBe(`site.test:${site.port}`);
    expect(dns.queries).toContain('A site.test');
  });
});

describe('page_fetch limits', () => {
  it('stops reading at max_bytes and marks the result truncated', async () => {
    const { result } = await fetchPage({ url: site.url('/big'), max_bytes: 2048 });
    expect(result).toMatchObject({ bytes: 2048, truncated: true, text: 'x'.repeat(2048) });
  });

  it('never reads more than FETCH_MAX_BYTES, whatever max_bytes asks', async () => {
    const { result } = await fetchPage({ url: site.url('/big'), max_bytes: 50_000 }, { FETCH_MAX_BYTES: '4096' });
    expect(result).toMatchObject({ bytes: 4096, truncated: true });
  });

  it('does not mark a body that ends exactly at the cap as truncated', async () => {
    const { result } = await fetchPage({ url: site.url('/exact'), max_bytes: 2048 });
    expect(result).toMatchObject({ bytes: 2048, truncated: false });
  });

  it('parses within the depth cap and marks a page past it truncated', async () => {
    const { result } = await fetchPage({ url: site.url('/deep') });
    expect(result).toMatchObject({ title: 'Deep', text: 'before', truncated: true });
  });

  it('fails with reason timeout when the server never answers', async () => {
    const err = await fetchError({ url: site.url('/hang') }, { FETCH_TIMEOUT_MS: '200' });
    expect(err).toMatchObject({ code: 'tool_failed', details: { reason: 'timeout' } });
    expect(err.message).toBe(`page_fetch timed out after 200 ms fetching ${site.hostPort}`);
  });

  it('fails with reason timeout when the body stalls', async () => {
    const err = await fetchError({ url: site.url('/slow-body') }, { FETCH_TIMEOUT_MS: '200' });
    expect(err).toMatchObject({ code: 'tool_failed', details: { reason: 'timeout' } });
  });

  it('stops when the call is cancelled', async () => {
    const controller = new AbortController();
    const pending = fetchError({ url: site.url('/hang') }, {}, controller.signal);
    const seen = site.requests.length;
    await waitFor(() => site.requests.length > seen);
    controller.abort();
    expect(await pending).toMatchObject({ code: 'timeout' });
  });

  it('reports byte progress, at most about every 64 KiB', async () => {
    const { result, progress } = await fetchPage({ url: site.url('/progress') });
    expect(result.bytes).toBe(300 * 1024);
    const body = progress.filter((p) => p.message === undefined);
    expect(body.length).toBeGreaterThanOrEqual(2);
    expect(body.length).toBeLessThanOrEqual(Math.ceil((300 * 1024) / (64 * 1024)) + 1);
    for (const p of body) expect(p).toMatchObject({ stage: 'fetching', unit: 'bytes', total: 300 * 1024 });
    const done = body.map((p) => p.done ?? -1);
    expect(done).toEqual([...done].sort((a, b) => a - b));
    expect(done.at(-1)).toBe(300 * 1024);
  });
});

describe('page_fetch failures of the target', () => {
  it('reports a refused connection', async () => {
    const port = await closedPort();
    const err = await fetchError({ url: `http://127.0.0.1:${port}/` }, { FETCH_ALLOWED_HOSTS: `127.0.0.1:${port}` });
    expect(err).toMatchObject({
      code: 'tool_failed',
      message: `page_fetch failed: 127.0.0.1:${port} refused the connection`,
      details: { reason: 'connection_refused' },
    });
    expect(err.retryable).toBe(false);
  });

  it('reports a TLS failure', async () => {
    const tls = await startHttpTarget((_req, res) => res.end('secret'), { tls: true });
    try {
      const err = await fetchError({ url: tls.url('/') }, { FETCH_ALLOWED_HOSTS: tls.hostPort });
      expect(err).toMatchObject({ code: 'tool_failed', details: { reason: 'tls_error' } });
      expect(err.message).toMatch(/^page_fetch failed: TLS error with 127\.0\.0\.1:\d+: /);
    } finally {
      await tls.close();
    }
  });

  it('reports a response header too large to read as an invalid response', async () => {
    const err = await fetchError({ url: site.url('/fat-header') });
    expect(err).toMatchObject({
      code: 'tool_failed',
      message: `page_fetch failed: ${site.hostPort} sent a malformed response`,
      details: { reason: 'invalid_response' },
    });
  });

  it('reports a name that does not exist', async () => {
    const err = await fetchError({ url: 'http://nowhere.test/' }, { DNS_SERVERS: dns.address });
    expect(err).toMatchObject({
      code: 'tool_failed',
      message: 'page_fetch could not resolve nowhere.test: no such domain',
      details: { reason: 'dns_not_found' },
    });
  });

  it('answers tool_unavailable when the DNS resolver is unreachable', async () => {
    const port = await closedPort();
    const err = await fetchError({ url: 'http://site.test/' }, { DNS_SERVERS: `127.0.0.1:${port}` });
    expect(err).toMatchObject({ code: 'tool_unavailable', message: 'DNS resolver unreachable' });
  });
});

describe('HTML parse caps', () => {
  it('cuts at the first element past the depth cap, counting only elements that stay open', () => {
    const ok = '<div>'.repeat(MAX_HTML_DEPTH - 2) + '<br><img src=x><p>a<p>b<li>c<li>d';
    expect(htmlCapOffset(Buffer.from(ok), null)).toBeNull();
    const closed = '<div></div>'.repeat(MAX_HTML_DEPTH * 2);
    expect(htmlCapOffset(Buffer.from(closed), null)).toBeNull();
    const deep = '<p>x</p>' + '<div>'.repeat(MAX_HTML_DEPTH + 1);
    expect(htmlCapOffset(Buffer.from(deep), null)).toBe(8 + 5 * MAX_HTML_DEPTH);
  });

  it('cuts at the first element past the element cap', () => {
    const wide = '<span>x</span>'.repeat(MAX_HTML_ELEMENTS + 10);
    expect(htmlCapOffset(Buffer.from(wide), null)).toBe(14 * MAX_HTML_ELEMENTS);
  });

  it('ignores markup inside scripts and comments, and reads UTF-16 pages', () => {
    const hidden = '<script>' + '<div>'.repeat(1000) + '</script><!--' + '<div>'.repeat(1000) + '-->';
    expect(htmlCapOffset(Buffer.from(hidden), null)).toBeNull();
    const utf16 = Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from('<div>'.repeat(MAX_HTML_DEPTH + 1), 'utf16le')]);
    expect(htmlCapOffset(utf16, null)).toBe(2 + 2 * 5 * MAX_HTML_DEPTH);
  });
});

describe('page_fetch input', () => {
  it('accepts a bare host as https and drops the fragment', () => {
    expect(PageFetchInput.parse({ url: 'example.com/a#top' })).toEqual({ url: 'https://example.com/a' });
  });

  it.each(['file:///etc/passwd', 'ftp://example.com/', 'gopher://example.com/', 'http://user:pw@example.com/', 'http://', 'not a url at all'])(
    'rejects %s',
    (url) => {
      expect(PageFetchInput.safeParse({ url }).success).toBe(false);
    },
  );

  it('parses its own examples', () => {
    for (const ex of pageFetch.examples) expect(PageFetchInput.safeParse(ex).success).toBe(true);
  });
});

async function waitFor(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((r) => setImmediate(r));
}
