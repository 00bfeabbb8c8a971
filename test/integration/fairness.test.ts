import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, json, type Harness } from '../helpers/harness.js';
import { registerSlowTools, sleepStarts } from '../helpers/slow-tools.js';
import { waitUntil } from '../helpers/wait.js';
import { inFlightKey } from '../../src/access/in-flight.js';

registerSlowTools();

const async = { prefer: 'respond-async' };

describe('jobs in flight per account', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ CONCURRENCY_WEB: '8' }, { workers: ['web', 'core'] });
  });
  afterAll(async () => {
    await h.close();
  });

  it('caps a free account at 2 jobs queued or running, and gives the slots back when they end', async () => {
    const a = await h.account('free', 0);
    const first = await h.call('test_sleep', { ms: 400 }, a.apiKey, async);
    const second = await h.call('test_sleep', { ms: 400 }, a.apiKey, async);
    expect([first.statusCode, second.statusCode]).toEqual([202, 202]);
    const third = await h.call('test_sleep', { ms: 10 }, a.apiKey);
    expect(third.statusCode).toBe(429);
    expect(third.headers['retry-after']).toBe('1');
    expect(json(third).error).toMatchObject({ code: 'concurrency_limited', max_in_flight: 2, in_flight: 2 });
    // Another account is not affected.
    const other = await h.account('free', 0);
    expect((await h.call('test_sleep', { ms: 1 }, other.apiKey)).statusCode).toBe(200);
    await waitUntil(async () => (await h.container.slots.count(a.accountId)) === 0);
    expect((await h.call('test_sleep', { ms: 1 }, a.apiKey)).statusCode).toBe(200);
  });

  it('counts every step of a chain or parallel request, all or none', async () => {
    const a = await h.account('starter', 0); // cap 5
    for (let i = 0; i < 3; i++) expect((await h.call('test_sleep', { ms: 500 }, a.apiKey, async)).statusCode).toBe(202);
    const parallel = await h.request({
      method: 'POST',
      url: '/',
      headers: { authorization: `Bearer ${a.apiKey}`, 'content-type': 'application/json' },
      payload: { parallel: ['domain_check', 'domain_check', 'domain_check'], q: 'example.invalid' },
    });
    expect(parallel.statusCode).toBe(429);
    expect(json(parallel).error.code).toBe('concurrency_limited');
    // Refused whole: nothing of it was taken.
    expect(await h.container.slots.count(a.accountId)).toBe(3);
  });

  it('gives the slot back when a call fails, and never runs a call it refused', async () => {
    const a = await h.account('pro', 100);
    const bad = await h.call('compute', { expression: '1 +' }, a.apiKey);
    expect(bad.statusCode).toBe(400);
    expect(await h.container.slots.count(a.accountId)).toBe(0);
    expect(await h.credits(a.accountId)).toBe(100);
  });

  it('reaps slots a dead process left behind (taken, never queued) once they are past the grace period', async () => {
    const a = await h.account('free', 0);
    const key = inFlightKey(h.config.REDIS_PREFIX, a.accountId);
    // As if an API process died between admission and enqueue, a minute ago.
    await h.container.redis.zadd(
      key,
      Date.now() - 60_000,
      'web-00000000-0000-4000-8000-000000000001',
      Date.now() - 60_000,
      'web-00000000-0000-4000-8000-000000000002',
    );
    const res = await h.call('test_sleep', { ms: 1 }, a.apiKey);
    expect(res.statusCode).toBe(200);
    expect(await h.container.slots.count(a.accountId)).toBe(0);
  });

  it('does not reap a slot whose job is still queued', async () => {
    const a = await h.account('free', 0);
    const key = inFlightKey(h.config.REDIS_PREFIX, a.accountId);
    const queued = await h.call('test_sleep', { ms: 1500 }, a.apiKey, async);
    const jobId = json(queued).job_id as string;
    // Age the live job's slot and fill the cap with a dead one.
    await h.container.redis.zadd(key, Date.now() - 60_000, jobId, Date.now() - 60_000, 'web-00000000-0000-4000-8000-000000000003');
    expect((await h.call('test_sleep', { ms: 1 }, a.apiKey)).statusCode).toBe(200);
    expect(await h.container.redis.zscore(key, jobId)).not.toBeNull();
  });
});

describe('fair share of a family between accounts', () => {
  let h: Harness;
  beforeAll(async () => {
    // 8 web workers: one account runs 2 at once (FAIR_SHARE 0.25) while others wait, never more than 6.
    h = await startHarness({ CONCURRENCY_WEB: '8' }, { workers: ['web'] });
  });
  afterAll(async () => {
    await h.close();
  });

  it("one account's 200 queued 5-second jobs do not hold up another account's call", async () => {
    const a = await h.account('enterprise', 0, { maxInFlight: 500 });
    const b = await h.account('free', 0);
    for (let i = 0; i < 200; i++) {
      const r = await h.call('test_sleep', { ms: 5_000, tag: `a${i}` }, a.apiKey, async);
      expect(r.statusCode).toBe(202);
    }
    // A's jobs fill its share of the workers.
    await waitUntil(async () => [...sleepStarts.keys()].filter((k) => k.startsWith('a')).length >= 2);
    const sent = Date.now();
    const res = await h.call('test_sleep', { ms: 1_000, tag: 'b' }, b.apiKey);
    const answered = Date.now();
    expect(res.statusCode).toBe(200);
    expect(sleepStarts.get('b')! - sent).toBeLessThan(1_000);
    expect(answered - sent).toBeLessThan(1_000 + 1_000);
    // A never held more than concurrency minus a share (8 - 2) of the workers at once: in the first
    // run of its 5-second jobs, at most 6 started.
    const aStarts = [...sleepStarts.entries()].filter(([k]) => k.startsWith('a')).map(([, t]) => t);
    const firstStart = Math.min(...aStarts);
    expect(aStarts.filter((t) => t < firstStart + 4_500).length).toBeLessThanOrEqual(6);
  }, 30_000);
});

describe('a job that kills its worker process', () => {
  let h: Harness;
  const children: ChildProcess[] = [];
  let stopping = false;

  beforeAll(async () => {
    h = await startHarness({ SYNC_TIMEOUT_MS: '60000' }, { workers: [] });
  });
  afterAll(async () => {
    stopping = true;
    for (const c of children) c.kill('SIGKILL');
    await h.close();
  });

  function startWorker(): ChildProcess {
    const child = spawn(process.execPath, ['--import', 'tsx', 'test/helpers/crash-worker.ts', '--family', 'core'], {
      env: {
        ...process.env,
        REDIS_URL: h.config.REDIS_URL,
        DATABASE_URL: h.config.DATABASE_URL,
        REDIS_PREFIX: h.config.REDIS_PREFIX,
        WORKER_LOCK_MS: '1000',
        LOG_LEVEL: 'warn',
      },
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    children.push(child);
    // Like an orchestrator: a worker that dies is replaced.
    child.once('exit', () => {
      if (!stopping) startWorker();
    });
    return child;
  }

  it('is redelivered once, then fails for good: uncharged, hold and slot released, caller answered', async () => {
    const a = await h.account('pro', 100);
    startWorker();
    const res = await h.call('test_crash', {}, a.apiKey);
    expect(res.statusCode).toBe(422);
    expect(json(res).error).toMatchObject({ code: 'limit_exceeded', limit: 'memory' });
    // Two deaths: the first run and the one redelivery.
    expect(children.filter((c) => c.exitCode !== null || c.signalCode !== null).length).toBe(2);
    expect(await h.credits(a.accountId)).toBe(100);
    expect(await h.ledgerCharges(a.accountId)).toBe(0);
    await waitUntil(async () => (await h.container.credits.available(a.accountId)) === 100);
    await waitUntil(async () => (await h.container.slots.count(a.accountId)) === 0);
    // The replacement worker is healthy and takes new calls.
    const ok = await h.call('compute', { expression: '1 + 1' }, a.apiKey);
    expect(ok.statusCode).toBe(200);
    const last = children[children.length - 1]!;
    expect(last.exitCode).toBeNull();
    stopping = true;
    last.kill('SIGTERM');
    await once(last, 'exit');
  }, 60_000);
});
