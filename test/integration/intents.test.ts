import { createHash } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { startHarness, json, type Harness, type TestAccount } from '../helpers/harness.js';
import { sql } from '../../src/db/pool.js';
import { connectRedis, deleteByPrefix, type Redis } from '../../src/queue/redis.js';
import { lostChannel } from '../../src/queue/call-job.js';
import { Queue } from 'bullmq';
import { queuePrefix } from '../../src/queue/keyspace.js';
import { queueName } from '../../src/queue/queues.js';
import { IntentReconciler, type IntentReport } from '../../src/calls/intents.js';
import { defineTool } from '../../src/tools/types.js';
import { findTool, registerTool } from '../../src/tools/index.js';
import { AppError } from '../../src/errors.js';

/** Test-only: answers 503 service_unavailable (as a run whose settlement cannot reach Postgres) while `unavailable`. Paid. */
let unavailable = false;
if (!findTool('test_unavailable_once'))
  registerTool(
    defineTool({
      name: 'test_unavailable_once',
      description: 'Test only: 503 while the test says so, else answers',
      tier: 'free',
      priceCents: 2,
      family: 'core',
      input: z.object({ n: z.number() }),
      qField: '',
      output: '{n}',
      examples: [{ n: 1 }],
      handler: async ({ n }) => {
        if (unavailable) throw new AppError('service_unavailable', 'The service cannot reach its data stores right now; nothing was charged. Retry shortly.');
        return { n };
      },
    }),
  );

/**
 * Job intents (src/calls/intents.ts): every key's job is recorded in Postgres before it is queued; a job
 * Redis then loses is marked lost (410 job_lost, never 404), its hold given back, a waiting caller told,
 * and a keyed retry runs once. Redis losing its data is this deployment's keys deleted (its prefix).
 */

const GRACE_MS = 1_000;
const env = { INTENT_GRACE_MS: String(GRACE_MS), RECONCILE_SECONDS: '0' };

let api: Harness;
let acct: TestAccount;

const auth = (a: TestAccount) => ({ authorization: `Bearer ${a.apiKey}` });
const IntentRow = z.object({
  id: z.string(),
  state: z.string(),
  key_id: z.string().nullable(),
  tool: z.string(),
  digest: z.instanceof(Buffer),
  idem: z.instanceof(Buffer).nullable(),
  root_id: z.string().nullable(),
});

async function intent(h: Harness, jobId: string) {
  return h.container.pool.maybeOne(sql.type(IntentRow)`SELECT id, state, key_id, tool, digest, idem, root_id FROM job_intents WHERE id = ${jobId}`);
}

async function charges(h: Harness, accountId: string): Promise<number> {
  return h.ledgerCharges(accountId);
}

/** One reconciler pass of `h`'s deployment (waiting out a pass its marker watch may be running). */
async function pass(h: Harness): Promise<IntentReport> {
  for (;;) {
    const r = await h.container.intents.runOnce();
    if (r.ran) return r;
    await sleep(50);
  }
}

/** Redis loses this deployment's data. */
async function loseRedis(h: Harness): Promise<void> {
  const r = connectRedis(h.config.REDIS_URL);
  await deleteByPrefix(r, h.config.REDIS_PREFIX);
  await r.quit();
}

function getJob(h: Harness, a: TestAccount, jobId: string) {
  return h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: auth(a) });
}

beforeAll(async () => {
  // The API alone: nothing runs until a worker process for the same deployment starts.
  api = await startHarness(env, { workers: [] });
  acct = await api.account('pro', 1_000);
});

afterAll(async () => {
  await api?.close();
});

describe('job intents', () => {
  it('are committed before the job is queued, with the key, tool and digest of the input', async () => {
    const seen: Array<Awaited<ReturnType<typeof intent>>> = [];
    const queues = api.container.queues;
    const add = queues.add.bind(queues);
    queues.add = async (family, jobId, data) => {
      seen.push(await intent(api, jobId));
      return add(family, jobId, data);
    };
    try {
      const res = await api.call('compute', { expression: '6*7' }, acct.apiKey, { prefer: 'respond-async' });
      expect(res.statusCode).toBe(202);
      const { job_id } = json(res);
      expect(seen).toHaveLength(1);
      expect(seen[0]).toMatchObject({ id: job_id, state: 'accepted', key_id: acct.keyId, tool: 'compute', idem: null, root_id: null });
      expect(seen[0]!.digest).toEqual(createHash('sha256').update('compute\n{"expression":"6*7"}').digest());
    } finally {
      queues.add = add;
    }
  });

  it('record the Idempotency-Key and fingerprint of a keyed request, and the root of chain steps', async () => {
    const res = await api.call('compute', { expression: '1+1' }, acct.apiKey, { prefer: 'respond-async', 'idempotency-key': 'intent-fp' });
    const row = await intent(api, json(res).job_id);
    expect(row!.idem).toEqual(createHash('sha256').update(`${acct.keyId}\nintent-fp`).digest());
    expect(row!.digest.toString('hex')).toMatch(/^[0-9a-f]{64}$/);
    const chain = await api.request({
      method: 'POST',
      url: '/',
      headers: { ...auth(acct), prefer: 'respond-async' },
      payload: { chain: ['compute', 'compute'], q: '2+2' },
    });
    expect(chain.statusCode).toBe(202);
    const root = json(chain).job_id;
    const steps = await api.container.pool.any(sql.type(z.object({ id: z.string(), root_id: z.string().nullable() }))`
      SELECT id, root_id FROM job_intents WHERE root_id = ${root}`);
    expect(steps).toHaveLength(2);
    expect(steps.map((s) => s.id)).toContain(root);
  });

  it('a failed intent write admits nothing: 503, the hold and slot given back', async () => {
    const a = await api.account('pro', 100);
    const writer = (api.container.api!.calls as unknown as { deps: { intents: { writer: { record: (rows: unknown[]) => Promise<void> } } } }).deps.intents
      .writer;
    const record = writer.record.bind(writer);
    writer.record = () => Promise.reject(new Error('connection terminated'));
    try {
      const res = await api.call('compute', { expression: '1' }, a.apiKey, { prefer: 'respond-async' });
      expect(res.statusCode).toBe(503);
      expect(json(res).error.code).toBe('service_unavailable');
    } finally {
      writer.record = record;
    }
    expect(await api.container.credits.available(a.accountId)).toBe(100);
    const snap = await api.container.credits.snapshot(a.accountId);
    expect(snap.holds).toHaveLength(0);
    // Its slot went back too: a free account's two slots both still take a job.
    const free = await api.account('pro', 100, { maxInFlight: 2 });
    writer.record = () => Promise.reject(new Error('connection terminated'));
    try {
      for (let i = 0; i < 3; i++) expect((await api.call('compute', { expression: '1' }, free.apiKey, { prefer: 'respond-async' })).statusCode).toBe(503);
    } finally {
      writer.record = record;
    }
    for (let i = 0; i < 2; i++) expect((await api.call('compute', { expression: '1' }, free.apiKey, { prefer: 'respond-async' })).statusCode).toBe(202);
  });

  it('a job waiting in the queue past the grace period is not lost', async () => {
    const res = await api.call('compute', { expression: '3*3' }, acct.apiKey, { prefer: 'respond-async' });
    expect(res.statusCode, res.body).toBe(202);
    const jobId = json(res).job_id;
    await sleep(GRACE_MS + 200);
    const report = await pass(api);
    expect(report.pending).toBeGreaterThanOrEqual(1);
    expect((await intent(api, jobId))!.state).toBe('accepted');
    const got = await getJob(api, acct, jobId);
    expect(got.statusCode).toBe(200);
    expect(json(got).status).toBe('queued');
    // The watermark stays before it, so the next pass looks at it again.
    const through = await api.container.pool.oneFirst(sql.type(z.object({ ok: z.boolean() }))`
      SELECT w.through <= i.created_at AS ok FROM job_intents_watermark w, job_intents i WHERE i.id = ${jobId} AND w.deployment = i.deployment`);
    expect(through).toBe(true);
  });

  it('after Redis lost its data: every accepted job is lost (410, never 404), a waiting caller is told, the money is whole', async () => {
    const a = await api.account('pro', 500);
    const plain = json(await api.call('compute', { expression: '2' }, a.apiKey, { prefer: 'respond-async' })).job_id as string;
    const keyed = await api.call('compute', { expression: '3' }, a.apiKey, { prefer: 'respond-async', 'idempotency-key': 'lost-once' });
    const keyedId = json(keyed).job_id as string;
    const chainId = json(
      await api.request({ method: 'POST', url: '/', headers: { ...auth(a), prefer: 'respond-async' }, payload: { chain: ['compute', 'compute'], q: '5' } }),
    ).job_id as string;
    const parallelId = json(
      await api.request({ method: 'POST', url: '/', headers: { ...auth(a), prefer: 'respond-async' }, payload: { parallel: ['compute', 'compute'], q: '7' } }),
    ).job_id as string;
    // A sync caller waiting (SYNC_TIMEOUT_MS is 30 s): it hears of the loss from the reconciler.
    const started = Date.now();
    const waiting = api.call('compute', { expression: '4' }, a.apiKey);
    await sleep(GRACE_MS + 300);
    expect(await api.container.credits.available(a.accountId)).toBe(500 - 7 * 2);

    await loseRedis(api);
    const lostMessages: string[] = [];
    const sub: Redis = connectRedis(api.config.REDIS_URL);
    sub.on('message', (_c: string, id: string) => lostMessages.push(id));
    await sub.subscribe(lostChannel(api.config.REDIS_PREFIX));
    const report = await pass(api);
    expect(report.lost).toBeGreaterThanOrEqual(7);

    const sync = await waiting;
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(sync.statusCode).toBe(410);
    expect(json(sync).error).toMatchObject({ code: 'job_lost', status: 'lost' });
    expect(sync.headers['x-job-id']).toBe(json(sync).error.job_id);

    for (const id of [plain, keyedId, chainId, parallelId]) {
      const got = await getJob(api, a, id);
      expect(got.statusCode, id).toBe(410);
      expect(json(got).error).toMatchObject({ code: 'job_lost', job_id: id, status: 'lost' });
      expect(json(got).error.message).toMatch(/Idempotency-Key/);
      // Another key still gets 404: a lost job tells nothing of other keys' jobs.
      expect((await getJob(api, acct, id)).statusCode).toBe(404);
    }
    // Its event stream is refused the same way: 410, not 404 (and 404 for another key).
    const events = (who: TestAccount) => api.request({ method: 'GET', url: `/jobs/${plain}/events`, headers: { ...auth(who), accept: 'text/event-stream' } });
    const stream = await events(a);
    expect(stream.statusCode, stream.body).toBe(410);
    expect(json(stream).error).toMatchObject({ code: 'job_lost', job_id: plain });
    expect((await events(acct)).statusCode).toBe(404);
    expect(lostMessages).toContain(plain);
    await sub.quit();
    // Nothing charged, nothing held: Redis's avail (reloaded) is Postgres's balance.
    expect(await charges(api, a.accountId)).toBe(0);
    expect(await api.credits(a.accountId)).toBe(500);
    expect((await api.container.credits.snapshot(a.accountId)).holds).toHaveLength(0);
    expect(await api.container.credits.available(a.accountId)).toBe(500);

    // A keyed retry of the lost job runs, once, even when two race; a third is its replay.
    const workers = await startHarness({ ...env, REDIS_PREFIX: api.config.REDIS_PREFIX }, { workers: ['core'] });
    try {
      const retry = () => api.call('compute', { expression: '3' }, a.apiKey, { 'idempotency-key': 'lost-once' });
      const [r1, r2] = await Promise.all([retry(), retry()]);
      const statuses = [r1.statusCode, r2.statusCode].sort();
      expect(statuses[0]).toBe(200);
      expect([200, 409]).toContain(statuses[1]);
      const done = r1.statusCode === 200 ? r1 : r2;
      expect(json(done)).toMatchObject({ result: { value: 3 }, cost_cents: 2 });
      expect(done.headers['x-job-id']).not.toBe(keyedId);
      const again = await retry();
      expect(again.statusCode).toBe(200);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.headers['x-job-id']).toBe(done.headers['x-job-id']);
      expect(await charges(api, a.accountId)).toBe(1);

      // A keyed call that completed before a loss is answered from its stored result, not run again.
      const first = await api.call('compute', { expression: '8' }, a.apiKey, { 'idempotency-key': 'done-before' });
      expect(first.statusCode).toBe(200);
      await loseRedis(api);
      await api.container.intents.checkMarker();
      const replay = await api.call('compute', { expression: '8' }, a.apiKey, { 'idempotency-key': 'done-before' });
      expect(replay.statusCode).toBe(200);
      expect(replay.headers['x-job-id']).toBe(first.headers['x-job-id']);
      expect(json(replay)).toMatchObject({ result: { value: 8 }, cost_cents: 2 });
      expect(await charges(api, a.accountId)).toBe(2);
      // The same key with another body is still refused.
      const other = await api.call('compute', { expression: '9' }, a.apiKey, { 'idempotency-key': 'done-before' });
      expect(other.statusCode).toBe(422);
      expect(json(other).error.code).toBe('idempotency_key_reused');
    } finally {
      await workers.close();
    }
  });

  it('without any Redis loss, a keyed 202 whose job never reached the queue is retried for real once the job is found lost', async () => {
    // The chaos row 'API SIGKILL and restart': the API died between a keyed job's intent and its
    // queueing; a retry found the intent still young and answered 202 for it, which the key kept. Once
    // the job was marked lost, every retry replayed that 202, pointing at a job answering 410.
    const a = await api.account('pro', 100);
    // A deployment whose Redis has held its data for two days: claims are not suspected lost.
    const r = connectRedis(api.config.REDIS_URL);
    await r.set(`${api.config.REDIS_PREFIX}:intents:since`, String(Date.now() - 2 * 86_400_000));
    await r.quit();
    await api.container.intents.checkMarker();
    expect(api.container.intents.mayHaveLostClaims()).toBe(false);
    const call = () => api.call('compute', { expression: '6' }, a.apiKey, { prefer: 'respond-async', 'idempotency-key': 'never-queued' });
    const first = await call();
    expect(first.statusCode, first.body).toBe(202);
    const jobId = json(first).job_id as string;
    // The job leaves the queue without a trace, as if it had never been added.
    const q = new Queue(queueName('core'), { connection: connectRedis(api.config.REDIS_URL), prefix: queuePrefix(api.config.REDIS_PREFIX) });
    try {
      await (await q.getJob(jobId))!.remove();
    } finally {
      await q.close();
    }
    expect((await call()).statusCode).toBe(202); // replayed while the intent is young
    // Passes until the job is found lost (by this pass or one the harness runs in the background).
    for (const end = Date.now() + 15_000; (await intent(api, jobId))!.state !== 'lost' && Date.now() < end; ) {
      await sleep(GRACE_MS + 200);
      await pass(api);
    }
    expect((await intent(api, jobId))!.state).toBe('lost');
    expect((await getJob(api, a, jobId)).statusCode).toBe(410);
    const workers = await startHarness({ ...env, REDIS_PREFIX: api.config.REDIS_PREFIX }, { workers: ['core'] });
    try {
      const retry = await api.call('compute', { expression: '6' }, a.apiKey, { 'idempotency-key': 'never-queued' });
      // The stored 202 is not replayed: this retry runs a new job (synchronously, as it asked).
      expect(retry.statusCode, retry.body).toBe(200);
      expect(retry.headers['x-job-id']).not.toBe(jobId);
      expect(json(retry)).toMatchObject({ result: { value: 6 }, cost_cents: 2 });
      const again = await api.call('compute', { expression: '6' }, a.apiKey, { 'idempotency-key': 'never-queued' });
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.headers['x-job-id']).toBe(retry.headers['x-job-id']);
      expect(await charges(api, a.accountId)).toBe(1);
    } finally {
      await workers.close();
    }
  });

  it('after a loss, a keyed retry of a job that failed with a retryable 5xx runs again, not replays the failure', async () => {
    // The chaos row 'Postgres connections terminated' after 'Redis SHUTDOWN NOSAVE': a keyed job whose
    // settlements all failed ended 503; every retry of its key then found the job through the intents
    // and answered its 503 again, for the day the loss is remembered.
    const a = await api.account('pro', 100);
    await loseRedis(api);
    await api.container.intents.checkMarker();
    const workers = await startHarness({ ...env, REDIS_PREFIX: api.config.REDIS_PREFIX }, { workers: ['core'] });
    try {
      const call = () => api.call('test_unavailable_once', { n: 5 }, a.apiKey, { 'idempotency-key': 'retry-after-503' });
      unavailable = true;
      const first = await call();
      expect(first.statusCode, first.body).toBe(503);
      const failedJob = first.headers['x-job-id'] as string;
      expect(failedJob).toBeTruthy();
      unavailable = false;
      const retry = await call();
      expect(retry.statusCode, retry.body).toBe(200);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(retry.headers['x-job-id']).not.toBe(failedJob);
      expect(json(retry)).toMatchObject({ result: { n: 5 }, cost_cents: 2 });
      // Once answered, the key keeps the answer: a further retry is its replay, charged once in all.
      const again = await call();
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.headers['x-job-id']).toBe(retry.headers['x-job-id']);
      expect(await charges(api, a.accountId)).toBe(1);
    } finally {
      unavailable = false;
      await workers.close();
    }
  });

  it('two reconcilers racing mark each job lost once', async () => {
    const a = await api.account('pro', 100);
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push(json(await api.call('compute', { expression: String(i) }, a.apiKey, { prefer: 'respond-async' })).job_id);
    await loseRedis(api);
    const c = api.container;
    const make = () =>
      new IntentReconciler({
        pool: c.pool,
        redis: c.redis,
        prefix: api.config.REDIS_PREFIX,
        log: c.log,
        records: c.records,
        credits: c.credits,
        slots: c.slots,
        graceMs: GRACE_MS,
        intervalSeconds: 0,
        days: 7,
      });
    type Marks = { markLost(ids: string[]): Promise<number> };
    const [one, two] = [make() as unknown as Marks, make() as unknown as Marks];
    const counts = await Promise.all([one.markLost(ids), two.markLost(ids), one.markLost(ids)]);
    expect(counts.reduce((s, n) => s + n, 0)).toBe(5);
    const states = await c.pool.any(sql.type(z.object({ state: z.string() }))`SELECT state FROM job_intents WHERE id = ANY(${sql.array(ids, 'text')})`);
    expect(states.map((s) => s.state)).toEqual(Array(5).fill('lost'));
    // A job whose outcome is stored is never marked lost.
    const kept = json(await api.call('compute', { expression: '1' }, a.apiKey, { prefer: 'respond-async' })).job_id as string;
    await c.pool.query(sql.unsafe`
      INSERT INTO job_results (job_id, account_id, key_id, tool, status, body, created_at)
      VALUES (${kept}, ${a.accountId}, ${a.keyId}, 'compute', 'failed', '{"code":"timeout","message":"x"}', now())`);
    expect(await one.markLost([kept])).toBe(0);
    expect((await intent(api, kept))!.state).toBe('accepted');
  });
});
