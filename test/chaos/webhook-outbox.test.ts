import { execFileSync } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { z } from 'zod';
import { sql, type DatabasePool } from '../../src/db/pool.js';
import type { AdminService } from '../../src/ops/admin.js';
import { Deployment, RedisServer, waitForHttp } from './rig.js';

/**
 * Webhooks under a Redis outage (issue #31: nothing accepted is ever lost). The API and a core worker
 * run as separate processes on a Redis and a database of their own. 50 async calls with a Callback-Url
 * are answered 202 and settled while the receiver refuses (503), so 50 deliveries are due for a retry;
 * then Redis goes away (paused, or shut down without saving and started again empty) and the receiver
 * starts accepting. Every delivery must arrive, each webhook-id once, and every outbox row be done.
 */

const PREFIX = 'chaoshook';
const DUE = 50;

let d: Deployment;
let redis: RedisServer;
let pool: DatabasePool;
let admin: AdminService;
let base: string;
let receiver: Server;
let hookBase: string;
/** Arrivals per path, then per webhook-id; while `refusing`, answered 503. */
const arrivals = new Map<string, Map<string, number>>();
let refusing = true;
const rows: string[] = [];

beforeAll(async () => {
  receiver = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const path = req.url ?? '/';
      if (refusing) {
        res.statusCode = 503;
        res.end('not now');
        return;
      }
      const ids = arrivals.get(path) ?? new Map<string, number>();
      arrivals.set(path, ids);
      const id = String(req.headers['webhook-id']);
      ids.set(id, (ids.get(id) ?? 0) + 1);
      res.end('ok');
    });
  });
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
  const hookPort = (receiver.address() as AddressInfo).port;
  hookBase = `http://127.0.0.1:${hookPort}`;

  d = await new Deployment({
    label: 'chaoshook',
    prefix: PREFIX,
    workers: 1,
    env: {
      WEBHOOK_ALLOWED_HOSTS: `127.0.0.1:${hookPort}`,
      WEBHOOK_BACKOFF_MS: '500',
      WEBHOOK_TIMEOUT_MS: '2000',
      WEBHOOK_MAX_PENDING: '1000',
    },
  }).launch(inject('databaseUrl'));
  ({ redis, pool, admin, base } = d);
}, 120_000);

afterAll(async () => {
  process.stdout.write(`\n${HEADER}\n${rows.join('\n')}\n`);
  await d?.close();
  await new Promise((r) => receiver?.close(r));
}, 60_000);

const HEADER = 'fault                                        due  during-outage  after  ids-once  duplicates  rows-done  seconds';

const Progress = z.object({ rows: z.number(), tried: z.number(), done: z.number() });

/** The account's outbox: rows, rows with a failed attempt at least, rows done. */
function progress(accountId: string) {
  return pool.one(sql.type(Progress)`
    SELECT count(*)::int AS rows, count(*) FILTER (WHERE attempts > 0)::int AS tried, count(*) FILTER (WHERE done_at IS NOT NULL)::int AS done
    FROM webhook_jobs WHERE account_id = ${accountId}`);
}

async function until(what: string, f: () => Promise<boolean>, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (!(await f())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

/** 50 async calls with a callback to `path`, all answered 202, settled, and each refused once by the receiver. */
async function dueDeliveries(path: string): Promise<string> {
  const acct = await admin.createAccount('enterprise', 10_000);
  refusing = true;
  for (let i = 0; i < DUE; i++) {
    const r = await fetch(`${base}/tools/compute`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${acct.api_key}`,
        'content-type': 'application/json',
        prefer: 'respond-async',
        'callback-url': `${hookBase}${path}`,
      },
      body: JSON.stringify({ expression: `${i} + 1` }),
    });
    expect(r.status, await r.text()).toBe(202);
  }
  await until(`${DUE} rows each tried once`, async () => (await progress(acct.account_id)).tried === DUE, 60_000);
  return acct.account_id;
}

async function outage(name: string, path: string, down: () => Promise<void>, up: () => Promise<void>) {
  const accountId = await dueDeliveries(path);
  const started = Date.now();
  await down();
  refusing = false;
  // Redis stays away for 5 s while the deliveries come due again.
  await sleep(5_000);
  const during = arrivals.get(path)?.size ?? 0;
  await up();
  await until('every row done', async () => (await progress(accountId)).done === DUE, 60_000);
  // Late duplicates (a resend after a lease) would arrive within the next second or two.
  await sleep(1_500);
  const ids = arrivals.get(path) ?? new Map<string, number>();
  const once = [...ids.values()].filter((n) => n === 1).length;
  const duplicates = [...ids.values()].reduce((s, n) => s + n - 1, 0);
  const done = (await progress(accountId)).done;
  rows.push(
    `${name.padEnd(44)} ${String(DUE).padStart(3)} ${String(during).padStart(14)} ${String(ids.size - during).padStart(6)} ` +
      `${String(once).padStart(9)} ${String(duplicates).padStart(11)} ${String(done).padStart(10)} ${((Date.now() - started) / 1000).toFixed(1).padStart(8)}`,
  );
  expect(ids.size).toBe(DUE);
  expect(once).toBe(DUE);
  expect(done).toBe(DUE);
  // Each row's outcome is recorded: delivered, with its attempts (at least the refused one and the delivered one).
  const delivered = await pool.oneFirst(sql.type(z.object({ n: z.number() }))`
    SELECT count(*)::int AS n FROM webhook_jobs WHERE account_id = ${accountId} AND delivered_at IS NOT NULL`);
  expect(delivered).toBe(DUE);
  await waitForHttp(base, true, 60_000);
}

describe('webhooks while Redis is away', () => {
  it('Redis paused (CLIENT PAUSE 5 s) while 50 deliveries are due: all delivered, each once', async () => {
    await outage(
      'Redis paused 5 s, 50 deliveries due',
      '/paused',
      async () => {
        execFileSync('redis-cli', ['-p', String(redis.port), 'client', 'pause', '5000', 'ALL'], { stdio: 'ignore' });
      },
      async () => {},
    );
  }, 120_000);

  it('Redis shut down without saving while 50 deliveries are due, back empty: all delivered, each once', async () => {
    await outage(
      'Redis SHUTDOWN NOSAVE, back empty, 50 due',
      '/empty',
      () => redis.shutdownNoSave(),
      () => redis.start(),
    );
  }, 120_000);
});
