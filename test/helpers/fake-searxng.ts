import http from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * A local stand-in for a SearXNG instance's JSON API: `GET /search?q=...&format=json&pageno=N`, answering
 * SearXNG's body shape `{query, number_of_results, results[{url,title,content,engine,engines,
 * publishedDate,score,category}], answers, suggestions, corrections, infoboxes, unresponsive_engines}`.
 * Like a real instance, it answers 403 when `format=json` is missing. Tests set the results per query
 * (a function of the query and page) and may make it fail.
 */

export interface FakeSearxResult {
  url: string;
  title: string;
  content?: string;
  engines?: string[];
  publishedDate?: string | null;
}

export interface FakeSearxRequest {
  path: string;
  params: Record<string, string>;
  headers: http.IncomingHttpHeaders;
}

export interface FakeSearxng {
  /** e.g. http://127.0.0.1:41234 (what SEARCH_BASE_URL takes). */
  url: string;
  requests: FakeSearxRequest[];
  /** Results for a query and page (1-based); by default none. */
  respond(fn: (query: string, page: number) => FakeSearxResult[]): void;
  suggestions: string[];
  answers: string[];
  /** Answer every request with this status (and an HTML error page) until set back to null. */
  failWith: number | null;
  close(): Promise<void>;
}

export async function startFakeSearxng(): Promise<FakeSearxng> {
  let responder: (query: string, page: number) => FakeSearxResult[] = () => [];
  const fake: Omit<FakeSearxng, 'url' | 'close'> & { url?: string; close?: () => Promise<void> } = {
    requests: [],
    respond: (fn) => {
      responder = fn;
    },
    suggestions: [],
    answers: [],
    failWith: null,
  };
  const server = http.createServer((req, res) => {
    const u = new URL(req.url ?? '/', 'http://fake');
    const params = Object.fromEntries(u.searchParams.entries());
    fake.requests.push({ path: u.pathname, params, headers: req.headers });
    if (fake.failWith !== null) {
      res.writeHead(fake.failWith, { 'content-type': 'text/html' }).end('<html><body>error</body></html>');
      return;
    }
    if (u.pathname !== '/search') {
      res.writeHead(404).end();
      return;
    }
    if (params['format'] !== 'json') {
      res.writeHead(403, { 'content-type': 'text/html' }).end('<html><body>403 Forbidden</body></html>');
      return;
    }
    const query = params['q'] ?? '';
    const page = Number(params['pageno'] ?? '1') || 1;
    const results = responder(query, page).map((r, i) => ({
      url: r.url,
      title: r.title,
      content: r.content ?? '',
      engine: (r.engines ?? ['fakeengine'])[0],
      engines: r.engines ?? ['fakeengine'],
      parsed_url: [new URL(r.url).protocol.replace(':', ''), new URL(r.url).host, new URL(r.url).pathname, '', '', ''],
      template: 'default.html',
      positions: [i + 1],
      publishedDate: r.publishedDate ?? null,
      score: 1 / (i + 1),
      category: 'general',
    }));
    res.writeHead(200, { 'content-type': 'application/json' }).end(
      JSON.stringify({
        query,
        number_of_results: results.length,
        results,
        answers: fake.answers,
        corrections: [],
        infoboxes: [],
        suggestions: fake.suggestions,
        unresponsive_engines: [],
      }),
    );
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  fake.url = `http://127.0.0.1:${port}`;
  fake.close = () =>
    new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    });
  return fake as FakeSearxng;
}
