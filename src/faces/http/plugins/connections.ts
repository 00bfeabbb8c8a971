import type { IncomingMessage, Server, ServerOptions, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Config } from '../../../config.js';

/**
 * Fastify server options for connection hygiene: every phase of a connection has a deadline, so a
 * client that trickles its headers or body, or idles, cannot hold a socket (and a file descriptor).
 */
export function connectionOptions(config: Config) {
  const requestTimeout = config.REQUEST_TIMEOUT_MS;
  // Node refuses a headers timeout longer than the request timeout; the whole request bounds its headers.
  const headersTimeout = Math.min(config.HEADERS_TIMEOUT_MS, requestTimeout);
  const http: ServerOptions = {
    requestTimeout,
    headersTimeout,
    // Node only looks for expired requests every connectionsCheckingInterval (30 s by default), which
    // would let a 2 s timeout run for 30 s; a quarter of the shortest deadline, at most a second.
    connectionsCheckingInterval: Math.max(50, Math.min(1000, Math.floor(headersTimeout / 4))),
  };
  return {
    connectionTimeout: config.CONNECTION_TIMEOUT_MS,
    keepAliveTimeout: config.KEEP_ALIVE_TIMEOUT_MS,
    requestTimeout,
    // Fastify reads 0 as "no limit", as the variable documents.
    maxRequestsPerSocket: config.MAX_REQUESTS_PER_SOCKET,
    // One proxy in front: the client is the address that proxy saw. Trusting every hop would let a
    // client pick its own address in X-Forwarded-For and slip past the per-address limits.
    // (A hop count is not enough: this Fastify refuses to trust any peer for one.)
    trustProxy: config.TRUST_PROXY ? (_address: string, hop: number) => hop < 1 : false,
    http,
  };
}

/**
 * Per-address cap on open connections, and the idle timeout's exception for responses still being
 * prepared. Call once on the server Fastify created, before it listens.
 */
export function installConnectionLimits(server: Server, config: Config, onRefused?: (address: string) => void): void {
  const max = config.MAX_CONNECTIONS_PER_IP;
  const open = new Map<string, number>();
  server.on('connection', (socket: Socket) => {
    const address = socket.remoteAddress;
    if (!address) return; // already gone
    const n = open.get(address) ?? 0;
    if (n >= max) {
      // At once, before a byte is read: holding the socket open would still cost a descriptor.
      socket.destroy();
      onRefused?.(address);
      return;
    }
    open.set(address, n + 1);
    socket.once('close', () => {
      const left = (open.get(address) ?? 1) - 1;
      if (left > 0) open.set(address, left);
      else open.delete(address);
    });
  });

  // CONNECTION_TIMEOUT_MS closes sockets without traffic. A call waiting on its job (a long chat
  // completion, an MCP tools/call) sends nothing until the job ends, and an event stream may be
  // silent between a job's events (MCP progress streams have no heartbeat): that silence is ours,
  // not the client's, and ends with the job, so such a socket is kept. Once any other response has
  // started, silence is the client not reading (or gone), and the socket is closed. Listening here
  // replaces Node's default, which is to destroy every socket that times out.
  const current = new WeakMap<Socket, ServerResponse>();
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    current.set(req.socket, res);
  });
  server.on('timeout', (socket: Socket) => {
    const res = current.get(socket);
    if (res && !res.writableEnded && (!res.headersSent || isEventStream(res))) return;
    socket.destroy();
  });
}

function isEventStream(res: ServerResponse): boolean {
  return /^text\/event-stream/i.test(String(res.getHeader('content-type') ?? ''));
}
