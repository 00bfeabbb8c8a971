import http from 'node:http';
import https from 'node:https';
import { once } from 'node:events';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';

/**
 * A local fixture web site for tests of tools that read the web: routes by path (exact match on the
 * path without its query string, or the whole path with the query), a request log, HTTP or HTTPS
 * with a self-signed certificate generated once per process by openssl.
 *
 *   const site = await startFixtureSite();
 *   site.route('/', { body: '<html>...</html>' });
 *   site.route('/sitemap.xml.gz', { headers: { 'content-type': 'application/gzip' }, body: gzipSync(xml) });
 *   site.route('/slow', { body: 'late', delayMs: 2000 });
 *   site.route('/dyn', (req, res) => res.end('hi'));
 *   startHarness({ FETCH_ALLOWED_HOSTS: site.hostPort }, ...)
 *
 * Unrouted paths answer 404 "not found". Bodies may be strings or Buffers; to serve a gzip-encoded
 * body set `headers: {'content-encoding': 'gzip'}` and a gzipped Buffer body.
 */

export interface FixtureRequest {
  method: string;
  /** The request target as sent (path and query). */
  path: string;
  headers: http.IncomingHttpHeaders;
}

export interface FixtureResponse {
  status?: number;
  headers?: Record<string, string | string[]>;
  body?: string | Buffer;
  /** Wait this long before answering (headers included). */
  delayMs?: number;
}

export type FixtureHandler = (req: http.IncomingMessage, res: http.ServerResponse) => void | Promise<void>;

export interface FixtureSite {
  port: number;
  /** `127.0.0.1:<port>`, as FETCH_ALLOWED_HOSTS spells it. */
  hostPort: string;
  origin: string;
  url(path?: string): string;
  /** Every request received, in order of arrival. */
  requests: FixtureRequest[];
  /** Adds or replaces the answer for `path` ("/a" matches "/a" and "/a?x=1"; "/a?x=1" matches only that). */
  route(path: string, answer: FixtureHandler | FixtureResponse): void;
  /** Requests received for `path` (path without query, or exact with a query). */
  requestsFor(path: string): FixtureRequest[];
  close(): Promise<void>;
}

let cachedCert: { key: Buffer; cert: Buffer } | undefined;

/** A self-signed certificate for CN=localhost, generated once per process. */
export function selfSignedCert(): { key: Buffer; cert: Buffer } {
  if (cachedCert) return cachedCert;
  const dir = mkdtempSync(join(tmpdir(), 'fixture-site-'));
  try {
    const k = join(dir, 'k');
    const c = join(dir, 'c');
    execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '30', '-subj', '/CN=localhost', '-keyout', k, '-out', c], {
      stdio: 'ignore',
    });
    cachedCert = { key: readFileSync(k), cert: readFileSync(c) };
    return cachedCert;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function pathOnly(target: string): string {
  const q = target.indexOf('?');
  return q >= 0 ? target.slice(0, q) : target;
}

export async function startFixtureSite(opts: { https?: boolean } = {}): Promise<FixtureSite> {
  const routes = new Map<string, FixtureHandler | FixtureResponse>();
  const requests: FixtureRequest[] = [];
  const timers = new Set<NodeJS.Timeout>();

  const serve = async (req: http.IncomingMessage, res: http.ServerResponse): Promise<void> => {
    const target = req.url ?? '/';
    requests.push({ method: req.method ?? 'GET', path: target, headers: req.headers });
    const answer = routes.get(target) ?? routes.get(pathOnly(target));
    if (answer === undefined) {
      res.writeHead(404, { 'content-type': 'text/plain' });
      res.end('not found');
      return;
    }
    if (typeof answer === 'function') {
      await answer(req, res);
      return;
    }
    if (answer.delayMs) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(() => {
          timers.delete(t);
          resolve();
        }, answer.delayMs);
        timers.add(t);
      });
      if (res.destroyed) return;
    }
    const body = answer.body ?? '';
    const headers: Record<string, string | string[]> = {
      'content-type': typeof body === 'string' ? 'text/html; charset=utf-8' : 'application/octet-stream',
      ...(answer.headers ?? {}),
    };
    res.writeHead(answer.status ?? 200, headers);
    res.end(req.method === 'HEAD' ? undefined : body);
  };

  const listener = (req: http.IncomingMessage, res: http.ServerResponse) => {
    serve(req, res).catch((err: unknown) => {
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
      res.end(String(err));
    });
  };
  const server = opts.https ? https.createServer(selfSignedCert(), listener) : http.createServer(listener);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as AddressInfo).port;
  const hostPort = `127.0.0.1:${port}`;
  const origin = `${opts.https ? 'https' : 'http'}://${hostPort}`;
  return {
    port,
    hostPort,
    origin,
    url: (path = '/') => `${origin}${path.startsWith('/') ? path : `/${path}`}`,
    requests,
    route: (path, answer) => {
      routes.set(path, answer);
    },
    requestsFor: (path) => requests.filter((r) => r.path === path || (!path.includes('?') && pathOnly(r.path) === path)),
    close: async () => {
      for (const t of timers) clearTimeout(t);
      timers.clear();
      server.closeAllConnections();
      server.close();
      await once(server, 'close');
    },
  };
}
