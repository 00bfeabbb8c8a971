/**
 * npm run bench:breakdown (issue #20, part 2): where a paid call's time goes, against the anchor's.
 *
 * Both run in the production split shape (service: WORKERS=off API + `workers/index.ts --family core`;
 * anchor: bench/anchor-server.ts + a no-op BullMQ worker), on a private redis-server started for the
 * run (BENCH_PORT + 2), so INFO commandstats, MONITOR and Redis CPU see nothing but these calls, and with
 * Postgres behind a counting proxy (BENCH_PORT + 3, bench/pg-proxy.ts). For each, after a warm-up:
 *
 * 1. Counting phase, BENCH_BREAKDOWN_CALLS calls (default 2000) at BENCH_BREAKDOWN_IN_FLIGHT (10):
 *    Redis commands per call as sent by each process (MONITOR, attributed to the API or the worker by
 *    the socket's owner in /proc), Lua script calls by script name (EVALSHA's SHA-1 against the scripts
 *    the processes defined, recorded by bench/script-names.mjs), commands run inside scripts, INFO
 *    commandstats (everything Redis executed), SQL statements per call by text and Postgres round trips
 *    (the proxy), Postgres commits (pg_stat_database).
 * 2. Timing phase, the same number of calls without MONITOR: CPU ms per call of the API process, the
 *    worker process (utime + stime of all threads, /proc/<pid>/stat), redis-server and Postgres (every
 *    `postgres` process on the machine), and req/s.
 *
 * Then the same for a chain of three (POST / with chain: [compute x3]), half as many operations, per
 * operation; BENCH_BREAKDOWN_CHAIN=0 skips it.
 *
 * BENCH_CPU_PROF=1 starts the children with `node --cpu-prof` and prints, per process, the top 25
 * functions by self time over the timing phase's samples only (bench/cpuprofile.ts).
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { mkdirSync, readFileSync, readdirSync, readlinkSync, existsSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { Redis as IORedis } from 'ioredis';
import { loadConfig } from '../src/config.js';
import { openPool } from '../src/db/pool.js';
import { AccountsRepo } from '../src/access/accounts.js';
import { connectRedis } from '../src/queue/redis.js';
import { CreditReservations } from '../src/money/holds.js';
import { AdminService } from '../src/ops/admin.js';
import { checkServices, runMigrations, makeLogger } from '../src/bootstrap.js';
import { assertPortFree, benchPorts, children, cpuMs, cpuMsOfComm, deleteAccounts, drive, poster, startAnchor, startService, type Running } from './common.js';
import { PgCountingProxy } from './pg-proxy.js';
import { formatSummary, profilesOf, summarise } from './cpuprofile.js';

const CALLS = Number(process.env.BENCH_BREAKDOWN_CALLS ?? 2000);
const IN_FLIGHT = Number(process.env.BENCH_BREAKDOWN_IN_FLIGHT ?? 10);
const WARMUP = Number(process.env.BENCH_BREAKDOWN_WARMUP ?? 1500);
const PROFILE = process.env.BENCH_CPU_PROF === '1';
const IDLE_MS = 3000;
const CHAIN = process.env.BENCH_BREAKDOWN_CHAIN !== '0';

const log = (s: string) => process.stderr.write(`[breakdown ${new Date().toISOString().slice(11, 19)}] ${s}\n`);
const inc = <K>(m: Map<K, number>, k: K, n = 1) => m.set(k, (m.get(k) ?? 0) + n);
/** total_reads_processed / total_writes_processed of INFO stats. */
function redisIo(info: string): { reads: number; writes: number } {
  const num = (k: string) => Number(new RegExp(`^${k}:(\\d+)`, 'm').exec(info)?.[1] ?? NaN);
  return { reads: num('total_reads_processed'), writes: num('total_writes_processed') };
}

const nowUs = () => Number(process.hrtime.bigint() / 1000n);

/** Local TCP ports of the sockets a process holds (its fds against /proc/net/tcp{,6}). */
function localPortsOf(pid: number): Set<number> {
  const inodes = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m) inodes.add(m[1]!);
    } catch {
      /* closed meanwhile */
    }
  }
  const ports = new Set<number>();
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    if (!existsSync(table)) continue;
    for (const line of readFileSync(table, 'utf8').split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length > 9 && inodes.has(f[9]!)) ports.add(parseInt(f[1]!.split(':')[1]!, 16));
    }
  }
  return ports;
}

interface Owners {
  byPort: Map<number, string>;
}
function owners(procs: Record<string, number | undefined>): Owners {
  const byPort = new Map<number, string>();
  for (const [name, pid] of Object.entries(procs)) if (pid) for (const p of localPortsOf(pid)) byPort.set(p, name);
  return { byPort };
}
const ownerOf = (o: Owners, port: number) => o.byPort.get(port) ?? 'other';

interface Result {
  label: string;
  calls: number;
  /** Top-level commands by owner (api, worker, bench, other) and name. */
  sent: Map<string, Map<string, number>>;
  /** Bytes of command arguments sent, by owner. */
  bytes: Map<string, number>;
  lua: Map<string, number>;
  inner: Map<string, number>;
  commandstats: Map<string, number>;
  /** Socket reads and writes redis-server made in the timing phase (INFO stats). */
  io: { reads: number; writes: number };
  idleSentPerSec: Map<string, number>;
  sql: Map<string, Map<string, number>>;
  sqlTrips: Map<string, number>;
  commits: number;
  cpu: Record<'api' | 'worker' | 'redis' | 'postgres', number>;
  rps: number;
  countRps: number;
  window: [number, number];
  pids: { api: number; worker: number };
}

function parseCommandstats(info: string): Map<string, number> {
  const m = new Map<string, number>();
  for (const line of info.split('\n')) {
    const r = /^cmdstat_([^:]+):calls=(\d+)/.exec(line.trim());
    if (r) m.set(r[1]!, Number(r[2]));
  }
  return m;
}

async function main() {
  const t0 = Date.now();
  const load0 = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  const ports = benchPorts();
  for (const [p, what] of [
    [ports.anchor, 'anchor'],
    [ports.service, 'service'],
    [ports.redis, 'private redis-server'],
    [ports.pgProxy, 'Postgres counting proxy'],
  ] as const)
    await assertPortFree(p, what);
  const prefix = `bench${randomBytes(3).toString('hex')}`;
  const work = join(tmpdir(), `tollgate-breakdown-${prefix}`);
  mkdirSync(work, { recursive: true });
  const profDir = join(work, 'prof');
  if (PROFILE) mkdirSync(profDir);
  const scriptNamesFile = join(work, 'scripts.txt');
  writeFileSync(scriptNamesFile, '');

  // A Redis of the run's own: its statistics are the calls', nobody else's.
  const redisUrl = `redis://127.0.0.1:${ports.redis}`;
  const redisServer = spawn(
    'redis-server',
    ['--port', String(ports.redis), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--daemonize', 'no', '--loglevel', 'warning'],
    {
      stdio: ['ignore', 'ignore', 'inherit'],
    },
  );
  children.push(redisServer);
  const stats = new IORedis(redisUrl, { maxRetriesPerRequest: null, lazyConnect: true });
  stats.on('error', () => {}); // refused until redis-server listens
  for (let i = 0; ; i++) {
    try {
      await stats.connect();
      await stats.ping();
      break;
    } catch {
      if (i > 50) throw new Error(`redis-server on ${ports.redis} did not start`);
      stats.disconnect();
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  const directDb = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/tollgate';
  const config = loadConfig({ ...process.env, DATABASE_URL: directDb, REDIS_URL: redisUrl }, { REDIS_PREFIX: prefix, LOG_LEVEL: 'warn' });
  await checkServices(config);
  await runMigrations(config, makeLogger(config));
  const dbu = new URL(directDb);
  const proxy = new PgCountingProxy(dbu.hostname, Number(dbu.port || 5432));
  await proxy.listen(ports.pgProxy);
  const proxiedDb = new URL(directDb);
  proxiedDb.hostname = '127.0.0.1';
  proxiedDb.port = String(ports.pgProxy);
  const dbName = dbu.pathname.slice(1);
  const pgStats = new pg.Client({ connectionString: directDb });
  await pgStats.connect();
  const commitsNow = async () =>
    Number((await pgStats.query('SELECT xact_commit FROM pg_stat_database WHERE datname = $1', [dbName])).rows[0]?.xact_commit ?? 0);

  const pool = await openPool(config.DATABASE_URL, { maximumPoolSize: 2 });
  const redis = connectRedis(redisUrl);
  const accountIds: string[] = [];
  const running: Running[] = [];
  const results: Result[] = [];
  try {
    const accounts = new AccountsRepo(pool);
    const admin = new AdminService({ accounts, credits: new CreditReservations(redis, prefix, accounts), redis, prefix });
    const acct = await admin.createAccount('enterprise', 10_000_000, 'bench-breakdown');
    accountIds.push(acct.account_id);
    await admin.setAccount(acct.account_id, { rpm: 10_000_000 });
    const headers = { authorization: `Bearer ${acct.api_key}`, 'content-type': 'application/json' };
    const body = JSON.stringify({ expression: '2 * (3 + 4)' });
    const env = {
      ...process.env,
      REDIS_URL: redisUrl,
      DATABASE_URL: proxiedDb.toString(),
      REDIS_PREFIX: prefix,
      LOG_LEVEL: 'warn',
      EDGE_TOKEN_KEY: randomBytes(32).toString('hex'),
      BENCH_SCRIPT_NAMES: scriptNamesFile,
    };
    const preload = ['--import', new URL('./script-names.mjs', import.meta.url).pathname];
    const nodeArgs = [...preload, ...(PROFILE ? ['--cpu-prof', `--cpu-prof-dir=${profDir}`] : [])];

    const chainBody = JSON.stringify({ chain: ['compute', 'compute', 'compute'], q: '2 * (3 + 4)' });
    const measure = async (label: string, r: Running, chain = false): Promise<Result> => {
      const post = poster(r.client, headers);
      const op = chain ? () => post('/', chainBody).then(() => {}) : () => post('/tools/compute', body).then(() => {});
      const pids = { api: r.api.pid!, worker: r.worker!.pid! };
      const n = chain ? Math.ceil(CALLS / 2) : CALLS;
      const warm = chain ? Math.ceil(WARMUP / 5) : WARMUP;
      log(`${label}: warm-up ${warm} calls`);
      await drive(IN_FLIGHT, warm, op);

      // Counting phase.
      const sha = new Map<string, string>();
      const readShas = () => {
        for (const line of readFileSync(scriptNamesFile, 'utf8').split('\n')) {
          const [s, name] = line.split(' ');
          if (s && name) sha.set(s, name);
        }
      };
      readShas();
      const who = owners({ ...pids, bench: process.pid });
      const sent = new Map<string, Map<string, number>>();
      const lua = new Map<string, number>();
      const inner = new Map<string, number>();
      const bytes = new Map<string, number>();
      let counting = false;
      const idle = new Map<string, number>();
      const monitor = await stats.duplicate().monitor();
      monitor.on('monitor', (_time: string, args: string[], source: string) => {
        const cmd = String(args[0] ?? '').toLowerCase();
        if (source === 'lua') {
          if (counting) inc(inner, cmd);
          return;
        }
        const owner = ownerOf(who, Number(source.split(':').at(-1)));
        if (!counting) {
          inc(idle, `${owner} ${cmd}`);
          return;
        }
        let m = sent.get(owner);
        if (!m) sent.set(owner, (m = new Map()));
        inc(m, cmd);
        inc(
          bytes,
          owner,
          args.reduce((a, x) => a + Buffer.byteLength(String(x)), 0),
        );
        if (owner === 'bench') return;
        if (cmd === 'evalsha') inc(lua, sha.get(String(args[1])) ?? `sha ${String(args[1]).slice(0, 8)}`);
        else if (cmd === 'eval') inc(lua, sha.get(createHash('sha1').update(String(args[1])).digest('hex')) ?? 'eval (unnamed)');
        else if (cmd === 'fcall' || cmd === 'fcall_ro') inc(lua, `function ${args[1]}`);
      });
      // Background traffic with no calls (heartbeats, blocking reads, timers), per second.
      await new Promise((res) => setTimeout(res, IDLE_MS));
      const idleSentPerSec = new Map([...idle].map(([k, v]) => [k, (v * 1000) / IDLE_MS]));
      await stats.config('RESETSTAT');
      const commits0 = await commitsNow();
      proxy.reset();
      proxy.counting = true;
      counting = true;
      log(`${label}: counting phase, ${n} ${chain ? 'operations' : 'calls'} at ${IN_FLIGHT} in flight (MONITOR on)`);
      const c = await drive(IN_FLIGHT, n, op);
      // Settlements and acks in flight; Postgres flushes its statistics at most once a second.
      await new Promise((res) => setTimeout(res, 1200));
      counting = false;
      proxy.counting = false;
      const commits = (await commitsNow()) - commits0;
      const commandstats = parseCommandstats(await stats.info('commandstats'));
      monitor.disconnect();
      readShas();
      // Statements and round trips by the process owning the client socket.
      const pgWho = owners({ ...pids, bench: process.pid });
      const sql = new Map<string, Map<string, number>>();
      const sqlTrips = new Map<string, number>();
      for (const [port, m] of proxy.counts.statements) {
        const o = ownerOf(pgWho, port);
        let t = sql.get(o);
        if (!t) sql.set(o, (t = new Map()));
        for (const [k, n] of m) inc(t, k, n);
      }
      for (const [port, n] of proxy.counts.roundTrips) inc(sqlTrips, ownerOf(pgWho, port), n);
      // Re-label unknown SHAs read after the fact.
      for (const [k, n] of [...lua]) {
        if (k.startsWith('sha ')) {
          const full = [...sha.keys()].find((s) => s.startsWith(k.slice(4)));
          if (full) {
            lua.delete(k);
            inc(lua, sha.get(full)!, n);
          }
        }
      }

      // Timing phase.
      log(`${label}: timing phase, ${n} ${chain ? 'operations' : 'calls'} at ${IN_FLIGHT} in flight`);
      const io0 = redisIo(await stats.info('stats'));
      const cpu0 = { api: cpuMs(pids.api), worker: cpuMs(pids.worker), redis: cpuMs(redisServer.pid!), postgres: cpuMsOfComm('postgres') };
      const w0 = nowUs();
      const t = await drive(IN_FLIGHT, n, op);
      const w1 = nowUs();
      const io1 = redisIo(await stats.info('stats'));
      // Socket reads and writes Redis made: how many separate writes the clients' commands arrived in.
      const io = { reads: io1.reads - io0.reads - 1, writes: io1.writes - io0.writes - 1 };
      const cpu = {
        api: cpuMs(pids.api) - cpu0.api,
        worker: cpuMs(pids.worker) - cpu0.worker,
        redis: cpuMs(redisServer.pid!) - cpu0.redis,
        postgres: cpuMsOfComm('postgres') - cpu0.postgres,
      };
      return {
        label,
        calls: n,
        sent,
        bytes,
        lua,
        inner,
        commandstats,
        idleSentPerSec,
        sql,
        sqlTrips,
        commits,
        cpu,
        io,
        rps: t.rps,
        countRps: c.rps,
        window: [w0, w1],
        pids,
      };
    };

    log('service: WORKERS=off API + core worker process');
    const service = await startService({ port: ports.service, split: true, env, nodeArgs });
    running.push(service);
    results.push(await measure('service', service));
    // The same service, a chain of three (POST /) per operation (BENCH_BREAKDOWN_CHAIN=0 skips it).
    if (CHAIN) results.push(await measure('chain of 3', service, true));
    await service.stop();
    running.pop();

    log('anchor: Fastify front + no-op worker process');
    const anchor = await startAnchor({ port: ports.anchor, prefix, queue: 'bench-anchor', concurrency: config.CONCURRENCY_CORE, env, nodeArgs });
    running.push(anchor);
    results.push(await measure('anchor', anchor));
    await anchor.stop();
    running.pop();

    // ---- report ----
    const out: string[] = [];
    const w = (s = '') => out.push(s);
    const sv = results.find((r) => r.label === 'service')!;
    const an = results.find((r) => r.label === 'anchor')!;
    const ch = results.find((r) => r.label === 'chain of 3');
    const sum = (m: Map<string, number> | undefined) => [...(m ?? new Map<string, number>()).values()].reduce((a, b) => a + b, 0);
    const sentBy = (r: Result, o: string) => sum(r.sent.get(o));
    const luaCalls = (r: Result) => sum(r.lua);
    const statsTotal = (r: Result) => sum(r.commandstats) - (r.commandstats.has('info') ? 1 : 0) - (r.commandstats.get('config|resetstat') ?? 0);
    const sqlBy = (r: Result, o: string) => sum(r.sql.get(o));
    // The chain's column is per operation (three paid calls).
    let chainCell = '';
    const row = (label: string, a: number, b: number, digits = 2) => {
      w(
        `${label.padEnd(46)} ${a.toFixed(digits).padStart(9)} ${b.toFixed(digits).padStart(9)}${b > 0 ? `   ${(a / b).toFixed(1).padStart(5)}x` : '         '}${chainCell}`,
      );
      chainCell = '';
    };
    const withChain = (f: (r: Result) => number, digits = 2) => {
      if (ch) chainCell = `   ${(f(ch) / ch.calls).toFixed(digits).padStart(9)}`;
    };
    const row3 = (label: string, f: (r: Result) => number, digits = 2) => {
      withChain(f, digits);
      row(label, f(sv) / sv.calls, f(an) / an.calls, digits);
    };
    w();
    w(`Per-call cost: paid POST /tools/compute (service, split: API + core worker process) against the anchor`);
    w(`${CALLS} calls at ${IN_FLIGHT} in flight per phase after ${WARMUP} warm-up calls; private redis-server, Postgres through a counting proxy`);
    w(
      `counting phase ${sv.countRps.toFixed(0)} / ${an.countRps.toFixed(0)} req/s (MONITOR on); timing phase ${sv.rps.toFixed(0)} / ${an.rps.toFixed(0)} req/s`,
    );
    if (ch) w(`chain op = one POST / with a chain of three compute calls (three paid calls), per operation; ${ch.rps.toFixed(0)} ops/s in its timing phase`);
    w();
    w(`${''.padEnd(46)} ${'service'.padStart(9)} ${'anchor'.padStart(9)}   ratio${ch ? `   ${'chain op'.padStart(9)}` : ''}`);
    row3('Redis commands sent by the API process', (r) => sentBy(r, 'api'));
    row3('Redis commands sent by the worker process', (r) => sentBy(r, 'worker'));
    row3('Redis commands sent, other connections', (r) => sentBy(r, 'other'));
    row3('Redis arg bytes sent by API (MONITOR text)', (r) => r.bytes.get('api') ?? 0, 0);
    row3('Redis arg bytes sent by worker (MONITOR text)', (r) => r.bytes.get('worker') ?? 0, 0);
    row3('Lua script calls (evalsha/eval/fcall)', luaCalls);
    row3('Redis commands run inside Lua scripts', (r) => sum(r.inner));
    row3('Redis commands executed (INFO commandstats)', statsTotal);
    row3('Redis socket reads (INFO stats, timing phase)', (r) => r.io.reads);
    row3('Redis socket writes (INFO stats, timing phase)', (r) => r.io.writes);
    row3('SQL statements, API process', (r) => sqlBy(r, 'api'));
    row3('SQL statements, worker process', (r) => sqlBy(r, 'worker'));
    row3('SQL statements, other connections', (r) => sqlBy(r, 'other'));
    row3('Postgres round trips (Sync + Query)', (r) => sum(r.sqlTrips));
    row3('Postgres commits (pg_stat_database)', (r) => r.commits);
    row3('CPU ms, API process (all threads)', (r) => r.cpu.api, 3);
    row3('CPU ms, worker process (all threads)', (r) => r.cpu.worker, 3);
    row3('CPU ms, redis-server', (r) => r.cpu.redis, 3);
    row3('CPU ms, Postgres (every postgres process)', (r) => r.cpu.postgres, 3);
    row3('CPU ms, all of the above', (r) => Object.values(r.cpu).reduce((a, b) => a + b), 3);

    const fmtMap = (m: Map<string, number> | undefined, calls: number, min = 0.005) =>
      [...(m ?? new Map())]
        .map(([k, n]) => [k, n / calls] as const)
        .filter(([, x]) => x >= min)
        .sort((a, b) => b[1] - a[1])
        .map(([k, x]) => `${k} ${x.toFixed(2)}`)
        .join(', ') || '-';
    for (const r of results) {
      w();
      w(`${r.label}: per call`);
      for (const o of ['api', 'worker', 'other']) if (r.sent.get(o)) w(`  Redis sent by ${o}: ${fmtMap(r.sent.get(o), r.calls)}`);
      w(`  Lua scripts: ${fmtMap(r.lua, r.calls)}`);
      w(`  inside Lua: ${fmtMap(r.inner, r.calls)}`);
      w(`  commandstats: ${fmtMap(new Map([...r.commandstats].filter(([k]) => k !== 'info' && !k.startsWith('config'))), r.calls)}`);
      w(`  idle background, commands/s: ${fmtMap(new Map([...r.idleSentPerSec].filter(([k]) => !k.startsWith('bench '))), 1, 0.1)}`);
      for (const o of ['api', 'worker', 'other']) {
        const m = r.sql.get(o);
        if (!m) continue;
        w(`  SQL by ${o} (${((r.sqlTrips.get(o) ?? 0) / r.calls).toFixed(2)} round trips/call):`);
        for (const [k, n] of [...m].sort((a, b) => b[1] - a[1]).slice(0, 12)) w(`    ${(n / r.calls).toFixed(3).padStart(7)}  ${k}`);
      }
    }

    if (PROFILE) {
      // The children wrote their profiles on exit.
      await new Promise((res) => setTimeout(res, 500));
      for (const r of results) {
        for (const [proc, pid] of Object.entries(r.pids)) {
          const files = profilesOf(profDir, pid);
          if (!files.length) {
            w(`\n${r.label} ${proc}: no profile found in ${profDir}`);
            continue;
          }
          const summaries = files.map((f) => summarise(f.file, pid, f.thread, r.window));
          w();
          for (const l of formatSummary(
            `CPU profile, ${r.label} ${proc} process, main thread${r === ch ? ' (per operation of three calls)' : ''}`,
            summaries[0]!,
            r.calls,
            r === ch ? 15 : 25,
          ))
            w(l);
          const others = summaries.slice(1);
          if (others.length) {
            const busy = others.reduce((a, s) => a + s.busyMs, 0);
            w(`  other threads (${others.length}): busy ${busy.toFixed(0)} ms (${(busy / r.calls).toFixed(3)} ms/call)`);
            const top = others.sort((a, b) => b.busyMs - a.busyMs)[0]!;
            if (top.busyMs > 0.05 * summaries[0]!.busyMs) for (const l of formatSummary(`  busiest other thread`, top, r.calls, 10)) w(l);
          }
        }
      }
      w();
      w(`profiles: ${profDir}`);
    }
    w();
    w(
      `breakdown took ${((Date.now() - t0) / 1000).toFixed(0)} s; load average at start ${load0}, at end ${readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ')} (2 cores)`,
    );
    process.stdout.write(out.join('\n') + '\n');
  } finally {
    for (const r of running) await r.stop().catch(() => {});
    const removed = await deleteAccounts(directDb, accountIds).catch((e) => (log(`account clean-up failed: ${(e as Error).message}`), 0));
    log(`cleaned up: ${removed} account(s); private redis-server stopped`);
    redis.disconnect();
    stats.disconnect();
    await pool.end();
    await pgStats.end();
    await proxy.close();
    redisServer.kill('SIGTERM');
    await once(redisServer, 'exit');
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`breakdown failed: ${(e as Error).stack}\n`);
    process.exit(1);
  },
);
