/**
 * npm run bench (issue #20): the service's sync path against a fair anchor, measured in one run on the
 * same Redis, alternating A B A B A B.
 *
 * - Service: `POST /tools/compute` over HTTP on one hot account (auth, rate limit, credit hold, queue,
 *   a real 2-cent Postgres debit per call), API and inline workers in one child process like `npm start`,
 *   on BENCH_PORT + 1.
 * - Anchor: the same Fastify server shape (bench/anchor-server.ts) doing only `Queue.add` +
 *   `job.waitUntilFinished(QueueEvents)`, with a no-op BullMQ worker in its own process at the core
 *   family's concurrency, on BENCH_PORT (default 18080).
 * - Bare baseline (second reference): Queue.add + waitUntilFinished from this process, no HTTP.
 *
 * Prints medians of req/s, p50, p99 at 1, 10 and 50 in flight, the service/anchor ratio at 50 (goal
 * >= 0.90), p50 at 1 (goal <= 5 ms), a chain of three against one call (goal <= 3x), the service's RSS
 * before and after BENCH_MEMORY_CALLS calls (default 100000), a split-process run, what isolation costs
 * (BENCH_ISOLATION=0 skips it), what the request log at info costs against warn (BENCH_LOGGING=0 skips it)
 * and the tools' worst cases. Cleans up its accounts and Redis keys.
 */
import { fork } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { once } from 'node:events';
import { randomBytes } from 'node:crypto';
import { Queue, QueueEvents } from 'bullmq';
import { Redis as IORedis } from 'ioredis';
import { loadConfig } from '../src/config.js';
import { openPool } from '../src/db/pool.js';
import { AccountsRepo } from '../src/access/accounts.js';
import { connectRedis, deleteByPrefix } from '../src/queue/redis.js';
import { CreditReservations } from '../src/money/holds.js';
import { AdminService } from '../src/ops/admin.js';
import { checkServices, runMigrations, makeLogger } from '../src/bootstrap.js';
import { toolLimitRows } from './tool-limits.js';
import { componentRows } from './components.js';
import { protocolBench } from './protocol.js';
import { usageExportRows } from './usage-export.js';
import {
  assertPortFree,
  benchPorts,
  cpuMs,
  children,
  deleteAccounts,
  dropDatabase,
  freshDatabase,
  drive,
  fmt,
  median,
  poster,
  rssMiB,
  startAnchor,
  startService,
  sweepKeys,
  type Running,
  type Stats,
} from './common.js';

const LEVELS = [1, 10, 50];
// BENCH_SCALE (default 1) scales every run's call count, for a quick smoke run (e.g. 0.05).
const SCALE = Number(process.env.BENCH_SCALE ?? 1);
const COUNT: Record<number, number> = { 1: Math.ceil(300 * SCALE), 10: Math.ceil(1500 * SCALE), 50: Math.ceil(3000 * SCALE) };
const ROUNDS = 3;
// Calls before measuring: processes started with tsx compile and JIT-warm for the first seconds.
const WARMUP = Math.ceil(1500 * SCALE);
const MEMORY_CALLS = Number(process.env.BENCH_MEMORY_CALLS ?? 100_000);
const ISOLATION = process.env.BENCH_ISOLATION !== '0';
/** BENCH_LOGGING=0 skips the request log's cost (info against warn, A B A B A B). */
const LOGGING = process.env.BENCH_LOGGING !== '0';

const log = (s: string) => process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${s}\n`);

async function main() {
  const t0 = Date.now();
  const load0 = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  const ports = benchPorts();
  await assertPortFree(ports.anchor, 'anchor');
  await assertPortFree(ports.service, 'service');
  const prefix = `bench${randomBytes(3).toString('hex')}`;
  const base = loadConfig(process.env, { REDIS_PREFIX: prefix, LOG_LEVEL: 'warn' });
  await checkServices(base);
  // A database of the run's own, fresh and never analysed (issue #33: nothing on the hot path may
  // depend on planner statistics), dropped at the end; BENCH_FRESH_DB=0 uses DATABASE_URL as it is.
  const fresh = process.env.BENCH_FRESH_DB !== '0';
  const dbUrl = fresh ? await freshDatabase(base.DATABASE_URL, `tollgate_${prefix}`) : base.DATABASE_URL;
  const config = loadConfig(process.env, { REDIS_PREFIX: prefix, LOG_LEVEL: 'warn', DATABASE_URL: dbUrl });
  await runMigrations(config, makeLogger(config));

  const pool = await openPool(config.DATABASE_URL, { maximumPoolSize: 2 });
  const redis = connectRedis(config.REDIS_URL);
  // The bench's own connection (one Redis node): the bare baseline's queue and the key sweep.
  const plain = new IORedis(config.REDIS_URL, { maxRetriesPerRequest: null });
  const accountIds: string[] = [];
  const running: Running[] = [];
  let baselineWorker: ReturnType<typeof fork> | undefined;
  let queue: Queue | undefined;
  let events: QueueEvents | undefined;
  try {
    // A hot account with credit for every call of the run.
    const accounts = new AccountsRepo(pool);
    const admin = new AdminService({ accounts, credits: new CreditReservations(redis, prefix, accounts), redis, prefix });
    const acct = await admin.createAccount('enterprise', 10_000_000, 'bench');
    accountIds.push(acct.account_id);
    await admin.setAccount(acct.account_id, { rpm: 10_000_000 });

    const edgeKey = randomBytes(32).toString('hex');
    const env = { ...process.env, DATABASE_URL: dbUrl, REDIS_PREFIX: prefix, LOG_LEVEL: 'warn', EDGE_TOKEN_KEY: edgeKey };
    const headers = { authorization: `Bearer ${acct.api_key}`, 'content-type': 'application/json' };
    const body = JSON.stringify({ expression: '2 * (3 + 4)' });
    const track = (r: Running) => (running.push(r), r);

    log(`starting service on ${ports.service} and anchor on ${ports.anchor} (prefix ${prefix})`);
    const service = track(await startService({ port: ports.service, split: false, env }));
    const anchor = track(await startAnchor({ port: ports.anchor, prefix, queue: 'bench-anchor', concurrency: config.CONCURRENCY_CORE, env }));
    const servicePost = poster(service.client, headers);
    const anchorPost = poster(anchor.client, headers);
    const serviceOp = () => servicePost('/tools/compute', body).then(() => {});
    const anchorOp = () => anchorPost('/tools/compute', body).then(() => {});

    // Bare baseline: BullMQ from this process, no HTTP, no-op worker in a child.
    const bq = 'bench-baseline';
    baselineWorker = fork(new URL('./baseline-worker.ts', import.meta.url).pathname, [bq, prefix, String(config.CONCURRENCY_CORE)], {
      execArgv: ['--import', 'tsx'],
      env: process.env,
    });
    children.push(baselineWorker);
    await once(baselineWorker, 'message');
    queue = new Queue(bq, { connection: plain, prefix });
    // waitUntilFinished listens for the queue's closing once per job in flight (50 at a time).
    queue.setMaxListeners(200);
    events = new QueueEvents(bq, { connection: { url: config.REDIS_URL } as never, prefix });
    await events.waitUntilReady();
    const q = queue;
    const ev = events;
    const baselineOp = async () => {
      const job = await q.add('noop', { expression: '2 * (3 + 4)' }, { removeOnComplete: { count: 20_000 } });
      await job.waitUntilFinished(ev);
    };

    log('warm-up');
    await drive(10, WARMUP, serviceOp);
    await drive(10, WARMUP, anchorOp);
    await drive(10, WARMUP, baselineOp);

    // A B A B A B (service, anchor; the bare baseline after each pair), each run all three levels.
    type Series = Map<number, Stats[]>;
    const series = { service: new Map() as Series, anchor: new Map() as Series, bare: new Map() as Series };
    const ops = { service: serviceOp, anchor: anchorOp, bare: baselineOp };
    // CPU per call of the processes behind each front (all threads, /proc): unlike req/s, it holds
    // still when other work shares the machine.
    const pidsOf = { service: [service.api.pid!], anchor: [anchor.api.pid!, anchor.worker!.pid!], bare: [process.pid, baselineWorker.pid!] };
    const cpuPerCall = { service: new Map<number, number[]>(), anchor: new Map<number, number[]>(), bare: new Map<number, number[]>() };
    const cpuOf = (who: keyof typeof pidsOf) => pidsOf[who].reduce((a, p) => a + cpuMs(p), 0);
    for (let round = 0; round < ROUNDS; round++) {
      for (const who of ['service', 'anchor', 'bare'] as const) {
        log(`round ${round + 1}/${ROUNDS}: ${who}`);
        for (const level of LEVELS) {
          const c0 = cpuOf(who);
          const s = await drive(level, COUNT[level]!, ops[who]);
          cpuPerCall[who].set(level, [...(cpuPerCall[who].get(level) ?? []), (cpuOf(who) - c0) / s.n]);
          series[who].set(level, [...(series[who].get(level) ?? []), s]);
        }
      }
    }
    const med = (xs: Stats[]): Stats => ({
      rps: median(xs.map((x) => x.rps)),
      p50: median(xs.map((x) => x.p50)),
      p99: median(xs.map((x) => x.p99)),
      n: xs[0]!.n,
    });

    log('root protocol (chain and parallel of three)');
    const proto = await protocolBench({ http: service.client, headers, drive, fmt });

    // Memory: the one-process service's RSS before and after MEMORY_CALLS calls at 50 in flight.
    log(`memory: ${MEMORY_CALLS} calls at 50 in flight`);
    const pid = service.api.pid!;
    const rssSamples: Array<[number, number]> = [[0, rssMiB(pid)]];
    const step = Math.max(1, Math.ceil(MEMORY_CALLS / 10));
    /** req/s of each tenth of the calls: the last against the first says whether cost grows with the data. */
    const stepRps: number[] = [];
    let done = 0;
    const memT0 = performance.now();
    while (done < MEMORY_CALLS) {
      const n = Math.min(step, MEMORY_CALLS - done);
      const s0 = performance.now();
      await drive(50, n, serviceOp);
      stepRps.push((n / (performance.now() - s0)) * 1000);
      done += n;
      rssSamples.push([done, rssMiB(pid)]);
    }
    const memRps = (MEMORY_CALLS / (performance.now() - memT0)) * 1000;
    await service.stop();
    running.splice(running.indexOf(service), 1);

    // The production shape once: WORKERS=off API + one core-family worker process.
    log('split service (API + core worker process), one run');
    const split = track(await startService({ port: ports.service, split: true, env }));
    const splitOp = () => poster(split.client, headers)('/tools/compute', body).then(() => {});
    await drive(10, WARMUP, splitOp);
    const splitStats = new Map<number, Stats>();
    for (const level of LEVELS) splitStats.set(level, await drive(level, COUNT[level]!, splitOp));
    await split.stop();
    running.splice(running.indexOf(split), 1);

    // What a setting costs, at 50 in flight, A B A B A B: sandbox threads against ISOLATION=off,
    // and the request log at info (one line per request, written to /dev/null) against warn.
    const compare = async (label: string, sides: Array<[string, Record<string, string>]>) => {
      const rps = new Map<string, number[]>(sides.map(([name]) => [name, []]));
      for (let round = 0; round < 3; round++) {
        for (const [name, extra] of sides) {
          log(`${label} round ${round + 1}/3: ${name}`);
          const s = track(await startService({ port: ports.service, split: false, env: { ...env, ...extra } }));
          const op = () => poster(s.client, headers)('/tools/compute', body).then(() => {});
          await drive(10, WARMUP, op);
          rps.get(name)!.push((await drive(50, COUNT[50]!, op)).rps);
          await s.stop();
          running.splice(running.indexOf(s), 1);
        }
      }
      return rps;
    };
    const isolation = ISOLATION
      ? await compare('isolation', [
          ['threads', { ISOLATION: 'threads' }],
          ['off', { ISOLATION: 'off' }],
        ])
      : null;
    const logging = LOGGING
      ? await compare('request log', [
          ['info', { LOG_LEVEL: 'info' }],
          ['warn', { LOG_LEVEL: 'warn' }],
        ])
      : null;
    await anchor.stop();
    running.splice(running.indexOf(anchor), 1);

    log('tool limits');
    const limitRows = await toolLimitRows(config);
    log('components (scale plan)');
    const componentLines = await componentRows(config);

    // ---- report ----
    const out: string[] = [];
    const w = (s = '') => out.push(s);
    w();
    w('Tollgate benchmark: one hot account, compute at 2 cents per call (real debit)');
    w(
      `service = npm start (API + workers, one process) on port ${ports.service}; anchor = same Fastify front, Queue.add + waitUntilFinished, no-op worker process (concurrency ${config.CONCURRENCY_CORE}) on port ${ports.anchor}`,
    );
    w('bare = Queue.add + waitUntilFinished from the bench process, no HTTP, no-op worker process (second reference)');
    w(`${ROUNDS} rounds alternating service, anchor, bare; medians of the rounds (calls per run: ${LEVELS.map((l) => `${COUNT[l]} at ${l}`).join(', ')})`);
    w();
    for (const level of LEVELS) {
      const sv = med(series.service.get(level)!);
      const an = med(series.anchor.get(level)!);
      const ba = med(series.bare.get(level)!);
      const rounds = (who: keyof typeof series) =>
        series[who]
          .get(level)!
          .map((x) => x.rps.toFixed(0))
          .join('/');
      w(`in flight ${String(level).padStart(2)}  service  ${fmt(sv)}   ratio to anchor ${(sv.rps / an.rps).toFixed(2)}   (rounds ${rounds('service')})`);
      w(`              anchor   ${fmt(an)}                        (rounds ${rounds('anchor')})`);
      w(`              bare     ${fmt(ba)}   service/bare ${(sv.rps / ba.rps).toFixed(2)}     (rounds ${rounds('bare')})`);
    }
    w();
    w('CPU ms per call (user + system, all threads; service: its one process; anchor: server + worker; bare: bench process + worker), medians');
    for (const level of LEVELS) {
      const c = (who: keyof typeof cpuPerCall) => median(cpuPerCall[who].get(level)!);
      w(
        `in flight ${String(level).padStart(2)}  service ${c('service').toFixed(3)}  anchor ${c('anchor').toFixed(3)}  bare ${c('bare').toFixed(3)}   service/anchor ${(c('service') / c('anchor')).toFixed(1)}x`,
      );
    }
    w();
    for (const level of LEVELS) w(`in flight ${String(level).padStart(2)}  service + worker process (one run)  ${fmt(splitStats.get(level)!)}`);
    for (const r of proto.rows) w(r);

    const sv50 = series.service.get(50)!;
    const an50 = series.anchor.get(50)!;
    const ratio50 = median(sv50.map((x) => x.rps)) / median(an50.map((x) => x.rps));
    const perRound = sv50.map((x, i) => (x.rps / an50[i]!.rps).toFixed(2)).join(', ');
    const bare50 = median(series.bare.get(50)!.map((x) => x.rps));
    const p50At1 = median(series.service.get(1)!.map((x) => x.p50));
    const rssBefore = rssSamples[0]![1];
    const rssAfter = rssSamples.at(-1)![1];
    w();
    w('Goals (issue #20)');
    w(`  ratio service/anchor at 50 in flight: ${ratio50.toFixed(2)} (goal >= 0.90; per round ${perRound})`);
    w(`  ratio service/bare baseline at 50 in flight: ${(median(sv50.map((x) => x.rps)) / bare50).toFixed(2)} (second reference)`);
    w(`  service p50 at 1 in flight: ${p50At1.toFixed(2)} ms (goal <= 5 ms); anchor ${median(series.anchor.get(1)!.map((x) => x.p50)).toFixed(2)} ms`);
    w(
      `  chain of 3 (POST /) p50 at 1 in flight: ${proto.chainP50.toFixed(2)} ms against one call ${proto.singleP50.toFixed(2)} ms: ${(proto.chainP50 / proto.singleP50).toFixed(2)}x (goal <= 3x)`,
    );
    w(
      `  service RSS before and after ${MEMORY_CALLS} calls at 50 in flight (${memRps.toFixed(0)} req/s): ${rssBefore.toFixed(0)} MiB -> ${rssAfter.toFixed(0)} MiB ` +
        `(${rssAfter - rssBefore >= 0 ? '+' : ''}${(rssAfter - rssBefore).toFixed(0)} MiB); every ${step}: ${rssSamples.map(([, r]) => r.toFixed(0)).join(' ')}`,
    );
    w(
      `  sustained on ${fresh ? 'a fresh, never analysed database' : 'DATABASE_URL as it is'}: the last ${step} calls at ${stepRps.at(-1)!.toFixed(0)} req/s against the first ${step} at ` +
        `${stepRps[0]!.toFixed(0)}: ${(stepRps.at(-1)! / stepRps[0]!).toFixed(2)}x (goal >= 0.80; issue #33); every ${step}: ${stepRps.map((r) => r.toFixed(0)).join(' ')}`,
    );
    const ratioLine = (what: string, rps: Map<string, number[]>, [a, b]: [string, string], goal: string) => {
      const list = (n: string) =>
        rps
          .get(n)!
          .map((x) => x.toFixed(0))
          .join(', ');
      w(
        `  ${what} at 50 in flight: ${a} ${list(a)} req/s, ${b} ${list(b)} req/s; ratio of medians ${(median(rps.get(a)!) / median(rps.get(b)!)).toFixed(2)}${goal}`,
      );
    };
    if (isolation) ratioLine('isolation (sandbox threads against ISOLATION=off)', isolation, ['threads', 'off'], ' (goal >= 0.90)');
    if (logging) ratioLine('request log (LOG_LEVEL info, one line per request, against warn)', logging, ['info', 'warn'], ' (issue #30: one line, not two)');
    w();
    w('Components in isolation (README, Scaling out)');
    for (const r of componentLines) w(`  ${r}`);
    if (limitRows.length) {
      w();
      w('Worst case per tool (largestInput in the sandbox pool, against its time limit)');
      for (const r of limitRows) w(r);
    }
    // The usage export's throughput per target, on a database of its own (bench/usage-export.ts).
    w();
    w('Usage export (20,000 ledger entries, local receivers)');
    for (const r of await usageExportRows(base.DATABASE_URL).catch((e) => [`failed: ${(e as Error).message}`])) w(`  ${r}`);
    w();
    const load1 = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
    w(
      `bench took ${((Date.now() - t0) / 1000).toFixed(0)} s; load average at start ${load0}, at end ${load1} (2 cores: above 2, other work shared the machine)`,
    );
    process.stdout.write(out.join('\n') + '\n');
  } finally {
    for (const r of running) await r.stop().catch(() => {});
    if (baselineWorker && baselineWorker.exitCode === null) {
      baselineWorker.kill('SIGTERM');
      await once(baselineWorker, 'exit');
    }
    await events?.close();
    await queue?.obliterate({ force: true }).catch(() => {});
    await queue?.close();
    // Leave nothing behind: the run's Redis keys all carry its prefix, and its accounts go.
    await deleteByPrefix(redis, prefix);
    const swept = await sweepKeys(plain, prefix);
    const removed = fresh
      ? accountIds.length
      : await deleteAccounts(config.DATABASE_URL, accountIds).catch((e) => (log(`account clean-up failed: ${(e as Error).message}`), 0));
    log(`cleaned up: ${removed} account(s), ${swept} Redis key(s) left by deleteByPrefix`);
    redis.disconnect();
    plain.disconnect();
    await pool.end();
    if (fresh) await dropDatabase(dbUrl, base.DATABASE_URL).catch((e) => log(`dropping ${dbUrl} failed: ${(e as Error).message}`));
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`bench failed: ${(e as Error).stack}\n`);
    process.exit(1);
  },
);
