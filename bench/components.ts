/**
 * The scale plan's component figures (README, "Scaling out"), each measured in isolation:
 * - one Redis core running BullMQ: jobs added and completed (no-op worker, 50 in flight) per second,
 *   and the Redis server's CPU per job, so jobs per second one Redis core can carry;
 * - the settlement statement (`settle_calls` through the Settler, batched as in production): rows
 *   per second on one hot account and spread over many accounts.
 * Run by `npm run bench` (bench/run.ts) and alone with `npx tsx bench/components.ts`.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import pg from 'pg';
import pino from 'pino';
import { Queue, QueueEvents, Worker } from 'bullmq';
import type { Config } from '../src/config.js';
import { connectRedis, deleteByPrefix, type Redis } from '../src/queue/redis.js';
import { queuePrefix } from '../src/queue/keyspace.js';
import { CreditReservations } from '../src/money/holds.js';
import { Settler, type Settlement } from '../src/money/settlement.js';
import { AccountsRepo } from '../src/access/accounts.js';
import { openPool } from '../src/db/pool.js';

/** used_cpu_user + used_cpu_sys of the Redis server, in ms. */
async function redisCpuMs(redis: Redis): Promise<number> {
  const info = await redis.info('cpu');
  const get = (k: string) => Number(new RegExp(`${k}:([0-9.]+)`).exec(info)?.[1] ?? 0);
  return (get('used_cpu_user') + get('used_cpu_sys')) * 1000;
}

async function inFlight(n: number, total: number, op: () => Promise<void>): Promise<number> {
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: n }, async () => {
      while (next++ < total) await op();
    }),
  );
  return performance.now() - t0;
}

/** BullMQ add + complete against one Redis: jobs/s here, Redis CPU ms per job, jobs/s per Redis core. */
async function bullmqPerCore(config: Config, prefix: string): Promise<string[]> {
  const redis = connectRedis(config.REDIS_URL);
  const name = `components-${randomBytes(3).toString('hex')}`;
  const opts = { connection: redis, prefix: queuePrefix(prefix) };
  const queue = new Queue(name, opts);
  queue.setMaxListeners(0); // every waitUntilFinished listens for the queue closing
  const events = new QueueEvents(name, opts);
  const worker = new Worker(name, async () => ({ ok: true }), { ...opts, connection: connectRedis(config.REDIS_URL), concurrency: 50 });
  await Promise.all([events.waitUntilReady(), worker.waitUntilReady()]);
  const op = async () => {
    const job = await queue.add('noop', { expression: '2 * (3 + 4)' }, { removeOnComplete: { count: 5_000 } });
    await job.waitUntilFinished(events);
  };
  await inFlight(50, 2_000, op); // warm-up
  const total = 10_000;
  const cpu0 = await redisCpuMs(redis);
  const ms = await inFlight(50, total, op);
  const cpuPerJob = ((await redisCpuMs(redis)) - cpu0) / total;
  await worker.close();
  await events.close();
  await queue.obliterate({ force: true }).catch(() => {});
  await queue.close();
  redis.disconnect();
  return [
    `BullMQ add + complete, no-op worker, 50 in flight: ${((total / ms) * 1000).toFixed(0)} jobs/s here (client and worker share this machine's 2 cores)`,
    `  Redis CPU per job ${cpuPerJob.toFixed(3)} ms -> one Redis core carries about ${(1000 / cpuPerJob).toFixed(0)} jobs/s of BullMQ alone`,
  ];
}

/** settle_calls rows per second, batched as in production, on one hot account and on many. */
async function settlementRows(config: Config, prefix: string): Promise<string[]> {
  const slonik = await openPool(config.DATABASE_URL, { maximumPoolSize: 2 });
  const pgPool = new pg.Pool({ connectionString: config.DATABASE_URL, max: 4 });
  const redis = connectRedis(config.REDIS_URL);
  const accounts = new AccountsRepo(slonik);
  const credits = new CreditReservations(redis, prefix, accounts);
  const log = pino({ level: 'warn' });
  const settler = new Settler(pgPool, credits, log, config.SETTLE_BATCH_MS, config.SETTLE_BATCH_MAX);
  const made: string[] = [];
  const account = async () => {
    const a = await accounts.createAccount({ plan: 'pro', credits: 100_000_000, name: `bench-components-${randomBytes(3).toString('hex')}` });
    made.push(a.id);
    return a.id;
  };
  const entry = (accountId: string): Settlement => ({
    jobId: `core-${randomUUID()}`,
    accountId,
    keyId: null,
    tool: 'compute',
    status: 'completed',
    amount: 2,
    costCents: 2,
    result: { expression: '2 * (3 + 4)', result: 14 },
    sandbox: false,
    agentName: null,
    usage: null,
    createdAt: null,
    holdId: null,
  });
  const rows: string[] = [];
  try {
    const hot = await account();
    const many = await Promise.all(Array.from({ length: 200 }, account));
    const run = async (label: string, pick: (i: number) => string) => {
      const total = 10_000;
      let i = 0;
      await inFlight(200, 1_000, () => settler.settle(entry(pick(i++))).then(() => undefined)); // warm-up
      const ms = await inFlight(200, total, () => settler.settle(entry(pick(i++))).then(() => undefined));
      rows.push(`settle_calls, 200 settlements in flight, ${label}: ${((total / ms) * 1000).toFixed(0)} rows/s`);
    };
    await run('one hot account', () => hot);
    await run('200 accounts', (i) => many[i % many.length]!);
  } finally {
    // The run's accounts and everything they own go again.
    const c = await pgPool.connect();
    try {
      for (const t of ['job_results', 'ledger']) await c.query(`DELETE FROM ${t} WHERE account_id = ANY($1::uuid[])`, [made]);
      await c.query('DELETE FROM accounts WHERE id = ANY($1::uuid[])', [made]);
    } finally {
      c.release();
    }
    await pgPool.end();
    await slonik.end();
    redis.disconnect();
  }
  return rows;
}

export async function componentRows(config: Config): Promise<string[]> {
  const prefix = `benchc${randomBytes(3).toString('hex')}`;
  const redis = connectRedis(config.REDIS_URL);
  try {
    return [...(await bullmqPerCore(config, prefix)), ...(await settlementRows(config, prefix))];
  } finally {
    await deleteByPrefix(redis, prefix);
    redis.disconnect();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { loadConfig } = await import('../src/config.js');
  const rows = await componentRows(loadConfig(process.env, { LOG_LEVEL: 'warn' }));
  process.stdout.write(`${rows.join('\n')}\n`);
}
