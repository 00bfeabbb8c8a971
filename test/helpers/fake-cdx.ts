import http from 'node:http';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';

/**
 * A fake of the Wayback Machine for grabr_wayback's tests: the CDX API (`GET /cdx?url=...&output=json`,
 * answering a header row then one row per capture, as the real server does) and raw snapshots
 * (`GET /web/{timestamp}id_/{url}`). Tests set the captures and snapshot bodies, read the parameters
 * each request carried, and may make either endpoint fail.
 */

export interface FakeCapture {
  timestamp: string;
  original: string;
  statuscode?: string;
  mimetype?: string;
  digest: string;
  length?: string;
}

export interface FakeCdx {
  origin: string;
  /** For WAYBACK_CDX_URL. */
  cdxUrl: string;
  /** For WAYBACK_BASE_URL. */
  baseUrl: string;
  captures: FakeCapture[];
  /** Snapshot bodies by "{timestamp}/{url}". */
  snapshots: Map<string, { contentType: string; body: string }>;
  /** Query parameters of every CDX request, in order. */
  cdxRequests: Array<Record<string, string>>;
  snapshotRequests: string[];
  /** Answer CDX requests with this status until set back to null. */
  failWith: number | null;
  close(): Promise<void>;
}

const HEADER = ['urlkey', 'timestamp', 'original', 'mimetype', 'statuscode', 'digest', 'length'];

export async function startFakeCdx(): Promise<FakeCdx> {
  const server = http.createServer((req, res) => {
    const u = new URL(req.url ?? '/', 'http://fake');
    if (u.pathname === '/cdx') {
      const params = Object.fromEntries(u.searchParams.entries());
      fake.cdxRequests.push(params);
      if (fake.failWith !== null) return void res.writeHead(fake.failWith, { 'content-type': 'text/html' }).end('<html>down</html>');
      // Like the real server: `fl` chooses columns, a negative limit keeps the last N.
      const fields = params['fl'] ? params['fl'].split(',') : HEADER;
      let rows = fake.captures.map((c) => ({ urlkey: c.original, statuscode: '200', mimetype: 'text/html', length: '100', ...c }) as Record<string, string>);
      if (params['from']) rows = rows.filter((r) => r['timestamp']! >= params['from']!.padEnd(14, '0'));
      if (params['to']) rows = rows.filter((r) => r['timestamp']! <= params['to']!.padEnd(14, '9'));
      const limit = Number(params['limit'] ?? '0');
      if (limit > 0) rows = rows.slice(0, limit);
      if (limit < 0) rows = rows.slice(limit);
      const body =
        params['output'] === 'json'
          ? JSON.stringify(rows.length ? [fields, ...rows.map((r) => fields.map((f) => r[f] ?? '-'))] : [])
          : rows.map((r) => fields.map((f) => r[f]).join(' ')).join('\n');
      return void res.writeHead(200, { 'content-type': params['output'] === 'json' ? 'application/json' : 'text/plain' }).end(body);
    }
    const m = /^\/web\/(\d{1,14})id_\/(.+)$/.exec(req.url ?? '');
    if (m) {
      fake.snapshotRequests.push(req.url ?? '');
      const snap = fake.snapshots.get(`${m[1]}/${m[2]}`);
      if (!snap) return void res.writeHead(404).end('not archived');
      return void res.writeHead(200, { 'content-type': snap.contentType }).end(snap.body);
    }
    res.writeHead(404).end();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as AddressInfo;
  const origin = `http://127.0.0.1:${port}`;
  const fake: FakeCdx = {
    origin,
    cdxUrl: `${origin}/cdx`,
    baseUrl: `${origin}/web`,
    captures: [],
    snapshots: new Map(),
    cdxRequests: [],
    snapshotRequests: [],
    failWith: null,
    close: async () => {
      server.closeAllConnections();
      server.close();
      await once(server, 'close');
    },
  };
  return fake;
}
