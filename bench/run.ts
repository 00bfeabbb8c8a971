/**
 * npm run bench: the service's sync path against a bare BullMQ round trip, measured in one run on
 * the same Redis. Prints req/s, p50 and p99 per concurrency level and the service/baseline ratio.
 *
 * Service: `POST /tools/compute` over HTTP on one hot account (a real 2-cent charge per call), the
 * API and inline workers in a child process like `npm start`. Baseline: Queue.add + waitUntilFinished
 * with a no-op worker in a child process.
 */
import { fork, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { randomBytes } from 'node:crypto';
import { Pool } from 'undici';
import { Queue, QueueEvents } from 'bullmq';
import { loadConfig } from '../src/config.js';
import { openPool } from '../src/db/pool.js';
import { AccountsRepo } from '../src/db/accounts-repo.js';
import { connectRedis, deleteByPrefix } from '../src/queue/redis.js';
import { CreditReservations } from '../src/money/holds.js';
import { AdminService } from '../src/services/admin.js';
import { checkServices, runMigrations, makeLogger } from '../src/bootstrap.js';
import { toolLimitRows } from './tool-limits.js';

const LEVELS = [1, 10, 50];
const children: ChildProcess[] = [];
process.on('exit', () => {
  for (const c of children) c.kill('SIGKILL');
});
const COUNT: Record<number, number> = { 1: 400, 10: 2000, 50: 4000 };
// Calls before measuring: processes started with tsx compile and JIT-warm for the first seconds.
const WARMUP = 1500;

interface Stats { rps: number; p50: number; p99: number; n: number }

function stats(latencies: number[], wallMs: number): Stats {
  const s = [...latencies].sort((a, b) => a - b);
  const pick = (q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
  return { rps: (latencies.length / wallMs) * 1000, p50: pick(0.5), p99: pick(0.99), n: latencies.length };
}

/** Runs `total` operations with `inFlight` at a time; returns per-op latencies and wall time. */
async function drive(inFlight: number, total: number, op: (i: number) => Promise<void>): Promise<Stats> {
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

const fmt = (s: Stats) => `${s.rps.toFixed(0).padStart(6)} req/s  p50 ${s.p50.toFixed(2).padStart(6)} ms  p99 ${s.p99.toFixed(2).padStart(7)} ms`;

async function main() {
  const prefix = `bench${randomBytes(3).toString('hex')}`;
  const config = loadConfig(process.env, { REDIS_PREFIX: prefix, LOG_LEVEL: 'warn' });
  await checkServices(config);
  await runMigrations(config, makeLogger(config));

  // A hot account with credit for every call of the run.
  const pool = await openPool(config.DATABASE_URL, { maximumPoolSize: 2 });
  const redis = connectRedis(config.REDIS_URL);
  const accounts = new AccountsRepo(pool);
  const admin = new AdminService({ accounts, credits: new CreditReservations(redis, prefix, accounts), redis, prefix });
  const acct = await admin.createAccount('enterprise', 10_000_000, 'bench');
  await admin.setAccount(acct.account_id, { rpm: 10_000_000 });

  // Two deployments of the service: the one-command default (API and workers in one process), and
  // the production shape (API process plus a separate worker process for the tool's family).
  const edgeKey = randomBytes(32).toString('hex');
  const startService = async (split: boolean, extraEnv: Record<string, string> = {}) => {
    const port = 18_000 + Math.floor(Math.random() * 1000);
    const env = { ...process.env, PORT: String(port), HOST: '127.0.0.1', REDIS_PREFIX: prefix, LOG_LEVEL: 'warn', EDGE_TOKEN_KEY: edgeKey, ...extraEnv };
    const procs = [spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], { env: { ...env, WORKERS: split ? 'off' : 'inline' }, stdio: ['ignore', 'inherit', 'inherit'] })];
    if (split) procs.push(spawn(process.execPath, ['--import', 'tsx', 'workers/index.ts', '--family', 'core'], { env, stdio: ['ignore', 'inherit', 'inherit'] }));
    children.push(...procs);
    const client = new Pool(`http://127.0.0.1:${port}`, { connections: 64, pipelining: 1 });
    for (;;) {
      try {
        // Ready when a core worker beats: the split run has no other family, so /health says degraded.
        const r = await client.request({ path: '/health', method: 'GET' });
        const health = JSON.parse(await r.body.text()) as { worker_counts?: { core?: number } | null };
        if ((health.worker_counts?.core ?? 0) > 0) break;
      } catch {
        /* not up yet */
      }
      await new Promise((r) => setTimeout(r, 200));
    }
    const stop = async () => {
      await client.close();
      for (const p of procs) p.kill('SIGTERM');
      await Promise.all(procs.map((p) => once(p, 'exit')));
    };
    return { client, stop };
  };
  let { client: http, stop } = await startService(false);

  const body = JSON.stringify({ expression: '2 * (3 + 4)' });
  const headers = { authorization: `Bearer ${acct.api_key}`, 'content-type': 'application/json' };
  const callTool = async (path: string, payload: string) => {
    const r = await http.request({ path, method: 'POST', headers, body: payload });
    const text = await r.body.text();
    if (r.statusCode !== 200) throw new Error(`${path} answered ${r.statusCode}: ${text}`);
  };
  const serviceOp = () => callTool('/tools/compute', body);

  // Baseline: bare BullMQ on the same Redis.
  const bq = 'bench-baseline';
  const worker = fork(new URL('./baseline-worker.ts', import.meta.url).pathname, [bq, prefix, '50'], {
    execArgv: ['--import', 'tsx'],
    env: process.env,
  });
  children.push(worker);
  await once(worker, 'message');
  const queue = new Queue(bq, { connection: redis, prefix });
  const events = new QueueEvents(bq, { connection: { url: config.REDIS_URL } as never, prefix });
  await events.waitUntilReady();
  const baselineOp = async () => {
    const job = await queue.add('noop', { expression: '2 * (3 + 4)' }, { removeOnComplete: { count: 20_000 } });
    await job.waitUntilFinished(events);
  };

  const measureBaseline = async () => {
    const out = new Map<number, Stats>();
    for (const level of LEVELS) out.set(level, await drive(level, COUNT[level]!, baselineOp));
    return out;
  };
  const measureService = async () => {
    await drive(10, WARMUP, serviceOp);
    const out = new Map<number, Stats>();
    for (const level of LEVELS) out.set(level, await drive(level, COUNT[level]!, serviceOp));
    return out;
  };

  await drive(10, WARMUP, baselineOp);
  const base = await measureBaseline();
  const inline = await measureService();
  const extra = await import('./protocol.js').then((m: { protocolBench?: Function }) => m.protocolBench?.({ http, headers, drive, fmt })).catch(() => null) as string[] | null;
  await stop();
  ({ client: http, stop } = await startService(true));
  const split = await measureService();
  await stop();

  // What isolation costs: compute in the sandbox's worker threads against the same service running
  // it on the worker's event loop (ISOLATION=off, never for production), at 50 in flight, A B A B A B.
  const isolation: Record<'threads' | 'off', number[]> = { threads: [], off: [] };
  for (let round = 0; round < 3; round++) {
    for (const mode of ['threads', 'off'] as const) {
      ({ client: http, stop } = await startService(false, { ISOLATION: mode }));
      await drive(10, WARMUP, serviceOp);
      isolation[mode].push((await drive(50, COUNT[50]!, serviceOp)).rps);
      await stop();
    }
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  const isolatedRps = median(isolation.threads);
  const unisolatedRps = median(isolation.off);

  const rows: string[] = [];
  for (const level of LEVELS) {
    const b = base.get(level)!;
    rows.push(`in flight ${String(level).padStart(2)}  baseline          ${fmt(b)}`);
    for (const [label, m] of [['service inline   ', inline], ['service + worker ', split]] as const) {
      const sv = m.get(level)!;
      rows.push(`              ${label} ${fmt(sv)}   ratio ${(sv.rps / b.rps).toFixed(2)}`);
    }
  }
  const ratioAt50 = Math.max(inline.get(50)!.rps, split.get(50)!.rps) / base.get(50)!.rps;
  const p50At1 = inline.get(1)!.p50;

  process.stdout.write('\nTollgate benchmark: one hot account, compute at 2 cents per call (real debit)\n');
  process.stdout.write('service inline = npm start (API + workers, one process); service + worker = WORKERS=off API + one core-family worker process\n');
  process.stdout.write('baseline = bare BullMQ Queue.add + waitUntilFinished, no-op worker in its own process, same Redis\n\n');
  for (const r of rows) process.stdout.write(r + '\n');
  if (extra) for (const r of extra) process.stdout.write(r + '\n');
  process.stdout.write(
    `\nratio service/baseline at 50 in flight: ${ratioAt50.toFixed(2)} (goal >= 0.90)\n` +
      `service p50 at 1 in flight: ${p50At1.toFixed(2)} ms (goal <= 5 ms)\n` +
      `isolation at 50 in flight: sandbox threads ${isolation.threads.map((x) => x.toFixed(0)).join(', ')} req/s, ` +
      `event loop (ISOLATION=off) ${isolation.off.map((x) => x.toFixed(0)).join(', ')} req/s; ` +
      `ratio of medians ${(isolatedRps / unisolatedRps).toFixed(2)} (goal >= 0.90: isolation costs under 10%)\n`,
  );

  // The catalogue tools' worst cases, each against its own time limit.
  const limitRows = await toolLimitRows(config);
  if (limitRows.length) {
    process.stdout.write(`\nWorst case per tool (largestInput in the sandbox pool, against its time limit)\n${limitRows.join('\n')}\n`);
  }

  worker.kill('SIGTERM');
  await once(worker, 'exit');
  await events.close();
  await queue.obliterate({ force: true }).catch(() => {});
  await queue.close();
  // Leave nothing behind in Redis: the run's keys all share its prefix.
  await deleteByPrefix(redis, prefix);
  redis.disconnect();
  await pool.end();
}

main().catch((e) => {
  process.stderr.write(`bench failed: ${(e as Error).stack}\n`);
  process.exit(1);
});
