import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Idempotency } from '../../src/calls/idempotency.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { registerSlowTools } from '../helpers/slow-tools.js';

registerSlowTools();

/**
 * An Idempotency-Key claim outlives the request that made it. Each test writes the claim a dead API
 * process would have left in Redis (running, lease run out, the job ids it recorded), then retries.
 */

let h: Harness;
let a: TestAccount;

beforeAll(async () => {
  h = await startHarness({}, { workers: ['core', 'web'] });
  a = await h.account('pro', 1_000);
});
afterAll(async () => {
  await h.close();
});

const claimKey = (idemKey: string) => `${h.config.REDIS_PREFIX}:idem:${a.keyId}:${createHash('sha256').update(idemKey).digest('hex')}`;

/** The claim a process that died mid-request leaves behind. */
async function deadClaim(idemKey: string, tool: string, body: unknown, jobIds: string[], leaseUntil = Date.now() - 1) {
  const fingerprint = Idempotency.fingerprint('POST', `/tools/${tool}`, body);
  await h.container.redis.set(
    claimKey(idemKey),
    JSON.stringify({ state: 'running', fingerprint, token: 'dead-process', lease_until: leaseUntil, job_ids: jobIds.join(',') }),
    'EX',
    3600,
  );
}

describe('a retry after the request that claimed the key died', () => {
  it('answers with the result of the job the dead request queued, and charges nothing more', async () => {
    const body = { expression: '6 * 7' };
    const first = await h.call('compute', body, a.apiKey);
    expect(first.statusCode).toBe(200);
    const jobId = first.headers['x-job-id'] as string;
    const charges = await h.ledgerCharges(a.accountId);
    await deadClaim('dead-after-run', 'compute', body, [jobId]);

    const retry = await h.call('compute', body, a.apiKey, { 'idempotency-key': 'dead-after-run' });
    expect(retry.statusCode).toBe(200);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(retry.headers['x-job-id']).toBe(jobId);
    expect(json(retry)).toMatchObject({ result: { value: 42 }, cost_cents: 2 });
    expect(await h.ledgerCharges(a.accountId)).toBe(charges);
    // The claim is settled now: a further retry replays it without touching the job.
    const again = await h.call('compute', body, a.apiKey, { 'idempotency-key': 'dead-after-run' });
    expect(json(again)).toEqual(json(retry));
  });

  it('waits for a job that is still running and answers with its result', async () => {
    const body = { ms: 600 };
    const queued = await h.call('test_sleep', body, a.apiKey, { prefer: 'respond-async' });
    const jobId = json(queued).job_id as string;
    await deadClaim('dead-while-running', 'test_sleep', body, [jobId]);
    const retry = await h.call('test_sleep', body, a.apiKey, { 'idempotency-key': 'dead-while-running' });
    expect(retry.statusCode).toBe(200);
    expect(json(retry).result).toEqual({ slept: 600 });
    expect(retry.headers['x-job-id']).toBe(jobId);
  });

  it('runs for real when the dead request never queued its job', async () => {
    const body = { expression: '1 + 2' };
    const charges = await h.ledgerCharges(a.accountId);
    await deadClaim('dead-before-enqueue', 'compute', body, ['core-00000000-0000-4000-8000-0000000000aa']);
    const retry = await h.call('compute', body, a.apiKey, { 'idempotency-key': 'dead-before-enqueue' });
    expect(retry.statusCode).toBe(200);
    expect(retry.headers['idempotent-replayed']).toBeUndefined();
    expect(json(retry).result.value).toBe(3);
    expect(await h.ledgerCharges(a.accountId)).toBe(charges + 1);
  });

  it('is 409 while the owner is alive (its lease not run out)', async () => {
    const body = { expression: '2 + 2' };
    await deadClaim('alive', 'compute', body, [], Date.now() + 60_000);
    const retry = await h.call('compute', body, a.apiKey, { 'idempotency-key': 'alive' });
    expect(retry.statusCode).toBe(409);
    expect(json(retry).error.code).toBe('idempotency_in_progress');
  });

  it('is 422 when the body differs, even from a dead owner', async () => {
    await deadClaim('other-body', 'compute', { expression: '1' }, []);
    const retry = await h.call('compute', { expression: '2' }, a.apiKey, { 'idempotency-key': 'other-body' });
    expect(retry.statusCode).toBe(422);
  });
});

describe('a live claim', () => {
  it('records its job before the job runs and renews its lease while the request lives', async () => {
    const pending = h.call('test_sleep', { ms: 4_000 }, a.apiKey, { 'idempotency-key': 'live-claim' });
    let entry: { job_ids: string; lease_until: number; state: string } | null = null;
    const t0 = Date.now();
    // Read the claim after a renewal (every third of the 10 s lease).
    await new Promise((r) => setTimeout(r, 3_600));
    entry = JSON.parse((await h.container.redis.get(claimKey('live-claim')))!);
    expect(entry!.state).toBe('running');
    expect(entry!.job_ids).toMatch(/^web-/);
    expect(entry!.lease_until).toBeGreaterThan(t0 + 10_000);
    const res = await pending;
    expect(res.statusCode).toBe(200);
    expect(res.headers['x-job-id']).toBe(entry!.job_ids);
  });
});
