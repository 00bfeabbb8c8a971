import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { Reconciler } from '../../src/money/reconciler.js';
import { InFlightSlots } from '../../src/access/in-flight.js';

/**
 * The money reconciler (src/money/reconciler.ts) against what a killed process leaves in Redis. The
 * automatic passes are off (RECONCILE_SECONDS=0); each test runs passes itself. `quick` is the same
 * reconciler with short grace periods, so a test need not wait 15 s for a hold to count as leaked.
 */
let h: Harness;
let quick: Reconciler;
let quickSlots: InFlightSlots;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

beforeAll(async () => {
  h = await startHarness({ RECONCILE_SECONDS: '0' }, { workers: ['core'] });
  const c = h.container;
  quickSlots = new InFlightSlots(c.redis, c.config, (ids) => c.queues.liveJobs(ids), 200);
  quick = new Reconciler({
    redis: c.redis,
    pool: c.pool,
    prefix: c.config.REDIS_PREFIX,
    log: c.log,
    credits: c.credits,
    slots: quickSlots,
    liveJobs: (ids) => c.queues.liveJobs(ids),
    intervalSeconds: 0,
    holdGraceMs: 300,
  });
});

afterAll(async () => {
  await h.close();
});

const avail = async (accountId: string) => Number(await h.container.redis.get(h.container.credits.availKey(accountId)));
const holds = (accountId: string) => h.container.redis.hgetall(h.container.credits.holdsKey(accountId));

describe('money reconciler', () => {
  it('releases a hold whose job was never queued (the API died between reserve and enqueue), only once past the grace period', async () => {
    const acct = await h.account('pro', 100);
    const jobId = `core-${randomUUID()}`;
    // Admission as CallService.reserve does it, and then nothing: the process "died" before queues.add.
    await h.container.slots.take(acct.accountId, 20, [jobId]);
    await h.container.credits.reserve(acct.accountId, [{ holdId: jobId, amount: 44 }], null);
    expect(await avail(acct.accountId)).toBe(56);
    const [value] = Object.values(await holds(acct.accountId));
    expect(value).toMatch(/^44\|\|\d{13}$/); // amount|subuseKey|takenAt

    // Within the grace period nothing is touched: the API may still be about to queue the job.
    const early = await h.container.reconciler.runOnce();
    expect(early).toMatchObject({ ran: true, released: 0 });
    expect(await avail(acct.accountId)).toBe(56);

    await sleep(400);
    const r = await quick.runOnce();
    expect(r.ran).toBe(true);
    expect(r.released).toBe(1);
    expect(r.slots).toBeGreaterThanOrEqual(1);
    expect(await holds(acct.accountId)).toEqual({});
    expect(await avail(acct.accountId)).toBe(await h.credits(acct.accountId));
    expect(await avail(acct.accountId)).toBe(100);
    expect(await h.container.slots.count(acct.accountId)).toBe(0);
  });

  it('never releases the hold of a job that is queued or running', async () => {
    const acct = await h.account('pro', 100);
    const res = await h.call('compute', { expression: '1 + 1' }, acct.apiKey, { prefer: 'respond-async' });
    expect(res.statusCode).toBe(202);
    // Passes while the job waits or runs (past the hold grace period) leave its hold alone.
    for (let i = 0; i < 50 && (await h.ledgerCharges(acct.accountId)) === 0; i++) {
      await sleep(100);
      if (i >= 3) await quick.runOnce();
    }
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    expect(await h.credits(acct.accountId)).toBe(98);
    await sleep(200);
    await quick.runOnce();
    // Charged once, and avail follows Postgres: the hold was not given back.
    expect(await avail(acct.accountId)).toBe(98);
    expect(await holds(acct.accountId)).toEqual({});
  });

  it('drops a hold whose charge is already in the ledger, without giving the credit back', async () => {
    const acct = await h.account('pro', 100);
    const res = await h.call('compute', { expression: '2 * 3' }, acct.apiKey);
    expect(res.statusCode).toBe(200);
    const jobId = res.headers['x-job-id'] as string;
    expect(await h.credits(acct.accountId)).toBe(98);
    // The settlement committed but the process died before dropping the hold.
    await h.container.redis.hset(h.container.credits.holdsKey(acct.accountId), jobId, `2||${Date.now() - 60_000}`);
    expect(await avail(acct.accountId)).toBe(98);

    const r = await quick.runOnce();
    expect(r.dropped).toBe(1);
    expect(r.released).toBe(0);
    expect(await holds(acct.accountId)).toEqual({});
    expect(await avail(acct.accountId)).toBe(98);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
  });

  it('rebuilds a stale avail from Postgres credits minus live holds', async () => {
    const acct = await h.account('pro', 100);
    expect((await h.call('compute', { expression: '1' }, acct.apiKey)).statusCode).toBe(200);
    const liveJob = `core-${randomUUID()}`;
    await h.container.credits.reserve(acct.accountId, [{ holdId: liveJob, amount: 10 }], null); // fresh: within grace
    await h.container.redis.set(h.container.credits.availKey(acct.accountId), 7);

    const r = await h.container.reconciler.runOnce();
    expect(r.rebuilt).toBeGreaterThanOrEqual(1);
    expect(await avail(acct.accountId)).toBe(98 - 10);
    await h.container.credits.release(acct.accountId, [liveJob]);
    expect(await avail(acct.accountId)).toBe(98);
  });

  it('holds in the old format (no time taken) are stamped, then released one grace period later', async () => {
    const acct = await h.account('pro', 100);
    await h.container.credits.reserve(acct.accountId, [{ holdId: `core-${randomUUID()}`, amount: 1 }], null);
    const oldJob = `core-${randomUUID()}`;
    await h.container.redis.hset(h.container.credits.holdsKey(acct.accountId), oldJob, '5|');
    await h.container.redis.decrby(h.container.credits.availKey(acct.accountId), 5);
    await quick.runOnce();
    expect((await holds(acct.accountId))[oldJob]).toMatch(/^5\|\|\d{13}$/);
    await sleep(400);
    await quick.runOnce();
    expect(await holds(acct.accountId)).toEqual({});
    expect(await avail(acct.accountId)).toBe(100);
  });

  it("reconciles a sub-key's monthly use: settled this month plus live holds", async () => {
    const acct = await h.account('enterprise', 1000);
    const sub = json(
      await h.request({
        method: 'POST',
        url: '/subkeys/create',
        headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json' },
        payload: JSON.stringify({ name: 'ci', monthly_limit: 100, allowed_tools: ['compute'] }),
      }),
    );
    const subKey = sub.api_key as string;
    const keyId = sub.key_id as string;
    expect((await h.call('compute', { expression: '3 + 4' }, subKey)).statusCode).toBe(200);
    const subuseKey = h.container.credits.subuseKey(acct.accountId, keyId);
    expect(Number(await h.container.redis.get(subuseKey))).toBe(2);

    // A leaked hold against the sub-key's month, and a counter set wrong by hand.
    const leaked = `core-${randomUUID()}`;
    await h.container.credits.reserve(acct.accountId, [{ holdId: leaked, amount: 5 }], { keyId, monthlyLimitCents: 100 });
    expect(Number(await h.container.redis.get(subuseKey))).toBe(7);
    await sleep(400);
    await quick.runOnce();
    expect(Number(await h.container.redis.get(subuseKey))).toBe(2);
    expect(await avail(acct.accountId)).toBe(998);

    await h.container.redis.set(subuseKey, 50, 'KEEPTTL');
    const r = await quick.runOnce();
    expect(r.rebuilt).toBeGreaterThanOrEqual(1);
    expect(Number(await h.container.redis.get(subuseKey))).toBe(2);
    expect(await h.container.redis.ttl(subuseKey)).toBeGreaterThan(0);
  });

  it('reaps in-flight slots of every owner, not only owners at their cap', async () => {
    const acct = await h.account('pro', 100);
    await h.container.slots.take(acct.accountId, 20, [`core-${randomUUID()}`, `core-${randomUUID()}`]);
    await h.container.slots.take('payer:0xabc', 20, [`core-${randomUUID()}`]);
    expect(await h.container.slots.count(acct.accountId)).toBe(2);
    await sleep(300);
    const r = await quick.runOnce();
    expect(r.slots).toBeGreaterThanOrEqual(3);
    expect(await h.container.slots.count(acct.accountId)).toBe(0);
    expect(await h.container.slots.count('payer:0xabc')).toBe(0);
    const [, owners] = h.container.slots.scriptKeys(acct.accountId).tgUnlistOwner;
    expect(await h.container.redis.sismember(owners!, acct.accountId)).toBe(0);
  });

  it('two reconcilers at once: only one runs the pass', async () => {
    const acct = await h.account('pro', 100);
    await h.container.credits.reserve(acct.accountId, [{ holdId: `core-${randomUUID()}`, amount: 1 }], null);
    await h.container.redis.set(h.container.credits.availKey(acct.accountId), 3); // something to fix: the pass takes a while
    const [a, b] = await Promise.all([h.container.reconciler.runOnce(), quick.runOnce()]);
    expect([a.ran, b.ran].filter(Boolean)).toHaveLength(1);
    expect(await avail(acct.accountId)).toBe(99);
    // The lock is given back: the next pass runs.
    expect((await quick.runOnce()).ran).toBe(true);
  });
});
