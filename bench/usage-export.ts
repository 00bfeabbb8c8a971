import { fork } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import pg from 'pg';
import pino from 'pino';
import { Registry } from 'prom-client';
import { loadConfig } from '../src/config.js';
import { openPool } from '../src/db/pool.js';
import { UsageExporter } from '../src/pay/export/exporter.js';
import { CloudEventsTarget, type ExportTarget, StripeMeterStreamTarget, StripeMeterTarget } from '../src/pay/export/targets.js';
import { startCloudEventsReceiver, startStripeMeterReceiver } from '../test/fakes/metering-receivers.js';
import { dropDatabase, freshDatabase } from './common.js';

/**
 * The usage export's throughput (src/pay/export): a ledger of ENTRIES charges on a fresh database
 * (every account has a Stripe customer, so both targets are sent every entry), exported from the
 * start by one target at a time to a local receiver of its wire format (in a process of its own, as a
 * billing system is: the exporter's process pays only for its side), with the default batch size.
 * Prints entries per second per target, and the plan of the export's read (it must walk
 * ledger_export_idx, with no statistics: the fresh database has never been analysed).
 */

const ENTRIES = Number(process.env.EXPORT_BENCH_ENTRIES ?? 20_000);
const ACCOUNTS = 100;

/** Rows for bench/run.ts and for `npm run bench:export`. */
export async function usageExportRows(baseUrl: string): Promise<string[]> {
  const url = await freshDatabase(baseUrl, `tollgate_exportbench_${randomBytes(4).toString('hex')}`);
  const db = await openPool(url, { maximumPoolSize: 4 });
  const raw = new pg.Client({ connectionString: url });
  await raw.connect();
  const secret = `sk_test_${randomBytes(12).toString('hex')}`;
  const receivers = fork(new URL(import.meta.url).pathname, ['--receivers'], { execArgv: ['--import', 'tsx'], env: { ...process.env, BENCH_SECRET: secret } });
  const [urls] = (await once(receivers, 'message')) as [{ ce: string; meter: string }];
  /** What a receiver took: ids accepted, ids that arrived more than once, requests answered. */
  const stats = async (which: 'ce' | 'meter' | 'reset') => {
    receivers.send(which);
    const [s] = (await once(receivers, 'message')) as [{ ids: number; twice: number; requests: number }];
    return s;
  };
  const rows: string[] = [];
  try {
    await raw.query(`
      WITH a AS (INSERT INTO accounts (plan, credits) SELECT 'pro', 0 FROM generate_series(1, ${ACCOUNTS}) RETURNING id)
      INSERT INTO stripe_customers (account_id, customer_id) SELECT id, 'cus_bench' || md5(id::text) FROM a`);
    // Fifty transactions of 400 charges, like settlement batches.
    for (let i = 0; i < ENTRIES / 400; i++) {
      await raw.query(`
        WITH a AS (SELECT array_agg(id) AS ids FROM accounts)
        INSERT INTO ledger (entry_key, account_id, kind, tool, delta_cents)
        SELECT 'job-' || gen_random_uuid(), a.ids[1 + g % ${ACCOUNTS}], 'charge', 'compute', -2
        FROM generate_series(1, 400) g, a`);
    }
    const plan = await raw.query<{ 'QUERY PLAN': string }>(`
      EXPLAIN SELECT id FROM ledger
      WHERE (COALESCE(xact, '0'::xid8), id) > ('0'::xid8, 0::bigint)
      ORDER BY COALESCE(xact, '0'::xid8), id LIMIT 500`);
    const scan = plan.rows.map((r) => r['QUERY PLAN']).find((l) => /Scan/.test(l)) ?? '?';
    const config = loadConfig(process.env, { DATABASE_URL: url });
    const log = pino({ level: 'warn' });
    const measure = async (target: ExportTarget, receiver: 'ce' | 'meter', label: string) => {
      const x = new UsageExporter({
        db,
        databaseUrl: url,
        targets: [target],
        log,
        registry: new Registry(),
        batchSize: config.EXPORT_BATCH_SIZE,
        intervalMs: config.EXPORT_INTERVAL_MS,
      });
      const t0 = performance.now();
      x.start();
      // Done when the target accepted every entry (the exporter counts what it accepted).
      while (((await x.exported.get()).values[0]?.value ?? 0) < ENTRIES) await new Promise((r) => setTimeout(r, 5));
      const seconds = (performance.now() - t0) / 1000;
      await x.stop();
      const got = await stats(receiver);
      rows.push(
        `${label.padEnd(16)} ${String(ENTRIES).padStart(6)} entries in ${seconds.toFixed(2).padStart(6)} s  ${(ENTRIES / seconds).toFixed(0).padStart(6)} entries/s  (receiver: ${got.ids} ids, ${got.requests} requests, ${got.twice} sent twice)`,
      );
    };
    await measure(new CloudEventsTarget(urls.ce, ''), 'ce', 'cloudevents');
    await measure(new StripeMeterStreamTarget(secret, 'tollgate_cents', urls.meter), 'meter', 'stripe v2 stream');
    // v1 from the start again, to a meter that has forgotten the stream's events.
    await raw.query(`DELETE FROM export_cursors WHERE target = 'stripe'`);
    await stats('reset');
    await measure(new StripeMeterTarget(secret, 'tollgate_cents', urls.meter), 'meter', 'stripe v1');
    rows.push(`read plan without statistics: ${scan.trim()}`);
    return rows;
  } finally {
    receivers.kill();
    await raw.end();
    await db.end();
    await dropDatabase(url, baseUrl);
  }
}

/** The receivers' process: says where they listen, then answers each 'ce' or 'meter' with what that one took ('reset' empties the meter first). */
async function serveReceivers(): Promise<void> {
  const ce = await startCloudEventsReceiver();
  const meter = await startStripeMeterReceiver({ secretKey: process.env.BENCH_SECRET! });
  process.on('message', (which: 'ce' | 'meter' | 'reset') => {
    if (which === 'reset') {
      meter.arrivals.clear();
      meter.events.clear();
      meter.order.length = 0;
      meter.requests = 0;
    }
    const r = which === 'ce' ? ce : meter;
    process.send!({ ids: r.order.length, twice: [...r.arrivals.values()].filter((n) => n > 1).length, requests: r.requests });
  });
  process.on('disconnect', () => process.exit(0));
  process.send!({ ce: ce.url, meter: meter.url });
}

if (process.argv.includes('--receivers')) {
  void serveReceivers();
} else if (import.meta.url === `file://${process.argv[1]}`) {
  const base = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/tollgate';
  usageExportRows(base).then(
    (rows) => {
      process.stdout.write(
        `Usage export (batch of ${process.env.EXPORT_BATCH_SIZE ?? 500}, local receivers, ${ENTRIES} charges)\n${rows.map((r) => `  ${r}`).join('\n')}\n`,
      );
      process.exit(0);
    },
    (e) => {
      process.stderr.write(`bench failed: ${(e as Error).stack}\n`);
      process.exit(1);
    },
  );
}
