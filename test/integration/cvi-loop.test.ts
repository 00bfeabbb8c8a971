import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { accountStore } from '../../src/queue/tool-store.js';

/**
 * cvi_loop through the real path (HTTP, queue, event-loop handler with ctx.store, the cvi_round task
 * in the sandbox pool): rounds increment per account, and another account's loop_id is 404 not_found.
 * Rounds of one loop sent at once run one after the other (a lock per loop); other loops do not wait.
 */

let h: Harness;
let a: TestAccount;
let b: TestAccount;

beforeAll(async () => {
  // Workers enough for one account's rounds to run at the same time.
  h = await startHarness({ CONCURRENCY_TEXT: '8' }, { workers: ['text'] });
  a = await h.account('pro', 1000);
  b = await h.account('pro', 1000);
});

afterAll(async () => {
  await h?.close();
});

const sources = [{ id: 'report', text: 'In 2023 Acme had 340 employees. Revenue rose 12% to $4.2 million in 2023.' }];

describe('cvi_loop', () => {
  it('rounds increment for the owner; another account gets 404 not_found', async () => {
    const first = await h.call('cvi_loop', { draft: 'Acme had 340 employees in 2023. Revenue rose 15% in 2023.', sources, max_rounds: 3 }, a.apiKey);
    expect(first.statusCode, first.body).toBe(200);
    const r1 = json(first).result;
    expect(r1).toMatchObject({ round: 1, status: 'revise', supported: 1 });
    const second = await h.call('cvi_loop', { loop_id: r1.loop_id, draft: 'Acme had 340 employees in 2023. Revenue rose 12% in 2023.' }, a.apiKey);
    expect(second.statusCode, second.body).toBe(200);
    expect(json(second).result).toMatchObject({ loop_id: r1.loop_id, round: 2, status: 'pass', fixed_since_last: ['Revenue rose 15% in 2023.'] });

    const other = await h.call('cvi_loop', { loop_id: r1.loop_id, draft: 'Acme had 340 employees in 2023.' }, b.apiKey);
    expect(other.statusCode, other.body).toBe(404);
    expect(json(other).error).toMatchObject({ code: 'not_found' });
  });

  const start = 'Acme had 340 employees in 2023. Revenue rose 15% in 2023. Acme sells outside Europe.';
  const wider = [{ id: 'report', text: `${sources[0]!.text} Acme does not sell outside Europe.` }];
  const lockKey = (acct: TestAccount, loopId: string) => `${h.config.REDIS_PREFIX}:store:${acct.accountId}:cvi_loop:loop:${loopId}:lock`;

  it('two rounds of one loop sent at once become rounds 2 and 3, the second checked against the first', async () => {
    const acct = await h.account('pro', 1000, { rpm: 100_000, maxInFlight: 20 });
    const r1 = json(await h.call('cvi_loop', { draft: start, sources: wider, max_rounds: 6 }, acct.apiKey)).result;
    expect(r1).toMatchObject({ round: 1, status: 'revise', supported: 1 });
    // One fixes the revenue, the other the markets: each leaves the other's claim failing.
    const fixRevenue = 'Acme had 340 employees in 2023. Revenue rose 12% in 2023. Acme sells outside Europe.';
    const fixMarkets = 'Acme had 340 employees in 2023. Revenue rose 15% in 2023. Acme does not sell outside Europe.';
    const both = await Promise.all([fixRevenue, fixMarkets].map((draft) => h.call('cvi_loop', { loop_id: r1.loop_id, draft }, acct.apiKey)));
    for (const res of both) expect(res.statusCode, res.body).toBe(200);
    const [first, second] = both.map((res) => json(res).result).sort((x, y) => x.round - y.round);
    expect([first.round, second.round]).toEqual([2, 3]);
    // The later round saw the earlier one's state: what it fixed is what the earlier round left failing.
    expect(first.failing.map((f: { claim: string }) => f.claim)).toHaveLength(1);
    expect(second.fixed_since_last).toEqual(first.failing.map((f: { claim: string }) => f.claim));
    expect(second.failing.map((f: { claim: string }) => f.claim)).toEqual(first.fixed_since_last);
    // The loop goes on from round 3.
    const next = await h.call('cvi_loop', { loop_id: r1.loop_id, draft: fixRevenue.replace('Acme sells', 'Acme does not sell') }, acct.apiKey);
    expect(json(next).result).toMatchObject({ round: 4, status: 'pass' });
    expect(await h.container.redis!.exists(lockKey(acct, r1.loop_id))).toBe(0);
  }, 60_000);

  it("a round waits while its loop's lock is held; another loop's round does not", async () => {
    const acct = await h.account('pro', 1000, { rpm: 100_000, maxInFlight: 20 });
    const busy = json(await h.call('cvi_loop', { draft: start, sources: wider, max_rounds: 6 }, acct.apiKey)).result;
    const free = json(await h.call('cvi_loop', { draft: `${start} Acme was founded in 1990.`, sources: wider, max_rounds: 6 }, acct.apiKey)).result;
    expect(free.loop_id).not.toBe(busy.loop_id);
    // Someone else's round holds the busy loop (as a round on another worker would).
    await h.container.redis!.set(lockKey(acct, busy.loop_id), 'another-round', 'PX', 30_000);
    const waiting = await h.call('cvi_loop', { loop_id: busy.loop_id, draft: start }, acct.apiKey, { prefer: 'respond-async' });
    expect(waiting.statusCode, waiting.body).toBe(202);
    const jobId = json(waiting).job_id as string;
    const other = await h.call('cvi_loop', { loop_id: free.loop_id, draft: start }, acct.apiKey);
    expect(other.statusCode, other.body).toBe(200);
    expect(json(other).result).toMatchObject({ loop_id: free.loop_id, round: 2 });
    const status = () => h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: { authorization: `Bearer ${acct.apiKey}` } });
    expect(json(await status()).status).not.toBe('completed');
    await h.container.redis!.del(lockKey(acct, busy.loop_id));
    let done: Record<string, any> = {};
    for (let i = 0; i < 200 && done.status !== 'completed'; i++) {
      await new Promise((r) => setTimeout(r, 25));
      done = json(await status());
    }
    expect(done).toMatchObject({ status: 'completed', result: { loop_id: busy.loop_id, round: 2, status: 'stalled' } });
  }, 60_000);

  it('a lock not freed within the wait gives null and runs nothing; a dead holder frees itself after its hold', async () => {
    const store = accountStore(h.container.redis!, h.config.REDIS_PREFIX, { accountId: a.accountId, sandbox: false, tool: 'cvi_loop' });
    let ran = 0;
    const held = store.exclusive('k', { holdMs: 300, waitMs: 0 }, async () => {
      ran++;
      await new Promise((r) => setTimeout(r, 200));
      return 'first';
    });
    await new Promise((r) => setTimeout(r, 50));
    expect(await store.exclusive('k', { holdMs: 300, waitMs: 50 }, async () => ran++)).toBeNull();
    expect(await store.exclusive('other', { holdMs: 300, waitMs: 0 }, async () => 'other')).toEqual({ value: 'other' });
    expect(await store.exclusive('k', { holdMs: 300, waitMs: 2_000 }, async () => 'second')).toEqual({ value: 'second' });
    expect(await held).toEqual({ value: 'first' });
    expect(ran).toBe(1);
    // A holder that never frees it (its worker died): the next one gets it once holdMs has passed.
    await h.container.redis!.set(`${h.config.REDIS_PREFIX}:store:${a.accountId}:cvi_loop:k:lock`, 'dead', 'PX', 200);
    const t0 = Date.now();
    expect(await store.exclusive('k', { holdMs: 300, waitMs: 2_000 }, async () => 'after')).toEqual({ value: 'after' });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(150);
  });
});
