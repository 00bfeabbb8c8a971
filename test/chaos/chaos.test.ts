import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it, inject } from 'vitest';
import type { AdminService } from '../../src/ops/admin.js';
import type { CreditReservations } from '../../src/money/holds.js';
import { inFlightKey } from '../../src/access/in-flight.js';
import { Deployment, RedisServer, ServiceProcess, waitForHttp } from './rig.js';

/**
 * Money under faults. The API and two core workers run as separate processes on a Redis and a
 * database of their own; a bounded load of 2-cent `compute` calls (every fifth with an
 * Idempotency-Key, retried until it gets an answer) runs while one fault strikes. Afterwards, per
 * account: credits spent = ledger charges = cost of the 200 answers + charges whose results
 * GET /jobs/{id} returns; every keyed request was charged exactly once and answered with its result;
 * no hold, running claim or in-flight slot is left once idle, and Redis `avail` equals Postgres.
 */

const PREFIX = 'chaos';
const PRICE = 2;
const LOCK_MS = 2_000;
const CALLS = 120;
const CLIENTS = 6;

let d: Deployment;
let redis: RedisServer;
let dbUrl: string;
let admin: AdminService;
let adminRedis: Redis;
/** The deployment's money keys (names only: src/queue/keyspace.ts says where each lives). */
let moneyKeys: CreditReservations;
let api: ServiceProcess;
let workers: ServiceProcess[];
let base: string;
const rows: string[] = [];

beforeAll(async () => {
  d = await new Deployment({
    label: 'chaos',
    prefix: PREFIX,
    workers: 2,
    env: {
      WORKER_LOCK_MS: String(LOCK_MS),
      SYNC_TIMEOUT_MS: '8000',
      RECONCILE_SECONDS: '1',
      FAIR_SHARE: '1',
    },
  }).launch(inject('databaseUrl'), 60_000);
  ({ redis, dbUrl, admin, adminRedis, moneyKeys, api, workers, base } = d);
}, 120_000);

afterAll(async () => {
  process.stdout.write(`\n${HEADER}\n${rows.join('\n')}\n`);
  await d?.close();
}, 60_000);

const HEADER =
  'fault                                  sent  200  charged  undelivered-but-retrievable  keyed ok/charged-once  holds claims slots  avail=credits';

interface Outcome {
  i: number;
  account: number;
  keyed: boolean;
  expression: string;
  /** The final answer: a 200 with its job, or what stopped the request. */
  status: number | 'conn';
  jobId?: string;
  cost?: number;
}

async function post(path: string, apiKey: string, body: unknown, headers: Record<string, string> = {}) {
  const r = await fetch(`${base}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(20_000),
  });
  return { status: r.status, headers: r.headers, body: (await r.json().catch(() => null)) as Record<string, any> | null };
}

async function getJob(apiKey: string, jobId: string) {
  const r = await fetch(`${base}/jobs/${jobId}`, { headers: { authorization: `Bearer ${apiKey}` }, signal: AbortSignal.timeout(10_000) }).catch(() => null);
  if (!r) return null;
  return { status: r.status, body: (await r.json().catch(() => null)) as Record<string, any> | null };
}

/** A 202 is followed to its end through GET /jobs/{id}, as a client would. */
async function follow(apiKey: string, jobId: string, deadline: number): Promise<{ status: number; body: Record<string, any> | null }> {
  for (;;) {
    const r = await getJob(apiKey, jobId);
    if (r && (r.status !== 200 || r.body?.status === 'completed')) return r as { status: number; body: Record<string, any> | null };
    if (Date.now() > deadline) return { status: 202, body: null };
    await sleep(300);
  }
}

async function oneCall(i: number, account: number, apiKey: string, tag: string): Promise<Outcome> {
  const keyed = i % 5 === 0;
  const expression = `${i} + 0`;
  const base: Outcome = { i, account, keyed, expression, status: 'conn' };
  const deadline = Date.now() + 90_000;
  const headers: Record<string, string> = keyed ? { 'idempotency-key': `${tag}-${i}` } : {};
  for (;;) {
    let res;
    try {
      res = await post('/tools/compute', apiKey, { expression }, headers);
    } catch {
      if (!keyed || Date.now() > deadline) return base;
      await sleep(300);
      continue;
    }
    let { status, body } = res;
    let jobId = res.headers.get('x-job-id') ?? undefined;
    if (status === 202 && body?.job_id) {
      jobId = body.job_id;
      ({ status, body } = await follow(apiKey, body.job_id, deadline));
    }
    if (status === 200) return { ...base, status, jobId, cost: body?.cost_cents };
    // 410 job_lost: accepted, then lost before it ran (the API died between its intent and the queue);
    // the contract says to send the request again with the same key, and then it runs once.
    const lost = status === 410 && body?.error?.code === 'job_lost';
    const retryable = status === 409 || status === 429 || status >= 500 || status === 202 || lost;
    if (!keyed || !retryable || Date.now() > deadline) return { ...base, status, jobId };
    await sleep(300);
  }
}

/** Runs the load; `fault` is started once a third of the calls are done, and awaited at the end. */
async function load(tag: string, keys: string[], fault: () => Promise<void>): Promise<Outcome[]> {
  const out: Outcome[] = [];
  let next = 0;
  let faultRun: Promise<void> | null = null;
  await Promise.all(
    Array.from({ length: CLIENTS }, async () => {
      while (next < CALLS) {
        const i = next++;
        if (i === Math.floor(CALLS / 3) && !faultRun) faultRun = fault();
        const account = i % keys.length;
        out.push(await oneCall(i, account, keys[account]!, tag));
      }
    }),
  );
  await faultRun;
  return out;
}

async function ledgerCharges(accountId: string): Promise<Array<{ entry_key: string; delta_cents: number }>> {
  const c = new pg.Client({ connectionString: dbUrl });
  await c.connect();
  try {
    const { rows: r } = await c.query(`SELECT entry_key, delta_cents::int FROM ledger WHERE account_id = $1 AND kind = 'charge'`, [accountId]);
    return r;
  } finally {
    await c.end();
  }
}

async function credits(accountId: string): Promise<number> {
  const c = new pg.Client({ connectionString: dbUrl });
  await c.connect();
  try {
    return Number((await c.query('SELECT credits FROM accounts WHERE id = $1', [accountId])).rows[0].credits);
  } finally {
    await c.end();
  }
}

interface Idle {
  holds: number;
  claims: number;
  slots: number;
  availOk: boolean;
}

async function idleState(accountIds: string[], keyIds: string[]): Promise<Idle> {
  let holds = 0;
  let slots = 0;
  let availOk = true;
  for (const id of accountIds) {
    holds += await adminRedis.hlen(moneyKeys.holdsKey(id));
    slots += await adminRedis.zcard(inFlightKey(PREFIX, id));
    const avail = await adminRedis.get(moneyKeys.availKey(id));
    if (avail !== null && Number(avail) !== (await credits(id))) availOk = false;
  }
  let claims = 0;
  for (const keyId of keyIds) {
    const keys = await adminRedis.keys(`${PREFIX}:idem:${keyId}:*`);
    for (const k of keys) {
      const raw = await adminRedis.get(k);
      if (raw && JSON.parse(raw).state === 'running') claims++;
    }
  }
  return { holds, claims, slots, availOk };
}

/** Waits (reconciler passes) until nothing is left behind, or gives the last reading. */
async function settleDown(accountIds: string[], keyIds: string[]): Promise<Idle> {
  let s = await idleState(accountIds, keyIds);
  for (let t = 0; t < 120 && (s.holds || s.claims || s.slots || !s.availOk); t++) {
    await sleep(500);
    s = await idleState(accountIds, keyIds);
  }
  return s;
}

async function ensureHealthy(): Promise<void> {
  if (!redis.ping()) await redis.start();
  if (api.proc?.exitCode !== null || api.proc?.signalCode !== null) api.start();
  for (const w of workers) if (w.proc?.exitCode !== null || w.proc?.signalCode !== null) w.start();
  await waitForHttp(base, true, 60_000);
}

const FAULTS: Array<[string, () => Promise<void>]> = [
  [
    'worker SIGKILL',
    async () => {
      await workers[0]!.kill('SIGKILL');
      await sleep(500);
      workers[0]!.start();
    },
  ],
  [
    'API SIGKILL and restart',
    async () => {
      await api.kill('SIGKILL');
      await sleep(1_000);
      api.start();
    },
  ],
  [
    'all workers down 10 s',
    async () => {
      for (const w of workers) await w.kill('SIGKILL');
      await sleep(10_000);
      for (const w of workers) w.start();
    },
  ],
  [
    'Redis SHUTDOWN NOSAVE and restart',
    async () => {
      await redis.shutdownNoSave();
      await sleep(1_000);
      await redis.start();
    },
  ],
  [
    'Postgres connections terminated 10 s',
    async () => {
      const u = new URL(dbUrl);
      const name = u.pathname.slice(1);
      u.pathname = '/postgres';
      const c = new pg.Client({ connectionString: u.toString() });
      await c.connect();
      const end = Date.now() + 10_000;
      while (Date.now() < end) {
        await c.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()', [name]);
        await sleep(100);
      }
      await c.end();
    },
  ],
  [
    'a job outlives its lock',
    async () => {
      // A worker frozen past its lock: its jobs are redelivered to the other, then it wakes up and
      // finishes them too.
      workers[0]!.signal('SIGSTOP');
      await sleep(LOCK_MS * 3);
      workers[0]!.signal('SIGCONT');
    },
  ],
];

describe('money under faults', () => {
  it.each(FAULTS)(
    '%s',
    async (name, fault) => {
      await ensureHealthy();
      const tag = randomBytes(3).toString('hex');
      const accts = [await admin.createAccount('pro', 10_000, `chaos-${tag}-a`), await admin.createAccount('pro', 10_000, `chaos-${tag}-b`)];
      for (const a of accts) await admin.setAccount(a.account_id, { plan: 'enterprise', rpm: 100_000, maxInFlight: 1_000 });
      const outcomes = await load(
        tag,
        accts.map((a) => a.api_key),
        fault,
      );
      await ensureHealthy();
      const idle = await settleDown(
        accts.map((a) => a.account_id),
        accts.map((a) => a.key_id),
      );

      let charged = 0;
      let undelivered = 0;
      let keyedOk = 0;
      let keyedOnce = 0;
      for (const [n, a] of accts.entries()) {
        const mine = outcomes.filter((o) => o.account === n);
        const ledger = await ledgerCharges(a.account_id);
        const spent = 10_000 - (await credits(a.account_id));
        const ledgerSum = -ledger.reduce((s, l) => s + l.delta_cents, 0);
        // Credits spent are exactly the ledger's charges.
        expect(spent).toBe(ledgerSum);
        charged += ledger.length;

        const delivered = new Map(mine.filter((o) => o.status === 200).map((o) => [o.jobId!, o]));
        // No 200 without its charge, at the price.
        const ledgerIds = new Set(ledger.map((l) => l.entry_key));
        for (const [jobId, o] of delivered) {
          expect(ledgerIds.has(jobId)).toBe(true);
          expect(o.cost).toBe(PRICE);
        }
        // Every charge not delivered as a 200 is retrievable by its key, and names the request it ran.
        const chargesPerExpression = new Map<string, number>();
        for (const o of delivered.values()) chargesPerExpression.set(o.expression, (chargesPerExpression.get(o.expression) ?? 0) + 1);
        let deliveredCost = 0;
        for (const o of delivered.values()) deliveredCost += o.cost ?? 0;
        let retrievableCost = 0;
        for (const l of ledger) {
          if (delivered.has(l.entry_key)) continue;
          const r = await getJob(a.api_key, l.entry_key);
          expect(r?.status).toBe(200);
          expect(r?.body?.status).toBe('completed');
          expect(r?.body?.cost_cents).toBe(PRICE);
          retrievableCost += r?.body?.cost_cents ?? 0;
          undelivered++;
          const expr = r?.body?.result?.expression as string;
          chargesPerExpression.set(expr, (chargesPerExpression.get(expr) ?? 0) + 1);
        }
        expect(deliveredCost + retrievableCost).toBe(ledgerSum);
        // Each request ran (and was charged) at most once; each keyed one exactly once, with its answer.
        for (const [, count] of chargesPerExpression) expect(count).toBe(1);
        for (const o of mine.filter((x) => x.keyed)) {
          expect(o.status).toBe(200);
          keyedOk++;
          if (chargesPerExpression.get(o.expression) === 1) keyedOnce++;
        }
      }
      const keyed = outcomes.filter((o) => o.keyed).length;
      rows.push(
        `${name.padEnd(38)} ${String(outcomes.length).padStart(4)} ${String(outcomes.filter((o) => o.status === 200).length).padStart(4)} ` +
          `${String(charged).padStart(8)} ${String(undelivered).padStart(28)} ${`${keyedOk}/${keyedOnce} of ${keyed}`.padStart(22)} ` +
          `${String(idle.holds).padStart(5)} ${String(idle.claims).padStart(6)} ${String(idle.slots).padStart(5)}  ${idle.availOk ? 'yes' : 'NO'}`,
      );
      expect(keyedOnce).toBe(keyed);
      expect(idle).toEqual({ holds: 0, claims: 0, slots: 0, availOk: true });
    },
    300_000,
  );
});
