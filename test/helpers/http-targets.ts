import http from 'node:http';
import https from 'node:https';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';

/** A local HTTP(S) server for tests that fetch pages. Records the paths it was asked for. */
export interface HttpTarget {
  port: number;
  /** `host:port` as FETCH_ALLOWED_HOSTS spells it. */
  hostPort: string;
  origin: string;
  url(path?: string): string;
  requests: Array<{ path: string; headers: http.IncomingHttpHeaders }>;
  close(): Promise<void>;
}

export type Handler = (req: http.IncomingMessage, res: http.ServerResponse) => void;

/**
 * A self-signed certificate for CN=localhost / 127.0.0.1 (P-256, valid for a century), used only to
 * make a TLS handshake fail the way an untrusted site's does.
 */
export const SELF_SIGNED = {
  key: `-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgxhONxrglV3joKuis
0twKHEhapSMqwVhuEfoyPQDS+8ihRANCAAQKCc8JeufPnC2UTLRHcVncIwM25IAo
+9VWdxHW2/AbZ0aKgsopsmEcf+a2l/H/9G4bA7hE0FdMHUr5RIb0YCyc
-----END PRIVATE KEY-----
`,
  cert: `-----BEGIN CERTIFICATE-----
MIIBmzCCAUGgAwIBAgIUD/URDYl3myNobLEwYRLv5iwpQ0owCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJbG9jYWxob3N0MCAXDTI2MTEyMjA2MjUyNVoYDzIxMjYxMDI5
MDYyNTI1WjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAAQKCc8JeufPnC2UTLRHcVncIwM25IAo+9VWdxHW2/AbZ0aKgsopsmEc
f+a2l/H/9G4bA7hE0FdMHUr5RIb0YCyco28wbTAdBgNVHQ4EFgQUhG9nIfOSXmgs
IHAx7kMcmg2WW6MwHwYDVR0jBBgwFoAUhG9nIfOSXmgsIHAx7kMcmg2WW6MwDwYD
VR0TAQH/BAUwAwEB/zAaBgNVHREEEzARhwR/AAABgglsb2NhbGhvc3QwCgYIKoZI
zj0EAwIDSAAwRQIhAI6Gf+ivoPZPT8Etc7cIoRrhEENuG4UajEHCDHa1lnkCAiAa
hUnx5Zk1byywnbUPcJt0r5CbJvX/ykftwzRGT2Foew==
-----END CERTIFICATE-----
`,
};

export async function startHttpTarget(handler: Handler, opts: { host?: string; port?: number; tls?: boolean } = {}): Promise<HttpTarget> {
  const host = opts.host ?? '127.0.0.1';
  const requests: HttpTarget['requests'] = [];
  const wrapped: Handler = (req, res) => {
    requests.push({ path: req.url ?? '', headers: req.headers });
    handler(req, res);
  };
  const server = opts.tls ? https.createServer(SELF_SIGNED, wrapped) : http.createServer(wrapped);
  server.listen(opts.port ?? 0, host);
  await once(server, 'listening');
  const port = (server.address() as AddressInfo).port;
  const hostPort = `${host.includes(':') ? `[${host}]` : host}:${port}`;
  const origin = `${opts.tls ? 'https' : 'http'}://${hostPort}`;
  return {
    port,
    hostPort,
    origin,
    url: (path = '/') => `${origin}${path}`,
    requests,
    close: async () => {
      server.closeAllConnections();
      server.close();
      await once(server, 'close');
    },
  };
}

/** A port on 127.0.0.1 with nothing listening (bound once, then released). */
export async function closedPort(): Promise<number> {
  const server = http.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as AddressInfo;
  server.close();
  await once(server, 'close');
  return port;
}

/** Serves fixed routes: path -> [status, headers, body]. Unknown paths get 404. */
export function routes(table: Record<string, [number, http.OutgoingHttpHeaders, string | Buffer] | Handler>): Handler {
  return (req, res) => {
    const route = table[(req.url ?? '/').split('?')[0]!];
    if (!route) {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found');
      return;
    }
    if (typeof route === 'function') return route(req, res);
    const [status, headers, body] = route;
    res.writeHead(status, headers).end(body);
  };
}
