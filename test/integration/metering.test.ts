import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import type { JobRun } from '../../src/calls/runner.js';
import type { CallJobData } from '../../src/queue/call-job.js';

describe('exact credit under concurrency', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness();
  });
  afterAll(() => h.close());

  it('with credit for N calls, 4N concurrent calls give exactly N successes and a balance of 0', async () => {
    const N = 25;
    const acct = await h.account('enterprise', N * 2, { rpm: 100_000 });
    const results = await Promise.all(Array.from({ length: 4 * N }, (_, i) => h.call('compute', { expression: `${i} + 1` }, acct.apiKey)));
    const ok = results.filter((r) => r.statusCode === 200);
    const refused = results.filter((r) => r.statusCode === 402);
    expect(ok).toHaveLength(N);
    expect(refused).toHaveLength(3 * N);
    for (const r of refused) expect(json(r).error.code).toBe('insufficient_credits');
    expect(await h.credits(acct.accountId)).toBe(0);
    expect(await h.ledgerCharges(acct.accountId)).toBe(N);
    expect(await h.ledgerSum(acct.accountId)).toBe(0);
    // Every success reported a balance that was real at some point, and none went below zero.
    for (const r of ok) expect(json(r).remaining_credits).toBeGreaterThanOrEqual(0);
  });

  it('settling the same job twice (a redelivery) debits once', async () => {
    const acct = await h.account('pro', 10);
    const jobId = `core-redelivered-${acct.accountId}`;
    const data: CallJobData = {
      tool: 'compute',
      input: { expression: '1+1' },
      accountId: acct.accountId,
      keyId: acct.keyId,
      subKeyId: null,
      agentName: null,
      payer: null,
      priceCents: 2,
      listPriceCents: 2,
      sandbox: false,
      requestId: 'r1',
    };
    await h.container.credits.reserve(acct.accountId, [{ holdId: jobId, amount: 2 }], null);
    const run: JobRun = {
      id: jobId,
      attemptsMade: 0,
      maxAttempts: 3,
      signal: new AbortController().signal,
      progress: async () => {},
      previousOutput: async () => undefined,
    };
    const first = await h.container.runner.run(data, run);
    const second = await h.container.runner.run(data, { ...run, attemptsMade: 1 });
    expect(first.remaining_credits).toBe(8);
    expect(second.remaining_credits).toBe(8);
    expect(await h.credits(acct.accountId)).toBe(8);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    // The hold is gone and the Redis view agrees with Postgres.
    expect(await h.container.credits.available(acct.accountId)).toBe(8);
  });
});

describe('a worker killed with SIGKILL mid-load', () => {
  let h: Harness;
  let fake: FakeOpenAI;
  const children: ChildProcess[] = [];

  beforeAll(async () => {
    fake = await startFakeOpenAI();
    // Slow enough that many calls are in flight when the worker dies.
    fake.setDefault({
      type: 'tokens',
      tokens: ['one ', 'two ', 'three ', 'four ', 'five'],
      beforeToken: () => new Promise((r) => setTimeout(r, 30)),
    });
    // The API process runs no workers; they run in child processes like in production.
    // The API admits genius only where LLM_BASE_URL is configured (its need); the workers use it.
    h = await startHarness({ SYNC_TIMEOUT_MS: '60000', LLM_BASE_URL: fake.baseURL }, { workers: [] });
  });
  afterAll(async () => {
    for (const c of children) c.kill('SIGKILL');
    await h.close();
    await fake.close();
  });

  function startWorker(): ChildProcess {
    const child = spawn(process.execPath, ['--import', 'tsx', 'workers/index.ts', '--family', 'llm'], {
      env: {
        ...process.env,
        REDIS_URL: h.config.REDIS_URL,
        DATABASE_URL: h.config.DATABASE_URL,
        REDIS_PREFIX: h.config.REDIS_PREFIX,
        LLM_BASE_URL: fake.baseURL,
        WORKER_LOCK_MS: '1000',
        CONCURRENCY_LLM: '8',
        // One account's calls fill the worker: this test is about money, not fairness.
        FAIR_SHARE: '1',
        LOG_LEVEL: 'warn',
      },
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    children.push(child);
    return child;
  }

  it('loses no debit and doubles none', async () => {
    const calls = 40;
    const price = 50;
    const acct = await h.account('pro', calls * price, { maxInFlight: calls });
    const first = startWorker();
    const pending = Array.from({ length: calls }, (_, i) => h.call('genius', { problem: `problem ${i}` }, acct.apiKey));
    // Kill the worker once some calls have completed and others are mid-stream.
    while (fake.requests.length < 16) await new Promise((r) => setTimeout(r, 25));
    first.kill('SIGKILL');
    await once(first, 'exit');
    startWorker();
    const results = await Promise.all(pending);
    const ok = results.filter((r) => r.statusCode === 200);
    const failed = results.filter((r) => r.statusCode !== 200);
    const credits = await h.credits(acct.accountId);
    // Every 200 was charged exactly once, every failure nothing, and the ledger explains the balance.
    expect(await h.ledgerCharges(acct.accountId)).toBe(ok.length);
    expect(credits).toBe(calls * price - ok.length * price);
    expect(await h.ledgerSum(acct.accountId)).toBe(credits);
    for (const r of ok) expect(json(r).cost_cents).toBe(price);
    // Redelivery means the killed worker's calls still complete on the second worker.
    expect(ok.length + failed.length).toBe(calls);
    expect(ok.length).toBeGreaterThan(calls / 2);
    // Redis' view of available credit matches Postgres once all holds are settled or released.
    expect(await h.container.credits.available(acct.accountId)).toBe(credits);
  }, 120_000);
});
