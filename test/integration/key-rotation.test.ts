import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { LightMyRequestResponse } from 'fastify';
import { z } from 'zod';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { sql } from '../../src/db/pool.js';

const auth = (key: string) => ({ authorization: `Bearer ${key}` });
const balance = (h: Harness, key: string) => h.request({ method: 'GET', url: '/balance', headers: auth(key) });
const listKeys = (h: Harness, key: string) => h.request({ method: 'GET', url: '/keys', headers: auth(key) });
const rotate = (h: Harness, key: string, keyId: string) => h.request({ method: 'POST', url: `/keys/${keyId}/rotate`, headers: auth(key) });
const sleepUntil = async (t: number) => {
  while (Date.now() < t) await new Promise((r) => setTimeout(r, Math.min(50, Math.max(1, t - Date.now()))));
};

function expectError(res: LightMyRequestResponse, status: number, code: string) {
  expect(res.statusCode, res.body).toBe(status);
  expect(json(res).error.code).toBe(code);
}

describe('key rotation across two replicas (grace 2 s, keys cached 30 s)', () => {
  let a: Harness;
  let b: Harness;
  beforeAll(async () => {
    const prefix = `t${Math.random().toString(16).slice(2, 12)}`;
    const env = { REDIS_PREFIX: prefix, KEY_CACHE_SECONDS: '30', KEY_ROTATION_GRACE_SECONDS: '2' };
    a = await startHarness(env, { workers: [] });
    b = await startHarness(env, { workers: [] });
  });
  afterAll(async () => {
    await b.close();
    await a.close();
  });

  it('old and new key work on both replicas inside the grace period, only the new one after it', async () => {
    const acct = await a.account('pro', 100);
    // Both replicas have the old key cached (30 s) before the rotation.
    for (const h of [a, b]) expect((await balance(h, acct.apiKey)).statusCode).toBe(200);
    const res = await rotate(a, acct.apiKey, acct.keyId);
    expect(res.statusCode, res.body).toBe(201);
    const r = json(res);
    expect(r.api_key).toMatch(/^cv_[A-Za-z0-9]{40}$/);
    expect(r).toMatchObject({ type: 'production', replaces: { key_id: acct.keyId, grace_seconds: 2 } });
    expect(r.display_prefix).toBe(r.api_key.slice(0, 9));
    const expiresAt = Date.parse(r.replaces.expires_at);
    expect(expiresAt - Date.now()).toBeGreaterThan(1000);
    expect(expiresAt - Date.now()).toBeLessThanOrEqual(2000);

    // Inside the grace period: both keys, both replicas (the records now cached carry expires_at).
    for (const h of [a, b]) {
      expect((await balance(h, acct.apiKey)).statusCode).toBe(200);
      expect((await balance(h, r.api_key)).statusCode).toBe(200);
    }
    await sleepUntil(expiresAt - 300);
    for (const h of [a, b]) expect((await balance(h, acct.apiKey)).statusCode).toBe(200);

    // After it: the old key is refused by both, although both still hold it in their 30 s caches.
    await sleepUntil(expiresAt + 1);
    for (const h of [a, b]) {
      const old = await balance(h, acct.apiKey);
      expectError(old, 401, 'key_not_found');
      expect(json(old).error.message).toMatch(/expired/);
      expect((await balance(h, r.api_key)).statusCode).toBe(200);
    }
  });

  it('GET /keys shows the rotation, without secrets', async () => {
    const acct = await a.account('pro', 100);
    const r = json(await rotate(a, acct.apiKey, acct.keyId));
    const res = await listKeys(b, r.api_key);
    expect(res.statusCode, res.body).toBe(200);
    const keys = json(res).keys as any[];
    expect(keys.map((k) => k.key_id).sort()).toEqual([acct.keyId, r.key_id].sort());
    const old = keys.find((k) => k.key_id === acct.keyId);
    expect(old).toMatchObject({ type: 'production', replaced_by_key_id: r.key_id, expires_at: r.replaces.expires_at, revoked_at: null });
    expect(keys.find((k) => k.key_id === r.key_id)).toMatchObject({ expires_at: null, replaced_by_key_id: null, display_prefix: r.display_prefix });
    for (const k of keys)
      expect(Object.keys(k).sort()).toEqual([
        'created_at',
        'display_prefix',
        'expires_at',
        'key_id',
        'last_used_at',
        'name',
        'replaced_by_key_id',
        'revoked_at',
        'type',
      ]);
    expect(res.body).not.toContain(r.api_key);
    expect(res.body).not.toContain(acct.apiKey);
  });
});

describe('key rotation with KEY_ROTATION_GRACE_SECONDS=0', () => {
  let a: Harness;
  let b: Harness;
  beforeAll(async () => {
    const prefix = `t${Math.random().toString(16).slice(2, 12)}`;
    const env = { REDIS_PREFIX: prefix, KEY_CACHE_SECONDS: '30', KEY_ROTATION_GRACE_SECONDS: '0' };
    a = await startHarness(env, { workers: [] });
    b = await startHarness(env, { workers: [] });
  });
  afterAll(async () => {
    await b.close();
    await a.close();
  });

  it('the old key is refused at once on both replicas, the new one works on both', async () => {
    const acct = await a.account('pro', 100);
    for (const h of [a, b]) expect((await balance(h, acct.apiKey)).statusCode).toBe(200);
    const res = await rotate(a, acct.apiKey, acct.keyId);
    expect(res.statusCode, res.body).toBe(201);
    const r = json(res);
    expect(r.replaces.grace_seconds).toBe(0);
    expectError(await balance(a, acct.apiKey), 401, 'key_not_found');
    // The other replica drops its cached record on the broadcast (milliseconds), then sees expires_at.
    const rotatedAt = Date.now();
    await vi.waitFor(async () => expect((await balance(b, acct.apiKey)).statusCode).toBe(401), { timeout: 1000, interval: 5 });
    expect(Date.now() - rotatedAt).toBeLessThan(1000);
    for (const h of [a, b]) expect((await balance(h, r.api_key)).statusCode).toBe(200);
  });
});

describe('who may list and rotate keys', () => {
  let h: Harness;
  let ent: TestAccount;
  let sub: { key_id: string; api_key: string };
  let sandbox: { keyId: string; apiKey: string };
  beforeAll(async () => {
    h = await startHarness({ KEY_ROTATION_GRACE_SECONDS: '60' }, { workers: [] });
    ent = await h.account('enterprise', 100, { rpm: 100_000 });
    sandbox = await h.key(ent.accountId, 'test');
    const created = await h.request({
      method: 'POST',
      url: '/subkeys/create',
      headers: { ...auth(ent.apiKey), 'content-type': 'application/json' },
      payload: JSON.stringify({ name: 's', monthly_limit: 100, allowed_tools: ['compute'] }),
    });
    sub = json(created);
  });
  afterAll(() => h.close());

  it('a sub-key and a sandbox key get 403 forbidden on GET /keys and on rotate, even of themselves', async () => {
    for (const key of [sub.api_key, sandbox.apiKey]) {
      expectError(await listKeys(h, key), 403, 'forbidden');
      expectError(await rotate(h, key, ent.keyId), 403, 'forbidden');
    }
    expectError(await rotate(h, sub.api_key, sub.key_id), 403, 'forbidden');
    expectError(await rotate(h, sandbox.apiKey, sandbox.keyId), 403, 'forbidden');
    // Nothing was rotated.
    const keys = json(await listKeys(h, ent.apiKey)).keys as any[];
    expect(keys.every((k) => k.replaced_by_key_id === null)).toBe(true);
    expect(keys).toHaveLength(3);
  });

  it("another account's key is 404, a key id that is not a uuid 400", async () => {
    const other = await h.account('pro', 0);
    expectError(await rotate(h, ent.apiKey, other.keyId), 404, 'not_found');
    expectError(await rotate(h, ent.apiKey, '00000000-0000-4000-8000-000000000000'), 404, 'not_found');
    expectError(await rotate(h, ent.apiKey, 'not-a-key'), 400, 'invalid_input');
    // The other account's key still works and is not replaced.
    expect((await balance(h, other.apiKey)).statusCode).toBe(200);
  });

  it('a production key rotates an agent key (same type and name); a sub-key is 403, a rotated or revoked key 409', async () => {
    const agent = await h.key(ent.accountId, 'agent', 'bot');
    const res = await rotate(h, ent.apiKey, agent.keyId);
    expect(res.statusCode, res.body).toBe(201);
    const r = json(res);
    expect(r).toMatchObject({ type: 'agent', name: 'bot' });
    expect(r.api_key).toMatch(/^cv_agent_/);
    expect((await balance(h, r.api_key)).statusCode).toBe(200);
    expect((await balance(h, agent.apiKey)).statusCode).toBe(200); // 60 s grace

    const again = await rotate(h, ent.apiKey, agent.keyId);
    expectError(again, 409, 'key_not_active');
    expect(json(again).error.state).toBe('rotated');

    expectError(await rotate(h, ent.apiKey, sub.key_id), 403, 'forbidden');

    // A production key may rotate the account's sandbox key (the sandbox key itself may not).
    const test = await h.key(ent.accountId, 'test', 'playground');
    const t = await rotate(h, ent.apiKey, test.keyId);
    expect(t.statusCode, t.body).toBe(201);
    expect(json(t)).toMatchObject({ type: 'test', name: 'playground' });
    expect(json(t).api_key).toMatch(/^cv_test_/);

    const spare = await h.key(ent.accountId, 'production', 'spare');
    await h.admin.revokeKey(spare.keyId);
    const revoked = await rotate(h, ent.apiKey, spare.keyId);
    expectError(revoked, 409, 'key_not_active');
    expect(json(revoked).error.state).toBe('revoked');
  });

  it('last_used_at is written on use, at most once a minute per key', async () => {
    const acct = await h.account('pro', 0);
    const lastUsed = () =>
      h.container.pool.oneFirst(sql.type(z.object({ t: z.string().nullable() }))`SELECT last_used_at AS t FROM api_keys WHERE id = ${acct.keyId}`);
    expect(await lastUsed()).toBeNull();
    expect((await balance(h, acct.apiKey)).statusCode).toBe(200);
    await vi.waitFor(async () => expect(await lastUsed()).not.toBeNull(), { timeout: 2000, interval: 20 });
    const keys = json(await listKeys(h, acct.apiKey)).keys as any[];
    expect(keys[0].last_used_at).toEqual(expect.any(String));
    // Within the minute, further uses write nothing.
    await h.container.pool.query(sql.unsafe`UPDATE api_keys SET last_used_at = NULL WHERE id = ${acct.keyId}`);
    for (let i = 0; i < 5; i++) expect((await balance(h, acct.apiKey)).statusCode).toBe(200);
    await new Promise((r) => setTimeout(r, 200));
    expect(await lastUsed()).toBeNull();
  });
});
