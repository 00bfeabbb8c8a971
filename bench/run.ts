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
import { connectRedis } from '../src/queue/redis.js';
import { CreditReservations } from '../src/services/credits.js';
import { AdminService } from '../src/services/admin.js';
import { checkServices, runMigrations, makeLogger } from '../src/bootstrap.js';

const LEVELS = [1, 10, 50];
const COUNT: Record<number, number> = { 1: 400, 10: 2000, 50: 4000 };
const WARMUP = 300;

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

  const port = 18_000 + Math.floor(Math.random() * 1000);
  const server = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
    env: { ...process.env, PORT: String(port), HOST: '127.0.0.1', REDIS_PREFIX: prefix, LOG_LEVEL: 'warn', WORKERS: 'inline' },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  const http = new Pool(`http://127.0.0.1:${port}`, { connections: 64, pipelining: 1 });
  for (;;) {
    try {
      const r = await http.request({ path: '/health', method: 'GET' });
      await r.body.text();
      if (r.statusCode === 200) break;
    } catch {
      /* not up yet */
    }
    await new Promise((r) => setTimeout(r, 200));
  }

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
  await once(worker, 'message');
  const queue = new Queue(bq, { connection: redis, prefix });
  const events = new QueueEvents(bq, { connection: { url: config.REDIS_URL } as never, prefix });
  await events.waitUntilReady();
  const baselineOp = async () => {
    const job = await queue.add('noop', { expression: '2 * (3 + 4)' }, { removeOnComplete: true });
    await job.waitUntilFinished(events);
  };

  await drive(10, WARMUP, serviceOp);
  await drive(10, WARMUP, baselineOp);

  const rows: string[] = [];
  let ratioAt50 = 0;
  let p50At1 = 0;
  for (const level of LEVELS) {
    const n = COUNT[level]!;
    const base = await drive(level, n, baselineOp);
    const svc = await drive(level, n, serviceOp);
    const ratio = svc.rps / base.rps;
    if (level === 50) ratioAt50 = ratio;
    if (level === 1) p50At1 = svc.p50;
    rows.push(`in flight ${String(level).padStart(2)}  service  ${fmt(svc)}`);
    rows.push(`             baseline ${fmt(base)}   ratio ${ratio.toFixed(2)}`);
  }

  const extra = await import('./protocol.js').then((m) => m.protocolBench?.({ http, headers, drive, fmt })).catch(() => null);

  process.stdout.write('\nTollgate benchmark (one hot account, compute at 2 cents, inline workers)\n');
  for (const r of rows) process.stdout.write(r + '\n');
  if (extra) for (const r of extra) process.stdout.write(r + '\n');
  process.stdout.write(
    `\nratio service/baseline at 50 in flight: ${ratioAt50.toFixed(2)} (goal >= 0.90)\n` +
      `service p50 at 1 in flight: ${p50At1.toFixed(2)} ms (goal <= 5 ms)\n`,
  );

  await http.close();
  server.kill('SIGTERM');
  worker.kill('SIGTERM');
  await Promise.all([once(server, 'exit'), once(worker, 'exit')]);
  await events.close();
  await queue.close();
  redis.disconnect();
  await pool.end();
}

main().catch((e) => {
  process.stderr.write(`bench failed: ${(e as Error).stack}\n`);
  process.exit(1);
});
