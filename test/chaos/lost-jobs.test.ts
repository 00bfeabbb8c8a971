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
 * Accepted means recorded (issue 31). The API and two core workers as separate processes on a Redis of
 * their own; with async, sync, keyed and chained calls in flight (the workers frozen, so they wait in
 * the queue), Redis goes away with `SHUTDOWN NOSAVE` and comes back empty 3 s later. Then: every job id
 * a caller was given ends completed, failed or lost in GET /jobs/{id}, none 404; every keyed request
 * retried after its lost answer runs exactly once; credits spent = ledger charges = cost of completed
 * answers, no hold, claim or slot is left, and Redis `avail` equals Postgres.
 */

const PREFIX = 'lostjobs';
const PRICE = 2;
const GRACE_MS = 2_000;

let d: Deployment;
let redis: RedisServer;
let dbUrl: string;
let admin: AdminService;
let adminRedis: Redis;
let moneyKeys: CreditReservations;
let workers: ServiceProcess[];
let base: string;
const rows: string[] = [];

beforeAll(async () => {
  d = await new Deployment({
    label: 'lostjobs',
    prefix: PREFIX,
    workers: 2,
    env: {
      WORKER_LOCK_MS: '2000',
      SYNC_TIMEOUT_MS: '15000',
      RECONCILE_SECONDS: '1',
      INTENT_GRACE_MS: String(GRACE_MS),
    },
  }).launch(inject('databaseUrl'), 150_000);
  ({ redis, dbUrl, admin, adminRedis, moneyKeys, workers, base } = d);
}, 180_000);

afterAll(async () => {
  process.stdout.write(`\n${HEADER}\n${rows.join('\n')}\n`);
  await d?.close();
}, 60_000);

const HEADER =
  'fault                                  sent  200  charged  undelivered-but-retrievable  keyed ok/charged-once  holds claims slots  avail=credits';

type Answer = { status: number; headers: Headers | null; body: Record<string, any> | null };

async function post(path: string, apiKey: string, body: unknown, headers: Record<string, string> = {}): Promise<Answer> {
  try {
    const r = await fetch(`${base}${path}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(30_000),
    });
    return { status: r.status, headers: r.headers, body: (await r.json().catch(() => null)) as Record<string, any> | null };
  } catch {
    return { status: 0, headers: null, body: null };
  }
}

async function getJob(apiKey: string, jobId: string): Promise<Answer> {
  try {
    const r = await fetch(`${base}/jobs/${jobId}`, { headers: { authorization: `Bearer ${apiKey}` }, signal: AbortSignal.timeout(10_000) });
    return { status: r.status, headers: r.headers, body: (await r.json().catch(() => null)) as Record<string, any> | null };
  } catch {
    return { status: 0, headers: null, body: null };
  }
}

/** Where a job ended: polled until it is completed, failed (its error) or lost, or the deadline. */
async function end(apiKey: string, jobId: string, deadline: number): Promise<Answer> {
  for (;;) {
    const r = await getJob(apiKey, jobId);
    const running = r.status === 0 || r.status >= 500 || (r.status === 200 && r.body?.status !== 'completed');
    if (!running || Date.now() > deadline) return r;
    await sleep(300);
  }
}

/** A request in flight: what it is, how to send it again, and the job id it was given (if any). */
interface Flight {
  kind: 'async' | 'sync' | 'chain';
  keyed: boolean;
  expression: string;
  send: () => Promise<Answer>;
  answer?: Answer;
  jobId?: string;
}

function jobIdOf(a: Answer): string | undefined {
  return (a.body?.job_id as string | undefined) ?? (a.body?.error?.job_id as string | undefined) ?? a.headers?.get('x-job-id') ?? undefined;
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

async function ledgerCharges(accountId: string): Promise<Array<{ entry_key: string; delta_cents: number }>> {
  const c = new pg.Client({ connectionString: dbUrl });
  await c.connect();
  try {
    return (await c.query(`SELECT entry_key, delta_cents::int FROM ledger WHERE account_id = $1 AND kind = 'charge'`, [accountId])).rows;
  } finally {
    await c.end();
  }
}

async function idleState(accountId: string, keyId: string) {
  const holds = await adminRedis.hlen(moneyKeys.holdsKey(accountId));
  const slots = await adminRedis.zcard(inFlightKey(PREFIX, accountId));
  const avail = await adminRedis.get(moneyKeys.availKey(accountId));
  const availOk = avail === null || Number(avail) === (await credits(accountId));
  let claims = 0;
  for (const k of await adminRedis.keys(`${PREFIX}:idem:${keyId}:*`)) {
    const raw = await adminRedis.get(k);
    if (raw && JSON.parse(raw).state === 'running') claims++;
  }
  return { holds, claims, slots, availOk };
}

describe('accepted means recorded', () => {
  it('Redis SHUTDOWN NOSAVE with calls in flight: every job id given ends completed, failed or lost; keyed retries run once; money exact', async () => {
    const tag = randomBytes(3).toString('hex');
    const acct = await admin.createAccount('pro', 10_000, `lost-${tag}`);
    await admin.setAccount(acct.account_id, { plan: 'enterprise', rpm: 100_000, maxInFlight: 1_000 });
    const key = acct.api_key;
    const flights: Flight[] = [];
    const add = (kind: Flight['kind'], keyed: boolean, i: number) => {
      const expression = `${i} + 0`;
      const headers: Record<string, string> = keyed ? { 'idempotency-key': `${tag}-${i}` } : {};
      if (kind === 'async') headers.prefer = 'respond-async';
      const send =
        kind === 'chain'
          ? () => post('/', key, { chain: ['compute', 'compute'], q: expression }, { ...headers, prefer: 'respond-async' })
          : () => post('/tools/compute', key, { expression }, headers);
      flights.push({ kind, keyed, expression, send });
    };
    // Calls that complete before the fault (some keyed: their retries must not run again).
    let i = 0;
    for (; i < 8; i++) add('sync', i % 2 === 0, i);
    for (const f of flights) {
      f.answer = await f.send();
      f.jobId = jobIdOf(f.answer);
      // A loaded machine may take longer than SYNC_TIMEOUT_MS: then its job is followed to the end.
      if (f.answer.status === 202) f.answer = await end(key, f.jobId!, Date.now() + 60_000);
      expect(f.answer.status).toBe(200);
    }
    const before = flights.length;
    // Then, with the workers frozen, calls of every kind wait in the queue.
    for (const w of workers) w.signal('SIGSTOP');
    for (let k = 0; k < 6; k++) add('async', false, i++);
    for (let k = 0; k < 6; k++) add('async', true, i++);
    for (let k = 0; k < 4; k++) add('sync', k % 2 === 0, i++);
    for (let k = 0; k < 4; k++) add('chain', k % 2 === 0, i++);
    const inFlight = flights.slice(before).map(async (f) => {
      f.answer = await f.send();
      f.jobId = jobIdOf(f.answer);
    });
    await sleep(1_500);
    await redis.shutdownNoSave();
    await sleep(3_000);
    await redis.start();
    for (const w of workers) w.signal('SIGCONT');
    await Promise.all(inFlight);
    await waitForHttp(base, true, 60_000);

    // Every job id a caller was given ends completed, failed or lost; never 404.
    const deadline = Date.now() + 60_000;
    const given = flights.filter((f) => f.jobId);
    const ends = await Promise.all(given.map((f) => end(key, f.jobId!, deadline)));
    let lost = 0;
    ends.forEach((e, n) => {
      const f = given[n]!;
      expect(e.status, `${f.kind} ${f.jobId}`).not.toBe(404);
      if (e.status === 410) {
        expect(e.body?.error).toMatchObject({ code: 'job_lost', job_id: f.jobId, status: 'lost' });
        lost++;
      } else if (e.status === 200) expect(e.body?.status).toBe('completed');
      else expect(e.status).toBeGreaterThanOrEqual(400);
    });
    expect(lost).toBeGreaterThan(0);
    // An in-flight request that was given no id failed as a whole (503 while Redis was down).
    for (const f of flights.filter((x) => !x.jobId)) expect([0, 503]).toContain(f.answer!.status);

    // Every keyed request whose answer was lost (or never came) is retried with its key until it is
    // answered; one of them twice at once. Completed ones replay.
    const keyed = flights.filter((f) => f.keyed);
    let keyedOk = 0;
    const retryUntilDone = async (f: Flight): Promise<Answer> => {
      let last: Answer | undefined;
      const trail: string[] = [];
      for (let t = 0; t < 60; t++) {
        const a = await f.send();
        const id = jobIdOf(a);
        const done = a.status === 202 && id ? await end(key, id, Date.now() + 30_000) : a;
        if (done.status === 200 && (done.body?.status === undefined || done.body?.status === 'completed')) return done;
        if (![0, 409, 410, 429, 503, 202].includes(done.status)) return done;
        last = done;
        trail.push(`${a.status}${a.headers?.get('idempotent-replayed') ? 'R' : ''}:${id ?? ''}->${done.status}`);
        await sleep(300);
      }
      return {
        status: 0,
        headers: null,
        body: { gaveUp: `${f.kind} ${f.expression}`, last: { status: last?.status, body: last?.body }, trail: trail.slice(0, 8) },
      };
    };
    const retried = await Promise.all(
      keyed.map((f, n) => (n === keyed.length - 1 ? Promise.all([retryUntilDone(f), retryUntilDone(f)]).then((r) => r[0]!) : retryUntilDone(f))),
    );
    for (const r of retried) {
      expect(r.status, JSON.stringify(r.body)).toBe(200);
      keyedOk++;
    }

    // Money: spent = ledger = cost of completed answers, each request charged at most once, each keyed one exactly once.
    const ledger = await ledgerCharges(acct.account_id);
    const spent = 10_000 - (await credits(acct.account_id));
    const ledgerSum = -ledger.reduce((s, l) => s + l.delta_cents, 0);
    expect(spent).toBe(ledgerSum);
    const perExpression = new Map<string, number>();
    let completedCost = 0;
    for (const l of ledger) {
      const r = await getJob(key, l.entry_key);
      expect(r.status).toBe(200);
      expect(r.body?.status).toBe('completed');
      // A chain's last step shares its id with the chain's root: GET answers the whole chain, whose last
      // step is this entry (its first step has its own entry and is counted under the expression).
      const steps = r.body?.steps as Array<{ result: { expression: string }; cost_cents: number }> | undefined;
      const own = steps ? steps.at(-1)! : (r.body as { cost_cents: number });
      expect(own.cost_cents).toBe(PRICE);
      completedCost += own.cost_cents;
      const expr = steps ? `chain: ${steps[0]!.result.expression}` : (r.body?.result?.expression as string);
      perExpression.set(expr, (perExpression.get(expr) ?? 0) + 1);
    }
    expect(completedCost).toBe(ledgerSum);
    // Each request's (first) job computes its own expression: charged at most once, a keyed one exactly once.
    for (const f of flights) expect(perExpression.get(f.expression) ?? 0).toBeLessThanOrEqual(1);
    let keyedOnce = 0;
    for (const f of keyed) if (perExpression.get(f.expression) === 1) keyedOnce++;
    expect(keyedOnce).toBe(keyed.length);

    let idle = await idleState(acct.account_id, acct.key_id);
    for (let t = 0; t < 60 && (idle.holds || idle.claims || idle.slots || !idle.availOk); t++) {
      await sleep(500);
      idle = await idleState(acct.account_id, acct.key_id);
    }
    // Charges answered with a 200 (first answers and retries), the rest only through GET /jobs/{id}.
    const deliveredIds = new Set(
      [...flights.map((f) => f.answer!), ...retried].filter((a) => a.status === 200).map((a) => a.headers?.get('x-job-id') ?? (a.body?.job_id as string)),
    );
    const delivered = ledger.filter((l) => deliveredIds.has(l.entry_key)).length;
    rows.push(
      `${`Redis NOSAVE, empty 3 s (${lost} lost)`.padEnd(38)} ${String(flights.length).padStart(4)} ${String(delivered).padStart(4)} ` +
        `${String(ledger.length).padStart(8)} ${String(ledger.length - delivered).padStart(28)} ${`${keyedOk}/${keyedOnce} of ${keyed.length}`.padStart(22)} ` +
        `${String(idle.holds).padStart(5)} ${String(idle.claims).padStart(6)} ${String(idle.slots).padStart(5)}  ${idle.availOk ? 'yes' : 'NO'}`,
    );
    expect(idle).toEqual({ holds: 0, claims: 0, slots: 0, availOk: true });
  }, 180_000);
});
