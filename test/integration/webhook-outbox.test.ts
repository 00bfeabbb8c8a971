import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import pg from 'pg';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { dueClaim } from '../../src/calls/webhooks.js';
import { loadConfig } from '../../src/config.js';
import { createContainer, type Container } from '../../src/container.js';
import { sql } from '../../src/db/pool.js';
import { Settler, type Settlement } from '../../src/money/settlement.js';
import { dropDatabase, freshDatabase } from '../chaos/rig.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { until } from '../helpers/wait.js';

/**
 * The webhook outbox (migrations/019_webhook_outbox.sql, src/calls/webhooks.ts): a delivery's row
 * commits or rolls back with the settlement it reports, a job settled twice has one row and one
 * webhook-id, relays sharing a database send each row once, and a relay killed mid-delivery leaves its
 * rows to the next one. The relays under test run under scopes of their own, so the harness's relay
 * (and other files' on the shared database) never take their rows.
 */

interface Got {
  path: string;
  id: string;
}

let h: Harness;
let server: Server;
let base: string;
let acct: TestAccount;
const got: Got[] = [];
/** `/hold/...` requests not answered yet (a relay killed meanwhile drops their connections). */
const held: ServerResponse[] = [];
/** While set, `/hold/...` answers 200 to this many requests, then holds the rest. */
let answerFirst = Number.POSITIVE_INFINITY;
let answeredHold = 0;
const edgeKey = randomBytes(32).toString('hex');

beforeAll(async () => {
  server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const path = req.url ?? '/';
      got.push({ path, id: String(req.headers['webhook-id']) });
      if (path.startsWith('/hold/') && answeredHold >= answerFirst) {
        held.push(res);
        return;
      }
      if (path.startsWith('/hold/')) answeredHold++;
      // A little slower than instant, so concurrent relays overlap.
      setTimeout(() => res.end('ok'), 20);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  base = `http://127.0.0.1:${port}`;
  h = await startHarness(
    { WEBHOOK_ALLOWED_HOSTS: `127.0.0.1:${port}`, EDGE_TOKEN_KEY: edgeKey, WEBHOOK_TIMEOUT_MS: '3000', WEBHOOK_BACKOFF_MS: '200' },
    { workers: ['core'] },
  );
  acct = await h.account('pro', 1000);
});

afterAll(async () => {
  for (const res of held) res.destroy();
  await h?.close();
  await new Promise((r) => server?.close(r));
});

const OutboxRow = z.object({
  job_id: z.string(),
  scope: z.string(),
  delivery_id: z.string(),
  attempts: z.number(),
  done: z.boolean(),
  delivered: z.boolean(),
});

function rows(jobIds: string[]) {
  return h.container.pool.any(sql.type(OutboxRow)`
    SELECT job_id, scope, delivery_id, attempts, done_at IS NOT NULL AS done, delivered_at IS NOT NULL AS delivered
    FROM webhook_jobs WHERE job_id = ANY(${sql.array(jobIds, 'text')}) ORDER BY job_id`);
}

/** `n` account events already in the outbox of `scope`, due now, each POSTed to `path`. */
async function eventRows(scope: string, n: number, path: string): Promise<Array<{ jobId: string; deliveryId: string }>> {
  const made = Array.from({ length: n }, (_, i) => {
    const id = randomUUID();
    return { job_id: `evt_${id}`, delivery_id: `evt_${id}`, i };
  });
  await h.container.pool.query(sql.unsafe`
    INSERT INTO webhook_jobs (job_id, account_id, url, body, scope, delivery_id, event)
    SELECT x.job_id, ${acct.accountId}, ${`${base}${path}`}, jsonb_build_object('type', 'test.outbox', 'data', jsonb_build_object('i', x.i)),
      ${scope}, x.delivery_id, 'test.outbox'
    FROM jsonb_to_recordset(${sql.jsonb(made)}) AS x(job_id text, delivery_id text, i int)`);
  return made.map((m) => ({ jobId: m.job_id, deliveryId: m.delivery_id }));
}

/** How often each webhook-id arrived at paths starting with `prefix`. */
function counts(prefix: string): Map<string, number> {
  const m = new Map<string, number>();
  for (const g of got) if (g.path.startsWith(prefix)) m.set(g.id, (m.get(g.id) ?? 0) + 1);
  return m;
}

/** A container running only the relay of `scope` (what a worker process runs), in this process. */
async function relayIn(scope: string): Promise<Container> {
  const config = loadConfig({}, { ...process.env, ...relayEnv(scope) });
  const c = await createContainer(config, pino({ level: 'warn' }), { api: false, workerFamilies: [] });
  c.webhooks!.start();
  return c;
}

function relayEnv(scope: string): Record<string, string> {
  return {
    DATABASE_URL: h.config.DATABASE_URL,
    REDIS_URL: h.config.REDIS_URL,
    REDIS_PREFIX: scope,
    EDGE_TOKEN_KEY: edgeKey,
    WEBHOOK_ALLOWED_HOSTS: h.config.WEBHOOK_ALLOWED_HOSTS.join(','),
    WEBHOOK_TIMEOUT_MS: '3000',
    LOG_LEVEL: 'warn',
  };
}

describe('the webhook outbox', () => {
  it('a call with a Callback-Url: its row is written by settlement under the deployment’s scope, and its webhook-id is the row’s', async () => {
    const res = await h.call('compute', { expression: '2 + 2' }, acct.apiKey, { prefer: 'respond-async', 'callback-url': `${base}/call/1` });
    expect(res.statusCode).toBe(202);
    const jobId = json(res).job_id as string;
    const delivery = await until('the delivery', () => got.find((g) => g.path === '/call/1'));
    const [row] = await until('the row done', async () => ((await rows([jobId]))[0]?.done ? rows([jobId]) : undefined));
    expect(row).toMatchObject({ scope: h.config.REDIS_PREFIX, delivery_id: delivery.id, attempts: 1, done: true, delivered: true });
    expect(delivery.id).toMatch(/^dlv_/);
    const plain = await h.call('compute', { expression: '3 + 3' }, acct.apiKey, { prefer: 'respond-async' });
    const plainId = json(plain).job_id as string;
    await until('the plain job settled', async () => (await h.container.results.get(plainId)) ?? undefined);
    expect(await rows([plainId])).toEqual([]);
  });

  it('commits and rolls back with the settlement: a failed statement leaves neither charge nor row; settled twice, one row and one charge', async () => {
    const pool = new pg.Pool({ connectionString: h.config.DATABASE_URL, max: 2 });
    const settler = new Settler(pool, h.container.credits, pino({ level: 'silent' }), 0, 10);
    const scope = `outbox-${randomBytes(4).toString('hex')}`;
    settler.outbox = { scope, wake: () => {} };
    const entry = (jobId: string, over: Partial<Settlement> = {}): Settlement => ({
      jobId,
      accountId: acct.accountId,
      keyId: null,
      tool: 'compute',
      status: 'completed',
      amount: 2,
      costCents: 2,
      result: { value: 1 },
      sandbox: false,
      agentName: null,
      usage: null,
      createdAt: null,
      holdId: null,
      callbackUrl: `${base}/never`,
      ...over,
    });
    const charges = (jobId: string) =>
      h.container.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM ledger WHERE entry_key = ${jobId}`);
    const stored = (jobId: string) =>
      h.container.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM job_results WHERE job_id = ${jobId}`);
    const before = await h.credits(acct.accountId);
    try {
      // The outbox insert fails: the charge and the stored answer go with it.
      const refused = `core-${randomUUID()}`;
      // Only this job id is refused (other files share the table meanwhile); the id is a UUID made here.
      const fn = `refuse_outbox_${randomBytes(4).toString('hex')}`;
      await pool.query(`CREATE FUNCTION ${fn}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.job_id = '${refused}' THEN RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$`);
      await pool.query(`CREATE TRIGGER ${fn} BEFORE INSERT ON webhook_jobs FOR EACH ROW EXECUTE FUNCTION ${fn}()`);
      try {
        await expect(settler.settle(entry(refused))).rejects.toThrow(/refused by the test/);
      } finally {
        await pool.query(`DROP TRIGGER ${fn} ON webhook_jobs`);
        await pool.query(`DROP FUNCTION ${fn}()`);
      }
      expect([await charges(refused), await stored(refused), (await rows([refused])).length]).toEqual([0, 0, 0]);

      // The settlement fails (an account that does not exist): no outbox row either.
      const orphan = `core-${randomUUID()}`;
      await expect(settler.settle(entry(orphan, { accountId: randomUUID() }))).rejects.toThrow();
      expect(await rows([orphan])).toEqual([]);
      expect(await h.credits(acct.accountId)).toBe(before);

      // Settled, then settled again (a redelivery): one charge, one row, one webhook-id.
      const jobId = `core-${randomUUID()}`;
      expect((await settler.settle(entry(jobId))).stored).toBe(true);
      const [first] = await rows([jobId]);
      expect(first).toMatchObject({ scope, attempts: 0, done: false });
      expect(first!.delivery_id).toMatch(/^dlv_/);
      expect((await settler.settle(entry(jobId))).stored).toBe(false);
      expect(await rows([jobId])).toEqual([first]);
      expect(await charges(jobId)).toBe(1);
      expect(await h.credits(acct.accountId)).toBe(before - 2);

      // Without a callback: the plain statement, no row.
      const plain = `core-${randomUUID()}`;
      await settler.settle(entry(plain, { callbackUrl: undefined }));
      expect([await stored(plain), (await rows([plain])).length]).toEqual([1, 0]);
      await h.container.pool.query(sql.unsafe`DELETE FROM webhook_jobs WHERE scope = ${scope}`);
    } finally {
      await pool.end();
    }
  });

  it('the relay’s claim uses webhook_jobs_due on an empty, never-analysed table', async () => {
    const db = await freshDatabase(h.config.DATABASE_URL, 'outbox');
    const client = new pg.Client({ connectionString: db });
    await client.connect();
    try {
      const q = dueClaim('tollgate', 16, 10_000);
      await client.query(`PREPARE claim AS ${q.sql.replace(/\$slonik_(\d+)/g, '$$$1')}`);
      const args = q.values.map((v) => (typeof v === 'string' ? `'${v}'` : String(v))).join(', ');
      // The plan for these values, and the generic one a prepared statement may settle on.
      for (const mode of ['force_custom_plan', 'force_generic_plan']) {
        await client.query(`SET plan_cache_mode = ${mode}`);
        const plan = (await client.query(`EXPLAIN EXECUTE claim(${args})`)).rows.map((r: { 'QUERY PLAN': string }) => r['QUERY PLAN']).join('\n');
        expect(plan, mode).toMatch(/Index Scan using webhook_jobs_due/);
        expect(plan, mode).not.toMatch(/Seq Scan/);
      }
    } finally {
      await client.end();
      await dropDatabase(db);
    }
  });

  it('two relays on one database send each of 60 rows once', async () => {
    const scope = `outbox-${randomBytes(4).toString('hex')}`;
    const made = await eventRows(scope, 60, '/two/');
    const [r1, r2] = await Promise.all([relayIn(scope), relayIn(scope)]);
    try {
      await until('60 rows done', async () => (await rows(made.map((m) => m.jobId))).every((r) => r.done) || undefined, 60_000);
    } finally {
      await Promise.all([r1.close(), r2.close()]);
    }
    const seen = counts('/two/');
    expect([...seen.keys()].sort()).toEqual(made.map((m) => m.deliveryId).sort());
    expect([...seen.values()].every((n) => n === 1)).toBe(true);
    const attempts = await h.container.pool.any(sql.type(z.object({ job_id: z.string(), n: z.number() }))`
      SELECT job_id, count(*)::int AS n FROM webhook_deliveries WHERE job_id = ANY(${sql.array(
        made.map((m) => m.jobId),
        'text',
      )}) GROUP BY job_id`);
    expect(attempts).toHaveLength(60);
    expect(attempts.every((a) => a.n === 1)).toBe(true);
  }, 90_000);

  it('a relay killed mid-delivery, then started again: each row delivered; only those in flight at the kill twice, with the same webhook-id', async () => {
    const scope = `outbox-${randomBytes(4).toString('hex')}`;
    const made = await eventRows(scope, 30, '/hold/');
    answeredHold = 0;
    answerFirst = 10;
    const start = () => {
      const p: ChildProcess = spawn(process.execPath, ['--import', 'tsx', 'test/helpers/outbox-relay.ts'], {
        env: { ...process.env, ...relayEnv(scope) },
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      return p;
    };
    const first = start();
    try {
      // Ten answered (and recorded), sixteen (the relay's concurrency) held open, four still due.
      await until('ten answered and sixteen held', () => answeredHold === 10 && held.length === 16, 60_000);
      await until('the ten recorded', async () => (await rows(made.map((m) => m.jobId))).filter((r) => r.done).length === 10 || undefined);
      first.kill('SIGKILL');
      await once(first, 'exit');
    } finally {
      first.kill('SIGKILL');
    }
    const inFlight = new Set(got.filter((g) => g.path.startsWith('/hold/')).map((g) => g.id));
    const answered = [...inFlight].slice(0, 10);
    for (const res of held.splice(0)) res.destroy();
    answerFirst = Number.POSITIVE_INFINITY;
    const second = start();
    try {
      await until('30 rows done', async () => (await rows(made.map((m) => m.jobId))).every((r) => r.done && r.delivered) || undefined, 60_000);
    } finally {
      second.kill('SIGTERM');
      if (second.exitCode === null) await once(second, 'exit');
    }
    const seen = counts('/hold/');
    expect([...seen.keys()].sort()).toEqual(made.map((m) => m.deliveryId).sort());
    for (const id of answered) expect(seen.get(id)).toBe(1);
    const twice = [...seen.entries()].filter(([, n]) => n === 2).map(([id]) => id);
    expect(twice).toHaveLength(16);
    expect([...seen.values()].every((n) => n === 1 || n === 2)).toBe(true);
    // A resent row's attempt counts the one that died: recorded as attempt 2, delivered.
    const recorded = await h.container.pool.any(sql.type(z.object({ delivery_id: z.string(), attempt: z.number(), ok: z.boolean() }))`
      SELECT delivery_id, attempt, ok FROM webhook_deliveries WHERE delivery_id = ANY(${sql.array(twice, 'text')})`);
    expect(recorded).toHaveLength(16);
    expect(recorded.every((r) => r.attempt === 2 && r.ok)).toBe(true);
  }, 120_000);
});
