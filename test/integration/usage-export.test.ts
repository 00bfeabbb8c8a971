import { randomBytes } from 'node:crypto';
import { Writable } from 'node:stream';
import pg from 'pg';
import pino from 'pino';
import { Registry } from 'prom-client';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { z } from 'zod';
import { ConfigError, loadConfig } from '../../src/config.js';
import { migrate } from '../../src/db/migrate.js';
import { ensureDatabase, openPool, sql, type DatabasePool } from '../../src/db/pool.js';
import { createUsageExporter, exportTargets, LedgerFeed, StripeMeterStreamTarget, StripeMeterTarget, type UsageExporter } from '../../src/pay/export/index.js';
import { START } from '../../src/pay/export/ledger-feed.js';
import { startCloudEventsReceiver, startStripeMeterReceiver } from '../fakes/metering-receivers.js';
import { startHarness } from '../helpers/harness.js';

/**
 * The usage export (src/pay/export) against local receivers of each wire format, on a database of
 * its own per case (the export reads the whole ledger). Receivers dedupe only by the id they are
 * sent, and count every arrival, so a duplicate shows as an id that arrived twice.
 */

const SECRET = `sk_test_${randomBytes(12).toString('hex')}`;
const TOKEN = `om_${randomBytes(12).toString('hex')}`;
const METER = 'tollgate_cents';

let ce: Awaited<ReturnType<typeof startCloudEventsReceiver>>;
let meter: Awaited<ReturnType<typeof startStripeMeterReceiver>>;
const cleanups: Array<() => Promise<unknown>> = [];

beforeAll(async () => {
  ce = await startCloudEventsReceiver({ token: TOKEN });
  meter = await startStripeMeterReceiver({ secretKey: SECRET });
});

afterAll(async () => {
  await ce?.close();
  await meter?.close();
});

afterEach(async () => {
  for (const f of cleanups.splice(0).reverse()) await f().catch(() => {});
  for (const r of [ce, meter]) {
    r.arrivals.clear();
    r.order.length = 0;
    r.events.clear();
    r.fail(0);
    r.delay = 0;
  }
  meter.byPath.clear();
});

function exportEnv(dbUrl: string): Record<string, string> {
  return {
    DATABASE_URL: dbUrl,
    REDIS_URL: inject('redisUrl'),
    EXPORT_CLOUDEVENTS_URL: ce.url,
    EXPORT_CLOUDEVENTS_TOKEN: TOKEN,
    STRIPE_SECRET_KEY: SECRET,
    STRIPE_WEBHOOK_SECRET: `whsec_${randomBytes(12).toString('hex')}`,
    STRIPE_API_URL: meter.url,
    EXPORT_STRIPE_METER_EVENT: METER,
    EXPORT_INTERVAL_MS: '100',
    EXPORT_BATCH_SIZE: '200',
  };
}

/** A migrated database for one case, dropped after it. */
async function freshDb(): Promise<{ url: string; db: DatabasePool }> {
  const u = new URL(inject('databaseUrl'));
  u.pathname = `/tollgate_export_${randomBytes(4).toString('hex')}`;
  const url = u.toString();
  await ensureDatabase(url);
  await migrate(url);
  const db = await openPool(url, { maximumPoolSize: 6 });
  cleanups.push(async () => {
    await db.end();
    const admin = new pg.Client({ connectionString: inject('databaseUrl') });
    await admin.connect();
    await admin.query(`DROP DATABASE IF EXISTS ${u.pathname.slice(1)} WITH (FORCE)`);
    await admin.end();
  });
  return { url, db };
}

function logSink(): { log: pino.Logger; lines: string[] } {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk, _enc, cb) {
      lines.push(String(chunk));
      cb();
    },
  });
  return { log: pino({ level: 'info' }, sink), lines };
}

function exporter(dbUrl: string, db: DatabasePool, log = logSink().log, registry = new Registry(), env: Record<string, string> = {}): UsageExporter {
  const x = createUsageExporter(loadConfig({}, { ...exportEnv(dbUrl), ...env }), { db, log, registry })!;
  cleanups.push(() => x.stop());
  return x;
}

const Id = z.object({ id: z.string() });
async function account(db: DatabasePool, customer?: string): Promise<string> {
  const { id } = await db.one(sql.type(Id)`INSERT INTO accounts (plan, credits) VALUES ('pro', 0) RETURNING id::text AS id`);
  if (customer) await db.query(sql.unsafe`INSERT INTO stripe_customers (account_id, customer_id) VALUES (${id}, ${customer})`);
  return id;
}

/** `n` charges of `cents` each for the account, in one statement (one transaction), as a settlement batch writes them. */
async function charges(db: DatabasePool | pg.Client, accountId: string, n: number, cents = 3): Promise<void> {
  const text = `INSERT INTO ledger (entry_key, account_id, kind, tool, delta_cents)
    SELECT 'job-' || gen_random_uuid(), $1::uuid, 'charge', 'compute', -$2::bigint FROM generate_series(1, $3::int)`;
  if (db instanceof pg.Client) await db.query(text, [accountId, cents, n]);
  else
    await db.query(sql.unsafe`INSERT INTO ledger (entry_key, account_id, kind, tool, delta_cents)
    SELECT 'job-' || gen_random_uuid(), ${accountId}::uuid, 'charge', 'compute', -${cents}::bigint FROM generate_series(1, ${n}::int)`);
}

const Row = z.object({ id: z.number(), kind: z.string(), delta_cents: z.number(), customer_id: z.string().nullable() });
/** The ledger in export order, as the receivers should have it. */
async function ledger(db: DatabasePool) {
  return db.any(sql.type(Row)`
    SELECT l.id, l.kind, l.delta_cents, sc.customer_id FROM ledger l LEFT JOIN stripe_customers sc ON sc.account_id = l.account_id
    ORDER BY COALESCE(l.xact, '0'::xid8), l.id`);
}

async function until(what: string, f: () => boolean | Promise<boolean>, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await f())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Every expected id arrived exactly once, and nothing else arrived. */
function exactlyOnce(arrivals: Map<string, number>, ids: string[]): void {
  expect([...arrivals.keys()].sort()).toEqual([...ids].sort());
  expect([...arrivals.values()].filter((n) => n !== 1)).toEqual([]);
}

const stripeIds = (rows: readonly z.infer<typeof Row>[]) =>
  rows.filter((r) => r.kind === 'charge' && r.customer_id && r.delta_cents < 0).map((r) => `ledger-${r.id}`);

describe('usage export', () => {
  it('sends every ledger entry of real calls once and in order, to both targets, from the API process, with lag and totals in /metrics', async () => {
    const { url, db } = await freshDb();
    const h = await startHarness({ ...exportEnv(url), METRICS_TOKEN: 'metrics-token-export' }, { workers: ['core'] });
    cleanups.push(() => h.close());
    expect(h.container.api?.exporter).toBeDefined();
    const billed = await h.account('pro', 500);
    const other = await h.account('pro', 500);
    await db.query(sql.unsafe`INSERT INTO stripe_customers (account_id, customer_id) VALUES (${billed.accountId}, 'cus_Exp0rt1')`);
    for (let i = 0; i < 15; i++) {
      for (const a of [billed, other]) expect((await h.call('compute', { expression: `${i} + 1` }, a.apiKey)).statusCode).toBe(200);
    }
    await h.admin.addCredits(billed.accountId, 100);
    const rows = await ledger(db);
    // Two openings, 30 charges, a top-up.
    expect(rows.length).toBe(33);
    const ids = rows.map((r) => `ledger-${r.id}`);
    await until('every entry at the CloudEvents ingest', () => ce.order.length >= ids.length);
    await until('every charge at the Stripe meter', () => meter.order.length >= 15);
    expect(ce.order).toEqual(ids);
    exactlyOnce(ce.arrivals, ids);
    // Stripe gets only the charges of the account with a customer, each for its cost.
    exactlyOnce(meter.arrivals, stripeIds(rows));
    for (const r of rows.filter((r) => r.customer_id && r.kind === 'charge')) {
      const e = meter.events.get(`ledger-${r.id}`)!;
      expect(e).toMatchObject({ event_name: METER, customer: 'cus_Exp0rt1', value: String(-r.delta_cents) });
    }
    const first = ce.events.get(ids[2]!)!;
    expect(first).toMatchObject({ specversion: '1.0', source: 'tollgate/ledger', type: 'tollgate.ledger.charge', subject: billed.accountId });
    expect(first.data).toMatchObject({ kind: 'charge', tool: 'compute', key_id: billed.keyId, cents: 2, delta_cents: -2 });

    // The cursor is committed just after a target accepts, and the lag is read at scrape time: wait until both read 0.
    const scrape = async () => (await h.request({ method: 'GET', url: '/metrics', headers: { authorization: 'Bearer metrics-token-export' } })).body;
    await until('no lag in /metrics', async () => {
      const body = await scrape();
      return /tollgate_export_lag_entries\{target="cloudevents"\} 0\n/.test(body) && /tollgate_export_lag_entries\{target="stripe"\} 0\n/.test(body);
    });
    const m = { body: await scrape() };
    expect(m.body).toMatch(/tollgate_export_lag_entries\{target="cloudevents"\} 0/);
    expect(m.body).toMatch(/tollgate_export_lag_entries\{target="stripe"\} 0/);
    expect(m.body).toMatch(/tollgate_export_entries_total\{target="cloudevents"\} 33/);
    expect(m.body).toMatch(/tollgate_export_entries_total\{target="stripe"\} 15/);
    expect(m.body).toMatch(/tollgate_export_failures_total\{target="stripe"\} 0/);
    for (const line of h.logs) {
      expect(line).not.toContain(SECRET);
      expect(line).not.toContain(TOKEN);
    }
  }, 90_000);

  it('a receiver answering 500 loses nothing and bills nothing twice: the batch is retried with backoff, the failure logged at warn without secrets', async () => {
    const { url, db } = await freshDb();
    const billed = await account(db, 'cus_Fa1ls');
    await charges(db, billed, 700);
    const { log, lines } = logSink();
    const registry = new Registry();
    ce.fail(3, 500);
    meter.fail(3, 500);
    const x = exporter(url, db, log, registry);
    x.start();
    const rows = await ledger(db);
    await until('the CloudEvents ingest took everything', () => ce.order.length >= rows.length);
    await until('the meter took everything', () => meter.order.length >= rows.length);
    exactlyOnce(
      ce.arrivals,
      rows.map((r) => `ledger-${r.id}`),
    );
    expect(ce.order).toEqual(rows.map((r) => `ledger-${r.id}`));
    // The meter's refused events were sent again; it recorded each identifier once, and refused none twice.
    expect([...meter.events.keys()].sort()).toEqual(stripeIds(rows).sort());
    const metrics = await registry.metrics();
    expect(metrics).toMatch(/tollgate_export_failures_total\{target="cloudevents"\} [3-9]/);
    expect(metrics).toMatch(/tollgate_export_failures_total\{target="stripe"\} [1-9]/);
    const warns = lines.map((l) => JSON.parse(l) as { level: number; msg: string; target?: string; err?: string }).filter((l) => l.level === 40);
    expect(warns.some((w) => w.target === 'cloudevents' && /HTTP 500/.test(w.err ?? ''))).toBe(true);
    expect(warns.some((w) => w.target === 'stripe' && /HTTP 500/.test(w.err ?? ''))).toBe(true);
    for (const l of lines) {
      expect(l).not.toContain(SECRET);
      expect(l).not.toContain(TOKEN);
    }
    // A target's cursor is committed just after it accepts the batch.
    await until('both cursors at the end', async () => {
      const st = await x.status();
      return st.cloudevents?.lag === 0 && st.stripe?.lag === 0;
    });
  }, 60_000);

  it('a lower id committed after a higher one was exported is not skipped: it waits below the line, then goes first', async () => {
    const { url, db } = await freshDb();
    const acct = await account(db);
    await charges(db, acct, 5);
    const x = exporter(url, db);
    x.start();
    await until('the first five', () => ce.order.length === 5);
    // A settlement batch takes the next id and stays open; another batch takes a higher id and commits.
    const slow = new pg.Client({ connectionString: url });
    await slow.connect();
    cleanups.push(() => slow.end());
    await slow.query('BEGIN');
    await charges(slow, acct, 1);
    await charges(db, acct, 1);
    const High = z.object({ id: z.number() });
    const high = await db.one(sql.type(High)`SELECT max(id)::int AS id FROM ledger`);
    // Several passes of the exporter: the committed higher id must wait, since a lower one may still come.
    await new Promise((r) => setTimeout(r, 800));
    expect(ce.order.length).toBe(5);
    expect(ce.arrivals.has(`ledger-${high.id}`)).toBe(false);
    await slow.query('COMMIT');
    await until('both late entries', () => ce.order.length === 7);
    // The lower id, committed last, is exported (first: its transaction began first).
    expect(ce.order.slice(5)).toEqual([`ledger-${high.id - 1}`, `ledger-${high.id}`]);
    exactlyOnce(
      ce.arrivals,
      (await ledger(db)).map((r) => `ledger-${r.id}`),
    );
  }, 60_000);

  it('a long write in another database of the cluster does not hold the export back', async () => {
    const { url, db } = await freshDb();
    const other = await freshDb();
    const acct = await account(db);
    const elsewhere = new pg.Client({ connectionString: other.url });
    await elsewhere.connect();
    cleanups.push(() => elsewhere.end());
    await elsewhere.query('BEGIN');
    await elsewhere.query('SELECT pg_current_xact_id()');
    await charges(db, acct, 20);
    const x = exporter(url, db);
    x.start();
    await until('the twenty, with the other transaction still open', () => ce.order.length === 20, 10_000);
    await elsewhere.query('ROLLBACK');
  }, 60_000);

  it('two exporters racing on one database: one exports at a time, every entry once; the other takes over when the first stops', async () => {
    const { url, db } = await freshDb();
    const billed = await account(db, 'cus_Race1');
    const a = exporter(url, db);
    const b = exporter(url, db);
    a.start();
    b.start();
    // Eight writers at once, like settlement batches from many processes.
    await Promise.all(Array.from({ length: 8 }, () => charges(db, billed, 150)));
    let both = false;
    const watch = setInterval(() => {
      if (a.leading && b.leading) both = true;
    }, 5);
    await until('the first 1,200', () => ce.order.length === 1200 && meter.order.length === 1200);
    const leader = a.leading ? a : b;
    const follower = leader === a ? b : a;
    expect(follower.leading).toBe(false);
    await leader.stop();
    await Promise.all(Array.from({ length: 4 }, () => charges(db, billed, 50)));
    await until('the follower took over', () => follower.leading, 10_000);
    await until('the next 200', () => ce.order.length === 1400 && meter.order.length === 1400);
    clearInterval(watch);
    expect(both).toBe(false);
    const rows = await ledger(db);
    exactlyOnce(
      ce.arrivals,
      rows.map((r) => `ledger-${r.id}`),
    );
    expect(ce.order).toEqual(rows.map((r) => `ledger-${r.id}`));
    exactlyOnce(meter.arrivals, stripeIds(rows));
  }, 60_000);

  it('the v2 stream: 100 events a request on a session token, renewed when Stripe says it expired, every charge once, the token in no log', async () => {
    // A meter whose sessions last 2 s, and an exporter whose clock runs 10 minutes slow, so it keeps a
    // token past its expiry and has to learn it from Stripe's 401.
    const short = await startStripeMeterReceiver({ secretKey: SECRET, sessionTtlMs: 2_000 });
    cleanups.push(() => short.close());
    const { url, db } = await freshDb();
    const billed = await account(db, 'cus_Str3am');
    const unbilled = await account(db);
    await charges(db, billed, 250);
    await charges(db, unbilled, 50);
    const stream = new StripeMeterStreamTarget(SECRET, METER, short.url, 4, () => Date.now() - 600_000);
    cleanups.push(async () => stream.close());
    const feed = new LedgerFeed(db);
    expect(await stream.send(await feed.after(START, 1000))).toEqual({ sent: 250 });
    // Three requests for 250 events (100, 100, 50) and one session; the other account's charges are not Stripe's.
    expect(short.byPath.get('/v2/billing/meter_event_stream')).toBe(3);
    expect(short.sessions).toBe(1);
    await new Promise((r) => setTimeout(r, 2_200));
    await charges(db, billed, 120);
    const all = await ledger(db);
    const { log, lines } = logSink();
    const registry = new Registry();
    // The second batch through the exporter (its cursor starts at the beginning: the first 250 are sent again).
    const x = createUsageExporter(loadConfig({}, { ...exportEnv(url), STRIPE_API_URL: short.url, EXPORT_CLOUDEVENTS_URL: '', EXPORT_CLOUDEVENTS_TOKEN: '' }), {
      db,
      log,
      registry,
    })!;
    cleanups.push(() => x.stop());
    x.start();
    await until('every billable charge at the meter', async () => (await x.status()).stripe?.lag === 0);
    // Every charge recorded once; the 250 sent again were dropped by their identifiers.
    expect([...short.events.keys()].sort()).toEqual(stripeIds(all).sort());
    expect(short.events.size).toBe(370);
    expect(short.errorReports).toEqual([]);
    for (const r of all.filter((r) => r.customer_id)) {
      expect(short.events.get(`ledger-${r.id}`)).toMatchObject({ event_name: METER, customer: 'cus_Str3am', value: String(-r.delta_cents) });
    }
    // The first target still holds its lapsed token (its clock is slow): Stripe's 401 makes it renew once and send again.
    const before = short.sessions;
    expect(await stream.send((await feed.after(START, 1000)).slice(-5))).toEqual({ sent: 5 });
    expect(short.expired).toBe(1);
    expect(short.sessions).toBe(before + 1);
    expect(short.events.size).toBe(370);
    for (const l of lines) {
      expect(l).not.toContain(SECRET);
      expect(l).not.toMatch(/mes_tok_/);
    }
  }, 60_000);

  it('v1 on request (EXPORT_STRIPE_METER_API=v1): one event a request, each charge once', async () => {
    const { url, db } = await freshDb();
    const billed = await account(db, 'cus_V1');
    await charges(db, billed, 60);
    expect(exportTargets(loadConfig({}, { ...exportEnv(url), EXPORT_STRIPE_METER_API: 'v1' }))[1]).toBeInstanceOf(StripeMeterTarget);
    expect(exportTargets(loadConfig({}, exportEnv(url)))[1]).toBeInstanceOf(StripeMeterStreamTarget);
    const x = exporter(url, db, undefined, undefined, { EXPORT_STRIPE_METER_API: 'v1' });
    x.start();
    await until('the sixty charges', () => meter.order.length === 60);
    exactlyOnce(meter.arrivals, stripeIds(await ledger(db)));
    expect(meter.byPath.get('/v1/billing/meter_events')).toBeGreaterThanOrEqual(60);
    expect(meter.byPath.get('/v2/billing/meter_event_stream') ?? 0).toBe(0);
  }, 60_000);

  const base = { DATABASE_URL: 'postgres://x@127.0.0.1/x', REDIS_URL: 'redis://127.0.0.1:6379' };
  it.each([
    ['a meter without a Stripe key', { EXPORT_STRIPE_METER_EVENT: 'm' }, /EXPORT_STRIPE_METER_EVENT/],
    ['an ingest URL that is no URL', { EXPORT_CLOUDEVENTS_URL: 'not a url' }, /EXPORT_CLOUDEVENTS_URL/],
    ['an ingest URL that is not http(s)', { EXPORT_CLOUDEVENTS_URL: 'ftp://meter.example/ingest' }, /EXPORT_CLOUDEVENTS_URL: must be an http\(s\) URL/],
    ['a token without an ingest URL', { EXPORT_CLOUDEVENTS_TOKEN: 'abc' }, /EXPORT_CLOUDEVENTS_TOKEN: set without EXPORT_CLOUDEVENTS_URL/],
    [
      'a token that would split the header',
      { EXPORT_CLOUDEVENTS_URL: 'http://127.0.0.1:1/e', EXPORT_CLOUDEVENTS_TOKEN: 'a\r\nx-evil: 1' },
      /EXPORT_CLOUDEVENTS_TOKEN: only visible ASCII/,
    ],
    [
      'a meter event name Stripe would refuse',
      { STRIPE_SECRET_KEY: 'sk_test_x', STRIPE_WEBHOOK_SECRET: 'whsec_x', EXPORT_STRIPE_METER_EVENT: 'cents per call' },
      /EXPORT_STRIPE_METER_EVENT: a meter event name/,
    ],
    ['a batch size of 0', { EXPORT_BATCH_SIZE: '0' }, /EXPORT_BATCH_SIZE/],
  ])('refuses to start with %s', (_name, env, message) => {
    expect(() => exportTargets(loadConfig({}, { ...base, ...env }))).toThrow(message);
    try {
      exportTargets(loadConfig({}, { ...base, ...env }));
    } catch (e) {
      expect(e).toBeInstanceOf(ConfigError);
    }
  });

  it('is off with no target: no exporter in the API process', () => {
    expect(exportTargets(loadConfig({}, base))).toEqual([]);
  });
});
