import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LightMyRequestResponse } from 'fastify';
import type { Hex } from 'viem';
import { generatePrivateKey } from 'viem/accounts';
import type { PaymentRequirements } from '../../src/pay/x402/requirements.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { PAY_TO, signPayment, toHeader } from '../helpers/x402-sign.js';

/**
 * The third round of attacks, keys, paid requests, deferred payments and passports: each case is a
 * finding that held on the code before it (see the README's security section). The other findings
 * of the round have their own files: attacks-round-3-redis (bounded answers and Redis),
 * attacks-round-3-webhooks (secrets and Standard Webhooks) and attacks-round-3-low.
 */

const X402_RPM = 4;
let h: Harness;

beforeAll(async () => {
  h = await startHarness(
    {
      KEY_ROTATION_GRACE_SECONDS: '86400',
      X402_ENABLED: 'true',
      X402_PAY_TO: PAY_TO,
      X402_SETTLEMENT: 'deferred',
      X402_DEFERRED_MAX_CENTS: '100000',
      X402_RPM: String(X402_RPM),
    },
    { workers: ['core', 'text'] },
  );
});

afterAll(async () => {
  await h?.close();
});

const auth = (key: string) => ({ authorization: `Bearer ${key}` });
const get = (url: string, key: string) => h.request({ method: 'GET', url, headers: auth(key) });
const post = (url: string, key: string, body?: unknown) =>
  h.request({
    method: 'POST',
    url,
    headers: { ...auth(key), ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    ...(body === undefined ? {} : { payload: JSON.stringify(body) }),
  });
const del = (url: string, key: string) => h.request({ method: 'DELETE', url, headers: auth(key) });

function expectError(res: LightMyRequestResponse, status: number, code: string): Record<string, any> {
  expect(res.statusCode, res.body).toBe(status);
  const { error } = json(res);
  expect(error.code, res.body).toBe(code);
  return error;
}

async function rotate(key: string, keyId: string): Promise<{ keyId: string; apiKey: string }> {
  const res = await post(`/keys/${keyId}/rotate`, key);
  expect(res.statusCode, res.body).toBe(201);
  return { keyId: json(res).key_id, apiKey: json(res).api_key };
}

/** Every route that manages the account's keys or secrets, as one key would try them. */
function managementRoutes(target: { keyId: string }) {
  return [
    ['GET /keys', (k: string) => get('/keys', k)],
    ['POST /keys/{id}/rotate', (k: string) => post(`/keys/${target.keyId}/rotate`, k)],
    ['DELETE /keys/{id}', (k: string) => del(`/keys/${target.keyId}`, k)],
    ['POST /subkeys/create', (k: string) => post('/subkeys/create', k, { name: 'x', monthly_limit: 1_000_000_000, allowed_tools: ['compute'] })],
    ['GET /subkeys', (k: string) => get('/subkeys', k)],
    ['DELETE /subkeys/{id}', (k: string) => del(`/subkeys/${target.keyId}`, k)],
    ['GET /webhooks/secret', (k: string) => get('/webhooks/secret', k)],
    ['POST /webhooks/secret', (k: string) => post('/webhooks/secret', k)],
  ] as const;
}

describe('a leaked key, rotated then revoked (the leak drill)', () => {
  it('the leaked key in its grace manages nothing, is revoked at once, and its replacement reads and cancels its jobs', async () => {
    const owner = await h.account('enterprise', 10_000, { rpm: 100_000, maxInFlight: 50 });
    const leaked = owner.apiKey;
    // A job the leaked key made before the leak was noticed (charged: its answer must stay reachable).
    const before = await h.call('compute', { expression: '6*7' }, leaked);
    expect(before.statusCode, before.body).toBe(200);
    const jobId = before.headers['x-job-id'] as string;
    expect(jobId).toBeTruthy();

    const fresh = await rotate(leaked, owner.keyId);

    // The attacker still holds the leaked key: every management route is 403 key_in_grace.
    for (const [route, call] of managementRoutes(fresh)) {
      const err = expectError(await call(leaked), 403, 'key_in_grace');
      expect(err.message, route).toMatch(/grace period/);
    }
    // ...and so are the account's usage and top-ups.
    expectError(await get('/usage', leaked), 403, 'key_in_grace');
    expectError(await post('/credits/topup', leaked, { cents: 500 }), 403, 'key_in_grace');
    // The owner's key was not put on a clock, and no key was minted by the attacker.
    const keys = json(await get('/keys', fresh.apiKey)).keys as Array<Record<string, any>>;
    expect(keys.map((k) => k.key_id).sort()).toEqual([owner.keyId, fresh.keyId].sort());
    expect(keys.find((k) => k.key_id === fresh.keyId)).toMatchObject({ expires_at: null, revoked_at: null });

    // In its grace the old key still does what clients in flight need: call tools, read its jobs.
    expect((await h.call('compute', { expression: '1+1' }, leaked)).statusCode).toBe(200);
    expect((await get(`/jobs/${jobId}`, leaked)).statusCode).toBe(200);

    // The owner revokes it: refused at once (no waiting for the grace to end).
    const revoked = await del(`/keys/${owner.keyId}`, fresh.apiKey);
    expect(revoked.statusCode, revoked.body).toBe(200);
    expect(json(revoked)).toMatchObject({ key_id: owner.keyId, revoked: true, type: 'production' });
    expectError(await h.call('compute', { expression: '1+1' }, leaked), 401, 'key_not_found');
    expectError(await get(`/jobs/${jobId}`, leaked), 401, 'key_not_found');
    // Revoking again changes nothing.
    expect(json(await del(`/keys/${owner.keyId}`, fresh.apiKey)).revoked_at).toBe(json(revoked).revoked_at);

    // The replacement reads the old key's job, finds it in its list, and may cancel it (finished: 409, not 404).
    const read = await get(`/jobs/${jobId}`, fresh.apiKey);
    expect(read.statusCode, read.body).toBe(200);
    expect(json(read)).toMatchObject({ job_id: jobId, status: 'completed', cost_cents: 2, result: expect.objectContaining({ value: 42 }) });
    const list = json(await get('/jobs', fresh.apiKey)).jobs as Array<{ job_id: string }>;
    expect(list.map((j) => j.job_id)).toContain(jobId);
    expectError(await del(`/jobs/${jobId}`, fresh.apiKey), 409, 'job_finished');
    // Another account's key still cannot.
    const other = await h.account('pro', 100);
    expectError(await get(`/jobs/${jobId}`, other.apiKey), 404, 'not_found');
  });

  it("the replacement of a replacement reads the first key's jobs; a grace key cannot read its replacement's", async () => {
    const owner = await h.account('pro', 1_000);
    const first = await h.call('compute', { expression: '2+2' }, owner.apiKey);
    const second = await rotate(owner.apiKey, owner.keyId);
    const third = await rotate(second.apiKey, second.keyId);
    expect((await get(`/jobs/${first.headers['x-job-id']}`, third.apiKey)).statusCode).toBe(200);
    const later = await h.call('compute', { expression: '3+3' }, third.apiKey);
    expectError(await get(`/jobs/${later.headers['x-job-id']}`, owner.apiKey), 404, 'not_found');
  });

  it("a key cannot revoke itself, and another account's key is not found", async () => {
    const a = await h.account('pro', 100);
    const b = await h.account('pro', 100);
    const err = expectError(await del(`/keys/${a.keyId}`, a.apiKey), 403, 'forbidden');
    expect(err.message).toMatch(/rotate it/);
    expectError(await del(`/keys/${b.keyId}`, a.apiKey), 404, 'not_found');
    expectError(await del('/keys/not-a-uuid', a.apiKey), 400, 'invalid_input');
    expect((await h.call('compute', { expression: '1' }, b.apiKey)).statusCode).toBe(200);
  });

  it('revokes a sub-key or an agent key at once', async () => {
    const owner = await h.account('enterprise', 1_000, { rpm: 100_000 });
    const agent = await h.key(owner.accountId, 'agent', 'bot');
    expect((await h.call('compute', { expression: '1' }, agent.apiKey)).statusCode).toBe(200);
    expect((await del(`/keys/${agent.keyId}`, owner.apiKey)).statusCode).toBe(200);
    expectError(await h.call('compute', { expression: '1' }, agent.apiKey), 401, 'key_not_found');
  });
});

describe('only the production key manages keys and secrets', () => {
  let owner: TestAccount;
  const others: Record<string, { keyId: string; apiKey: string }> = {};

  beforeAll(async () => {
    owner = await h.account('enterprise', 10_000, { rpm: 100_000 });
    others.agent = await h.key(owner.accountId, 'agent', 'bot');
    others.test = await h.key(owner.accountId, 'test', 'sandbox');
    const sub = await post('/subkeys/create', owner.apiKey, { name: 'team', monthly_limit: 100, allowed_tools: ['compute'] });
    expect(sub.statusCode, sub.body).toBe(201);
    others.sub = { keyId: json(sub).key_id, apiKey: json(sub).api_key };
  });

  it.each(['agent', 'test', 'sub'])('a %s key gets 403 on every management route and mints no key', async (type) => {
    const key = others[type]!;
    for (const [route, call] of managementRoutes({ keyId: owner.keyId })) {
      const res = await call(key.apiKey);
      expect(res.statusCode, `${route}: ${res.body}`).toBe(403);
      expect(['forbidden'], route).toContain(json(res).error.code);
    }
    // The production key is untouched: not rotated, not revoked.
    const mine = (json(await get('/keys', owner.apiKey)).keys as Array<Record<string, any>>).find((k) => k.key_id === owner.keyId);
    expect(mine).toMatchObject({ expires_at: null, revoked_at: null, replaced_by_key_id: null });
  });

  it('the production key does all of it', async () => {
    expect((await get('/keys', owner.apiKey)).statusCode).toBe(200);
    expect((await get('/webhooks/secret', owner.apiKey)).statusCode).toBe(200);
    expect((await get('/subkeys', owner.apiKey)).statusCode).toBe(200);
    const r = await post(`/keys/${others.agent!.keyId}/rotate`, owner.apiKey);
    expect(r.statusCode, r.body).toBe(201);
  });
});

const root = (body: unknown, headers: Record<string, string> = {}) =>
  h.request({ method: 'POST', url: '/', headers: { 'content-type': 'application/json', ...headers }, payload: JSON.stringify(body) });

async function offer(body: unknown): Promise<PaymentRequirements> {
  const res = await root(body);
  expect(res.statusCode, res.body).toBe(402);
  return json(res).accepts[0];
}

describe('paying buys a price, not a wider door', () => {
  it.each([
    ['parallel', { parallel: ['compute', 'context_extract', 'conversation_diagnostic'], q: '1+1' }],
    ['chain', { chain: ['compute', 'context_extract'], q: '1+1' }],
  ])('a %s request with a free step is 401 before any price is quoted', async (_mode, body) => {
    const res = await root(body);
    const err = expectError(res, 401, 'unauthorized');
    expect(err.message).toMatch(/free but needs an API key/);
    expect(err.free_tools).toEqual(expect.arrayContaining(['context_extract']));
    expect(res.headers['payment-required']).toBeUndefined();
    // Each free step alone is refused the same way.
    for (const tool of err.free_tools as string[]) expectError(await root({ m: tool, q: 'x' }), 401, 'unauthorized');
  });

  it("each step of a paid request counts against the payer's rate limit, as alone", async () => {
    const payer: Hex = generatePrivateKey();
    const body = { parallel: ['compute', 'compute', 'compute'], q: '1+1' };
    const pay = async () => root(body, { 'x-payment': toHeader(await signPayment(await offer(body), { privateKey: payer })) });
    expect((await pay()).statusCode).toBe(200);
    // Three calls of an X402_RPM of 4 are spent: three more do not fit, though it is one request.
    expectError(await pay(), 429, 'rate_limited');
  });
});

describe('deferred payments must be collectable', () => {
  it('an authorization that expires before the collection window is 402 payment_invalid, and nothing runs', async () => {
    const body = { m: 'compute', q: '1+1' };
    const req = await offer(body);
    const now = Math.floor(Date.now() / 1000);
    const payment = await signPayment(req, { privateKey: generatePrivateKey(), authorization: { validBefore: String(now + 9) } });
    const res = await root(body, { 'x-payment': toHeader(payment) });
    expect(res.statusCode, res.body).toBe(402);
    expect(json(res)).toMatchObject({ code: 'payment_invalid' });
    expect(JSON.stringify(json(res))).toMatch(/expires_before_collection/);
    expect(res.headers['x-job-id']).toBeUndefined();
    // One signed for the window asked (maxTimeoutSeconds) is served.
    const good = await root(body, { 'x-payment': toHeader(await signPayment(req, { privateKey: generatePrivateKey() })) });
    expect(good.statusCode, good.body).toBe(200);
  });
});

describe('passports follow keys', () => {
  const store = (body: unknown, key: string) => h.call('passport_store', body, key);
  const result = (res: LightMyRequestResponse) => {
    expect(res.statusCode, res.body).toBe(200);
    return json(res).result as Record<string, any>;
  };

  it('a sub-key sees and deletes only what it stored or was sent; the production key sees all', async () => {
    const owner = await h.account('enterprise', 10_000, { rpm: 100_000 });
    const mk = async (name: string) => {
      const res = await post('/subkeys/create', owner.apiKey, { name, monthly_limit: 1000, allowed_tools: ['passport_store', 'passport_send'] });
      return json(res).api_key as string;
    };
    const subA = await mk('a');
    const subB = await mk('b');
    const ownerPp = result(await store({ action: 'put', content: 'owner secret' }, owner.apiKey)).handle as string;
    const aPp = result(await store({ action: 'put', content: 'a note' }, subA)).handle as string;
    const bPp = result(await store({ action: 'put', content: 'b note' }, subB)).handle as string;
    // The owner hands one passport to sub-key b.
    const subBId = (json(await get('/subkeys', owner.apiKey)).subkeys as Array<{ key_id: string; name: string }>).find((s) => s.name === 'b')!.key_id;
    const sent = result(await h.call('passport_send', { to: subBId, content: 'for b only' }, owner.apiKey));

    // Sub-key a: its own passport only.
    const aList = result(await store({ action: 'list' }, subA));
    expect(aList.passports.map((p: { handle: string }) => p.handle)).toEqual([aPp]);
    expect(aList.total).toBe(1);
    for (const handle of [ownerPp, bPp, sent.handle]) {
      expectError(await store({ action: 'get', handle }, subA), 404, 'not_found');
      expectError(await store({ action: 'delete', handle }, subA), 404, 'not_found');
      // Nor can it pass on what it cannot read.
      expectError(await h.call('passport_send', { to: 'self', handle }, subA), 404, 'not_found');
    }
    // Sub-key b: its own and the one sent to it.
    expect(result(await store({ action: 'get', handle: sent.handle }, subB)).content).toBe('for b only');
    expectError(await store({ action: 'get', handle: ownerPp }, subB), 404, 'not_found');
    // The production key sees all four, and everything is still there.
    const all = result(await store({ action: 'list' }, owner.apiKey));
    expect(all.passports.map((p: { handle: string }) => p.handle).sort()).toEqual([ownerPp, aPp, bPp, sent.handle].sort());
    expect(result(await store({ action: 'get', handle: aPp }, owner.apiKey)).content).toBe('a note');
  });
});
