import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool } from '../../src/tools/types.js';
import { AppError } from '../../src/errors.js';
import { findTool, registerTool } from '../../src/tools/index.js';
import { sql } from '../../src/db/pool.js';
import { deleteByPrefix } from '../../src/queue/redis.js';
import { JobFailure, type JobRun } from '../../src/calls/runner.js';
import type { CallJobData } from '../../src/queue/call-job.js';
import { json, startHarness, type Harness } from '../helpers/harness.js';

/** How often test_counted ran, by tag; `fail` makes its runs after the first fail for good. */
const runs = new Map<string, number>();
const testCounted = defineTool({
  name: 'test_counted',
  description: 'Test only: counts its runs',
  tier: 'free',
  priceCents: 3,
  family: 'core',
  input: z.object({ tag: z.string(), fail: z.boolean().default(false) }),
  qField: 'tag',
  output: '{tag, run}',
  examples: [{ tag: 'a' }],
  handler: async ({ tag, fail }) => {
    const n = (runs.get(tag) ?? 0) + 1;
    runs.set(tag, n);
    if (fail && n > 1) throw new AppError('tool_failed', 'the target went away');
    return { tag, run: n };
  },
});
/** Test only: returns `n` copies of `ch`, and (with `odd`) strings Postgres' jsonb refuses as they are. */
const testBig = defineTool({
  name: 'test_big',
  description: 'Test only: a result of a chosen size',
  tier: 'free',
  priceCents: 1,
  family: 'core',
  input: z.object({ n: z.number().int().min(0).max(1_000_000), ch: z.string().default('x'), odd: z.boolean().default(false) }),
  qField: 'ch',
  output: '{text}',
  examples: [{ n: 10 }],
  handler: async ({ n, ch, odd }) => ({ text: ch.repeat(n), ...(odd ? { nul: 'a\u0000b', lone: 'x\ud800y', literal: '\\u0000' } : {}) }),
});

const MAX = 2048;
const ResultRow = z.object({
  job_id: z.string(),
  key_id: z.string().nullable(),
  status: z.string(),
  cost_cents: z.number(),
  body: z.record(z.unknown()),
  truncated: z.boolean(),
});

describe('job results in Postgres', () => {
  let h: Harness;
  beforeAll(async () => {
    for (const t of [testCounted, testBig]) if (!findTool(t.name)) registerTool(t);
    h = await startHarness({ RESULT_MAX_BYTES: String(MAX) });
  });
  afterAll(() => h.close());

  const row = (jobId: string) =>
    h.container.pool.maybeOne(sql.type(ResultRow)`SELECT job_id, key_id, status, cost_cents, body, truncated FROM job_results WHERE job_id = ${jobId}`);
  const ledger = (jobId: string) =>
    h.container.pool.maybeOneFirst(sql.type(z.object({ d: z.number() }))`SELECT delta_cents AS d FROM ledger WHERE entry_key = ${jobId}`);
  const getJob = (id: string, apiKey: string) => h.request({ method: 'GET', url: `/jobs/${id}`, headers: { authorization: `Bearer ${apiKey}` } });
  const listJobs = (apiKey: string, query = '') => h.request({ method: 'GET', url: `/jobs${query}`, headers: { authorization: `Bearer ${apiKey}` } });
  /** Every Redis key of this service gone, as after a restart of a Redis without persistence. */
  const flushRedis = () => deleteByPrefix(h.container.redis, h.config.REDIS_PREFIX);

  it('a paid call stores its answer with its ledger row: same job id, same cost, the body the caller got', async () => {
    const acct = await h.account('pro', 100);
    const res = await h.call('compute', { expression: '6 * 7' }, acct.apiKey);
    expect(res.statusCode).toBe(200);
    const jobId = res.headers['x-job-id'] as string;
    const r = await row(jobId);
    expect(r).toMatchObject({ status: 'completed', cost_cents: 2, key_id: acct.keyId, truncated: false });
    expect(await ledger(jobId)).toBe(-2);
    expect(r!.body).toEqual(json(res));
    expect(json(res).remaining_credits).toBe(98);
  });

  it('free and sandbox calls made with a key are stored too, without a ledger row', async () => {
    const acct = await h.account('pro', 10);
    const sandbox = await h.key(acct.accountId, 'test');
    const free = await h.call('check_balance', {}, acct.apiKey);
    const sb = await h.call('compute', { expression: '1 + 1' }, sandbox.apiKey);
    expect([free.statusCode, sb.statusCode]).toEqual([200, 200]);
    for (const res of [free, sb]) {
      const jobId = res.headers['x-job-id'] as string;
      expect((await row(jobId))!.body).toEqual(json(res));
      expect(await ledger(jobId)).toBeNull();
    }
    expect(json(sb)).toMatchObject({ cost_cents: 0, sandbox: true, remaining_credits: 10 });
    expect(await h.credits(acct.accountId)).toBe(10);
  });

  it('after Redis lost every key, GET /jobs/{id} answers from Postgres for its key and 404 for another', async () => {
    const acct = await h.account('pro', 100);
    const other = await h.account('pro', 100);
    const res = await h.call('compute', { expression: '2 ^ 10' }, acct.apiKey);
    expect(res.statusCode).toBe(200);
    const jobId = res.headers['x-job-id'] as string;
    const counted = await h.call('test_counted', { tag: `flush-${jobId}` }, acct.apiKey);
    expect(counted.statusCode).toBe(200);

    await flushRedis();
    expect(await h.container.queues.getJob(jobId)).toBeNull();

    const got = await getJob(jobId, acct.apiKey);
    expect(got.statusCode).toBe(200);
    expect(json(got)).toEqual({ job_id: jobId, status: 'completed', ...json(res) });
    const foreign = await getJob(jobId, other.apiKey);
    expect(foreign.statusCode).toBe(404);
    expect(json(foreign).error.code).toBe('not_found');
    expect((await getJob('core-00000000-0000-0000-0000-000000000000', acct.apiKey)).statusCode).toBe(404);

    // The service keeps working on the emptied Redis: the balance is reloaded from Postgres.
    const again = await h.call('compute', { expression: '1 + 2' }, acct.apiKey);
    expect(again.statusCode).toBe(200);
    expect(json(again).remaining_credits).toBe(100 - 2 - 3 - 2);
  });

  it('a call that failed for good is stored as failed and GET /jobs/{id} answers with its error', async () => {
    const acct = await h.account('pro', 100);
    const res = await h.call('compute', { expression: 'nosuchsymbol + 1' }, acct.apiKey);
    expect(res.statusCode).toBeGreaterThanOrEqual(400);
    const jobId = res.headers['x-job-id'] as string;
    const r = await row(jobId);
    expect(r).toMatchObject({ status: 'failed', cost_cents: 0 });
    expect(r!.body.code).toBe(json(res).error.code);
    expect(await ledger(jobId)).toBeNull();
    await h.container.queues.getJob(jobId).then((j) => j?.remove());
    const got = await getJob(jobId, acct.apiKey);
    expect(got.statusCode).toBe(res.statusCode);
    expect(json(got).error).toMatchObject({ code: json(res).error.code, message: json(res).error.message, job_id: jobId });
  });

  it("GET /jobs lists the key's calls newest first, by pages, with filters; another key sees none of them", async () => {
    const acct = await h.account('pro', 1000);
    const second = await h.key(acct.accountId, 'production');
    const made: string[] = [];
    for (let i = 0; i < 5; i++) {
      const res = await h.call('compute', { expression: `${i} + 1` }, acct.apiKey);
      expect(res.statusCode).toBe(200);
      made.push(res.headers['x-job-id'] as string);
    }
    const bad = await h.call('compute', { expression: 'nosuchsymbol' }, acct.apiKey);
    made.push(bad.headers['x-job-id'] as string);
    const free = await h.call('check_balance', {}, acct.apiKey);
    made.push(free.headers['x-job-id'] as string);

    // Pages of 3, following next_cursor to the end.
    const seen: Array<Record<string, unknown>> = [];
    let cursor: string | null = null;
    let pages = 0;
    do {
      const res = await listJobs(acct.apiKey, `?limit=3${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
      expect(res.statusCode).toBe(200);
      const body = json<{ jobs: Array<Record<string, unknown>>; next_cursor: string | null }>(res);
      expect(body.jobs.length).toBeLessThanOrEqual(3);
      seen.push(...body.jobs);
      cursor = body.next_cursor;
      pages++;
    } while (cursor && pages < 10);
    expect(pages).toBe(3);
    expect(seen.map((j) => j.job_id)).toEqual([...made].reverse());
    expect(Object.keys(seen[0]!).sort()).toEqual(['cost_cents', 'created_at', 'finished_at', 'job_id', 'status', 'tool']);
    expect(seen[0]).toMatchObject({ tool: 'check_balance', status: 'completed', cost_cents: 0 });
    expect(seen[1]).toMatchObject({ tool: 'compute', status: 'failed', cost_cents: 0 });
    expect(seen[2]).toMatchObject({ tool: 'compute', status: 'completed', cost_cents: 2 });
    const times = seen.map((j) => Date.parse(j.created_at as string));
    expect([...times].sort((a, b) => b - a)).toEqual(times);

    const all = json(await listJobs(acct.apiKey));
    expect(all.jobs).toHaveLength(7);
    expect(all.next_cursor).toBeNull();
    expect(json(await listJobs(acct.apiKey, '?tool=compute')).jobs).toHaveLength(6);
    expect(json(await listJobs(acct.apiKey, '?status=failed')).jobs.map((j: { job_id: string }) => j.job_id)).toEqual([made[5]]);
    expect(json(await listJobs(acct.apiKey, '?tool=compute&status=completed&limit=200')).jobs).toHaveLength(5);
    const future = new Date(Date.now() + 3_600_000).toISOString();
    expect(json(await listJobs(acct.apiKey, `?since=${future}`)).jobs).toHaveLength(0);
    const past = new Date(Date.now() - 3_600_000).toISOString();
    expect(json(await listJobs(acct.apiKey, `?since=${encodeURIComponent(past)}`)).jobs).toHaveLength(7);

    // Jobs are per key: the account's other key sees none of these, and cannot read one.
    expect(json(await listJobs(second.apiKey)).jobs).toHaveLength(0);
    expect((await getJob(made[0]!, second.apiKey)).statusCode).toBe(404);
  });

  it('GET /jobs refuses bad query values with 400 invalid_input in the error envelope', async () => {
    const acct = await h.account('pro', 10);
    const cases = [
      '?limit=0',
      '?limit=201',
      '?limit=abc',
      '?limit=1.5',
      '?status=done',
      '?since=yesterday',
      '?cursor=garbage',
      `?cursor=${Buffer.from('["x","y"]').toString('base64url')}`,
    ];
    for (const q of cases) {
      const res = await listJobs(acct.apiKey, q);
      expect(res.statusCode, q).toBe(400);
      const { error } = json(res);
      expect(error.code, q).toBe('invalid_input');
      expect(typeof error.message).toBe('string');
      expect(typeof error.request_id).toBe('string');
      expect(Array.isArray(error.issues), q).toBe(true);
    }
    expect((await h.request({ method: 'GET', url: '/jobs' })).statusCode).toBe(401);
  });

  it('an answer over RESULT_MAX_BYTES is stored truncated and flagged; the caller got it whole', async () => {
    const acct = await h.account('pro', 100);
    const res = await h.call('test_big', { n: 3000, ch: 'é' }, acct.apiKey);
    expect(res.statusCode).toBe(200);
    expect(json(res).result.text).toHaveLength(3000);
    const jobId = res.headers['x-job-id'] as string;
    const r = await row(jobId);
    expect(r).toMatchObject({ status: 'completed', truncated: true, cost_cents: 1 });
    expect(await ledger(jobId)).toBe(-1);
    await flushRedis();
    const got = json(await getJob(jobId, acct.apiKey));
    expect(got).toMatchObject({ job_id: jobId, status: 'completed', cost_cents: 1, truncated: true, remaining_credits: 99 });
    // The result becomes the start of its JSON text, as a string, at most RESULT_MAX_BYTES bytes.
    expect(typeof got.result).toBe('string');
    expect(Buffer.byteLength(got.result)).toBeLessThanOrEqual(MAX);
    expect(Buffer.byteLength(got.result)).toBeGreaterThan(MAX - 4);
    expect(JSON.stringify(json(res).result).startsWith(got.result)).toBe(true);
  });

  it("a result jsonb cannot hold as is (NUL, lone surrogate) is stored with U+FFFD, and fails no one else's settlement", async () => {
    const acct = await h.account('pro', 100);
    const other = await h.account('pro', 100);
    const [odd, fine] = await Promise.all([h.call('test_big', { n: 1, odd: true }, acct.apiKey), h.call('compute', { expression: '3 * 3' }, other.apiKey)]);
    expect([odd.statusCode, fine.statusCode]).toEqual([200, 200]);
    const r = await row(odd.headers['x-job-id'] as string);
    expect(r!.body.result).toEqual({ text: 'x', nul: 'a\ufffdb', lone: 'x\ufffdy', literal: '\\u0000' });
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    expect(await h.ledgerCharges(other.accountId)).toBe(1);
  });

  describe('once charged, always reported charged', () => {
    const jobData = (acct: { accountId: string; keyId: string }, input: Record<string, unknown>): CallJobData => ({
      tool: 'test_counted',
      input,
      accountId: acct.accountId,
      keyId: acct.keyId,
      subKeyId: null,
      agentName: null,
      payer: null,
      priceCents: 3,
      listPriceCents: 3,
      sandbox: false,
      requestId: 'r1',
    });
    const jobRun = (id: string, extra: Partial<JobRun> = {}): JobRun => ({
      id,
      attemptsMade: 0,
      maxAttempts: 3,
      signal: new AbortController().signal,
      progress: async () => {},
      previousOutput: async () => undefined,
      ...extra,
    });

    it('a redelivered job whose charge exists answers with the stored result without running the tool again', async () => {
      const acct = await h.account('pro', 30);
      const jobId = `core-redelivered-${acct.accountId}`;
      const tag = `redeliver-${acct.accountId}`;
      await h.container.credits.reserve(acct.accountId, [{ holdId: jobId, amount: 3 }], null);
      const first = await h.container.runner.run(jobData(acct, { tag }), jobRun(jobId));
      expect(first).toEqual({ result: { tag, run: 1 }, cost_cents: 3, remaining_credits: 27 });
      // Stalled and redelivered (a dead worker, a lost lock), or retried after a failure past the commit.
      const second = await h.container.runner.run(jobData(acct, { tag }), jobRun(jobId, { redelivered: true, attemptsMade: 1 }));
      expect(second).toEqual(first);
      expect(runs.get(tag)).toBe(1);
      expect(await h.ledgerCharges(acct.accountId)).toBe(1);
      expect(await h.credits(acct.accountId)).toBe(27);
      expect(await h.container.credits.available(acct.accountId)).toBe(27);
    });

    it('a run that does not know it is a redelivery still answers with the first, charged result', async () => {
      const acct = await h.account('pro', 30);
      const jobId = `core-twice-${acct.accountId}`;
      const tag = `twice-${acct.accountId}`;
      await h.container.credits.reserve(acct.accountId, [{ holdId: jobId, amount: 3 }], null);
      const first = await h.container.runner.run(jobData(acct, { tag }), jobRun(jobId));
      // The tool runs again (nothing said this was a redelivery) but settlement finds the first answer.
      const second = await h.container.runner.run(jobData(acct, { tag }), jobRun(jobId));
      expect(runs.get(tag)).toBe(2);
      expect(second).toEqual(first);
      expect((second.result as { run: number }).run).toBe(1);
      expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    });

    it('a failure for good after the charge committed answers with the charged result, never "not charged"', async () => {
      const acct = await h.account('pro', 30);
      const jobId = `core-failafter-${acct.accountId}`;
      const tag = `failafter-${acct.accountId}`;
      await h.container.credits.reserve(acct.accountId, [{ holdId: jobId, amount: 3 }], null);
      const first = await h.container.runner.run(jobData(acct, { tag, fail: true }), jobRun(jobId));
      // The second run fails for good (tool_failed is not retried): it must not erase the charged answer.
      const second = await h.container.runner.run(jobData(acct, { tag, fail: true }), jobRun(jobId));
      expect(runs.get(tag)).toBe(2);
      expect(second).toEqual(first);
      expect((await row(jobId))!.status).toBe('completed');
      expect(await h.credits(acct.accountId)).toBe(27);
      expect(await h.container.credits.available(acct.accountId)).toBe(27);
    });

    it('a redelivered job whose stored outcome is a failure fails again, for good, without running', async () => {
      const acct = await h.account('pro', 30);
      const jobId = `core-failed-${acct.accountId}`;
      const tag = `failed-${acct.accountId}`;
      runs.set(tag, 1); // its next run fails
      await h.container.credits.reserve(acct.accountId, [{ holdId: jobId, amount: 3 }], null);
      const err = await h.container.runner.run(jobData(acct, { tag, fail: true }), jobRun(jobId)).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(JobFailure);
      expect((await row(jobId))!.status).toBe('failed');
      const again = await h.container.runner.run(jobData(acct, { tag, fail: true }), jobRun(jobId, { redelivered: true })).catch((e: unknown) => e);
      expect(again).toBeInstanceOf(JobFailure);
      expect((again as JobFailure).final).toBe(true);
      expect((again as JobFailure).error.code).toBe('tool_failed');
      expect(runs.get(tag)).toBe(2);
      expect(await h.ledgerCharges(acct.accountId)).toBe(0);
      expect(await h.container.credits.available(acct.accountId)).toBe(30);
    });
  });

  it('pruning removes rows older than JOB_RESULT_DAYS and keeps the rest', async () => {
    const acct = await h.account('pro', 100);
    const res = await h.call('compute', { expression: '5 + 5' }, acct.apiKey);
    const fresh = res.headers['x-job-id'] as string;
    const old = `core-old-${acct.accountId}`;
    await h.container.pool.query(sql.unsafe`
      INSERT INTO job_results (job_id, account_id, key_id, tool, status, cost_cents, body, created_at, finished_at)
      VALUES (${old}, ${acct.accountId}, ${acct.keyId}, 'compute', 'completed', 2, '{"result": 1}',
        now() - interval '8 days', now() - interval '8 days')`);
    expect(await row(old)).not.toBeNull();
    const deleted = await h.container.results.prune();
    expect(deleted).toBeGreaterThanOrEqual(1);
    expect(await row(old)).toBeNull();
    expect(await row(fresh)).not.toBeNull();
    expect(await h.container.results.prune()).toBe(0);
  });
});
