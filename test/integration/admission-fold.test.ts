import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inFlightKey } from '../../src/access/in-flight.js';
import { json, startHarness, type Harness } from '../helpers/harness.js';

/**
 * A plain tool call's rate-limit hit is counted by admission's script together with its slot in flight
 * and its credit hold (src/money/holds.ts RESERVE, src/faces/http/calls.ts). These check that every request
 * still counts exactly once whichever way it ends, and that settlement gives the slot back with the
 * batch's holds (src/money/settlement.ts).
 */
let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(() => h.close());

const call = (key: string, body: unknown, headers: Record<string, string> = {}) => h.call('compute', body, key, headers);
const code = (res: { body: string }) => (JSON.parse(res.body) as { error?: { code: string } }).error?.code;
const inFlight = (accountId: string) => h.container.redis.zcard(inFlightKey(h.config.REDIS_PREFIX, accountId));
const window = (accountId: string) => h.container.redis.zcard(h.container.api!.limiter.key(accountId));

describe('rate limit counted at admission', () => {
  it('counts a valid call once (even when its first admission attempt had to load the balance) and a refused body too', async () => {
    const acct = await h.account('enterprise', 1_000, { rpm: 4 });
    // A fresh account: avail is not in Redis, so the first RESERVE answers "not loaded" and runs again.
    const first = await call(acct.apiKey, { expression: '1 + 1' });
    expect(first.statusCode).toBe(200);
    expect(first.headers['x-ratelimit-remaining']).toBe('3');
    expect(await window(acct.accountId)).toBe(1);
    // Bad input never reaches admission: it is counted on its own, with the same headers.
    const bad = await call(acct.apiKey, { expression: 7 });
    expect(bad.statusCode).toBe(400);
    expect(bad.headers['x-ratelimit-remaining']).toBe('2');
    expect(
      (
        await h.request({
          method: 'POST',
          url: '/tools/no_such_tool',
          headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json' },
          payload: '{}',
        })
      ).statusCode,
    ).toBe(404);
    expect((await call(acct.apiKey, { expression: '2 + 2' })).statusCode).toBe(200);
    expect(await window(acct.accountId)).toBe(4);
    // The fifth request of the minute: 429 whether its body is good or not, and nothing is held or charged for it.
    const over = await call(acct.apiKey, { expression: '3 + 3' });
    expect(over.statusCode).toBe(429);
    expect(code(over)).toBe('rate_limited');
    expect(over.headers['retry-after']).toBeTruthy();
    const overBad = await call(acct.apiKey, { expression: 7 });
    expect(overBad.statusCode).toBe(429);
    expect(await window(acct.accountId)).toBe(4);
    expect(await h.credits(acct.accountId)).toBe(1_000 - 2 * 2);
    expect(await h.container.credits.available(acct.accountId)).toBe(1_000 - 2 * 2);
    expect(await inFlight(acct.accountId)).toBe(0);
  });

  it('a call refused for credit or concurrency still counts against the limit', async () => {
    const poor = await h.account('enterprise', 1, { rpm: 2 });
    expect(code(await call(poor.apiKey, { expression: '1' }))).toBe('insufficient_credits');
    expect(code(await call(poor.apiKey, { expression: '1' }))).toBe('insufficient_credits');
    expect(code(await call(poor.apiKey, { expression: '1' }))).toBe('rate_limited');
    expect(await window(poor.accountId)).toBe(2);
  });

  it('an Idempotency-Key replay counts as a request, and over the limit is refused like any other', async () => {
    const acct = await h.account('enterprise', 1_000, { rpm: 2 });
    const key = { 'idempotency-key': `k-${Date.now()}` };
    const a = await call(acct.apiKey, { expression: '5 * 5' }, key);
    const b = await call(acct.apiKey, { expression: '5 * 5' }, key);
    expect(a.statusCode).toBe(200);
    expect(b.statusCode).toBe(200);
    expect(b.headers['idempotent-replayed']).toBe('true');
    expect(json(b).result).toEqual(json(a).result);
    expect(code(await call(acct.apiKey, { expression: '5 * 5' }, key))).toBe('rate_limited');
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
  });

  it('concurrent calls on a small limit admit exactly the limit, each charged once', async () => {
    const acct = await h.account('enterprise', 1_000, { rpm: 7, maxInFlight: 100 });
    const res = await Promise.all(Array.from({ length: 20 }, (_, i) => call(acct.apiKey, { expression: `${i} + 1` })));
    const ok = res.filter((r) => r.statusCode === 200).length;
    expect(ok).toBe(7);
    expect(res.filter((r) => code(r) === 'rate_limited').length).toBe(13);
    expect(await h.ledgerCharges(acct.accountId)).toBe(7);
    expect(await h.container.credits.available(acct.accountId)).toBe(1_000 - 7 * 2);
    expect(await inFlight(acct.accountId)).toBe(0);
  });
});

describe('slots in flight given back by settlement', () => {
  it('a caller at max_in_flight 1 can call again as soon as it is answered', async () => {
    const acct = await h.account('enterprise', 1_000, { rpm: 1_000, maxInFlight: 1 });
    for (let i = 0; i < 15; i++) {
      const res = await call(acct.apiKey, { expression: `${i} * 2` });
      expect(res.statusCode, res.body).toBe(200);
    }
    expect(await inFlight(acct.accountId)).toBe(0);
    expect(await h.ledgerCharges(acct.accountId)).toBe(15);
  });

  it('a free call (sandbox key: no hold) gives its slot back too', async () => {
    const acct = await h.account('enterprise', 1_000, { rpm: 1_000, maxInFlight: 1 });
    const test = await h.key(acct.accountId, 'test');
    for (let i = 0; i < 3; i++) expect((await call(test.apiKey, { expression: '1' })).statusCode).toBe(200);
    expect(await inFlight(acct.accountId)).toBe(0);
    expect(await h.credits(acct.accountId)).toBe(1_000);
  });
});
