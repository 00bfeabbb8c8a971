import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { migrate } from '../../src/db/migrate.js';
import { Redis } from 'ioredis';
import { ensureDatabase, openPool, type DatabasePool } from '../../src/db/pool.js';
import { AccountsRepo } from '../../src/access/accounts.js';
import { AdminService } from '../../src/ops/admin.js';
import { CreditReservations } from '../../src/money/holds.js';

/**
 * The chaos rig's moving parts as real processes: a Redis of its own, the API and core workers started
 * as in production (`node --import tsx src/server.ts` with WORKERS=off, `workers/index.ts --family core`),
 * each killable by PID.
 */

export async function freePort(): Promise<number> {
  const srv = net.createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const { port } = srv.address() as net.AddressInfo;
  srv.close();
  await once(srv, 'close');
  return port;
}

export class RedisServer {
  private proc: ChildProcess | null = null;
  constructor(readonly port: number) {}

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  /** Without persistence, like the machine's own Redis: a restart loses everything. */
  async start(): Promise<void> {
    this.proc = spawn('redis-server', ['--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
    for (let i = 0; i < 100; i++) {
      if (this.ping()) return;
      await sleep(50);
    }
    throw new Error(`redis-server on ${this.port} did not start`);
  }

  ping(): boolean {
    try {
      return execFileSync('redis-cli', ['-p', String(this.port), 'ping'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim() === 'PONG';
    } catch {
      return false;
    }
  }

  /** `SHUTDOWN NOSAVE`: Redis goes away with all its data. */
  async shutdownNoSave(): Promise<void> {
    try {
      execFileSync('redis-cli', ['-p', String(this.port), 'shutdown', 'nosave'], { stdio: 'ignore' });
    } catch {
      /* the connection drops as it shuts down */
    }
    if (this.proc && this.proc.exitCode === null) await once(this.proc, 'exit');
  }

  async stop(): Promise<void> {
    await this.shutdownNoSave();
  }
}

export class ServiceProcess {
  proc: ChildProcess | null = null;
  constructor(
    readonly name: string,
    private readonly args: string[],
    private readonly env: NodeJS.ProcessEnv,
  ) {}

  start(): void {
    this.proc = spawn(process.execPath, ['--import', 'tsx', ...this.args], { env: this.env, stdio: ['ignore', 'inherit', 'inherit'] });
  }

  get pid(): number {
    return this.proc!.pid!;
  }

  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const p = this.proc;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    p.kill(signal);
    await once(p, 'exit');
  }

  signal(signal: NodeJS.Signals): void {
    this.proc?.kill(signal);
  }
}

/** Waits until GET /health answers at all (any status: with no worker it says degraded). */
export async function waitForHttp(base: string, okOnly = false, timeoutMs = 30_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const status = await fetch(`${base}/health`, { signal: AbortSignal.timeout(2_000) }).then(
      (r) => r.status,
      () => 0,
    );
    if (status && (!okOnly || status === 200)) return;
    if (Date.now() > end) throw new Error(`${base} did not come up${okOnly ? ' healthy' : ''}`);
    await sleep(100);
  }
}

/** A migrated database of its own next to `baseUrl`'s (`tollgate_<label>_<random>`); returns its URL. */
export async function freshDatabase(baseUrl: string, label: string): Promise<string> {
  const u = new URL(baseUrl);
  u.pathname = `/tollgate_${label}_${randomBytes(4).toString('hex')}`;
  await ensureDatabase(u.toString());
  await migrate(u.toString());
  return u.toString();
}

/** Drops a database freshDatabase made, closing whatever is still connected to it. */
export async function dropDatabase(dbUrl: string): Promise<void> {
  const u = new URL(dbUrl);
  const name = u.pathname.slice(1);
  u.pathname = '/postgres';
  const c = new pg.Client({ connectionString: u.toString() });
  await c.connect();
  try {
    await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  } finally {
    await c.end();
  }
}

/**
 * A deployment of its own for one chaos file: a Redis server, a migrated database, the API (WORKERS=off)
 * and `workers` core workers as processes, and the operator's handles on its money (admin service,
 * the money keys, a small pool). `env` adds to what every deployment sets.
 */
export class Deployment {
  redis!: RedisServer;
  dbUrl!: string;
  pool!: DatabasePool;
  adminRedis!: Redis;
  admin!: AdminService;
  moneyKeys!: CreditReservations;
  api!: ServiceProcess;
  workers: ServiceProcess[] = [];
  base!: string;

  constructor(private readonly opts: { label: string; prefix: string; workers: number; env?: Record<string, string> }) {}

  async launch(baseDbUrl: string, readyTimeoutMs = 60_000): Promise<this> {
    const { label, prefix } = this.opts;
    this.redis = new RedisServer(await freePort());
    await this.redis.start();
    this.dbUrl = await freshDatabase(baseDbUrl, label);
    this.pool = await openPool(this.dbUrl, { maximumPoolSize: 2 });
    this.adminRedis = new Redis(this.redis.url, { maxRetriesPerRequest: null });
    this.adminRedis.on('error', () => {});
    const accounts = new AccountsRepo(this.pool);
    this.moneyKeys = new CreditReservations(this.adminRedis, prefix, accounts);
    this.admin = new AdminService({ accounts, credits: this.moneyKeys, redis: this.adminRedis, prefix });
    const port = await freePort();
    this.base = `http://127.0.0.1:${port}`;
    const env = {
      ...process.env,
      REDIS_URL: this.redis.url,
      DATABASE_URL: this.dbUrl,
      REDIS_PREFIX: prefix,
      PORT: String(port),
      HOST: '127.0.0.1',
      EDGE_TOKEN_KEY: randomBytes(32).toString('hex'),
      LOG_LEVEL: 'error',
      ...this.opts.env,
    };
    this.api = new ServiceProcess('api', ['src/server.ts'], { ...env, WORKERS: 'off' });
    this.workers = Array.from({ length: this.opts.workers }, (_, i) => new ServiceProcess(`worker-${i}`, ['workers/index.ts', '--family', 'core'], env));
    this.api.start();
    for (const w of this.workers) w.start();
    await waitForHttp(this.base, true, readyTimeoutMs);
    return this;
  }

  /** Stops every process (a frozen one is woken first), the Redis server, and drops the database. */
  async close(): Promise<void> {
    for (const w of this.workers) w.signal('SIGCONT');
    for (const p of [this.api, ...this.workers]) await p?.kill();
    this.adminRedis?.disconnect();
    await this.pool?.end();
    await this.redis?.stop();
    if (this.dbUrl) await dropDatabase(this.dbUrl);
  }
}
