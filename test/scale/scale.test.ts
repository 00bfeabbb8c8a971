import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, inject } from 'vitest';
import { openPool, type DatabasePool } from '../../src/db/pool.js';
import { AccountsRepo } from '../../src/access/accounts.js';
import { AdminService } from '../../src/ops/admin.js';
import { CreditReservations } from '../../src/money/holds.js';
import { inFlightKey } from '../../src/access/in-flight.js';
import { connectRedis, isCluster, type Redis } from '../../src/queue/redis.js';
import { queuePrefix } from '../../src/queue/keyspace.js';
import { ServiceProcess, dropDatabase, freePort, freshDatabase, waitForHttp } from '../chaos/rig.js';
import { RedisCluster } from './cluster.js';

/**
 * `npm run test:scale`: the integration suite's money, rate-limit, sub-key and idempotency properties
 * against the production shape scaled out: a 3-primary Redis Cluster with a replica per primary, two
 * API processes (one given REDIS_URL=redis+cluster://..., the other REDIS_CLUSTER_NODES) and two
 * worker processes that each run every family. Every request load is split across both APIs.
 */

const exec = promisify(execFile);
const PREFIX = `scale${randomBytes(3).toString('hex')}`;
const PRICE = 2; // compute, cents
let cluster: RedisCluster;
let dbUrl: string;
let pool: DatabasePool;
let redis: Redis;
let admin: AdminService;
let money: CreditReservations;
let apis: ServiceProcess[] = [];
let workers: ServiceProcess[] = [];
const bases: string[] = [];
let baseEnv: NodeJS.ProcessEnv;

beforeAll(async () => {
  cluster = new RedisCluster(3);
  await cluster.start();
  dbUrl = await freshDatabase(inject('databaseUrl'), 'scale');
  pool = await openPool(dbUrl, { maximumPoolSize: 2 });
  redis = connectRedis(cluster.url);
  redis.on('error', () => {});
  const accounts = new AccountsRepo(pool);
  money = new CreditReservations(redis, PREFIX, accounts);
  admin = new AdminService({ accounts, credits: money, redis, prefix: PREFIX, pool });

  baseEnv = {
    ...process.env,
    DATABASE_URL: dbUrl,
    REDIS_PREFIX: PREFIX,
    HOST: '127.0.0.1',
    EDGE_TOKEN_KEY: randomBytes(32).toString('hex'),
    // A family's first call loads its sandbox thread's modules under tsx: 15-25 s on a loaded CI machine,
    // where a sync chain's first text step once answered 202 at 15 s. Below the client's 30 s.
    SYNC_TIMEOUT_MS: '25000',
    RECONCILE_SECONDS: '1',
    LOG_LEVEL: 'error',
  };
  delete baseEnv.REDIS_URL;
  // One API names the cluster by URL, the other by its node list: both forms are in use.
  const redisEnvs = [{ REDIS_URL: cluster.url }, { REDIS_CLUSTER_NODES: cluster.nodes.join(',') }];
  for (const [i, redisEnv] of redisEnvs.entries()) {
    const port = await freePort();
    bases.push(`http://127.0.0.1:${port}`);
    apis.push(new ServiceProcess(`api-${i}`, ['src/server.ts'], { ...baseEnv, ...redisEnv, PORT: String(port), WORKERS: 'off' }));
  }
  workers = [0, 1].map((i) => new ServiceProcess(`worker-${i}`, ['workers/index.ts', '--family', 'all'], { ...baseEnv, ...redisEnvs[i]!, PORT: '0' }));
  for (const p of [...apis, ...workers]) p.start();
  for (const b of bases) await waitForHttp(b, true, 120_000);
}, 240_000);

afterAll(async () => {
  for (const p of [...apis, ...workers]) await p.kill();
  redis?.disconnect();
  await pool?.end();
  await cluster?.stop();
  if (dbUrl) await dropDatabase(dbUrl);
}, 60_000);

interface Answer {
  status: number;
  body: Record<string, any> | null;
  jobId?: string;
}

async function post(i: number, path: string, apiKey: string, body: unknown, headers: Record<string, string> = {}): Promise<Answer> {
  const r = await fetch(`${bases[i % bases.length]}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(30_000),
  });
  return { status: r.status, body: (await r.json().catch(() => null)) as Record<string, any> | null, jobId: r.headers.get('x-job-id') ?? undefined };
}

/** `n` compute calls at once, alternating between the two APIs. */
function storm(n: number, apiKey: string, headers: (i: number) => Record<string, string> = () => ({})): Promise<Answer[]> {
  return Promise.all(Array.from({ length: n }, (_, i) => post(i, '/tools/compute', apiKey, { expression: `${i} * 3` }, headers(i))));
}

async function pgValue<T>(query: string, params: unknown[]): Promise<T> {
  const c = new pg.Client({ connectionString: dbUrl });
  await c.connect();
  try {
    return (await c.query(query, params)).rows[0] as T;
  } finally {
    await c.end();
  }
}

const credits = async (accountId: string) => Number((await pgValue<{ credits: string }>('SELECT credits FROM accounts WHERE id = $1', [accountId])).credits);
const charges = async (accountId: string) =>
  Number((await pgValue<{ n: string }>(`SELECT count(*) AS n FROM ledger WHERE account_id = $1 AND kind = 'charge'`, [accountId])).n);

const count = (answers: Answer[], status: number) => answers.filter((a) => a.status === status).length;

describe('scaled out: Redis Cluster, two APIs, two workers per family', () => {
  it('runs on a cluster: the queues in one slot, accounts spread over every primary', async () => {
    expect(isCluster(redis)).toBe(true);
    expect(cluster.primaryPorts()).toHaveLength(3);
    // Accounts' money keys land on every primary, the queues on one.
    const accts = await Promise.all(Array.from({ length: 12 }, () => admin.createAccount('pro', 100)));
    const primaries = new Set(accts.map((a) => cluster.primaryOf(money.availKey(a.account_id))));
    expect(primaries.size).toBe(3);
    expect(cluster.primaryPorts()).toContain(cluster.primaryOf(`${queuePrefix(PREFIX)}:core:wait`));
  });

  it('the admin CLI works against the cluster', async () => {
    const { stdout } = await exec(
      process.execPath,
      ['--import', 'tsx', 'src/cli/admin.ts', 'account', 'create', '--plan', 'pro', '--credits', '40', '--name', 'scale-cli'],
      {
        env: { ...baseEnv, REDIS_CLUSTER_NODES: cluster.nodes.join(',') },
      },
    );
    const created = JSON.parse(stdout) as { account_id: string; api_key: string };
    const r = await post(1, '/tools/compute', created.api_key, { expression: '6 * 7' });
    expect(r.status).toBe(200);
    expect(r.body?.result?.result ?? r.body?.result).toBeDefined();
    expect(await credits(created.account_id)).toBe(40 - PRICE);
  });

  it('exact credit: 4N concurrent calls split across both APIs run N times and charge N', async () => {
    const N = 25;
    const a = await admin.createAccount('pro', N * PRICE);
    await admin.setAccount(a.account_id, { plan: 'enterprise', rpm: 100_000, maxInFlight: 1_000 });
    const answers = await storm(4 * N, a.api_key);
    expect(count(answers, 200)).toBe(N);
    expect(count(answers, 402)).toBe(3 * N);
    expect(answers.filter((x) => x.status === 402).every((x) => x.body?.error?.code === 'insufficient_credits')).toBe(true);
    expect(await credits(a.account_id)).toBe(0);
    expect(await charges(a.account_id)).toBe(N);
    expect(Number(await redis.get(money.availKey(a.account_id)))).toBe(0);
  });

  it('rate limits are exact across replicas', async () => {
    const RPM = 30;
    const a = await admin.createAccount('pro', 10_000);
    await admin.setAccount(a.account_id, { plan: 'enterprise', rpm: RPM, maxInFlight: 1_000 });
    const answers = await storm(2 * RPM, a.api_key);
    expect(count(answers, 200)).toBe(RPM);
    expect(count(answers, 429)).toBe(RPM);
    expect(answers.filter((x) => x.status === 429).every((x) => x.body?.error?.code === 'rate_limited')).toBe(true);
    expect(await charges(a.account_id)).toBe(RPM);
  });

  it("a sub-key's monthly cap is exact across replicas", async () => {
    const a = await admin.createAccount('pro', 10_000);
    await admin.setAccount(a.account_id, { plan: 'enterprise', rpm: 100_000, maxInFlight: 1_000 });
    const sub = await post(0, '/subkeys/create', a.api_key, { name: 'capped', monthly_limit: 10 * PRICE, allowed_tools: ['compute'] });
    expect(sub.status).toBe(201);
    const answers = await storm(40, sub.body!.api_key as string);
    expect(count(answers, 200)).toBe(10);
    expect(answers.filter((x) => x.status !== 200).every((x) => x.body?.error?.code === 'monthly_limit_exceeded')).toBe(true);
    expect(await credits(a.account_id)).toBe(10_000 - 10 * PRICE);
  });

  it('one idempotent retry storm across replicas runs once and is charged once', async () => {
    const a = await admin.createAccount('pro', 10_000);
    await admin.setAccount(a.account_id, { plan: 'enterprise', rpm: 100_000, maxInFlight: 1_000 });
    const key = `storm-${randomBytes(4).toString('hex')}`;
    const body = { expression: '12 * 12' };
    const first = await Promise.all(Array.from({ length: 30 }, (_, i) => post(i, '/tools/compute', a.api_key, body, { 'idempotency-key': key })));
    // Those that raced the first are told to retry; retried until answered, every answer is the one job's.
    const answers: Answer[] = [];
    for (const [i, r] of first.entries()) {
      let x = r;
      for (let t = 0; t < 40 && x.status === 409; t++) {
        await sleep(250);
        x = await post(i, '/tools/compute', a.api_key, body, { 'idempotency-key': key });
      }
      answers.push(x);
    }
    expect(count(answers, 200)).toBe(30);
    const jobs = new Set(answers.map((x) => x.body?.job_id ?? x.jobId));
    expect(jobs.size).toBe(1);
    expect(await charges(a.account_id)).toBe(1);
    expect(await credits(a.account_id)).toBe(10_000 - PRICE);
  });

  it('a revoked sub-key is refused by both APIs at once', async () => {
    const a = await admin.createAccount('pro', 10_000);
    await admin.setAccount(a.account_id, { plan: 'enterprise', rpm: 100_000, maxInFlight: 1_000 });
    const sub = await post(0, '/subkeys/create', a.api_key, { name: 'soon-gone', monthly_limit: 1_000, allowed_tools: ['compute'] });
    expect(sub.status).toBe(201);
    const subKey = sub.body!.api_key as string;
    // Both APIs have the key in their caches.
    expect((await post(0, '/tools/compute', subKey, { expression: '1 + 1' })).status).toBe(200);
    expect((await post(1, '/tools/compute', subKey, { expression: '1 + 1' })).status).toBe(200);
    const del = await fetch(`${bases[0]}/subkeys/${sub.body!.key_id}`, { method: 'DELETE', headers: { authorization: `Bearer ${a.api_key}` } });
    expect(del.status).toBe(200);
    // The other API heard it over pub/sub (on the cluster): its next call is refused.
    const end = Date.now() + 1_000;
    let status = 0;
    while (Date.now() < end && (status = (await post(1, '/tools/compute', subKey, { expression: '1 + 1' })).status) !== 401) await sleep(50);
    expect(status).toBe(401);
    expect((await post(0, '/tools/compute', subKey, { expression: '1 + 1' })).status).toBe(401);
  });

  it('chains and parallel requests across family queues run as flows on the cluster, from either API', async () => {
    const a = await admin.createAccount('pro', 1_000);
    const root = (i: number, body: unknown, headers: Record<string, string> = {}) => post(i, '/', a.api_key, body, headers);
    // compute runs on the core queue, beacon_scan on the text queue: one flow over two queues.
    const chain = await root(0, { chain: ['compute', 'beacon_scan'], q: '6 * 7' });
    expect(chain.status).toBe(200);
    expect(chain.body!.steps.map((x: { tool: string }) => x.tool)).toEqual(['compute', 'beacon_scan']);
    expect(chain.body!.cost_cents).toBe(PRICE + 1);
    const parallel = await root(1, { parallel: ['compute', 'beacon_scan'], q: '6 * 7' });
    expect(parallel.status).toBe(200);
    expect(Object.keys(parallel.body!.results)).toEqual(['compute', 'beacon_scan']);
    // Queued on one API, read from the other.
    const queued = await root(0, { parallel: ['compute', 'beacon_scan'], q: '2 + 2' }, { prefer: 'respond-async' });
    expect(queued.status).toBe(202);
    const id = (queued.body!.job_id ?? queued.jobId) as string;
    let done: Record<string, any> | null = null;
    let last = '';
    // Once a second for 30 s: the account's plan allows 60 requests a minute, GETs included.
    for (let t = 0; t < 30 && done?.status !== 'completed'; t++) {
      await sleep(1_000);
      const g = await fetch(`${bases[1]}/jobs/${id}`, { headers: { authorization: `Bearer ${a.api_key}` } });
      const text = await g.text();
      last = `${g.status} ${text.slice(0, 300)}`;
      done = g.status === 200 ? (JSON.parse(text) as Record<string, any>) : null;
    }
    expect(done?.status, last).toBe('completed');
    expect(await credits(a.account_id)).toBe(1_000 - 3 * (PRICE + 1));
    expect(await charges(a.account_id)).toBe(6);
  });

  it('a primary killed mid-load (its replica takes over) loses no money', async () => {
    // The primary with the queues: every call goes through it. One of the accounts keeps its money
    // state there too, the others elsewhere.
    const victim = cluster.primaryOf(`${queuePrefix(PREFIX)}:core:wait`);
    const accts: Array<Awaited<ReturnType<AdminService['createAccount']>>> = [];
    let onVictim = false;
    while (accts.length < 3) {
      const a = await admin.createAccount('pro', 10_000);
      const here = cluster.primaryOf(money.availKey(a.account_id)) === victim;
      if (accts.length < 2 ? here === (accts.length === 0) : true) accts.push(a);
      onVictim ||= here && accts.includes(a);
    }
    expect(onVictim).toBe(true);
    for (const a of accts) await admin.setAccount(a.account_id, { plan: 'enterprise', rpm: 100_000, maxInFlight: 1_000 });
    const CALLS = 150;
    const t0 = Date.now();
    const outcomes: Array<{ account: number; status: number; jobId?: string; cost?: number }> = [];
    let next = 0;
    let killed: Promise<void> | null = null;
    await Promise.all(
      Array.from({ length: 12 }, async () => {
        while (next < CALLS) {
          const i = next++;
          if (i === 40) killed = cluster.kill(victim);
          const account = i % accts.length;
          const apiKey = accts[account]!.api_key;
          let r: Answer;
          try {
            r = await post(i, '/tools/compute', apiKey, { expression: `${i} + 1` });
          } catch {
            outcomes.push({ account, status: 0 });
            continue;
          }
          let jobId = r.body?.job_id ?? r.jobId;
          // An answer that came back as a job is followed to its end, as a client would.
          if (r.status === 202 && jobId) {
            for (let t = 0; t < 120; t++) {
              const g = await fetch(`${bases[i % 2]}/jobs/${jobId}`, { headers: { authorization: `Bearer ${apiKey}` } }).catch(() => null);
              const b = g ? ((await g.json().catch(() => null)) as Record<string, any> | null) : null;
              if (g && (g.status !== 200 || b?.status === 'completed' || b?.status === 'failed')) {
                r = { status: g.status === 200 && b?.status === 'completed' ? 200 : g.status, body: b };
                break;
              }
              await sleep(500);
            }
          }
          jobId ??= r.body?.job_id;
          outcomes.push({ account, status: r.status, jobId, cost: r.body?.cost_cents });
        }
      }),
    );
    await killed;
    const loadMs = Date.now() - t0;
    await cluster.waitHealthy(60_000);
    await cluster.restart(victim);

    // Quiet: holds, in-flight slots and avail repaired by the reconciler (RECONCILE_SECONDS=1).
    const idle = async () => {
      let holds = 0;
      let slots = 0;
      let availOk = true;
      for (const a of accts) {
        holds += await redis.hlen(money.holdsKey(a.account_id));
        slots += await redis.zcard(inFlightKey(PREFIX, a.account_id));
        const avail = await redis.get(money.availKey(a.account_id));
        if (avail !== null && Number(avail) !== (await credits(a.account_id))) availOk = false;
      }
      return { holds, slots, availOk };
    };
    let s = await idle().catch(() => ({ holds: -1, slots: -1, availOk: false }));
    for (let t = 0; t < 360 && (s.holds || s.slots || !s.availOk); t++) {
      await sleep(500);
      s = await idle().catch(() => ({ holds: -1, slots: -1, availOk: false }));
    }
    expect(s).toEqual({ holds: 0, slots: 0, availOk: true });
    const quietMs = Date.now() - t0 - loadMs;

    let ok = 0;
    for (const [n, a] of accts.entries()) {
      const spent = 10_000 - (await credits(a.account_id));
      const c = new pg.Client({ connectionString: dbUrl });
      await c.connect();
      const { rows } = await c.query(`SELECT entry_key, delta_cents::int AS d FROM ledger WHERE account_id = $1 AND kind = 'charge'`, [a.account_id]);
      await c.end();
      // Credits spent are exactly the ledger's charges, one per job.
      expect(spent).toBe(-rows.reduce((sum, r) => sum + r.d, 0));
      expect(new Set(rows.map((r) => r.entry_key)).size).toBe(rows.length);
      // Every 200 was charged, at the price; every charge is retrievable by whoever paid it.
      const charged = new Set(rows.map((r) => r.entry_key as string));
      for (const o of outcomes.filter((x) => x.account === n && x.status === 200)) {
        expect(charged.has(o.jobId!)).toBe(true);
        expect(o.cost).toBe(PRICE);
        ok++;
      }
      for (const jobId of charged) {
        const g = await fetch(`${bases[0]}/jobs/${jobId}`, { headers: { authorization: `Bearer ${a.api_key}` } });
        expect(g.status).toBe(200);
        expect(((await g.json()) as { status: string }).status).toBe('completed');
      }
    }
    process.stdout.write(
      `\nprimary killed mid-load: ${CALLS} sent, ${ok} answered 200, ` +
        `${
          outcomes
            .filter((o) => o.status !== 200)
            .map((o) => o.status)
            .join(',') || 'no other answers'
        }; holds ${s.holds}, slots ${s.slots}, avail = credits ${s.availOk}; ` +
        `load ${(loadMs / 1000).toFixed(1)} s, quiet again ${(quietMs / 1000).toFixed(1)} s later\n`,
    );
    // What the failover did to callers is a 503 with Retry-After (uncharged), never an internal error.
    expect(outcomes.filter((o) => o.status >= 500 && o.status !== 503)).toEqual([]);
    // Most calls still succeeded: the cluster carried on around the failover.
    expect(ok).toBeGreaterThan(CALLS / 2);
  }, 300_000);
});
