/**
 * What `npm run bench` and `npm run bench:breakdown` share: the load driver, the service and anchor
 * child processes on explicit ports, /proc readings (RSS, CPU) and the clean-up of what a run made.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import pg from 'pg';
import { migrate } from '../src/db/migrate.js';
import { ensureDatabase } from '../src/db/pool.js';
import { Pool } from 'undici';

export interface Stats {
  rps: number;
  p50: number;
  p99: number;
  n: number;
}

export function stats(latencies: number[], wallMs: number): Stats {
  const s = [...latencies].sort((a, b) => a - b);
  const pick = (q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
  return { rps: (latencies.length / wallMs) * 1000, p50: pick(0.5), p99: pick(0.99), n: latencies.length };
}

/** Runs `total` operations with `inFlight` at a time; returns per-op latencies and wall time. */
export async function drive(inFlight: number, total: number, op: (i: number) => Promise<void>): Promise<Stats> {
  const latencies: number[] = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (next < total) {
        const i = next++;
        const s = performance.now();
        await op(i);
        latencies.push(performance.now() - s);
      }
    }),
  );
  return stats(latencies, performance.now() - t0);
}

export const fmt = (s: Stats) => `${s.rps.toFixed(0).padStart(6)} req/s  p50 ${s.p50.toFixed(2).padStart(6)} ms  p99 ${s.p99.toFixed(2).padStart(7)} ms`;
export const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** BENCH_PORT: the anchor's port; the service under test listens on BENCH_PORT + 1. */
export function benchPorts() {
  const base = Number(process.env.BENCH_PORT ?? 18_080);
  if (!Number.isInteger(base) || base < 1 || base > 65_530) throw new Error(`BENCH_PORT must be a port number, got ${process.env.BENCH_PORT}`);
  return { anchor: base, service: base + 1, redis: base + 2, pgProxy: base + 3 };
}

/** Fails clearly when something else listens on `port` (the children would die with EADDRINUSE). */
export async function assertPortFree(port: number, what: string): Promise<void> {
  const srv = createServer();
  try {
    await new Promise<void>((resolve, reject) => {
      srv.once('error', reject);
      srv.listen(port, '127.0.0.1', () => resolve());
    });
  } catch (e) {
    throw new Error(
      `port ${port} (${what}) is taken (${(e as NodeJS.ErrnoException).code}); choose another base with BENCH_PORT=<port> (uses BENCH_PORT..BENCH_PORT+3)`,
    );
  } finally {
    await new Promise((r) => srv.close(r));
  }
}

/** Resident set of a process in MiB (VmRSS of /proc/<pid>/status). */
export function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

const CLK_TCK = 100; // getconf CLK_TCK on Linux x86_64
/** User + system CPU of a process (all its threads) so far, in ms. */
export function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // Fields after the command: state(3) ... utime(14) stime(15), counted from 1 with pid and comm.
  return ((Number(f[11]) + Number(f[12])) * 1000) / CLK_TCK;
}

/** CPU ms of every process whose command name is `comm` (e.g. all postgres backends). */
export function cpuMsOfComm(comm: string): number {
  let total = 0;
  for (const pid of readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .map(Number)) {
    try {
      if (readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === comm) total += cpuMs(pid);
    } catch {
      /* gone */
    }
  }
  return total;
}

export const children: ChildProcess[] = [];
process.on('exit', () => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
});

/** Polls `ready` every 200 ms; fails when a process died first or after `timeoutMs`. */
async function waitReady(procs: ChildProcess[], what: string, ready: () => Promise<boolean>, timeoutMs = 90_000): Promise<void> {
  const t0 = Date.now();
  for (;;) {
    const dead = procs.find((p) => p.exitCode !== null || p.signalCode !== null);
    if (dead) throw new Error(`${what}: process ${dead.pid} exited (${dead.exitCode ?? dead.signalCode}) before it was ready`);
    try {
      if (await ready()) return;
    } catch {
      /* not up yet */
    }
    if (Date.now() - t0 > timeoutMs) throw new Error(`${what}: not ready after ${timeoutMs / 1000} s`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

export interface Running {
  client: Pool;
  api: ChildProcess;
  worker?: ChildProcess;
  stop: () => Promise<void>;
}

async function stopAll(client: Pool, procs: ChildProcess[]) {
  await client.close();
  for (const p of procs) if (p.exitCode === null) p.kill('SIGTERM');
  await Promise.all(procs.map((p) => (p.exitCode === null && p.signalCode === null ? once(p, 'exit') : null)));
}

/**
 * The service on `port`: `npm start` (API + inline workers, one process), or split (WORKERS=off API
 * plus `workers/index.ts --family core`). `nodeArgs` go before `--import tsx` (e.g. --cpu-prof).
 */
export async function startService(opts: {
  port: number;
  split: boolean;
  env: Record<string, string | undefined>;
  nodeArgs?: string[];
  workerNodeArgs?: string[];
  /** The checkout to run (bench/ab.ts compares two); default the current directory. */
  cwd?: string;
}): Promise<Running> {
  await assertPortFree(opts.port, 'service');
  // At a request-logging level the service's lines would drown the report: written to /dev/null.
  const stdout = ['info', 'debug', 'trace'].includes(opts.env.LOG_LEVEL ?? '') ? 'ignore' : 'inherit';
  const env = { ...opts.env, PORT: String(opts.port), HOST: '127.0.0.1' };
  const api = spawn(process.execPath, [...(opts.nodeArgs ?? []), '--import', 'tsx', 'src/server.ts'], {
    env: { ...env, WORKERS: opts.split ? 'off' : 'inline' },
    stdio: ['ignore', stdout, 'inherit'],
    cwd: opts.cwd,
  });
  const procs: ChildProcess[] = [api];
  let worker: ChildProcess | undefined;
  if (opts.split) {
    worker = spawn(process.execPath, [...(opts.workerNodeArgs ?? opts.nodeArgs ?? []), '--import', 'tsx', 'workers/index.ts', '--family', 'core'], {
      env,
      stdio: ['ignore', stdout, 'inherit'],
      cwd: opts.cwd,
    });
    procs.push(worker);
  }
  children.push(...procs);
  const client = new Pool(`http://127.0.0.1:${opts.port}`, { connections: 64, pipelining: 1 });
  // Ready when a core worker beats: the split run has no other family, so /health says degraded.
  await waitReady(procs, `service on port ${opts.port}`, async () => {
    const r = await client.request({ path: '/health', method: 'GET' });
    const health = JSON.parse(await r.body.text()) as { worker_counts?: { core?: number } | null };
    return (health.worker_counts?.core ?? 0) > 0;
  });
  return { client, api, worker, stop: () => stopAll(client, procs) };
}

/**
 * The anchor on `port`: the service's HTTP front without the service (bench/anchor-server.ts) and a
 * no-op BullMQ worker in its own process (bench/baseline-worker.ts) at the core family's concurrency.
 */
export async function startAnchor(opts: {
  port: number;
  prefix: string;
  queue: string;
  concurrency: number;
  env: Record<string, string | undefined>;
  nodeArgs?: string[];
}): Promise<Running> {
  await assertPortFree(opts.port, 'anchor');
  const dir = new URL('.', import.meta.url).pathname;
  const env = { ...opts.env, BENCH_ANCHOR_PORT: String(opts.port), BENCH_ANCHOR_QUEUE: opts.queue, BENCH_ANCHOR_PREFIX: opts.prefix };
  const worker = spawn(
    process.execPath,
    [...(opts.nodeArgs ?? []), '--import', 'tsx', `${dir}baseline-worker.ts`, opts.queue, opts.prefix, String(opts.concurrency)],
    {
      env,
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    },
  );
  const api = spawn(process.execPath, [...(opts.nodeArgs ?? []), '--import', 'tsx', `${dir}anchor-server.ts`], {
    env,
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  const procs = [api, worker];
  children.push(...procs);
  let workerReady = false;
  worker.once('message', () => (workerReady = true));
  const client = new Pool(`http://127.0.0.1:${opts.port}`, { connections: 64, pipelining: 1 });
  await waitReady(procs, `anchor on port ${opts.port}`, async () => {
    if (!workerReady) return false;
    const r = await client.request({ path: '/health', method: 'GET' });
    await r.body.text();
    return r.statusCode === 200;
  });
  return { client, api, worker, stop: () => stopAll(client, procs) };
}

/** One POST with a JSON body; throws unless the answer is 200. */
export function poster(client: Pool, headers: Record<string, string>) {
  return async (path: string, payload: string): Promise<string> => {
    const r = await client.request({ path, method: 'POST', headers, body: payload });
    const text = await r.body.text();
    if (r.statusCode !== 200) throw new Error(`${path} answered ${r.statusCode}: ${text.slice(0, 300)}`);
    return text;
  };
}

/**
 * Deletes the accounts a run made and every row that points at them or their keys, in one transaction.
 * The tables are found in the catalogue (every table with an `account_id` column, every foreign key to
 * api_keys), so a later migration's table is covered without a change here.
 */
export async function deleteAccounts(databaseUrl: string, accountIds: string[]): Promise<number> {
  if (!accountIds.length) return 0;
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    await client.query('BEGIN');
    const keys = (await client.query<{ id: string }>('SELECT id FROM api_keys WHERE account_id = ANY($1::uuid[])', [accountIds])).rows.map((r) => r.id);
    // Foreign keys into api_keys from other tables (ledger.key_id, ...), and tables keyed by account.
    const keyRefs = (
      await client.query<{ tbl: string; col: string }>(`
        SELECT c.conrelid::regclass::text AS tbl, a.attname AS col
        FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
        WHERE c.contype = 'f' AND c.confrelid = 'api_keys'::regclass AND c.conrelid <> 'api_keys'::regclass`)
    ).rows;
    const byAccount = (
      await client.query<{ tbl: string }>(`
        SELECT format('%I.%I', table_schema, table_name) AS tbl FROM information_schema.columns
        WHERE column_name = 'account_id' AND table_schema = current_schema()
          AND table_name NOT IN ('accounts', 'api_keys')
          AND table_name IN (SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE' AND table_schema = current_schema())`)
    ).rows.map((r) => r.tbl);
    const steps: Array<[string, unknown[]]> = [
      ...keyRefs.map((r): [string, unknown[]] => [`DELETE FROM ${r.tbl} WHERE "${r.col}" = ANY($1::uuid[])`, [keys]]),
      ...byAccount.map((t): [string, unknown[]] => [`DELETE FROM ${t} WHERE account_id = ANY($1::uuid[])`, [accountIds]]),
    ];
    // Tables may point at each other (a delivery at its job): retry what a foreign key refused.
    let pending = steps;
    for (let pass = 0; pass < 5 && pending.length; pass++) {
      const failed: typeof steps = [];
      for (const [q, args] of pending) {
        await client.query('SAVEPOINT s');
        try {
          await client.query(q, args);
          await client.query('RELEASE SAVEPOINT s');
        } catch {
          await client.query('ROLLBACK TO SAVEPOINT s');
          failed.push([q, args]);
        }
      }
      pending = failed;
    }
    if (pending.length) throw new Error(`could not clean up: ${pending.map(([q]) => q).join('; ')}`);
    // Keys point at keys (created_by_key_id, replaced_by_key_id): cut those links first.
    const selfRefs = (
      await client.query<{ col: string }>(`
        SELECT a.attname AS col FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
        WHERE c.contype = 'f' AND c.confrelid = 'api_keys'::regclass AND c.conrelid = 'api_keys'::regclass`)
    ).rows.map((r) => r.col);
    if (selfRefs.length)
      await client.query(`UPDATE api_keys SET ${selfRefs.map((c) => `"${c}" = NULL`).join(', ')} WHERE account_id = ANY($1::uuid[])`, [accountIds]);
    await client.query('DELETE FROM api_keys WHERE account_id = ANY($1::uuid[])', [accountIds]);
    const n = (await client.query('DELETE FROM accounts WHERE id = ANY($1::uuid[])', [accountIds])).rowCount ?? 0;
    await client.query('COMMIT');
    return n;
  } catch (e) {
    await client.query('ROLLBACK').catch(() => {});
    throw e;
  } finally {
    await client.end();
  }
}

/** What sweepKeys needs of a Redis client (a node's connection, not a cluster's). */
export interface KeyScanner {
  scan(cursor: string, match: 'MATCH', pattern: string, count: 'COUNT', n: number): Promise<[string, string[]]>;
  unlink(...keys: string[]): Promise<number>;
}

/** Unlinks every key whose name contains `tag` (a run's random prefix), whatever shape it took. */
export async function sweepKeys(redis: KeyScanner, tag: string): Promise<number> {
  let cursor = '0';
  let n = 0;
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `*${tag}*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length) n += await redis.unlink(...keys);
  } while (cursor !== '0');
  return n;
}

/** A database called `name` on the server of `baseUrl`, created and migrated; its URL. Drop it with dropDatabase. */
export async function freshDatabase(baseUrl: string, name: string): Promise<string> {
  const u = new URL(baseUrl);
  u.pathname = `/${name}`;
  await ensureDatabase(u.toString());
  await migrate(u.toString());
  return u.toString();
}

export async function dropDatabase(url: string, baseUrl: string): Promise<void> {
  const admin = new URL(baseUrl);
  admin.pathname = '/postgres';
  const c = new pg.Client({ connectionString: admin.toString() });
  await c.connect();
  try {
    await c.query(`DROP DATABASE IF EXISTS ${new URL(url).pathname.slice(1)} WITH (FORCE)`);
  } finally {
    await c.end();
  }
}
