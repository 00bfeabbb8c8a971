/**
 * `npm run bench:ab`: the paid call of two checkouts of the service, side by side in one run, to
 * tell whether a change saves anything: A is BENCH_AB_BASE (a directory holding another checkout,
 * by default a worktree of HEAD made under the system's temporary directory), B is this one. Each
 * round runs A then B (`npm start` shape, one hot account, POST /tools/compute at BENCH_AB_INFLIGHT,
 * default 50), BENCH_AB_ROUNDS rounds (default 3), and reports req/s and the CPU ms per call of the
 * service, redis-server and every postgres process, read from /proc over the measured window.
 * BENCH_AB_LOG_LEVEL=info compares the two at the request log's level (lines written to /dev/null).
 */
import { execFileSync } from 'node:child_process';
import { existsSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { loadConfig } from '../src/config.js';
import { checkServices, makeLogger, runMigrations } from '../src/bootstrap.js';
import { openPool } from '../src/db/pool.js';
import { AccountsRepo } from '../src/access/accounts.js';
import { AdminService } from '../src/ops/admin.js';
import { CreditReservations } from '../src/money/holds.js';
import { connectRedis } from '../src/queue/redis.js';
import { mkdtempSync } from 'node:fs';
import { formatSummary, profilesOf, summarise } from './cpuprofile.js';
import { benchPorts, cpuMs, cpuMsOfComm, deleteAccounts, drive, median, poster, startService, sweepKeys } from './common.js';

const ROUNDS = Number(process.env.BENCH_AB_ROUNDS ?? 3);
const IN_FLIGHT = Number(process.env.BENCH_AB_INFLIGHT ?? 50);
const CALLS = Number(process.env.BENCH_AB_CALLS ?? 8000);
/** BENCH_AB_OP=chain: each operation is one POST / with a chain of three compute calls instead of one POST /tools/compute. */
const CHAIN = process.env.BENCH_AB_OP === 'chain';
/** BENCH_AB_PROF=1: B's last round runs under `node --cpu-prof`; its main thread's top functions are printed. */
const PROFILE = process.env.BENCH_AB_PROF === '1';
/** BENCH_AB_B_NODE_ARGS: node options for B only (e.g. a V8 flag to compare against the same code without it). */
const B_NODE_ARGS = (process.env.BENCH_AB_B_NODE_ARGS ?? '').split(' ').filter(Boolean);
/** BENCH_AB_B_ENV: `NAME=value ...` set for B only (a setting to compare against the same code without it). */
const B_ENV = Object.fromEntries(
  (process.env.BENCH_AB_B_ENV ?? '')
    .split(' ')
    .filter(Boolean)
    .map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]),
);
/** BENCH_AB_LOG_LEVEL: both sides' LOG_LEVEL (default warn); at info their log lines go to /dev/null, written but not shown. */
const LOG_LEVEL = process.env.BENCH_AB_LOG_LEVEL ?? 'warn';
const nowUs = () => Number(process.hrtime.bigint() / 1000n);
const log = (s: string) => process.stderr.write(`[ab ${new Date().toISOString().slice(11, 19)}] ${s}\n`);

function baseCheckout(): string {
  if (process.env.BENCH_AB_BASE) return process.env.BENCH_AB_BASE;
  const dir = join(tmpdir(), `tollgate-ab-${execFileSync('git', ['rev-parse', '--short', 'HEAD']).toString().trim()}`);
  if (!existsSync(dir)) {
    execFileSync('git', ['worktree', 'add', '--detach', dir, 'HEAD'], { stdio: 'ignore' });
    symlinkSync(join(process.cwd(), 'node_modules'), join(dir, 'node_modules'));
  }
  return dir;
}

async function main() {
  const ports = benchPorts();
  const prefix = `benchab${randomBytes(3).toString('hex')}`;
  const config = loadConfig(process.env, { REDIS_PREFIX: prefix, LOG_LEVEL: 'warn' });
  await checkServices(config);
  await runMigrations(config, makeLogger(config));
  const pool = await openPool(config.DATABASE_URL, { maximumPoolSize: 2 });
  const redis = connectRedis(config.REDIS_URL);
  const accounts = new AccountsRepo(pool);
  const admin = new AdminService({ accounts, credits: new CreditReservations(redis, prefix, accounts), redis, prefix });
  const acct = await admin.createAccount('enterprise', 100_000_000, 'bench-ab');
  await admin.setAccount(acct.account_id, { rpm: 10_000_000 });
  const env = { ...process.env, REDIS_PREFIX: prefix, LOG_LEVEL, EDGE_TOKEN_KEY: randomBytes(32).toString('hex'), METRICS_TOKEN: 'bench-ab-metrics' };
  const headers = { authorization: `Bearer ${acct.api_key}`, 'content-type': 'application/json' };
  const body = JSON.stringify({ expression: '2 * (3 + 4)' });
  const sides = { A: baseCheckout(), B: process.cwd() };
  const results: Record<'A' | 'B', Array<{ rps: number; svc: number; redis: number; pg: number }>> = { A: [], B: [] };
  log(`A = ${sides.A}, B = ${sides.B}; ${ROUNDS} rounds of ${CALLS} calls at ${IN_FLIGHT} in flight`);
  try {
    for (let r = 0; r < ROUNDS; r++) {
      for (const side of ['A', 'B'] as const) {
        const prof = PROFILE && side === 'B' && r === ROUNDS - 1 ? mkdtempSync(join(tmpdir(), 'tollgate-ab-prof-')) : null;
        const svc = await startService({
          port: ports.service,
          split: false,
          env: side === 'B' ? { ...env, ...B_ENV } : env,
          cwd: sides[side],
          nodeArgs: [...(side === 'B' ? B_NODE_ARGS : []), ...(prof ? ['--cpu-prof', `--cpu-prof-dir=${prof}`] : [])],
        });
        let window: [number, number] = [0, 0];
        let calls = 0;
        try {
          const post = poster(svc.client, headers);
          const op = CHAIN
            ? () => post('/', JSON.stringify({ chain: ['compute', 'compute', 'compute'], q: '2 * (3 + 4)' })).then(() => {})
            : () => post('/tools/compute', body).then(() => {});
          await drive(IN_FLIGHT, Math.floor(CALLS / 4), op);
          const c0 = [cpuMs(svc.api.pid!), cpuMsOfComm('redis-server'), cpuMsOfComm('postgres')];
          const w0 = nowUs();
          const s = await drive(IN_FLIGHT, CALLS, op);
          window = [w0, nowUs()];
          calls = s.n;
          const c1 = [cpuMs(svc.api.pid!), cpuMsOfComm('redis-server'), cpuMsOfComm('postgres')];
          const per = c1.map((v, i) => (v - c0[i]!) / s.n);
          const m = await (await svc.client.request({ path: '/metrics', method: 'GET', headers: { authorization: 'Bearer bench-ab-metrics' } })).body.text();
          const metric = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(m)?.[1] ?? NaN);
          const batch = metric('tollgate_settlement_batch_size_sum') / metric('tollgate_settlement_batch_size_count');
          results[side].push({ rps: s.rps, svc: per[0]!, redis: per[1]!, pg: per[2]! });
          log(
            `round ${r + 1} ${side}: ${s.rps.toFixed(0)} req/s, p50 ${s.p50.toFixed(2)} ms, CPU ms/call service ${per[0]!.toFixed(3)} redis ${per[1]!.toFixed(3)} postgres ${per[2]!.toFixed(3)}; mean settlement batch ${batch.toFixed(1)}`,
          );
        } finally {
          await svc.stop();
        }
        if (prof) {
          await new Promise((res) => setTimeout(res, 500));
          const files = profilesOf(prof, svc.api.pid!);
          const summaries = files.map((f) => summarise(f.file, svc.api.pid!, f.thread, window));
          if (summaries[0]) for (const l of formatSummary('CPU profile of B, main thread', summaries[0], calls, 40)) console.log(l);
          for (const t of summaries
            .slice(1)
            .sort((a, b) => b.busyMs - a.busyMs)
            .slice(0, 1))
            for (const l of formatSummary('busiest other thread', t, calls, 12)) console.log(l);
        }
      }
    }
    const med = (side: 'A' | 'B', k: 'rps' | 'svc' | 'redis' | 'pg') => median(results[side].map((x) => x[k]));
    for (const side of ['A', 'B'] as const) {
      const total = med(side, 'svc') + med(side, 'redis') + med(side, 'pg');
      console.log(
        `${side}  ${med(side, 'rps').toFixed(0).padStart(6)} req/s   CPU ms/call: service ${med(side, 'svc').toFixed(3)}  redis ${med(side, 'redis').toFixed(3)}  postgres ${med(side, 'pg').toFixed(3)}  sum ${total.toFixed(3)}`,
      );
    }
    console.log(`B/A req/s ${(med('B', 'rps') / med('A', 'rps')).toFixed(3)}`);
  } finally {
    await deleteAccounts(config.DATABASE_URL, [acct.account_id]).catch(() => {});
    await sweepKeys(redis as never, prefix).catch(() => {});
    redis.disconnect();
    await pool.end();
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
