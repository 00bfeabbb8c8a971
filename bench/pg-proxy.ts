/**
 * A counting TCP proxy in front of Postgres for `npm run bench:breakdown`. It forwards bytes both ways
 * unchanged and reads the frontend messages on the way: every Execute (extended protocol) or Query
 * (simple protocol) is one statement, counted by its SQL text; every Sync or Query is one round trip.
 * Counts are per client port, so the breakdown can tell the API's statements from the worker's.
 * (pg_stat_statements would need shared_preload_libraries and a restart of a shared server.)
 */
import { createServer, connect, type Server, type Socket } from 'node:net';

export interface PgCounts {
  /** Statements by normalised SQL text, per client port. */
  statements: Map<number, Map<string, number>>;
  /** Round trips (Sync + simple Query messages) per client port. */
  roundTrips: Map<number, number>;
}

const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;

const normalise = (sql: string) => sql.replace(/\s+/g, ' ').trim().slice(0, 110);

export class PgCountingProxy {
  counting = false;
  counts: PgCounts = { statements: new Map(), roundTrips: new Map() };
  private server: Server | null = null;
  private sockets = new Set<Socket>();

  constructor(
    private readonly upstreamHost: string,
    private readonly upstreamPort: number,
  ) {}

  reset(): void {
    this.counts = { statements: new Map(), roundTrips: new Map() };
  }

  async listen(port: number): Promise<void> {
    this.server = createServer((client) => this.handle(client));
    await new Promise<void>((resolve, reject) => {
      this.server!.once('error', reject);
      this.server!.listen(port, '127.0.0.1', () => resolve());
    });
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise((r) => this.server?.close(r) ?? r(null));
  }

  private handle(client: Socket): void {
    const port = client.remotePort ?? 0;
    const upstream = connect(this.upstreamPort, this.upstreamHost);
    this.sockets.add(client).add(upstream);
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    upstream.pipe(client);
    const stmts = new Map<string, string>(); // prepared statement name -> SQL
    const portals = new Map<string, string>(); // portal name -> SQL
    let buf: Buffer = Buffer.alloc(0);
    let startup = true;
    const count = (sql: string) => {
      if (!this.counting) return;
      let m = this.counts.statements.get(port);
      if (!m) this.counts.statements.set(port, (m = new Map()));
      const k = normalise(sql);
      m.set(k, (m.get(k) ?? 0) + 1);
    };
    const trip = () => {
      if (this.counting) this.counts.roundTrips.set(port, (this.counts.roundTrips.get(port) ?? 0) + 1);
    };
    const cstr = (b: Buffer, at: number): [string, number] => {
      const end = b.indexOf(0, at);
      return [b.toString('utf8', at, end), end + 1];
    };
    client.on('data', (chunk: Buffer) => {
      upstream.write(chunk);
      buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
      for (;;) {
        if (startup) {
          if (buf.length < 8) break;
          const len = buf.readInt32BE(0);
          if (buf.length < len) break;
          const code = buf.readInt32BE(4);
          if (code !== SSL_REQUEST && code !== GSSENC_REQUEST) startup = false;
          buf = buf.subarray(len);
          continue;
        }
        if (buf.length < 5) break;
        const type = String.fromCharCode(buf[0]!);
        const len = buf.readInt32BE(1);
        if (buf.length < 1 + len) break;
        const msg = buf.subarray(5, 1 + len);
        if (type === 'Q') {
          count(cstr(msg, 0)[0]);
          trip();
        } else if (type === 'P') {
          const [name, at] = cstr(msg, 0);
          stmts.set(name, cstr(msg, at)[0]);
        } else if (type === 'B') {
          const [portal, at] = cstr(msg, 0);
          portals.set(portal, stmts.get(cstr(msg, at)[0]) ?? '?');
        } else if (type === 'E') {
          count(portals.get(cstr(msg, 0)[0]) ?? '?');
        } else if (type === 'S') {
          trip();
        }
        buf = buf.subarray(1 + len);
      }
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
      this.sockets.delete(client);
      this.sockets.delete(upstream);
    };
    client.on('close', end).on('error', end);
    upstream.on('close', end).on('error', end);
  }
}
