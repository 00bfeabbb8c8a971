import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { startCloudEventsReceiver, startStripeMeterReceiver } from '../fakes/metering-receivers.js';
import { RedisServer, ServiceProcess, dropDatabase, freePort, freshDatabase, waitForHttp } from './rig.js';

/**
 * The usage export under SIGKILL (issue #32): the API process, which runs the exporter, is killed
 * while a batch is in flight to each receiver (both answer slowly, so the kill lands mid-batch), twice,
 * and started again. Every ledger entry must reach each receiver exactly once: the receivers dedupe
 * only by the id the export sends and count everything that arrived, so a batch sent again after a
 * kill shows as resent, and a lost entry as missing.
 */

const ENTRIES = 3000;
const SECRET = `sk_test_${randomBytes(12).toString('hex')}`;

let redis: RedisServer;
let dbUrl: string;
let db: pg.Client;
let ce: Awaited<ReturnType<typeof startCloudEventsReceiver>>;
let meter: Awaited<ReturnType<typeof startStripeMeterReceiver>>;
let api: ServiceProcess;
let base: string;
const rows: string[] = [];

const HEADER = 'fault                                    entries  ce-once  ce-resent  stripe-once  stripe-resent  missing  seconds';

beforeAll(async () => {
  ce = await startCloudEventsReceiver({ token: 'chaos-token' });
  meter = await startStripeMeterReceiver({ secretKey: SECRET });
  redis = new RedisServer(await freePort());
  await redis.start();
  dbUrl = await freshDatabase(inject('databaseUrl'), 'chaosexport');
  db = new pg.Client({ connectionString: dbUrl });
  await db.connect();
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  api = new ServiceProcess('api', ['src/server.ts'], {
    ...process.env,
    REDIS_URL: redis.url,
    DATABASE_URL: dbUrl,
    REDIS_PREFIX: 'chaosexport',
    PORT: String(port),
    HOST: '127.0.0.1',
    WORKERS: 'off',
    EDGE_TOKEN_KEY: randomBytes(32).toString('hex'),
    EXPORT_CLOUDEVENTS_URL: ce.url,
    EXPORT_CLOUDEVENTS_TOKEN: 'chaos-token',
    STRIPE_SECRET_KEY: SECRET,
    STRIPE_WEBHOOK_SECRET: `whsec_${randomBytes(12).toString('hex')}`,
    STRIPE_API_URL: meter.url,
    EXPORT_STRIPE_METER_EVENT: 'tollgate_cents',
    EXPORT_INTERVAL_MS: '100',
    LOG_LEVEL: 'error',
  });
}, 120_000);

afterAll(async () => {
  process.stdout.write(`\n${HEADER}\n${rows.join('\n')}\n`);
  await api?.kill();
  await db?.end();
  await redis?.stop();
  if (dbUrl) await dropDatabase(dbUrl);
  await ce?.close();
  await meter?.close();
}, 60_000);

async function until(what: string, f: () => boolean, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (!f()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

describe('usage export under SIGKILL', () => {
  it('every ledger entry reaches each receiver exactly once after the exporting process is killed mid-batch twice', async () => {
    // Half the accounts pay through Stripe; their charges go to the meter as well.
    await db.query(`
      WITH a AS (INSERT INTO accounts (plan, credits) SELECT 'pro', 0 FROM generate_series(1, 20) RETURNING id),
           n AS (SELECT id, row_number() OVER () AS i FROM a)
      INSERT INTO stripe_customers (account_id, customer_id) SELECT id, 'cus_chaos' || i FROM n WHERE i % 2 = 0`);
    // In twelve transactions, as settlement batches commit.
    for (let t = 0; t < 12; t++) {
      await db.query(`
        WITH a AS (SELECT array_agg(id ORDER BY id) AS ids FROM accounts)
        INSERT INTO ledger (entry_key, account_id, kind, tool, delta_cents)
        SELECT 'job-' || gen_random_uuid(), a.ids[1 + g % 20], 'charge', 'compute', -(1 + g % 5) FROM generate_series(1, ${ENTRIES / 12}) g, a`);
    }
    const ledger = await db.query<{ id: string; customer: string | null }>(`
      SELECT l.id::text, sc.customer_id AS customer FROM ledger l LEFT JOIN stripe_customers sc USING (account_id)`);
    const ceIds = ledger.rows.map((r) => `ledger-${r.id}`);
    const meterIds = ledger.rows.filter((r) => r.customer).map((r) => `ledger-${r.id}`);

    const started = Date.now();
    // Slow receivers, both at about a batch a second: a CloudEvents batch (500 entries) takes 1 s to
    // be answered, and so does each request to the meter (the v2 stream: up to 100 events, sent 4 at once).
    ce.delay = 1_000;
    meter.delay = 1_000;
    api.start();
    await waitForHttp(base, false, 60_000);
    for (const kill of [1, 2]) {
      // Some batches through, and one in flight at each receiver when the process dies.
      const ceAt = ce.order.length;
      const meterAt = meter.order.length;
      await until(`progress before kill ${kill}`, () => ce.order.length >= ceAt + 500 && meter.order.length >= meterAt + 200, 60_000);
      const inFlight = ce.requests;
      const meterInFlight = meter.requests;
      await until('a CloudEvents batch in flight', () => ce.requests > inFlight, 10_000);
      await until('a meter request in flight', () => meter.requests > meterInFlight, 10_000);
      await api.kill('SIGKILL');
      expect(ce.order.length).toBeLessThan(ceIds.length);
      api.start();
      await waitForHttp(base, false, 60_000);
    }
    ce.delay = 0;
    meter.delay = 0;
    await until('every entry at both receivers', () => ce.order.length >= ceIds.length && meter.order.length >= meterIds.length, 120_000);
    // A moment for anything still on its way, which would show as an id that arrived twice or an unknown one.
    await sleep(1_000);
    const seconds = (Date.now() - started) / 1000;

    const resent = (r: typeof ce | typeof meter) => [...r.arrivals.values()].reduce((s, n) => s + (n - 1), 0);
    const missing = ceIds.filter((id) => !ce.arrivals.has(id)).length + meterIds.filter((id) => !meter.events.has(id)).length;
    rows.push(
      `${'SIGKILL mid-batch x2, restarted'.padEnd(40)} ${String(ceIds.length).padStart(7)} ${String(ce.order.length).padStart(8)} ${String(resent(ce)).padStart(10)} ` +
        `${String(meter.order.length).padStart(12)} ${String(resent(meter)).padStart(14)} ${String(missing).padStart(8)} ${seconds.toFixed(1).padStart(8)}`,
    );
    expect(missing).toBe(0);
    // Each receiver holds each id once, and no id it was not sent.
    expect([...ce.order].sort()).toEqual([...ceIds].sort());
    expect(new Set(ce.order).size).toBe(ce.order.length);
    expect([...meter.events.keys()].sort()).toEqual([...meterIds].sort());
    // In order at the CloudEvents ingest: export order is (transaction, id), and these were written in id order per transaction.
    const exportOrder = await db.query<{ id: string }>(`SELECT l.id::text AS id FROM ledger l ORDER BY l.xact, l.id`);
    expect(ce.order).toEqual(exportOrder.rows.map((r) => `ledger-${r.id}`));
    // The cursors are at the end.
    const cursors = await db.query<{ target: string; last_id: string }>(`SELECT target, last_id::text FROM export_cursors ORDER BY target`);
    expect(cursors.rows.map((r) => r.target)).toEqual(['cloudevents', 'stripe']);
  });
});
