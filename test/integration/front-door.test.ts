import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { z } from 'zod';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import type { InjectOptions } from 'fastify';
import { sql } from '../../src/db/pool.js';
import { nestsDeeperThan } from '../../src/faces/http/plugins/json-body.js';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { PAY_TO, signPayment, toHeader } from '../helpers/x402-sign.js';

/**
 * What stands in front of every call: the JSON depth cap, the throttle before authentication and
 * its negative key cache, VIP keys that follow their account, rate limits on MCP batches and x402
 * payers, and edge tokens limited to visible ASCII. Requests carry a client address of their own per
 * test (inject's remoteAddress), so per-address counts never leak between tests.
 */

let h: Harness;
beforeAll(async () => {
  h = await startHarness({ X402_ENABLED: 'true', X402_PAY_TO: PAY_TO, X402_SETTLEMENT: 'deferred', X402_DEFERRED_MAX_CENTS: '100000' }, { workers: ['core'] });
});
afterAll(() => h.close());

let nextAddress = 1;
/** A client address no other test uses. */
const newAddress = () => `10.77.${Math.floor(nextAddress / 250)}.${(nextAddress++ % 250) + 1}`;

const randomKey = (prefix = 'cv_') =>
  prefix +
  randomBytes(48)
    .toString('base64')
    .replace(/[^A-Za-z0-9]/g, '')
    .slice(0, 40);

function from(address: string, o: InjectOptions) {
  return h.request({ ...o, remoteAddress: address });
}
const getBalance = (address: string, key?: string) => from(address, { method: 'GET', url: '/balance', headers: key ? { authorization: `Bearer ${key}` } : {} });
const postJson = (address: string, url: string, key: string | undefined, payload: string, headers: Record<string, string> = {}) =>
  from(address, {
    method: 'POST',
    url,
    headers: { ...(key ? { authorization: `Bearer ${key}` } : {}), 'content-type': 'application/json', ...headers },
    payload,
  });

const MCP_HEADERS = { accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-03-26' };
const postMcp = (address: string, key: string, payload: string, headers: Record<string, string> = {}) =>
  postJson(address, '/mcp', key, payload, { ...MCP_HEADERS, ...headers });

function expectEnvelope(res: { statusCode: number; body: string; headers: Record<string, unknown> }, status: number, code: string) {
  expect(res.statusCode).toBe(status);
  const body = JSON.parse(res.body);
  expect(Object.keys(body)).toEqual(['error']);
  expect(body.error).toMatchObject({ code, request_id: res.headers['x-request-id'] });
  return body.error as Record<string, unknown> & { message: string };
}

describe('JSON nesting depth', () => {
  const nested = (depth: number) => `{"expression":"1+1","x":${'['.repeat(depth - 1)}${']'.repeat(depth - 1)}}`;
  let key: string;
  beforeAll(async () => {
    key = (await h.account('enterprise', 1_000, { rpm: 100_000 })).apiKey;
  });

  it('the scan counts [ and { outside strings only, escapes included', () => {
    expect(nestsDeeperThan('[[[]]]', 3)).toBe(false);
    expect(nestsDeeperThan('[[[[]]]]', 3)).toBe(true);
    expect(nestsDeeperThan(`{"a":"${'['.repeat(100)}"}`, 1)).toBe(false);
    expect(nestsDeeperThan(`{"a":"\\"[[[[","b":[[1]]}`, 3)).toBe(false);
    expect(nestsDeeperThan(`{"a":"\\\\","b":[[[1]]]}`, 3)).toBe(true);
  });

  it('64 levels pass the cap; 65 are 400 invalid_input in the envelope', async () => {
    const ok = await postJson(newAddress(), '/tools/compute', key, nested(64));
    expect(ok.body).not.toMatch(/nests deeper/);
    const deep = await postJson(newAddress(), '/tools/compute', key, nested(65));
    const err = expectEnvelope(deep, 400, 'invalid_input');
    expect(err.message).toBe('JSON body nests deeper than 64 levels');
  });

  it('with an Idempotency-Key: 400 on POST /tools/compute, POST / and POST /v1/chat/completions, never 500', async () => {
    const deep = '['.repeat(5_000) + ']'.repeat(5_000);
    const rest = await postJson(newAddress(), '/tools/compute', key, `{"expression":"1","x":${deep}}`, { 'idempotency-key': 'deep-rest' });
    expect(expectEnvelope(rest, 400, 'invalid_input').message).toMatch(/nests deeper than 64 levels/);
    const root = await postJson(newAddress(), '/', key, `{"m":"compute","q":"1","x":${deep}}`, { 'idempotency-key': 'deep-root' });
    expect(expectEnvelope(root, 400, 'invalid_input').message).toMatch(/nests deeper than 64 levels/);
    const chat = await postJson(newAddress(), '/v1/chat/completions', key, `{"model":"svc-hints","messages":[{"role":"user","content":"hi","x":${deep}}]}`, {
      'idempotency-key': 'deep-chat',
    });
    expect(chat.statusCode).toBe(400);
    // The chat endpoint answers in OpenAI's error shape, with the service's code.
    expect(json(chat).error).toMatchObject({ code: 'invalid_input', type: 'invalid_request_error', message: 'JSON body nests deeper than 64 levels' });
  });

  it('on MCP: a JSON-RPC Invalid Request (-32600) with HTTP 400, no internals', async () => {
    const body = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"compute","arguments":{"expression":"1","x":${'['.repeat(5_000)}${']'.repeat(5_000)}}}}`;
    const res = await postMcp(newAddress(), key, body, { 'idempotency-key': 'deep-mcp' });
    expect(res.statusCode).toBe(400);
    expect(json(res)).toEqual({ jsonrpc: '2.0', id: null, error: { code: -32600, message: 'Invalid Request: JSON body nests deeper than 64 levels' } });
    expect(res.body).not.toMatch(/call stack/i);
    // Authentication still comes first.
    expect((await postMcp(newAddress(), randomKey(), body)).statusCode).toBe(401);
  });

  it('prototype poisoning is still refused', async () => {
    const res = await postJson(newAddress(), '/tools/compute', key, '{"expression":"1","__proto__":{"admin":true}}');
    expectEnvelope(res, 400, 'invalid_input');
  });
});

describe('throttle before authentication', () => {
  it('a repeated unknown key costs one Postgres lookup: concurrent or later, the rest are answered from memory', async () => {
    const spy = vi.spyOn(h.container.accounts, 'findKeyByHash');
    try {
      const address = newAddress();
      const key = randomKey();
      const burst = await Promise.all(Array.from({ length: 10 }, () => getBalance(address, key)));
      for (let i = 0; i < 10; i++) burst.push(await getBalance(address, key));
      for (const res of burst) expectEnvelope(res, 401, 'key_not_found');
      expect(spy).toHaveBeenCalledTimes(1);
    } finally {
      spy.mockRestore();
    }
  });

  it('past AUTH_FAIL_PER_MINUTE failures an address gets 429 with Retry-After and no lookup of its own; valid keys from it still work', async () => {
    const limit = h.config.AUTH_FAIL_PER_MINUTE;
    const address = newAddress();
    const acct = await h.account('enterprise', 100, { rpm: 100_000 });
    expect((await getBalance(address, acct.apiKey)).statusCode).toBe(200);
    const spy = vi.spyOn(h.container.accounts, 'findKeyByHash');
    try {
      const statuses: number[] = [];
      let last;
      for (let i = 0; i < limit + 40; i++) {
        last = await getBalance(address, randomKey());
        statuses.push(last.statusCode);
      }
      expect(statuses.slice(0, limit).every((s) => s === 401)).toBe(true);
      expect(statuses.slice(limit).every((s) => s === 429)).toBe(true);
      const err = expectEnvelope(last!, 429, 'rate_limited');
      expect(Number(last!.headers['retry-after'])).toBeGreaterThan(0);
      expect(err.retry_after).toBe(Number(last!.headers['retry-after']));
      // Only the failures under the limit had lookups of their own.
      expect(spy).toHaveBeenCalledTimes(limit);

      // A flood from the throttled address costs one query per batch, not one per request.
      const batchesBefore = h.container.api!.auth.batchedLookups;
      const flood = await Promise.all(Array.from({ length: 300 }, () => getBalance(address, randomKey())));
      expect(flood.every((r) => r.statusCode === 429)).toBe(true);
      expect(spy).toHaveBeenCalledTimes(limit);
      expect(h.container.api!.auth.batchedLookups - batchesBefore).toBeLessThanOrEqual(5);

      // Keyless and malformed requests from the address are refused the same way.
      expectEnvelope(await getBalance(address), 429, 'rate_limited');
      expectEnvelope(await getBalance(address, 'cv_short'), 429, 'rate_limited');
      // A valid key from the same address is not slowed down or refused, even once its cache entry lapsed.
      await new Promise((r) => setTimeout(r, h.config.KEY_CACHE_SECONDS * 1000 + 50));
      for (let i = 0; i < 3; i++) expect((await getBalance(address, acct.apiKey)).statusCode).toBe(200);
      // So does a valid key the service has never seen from this address.
      const fresh = await h.account('pro', 0);
      expect((await getBalance(address, fresh.apiKey)).statusCode).toBe(200);
      // One more lookup of its own: the known valid key's, once its cache entry lapsed.
      expect(spy).toHaveBeenCalledTimes(limit + 1);
      // Other addresses are untouched.
      expectEnvelope(await getBalance(newAddress(), randomKey()), 401, 'key_not_found');
      expect((await getBalance(newAddress(), acct.apiKey)).statusCode).toBe(200);
    } finally {
      spy.mockRestore();
    }
  });

  it('missing and malformed keys count as failures too', async () => {
    const address = newAddress();
    const limit = h.config.AUTH_FAIL_PER_MINUTE;
    for (let i = 0; i < limit; i++) {
      const res = i % 2 ? await getBalance(address) : await getBalance(address, 'Basic abc');
      expect(res.statusCode).toBe(401);
    }
    const res = await getBalance(address);
    expectEnvelope(res, 429, 'rate_limited');
    expect(res.headers['retry-after']).toMatch(/^\d+$/);
  });

  it('a revoked key is refused at once and then without lookups', async () => {
    const address = newAddress();
    const acct = await h.account('enterprise', 100, { rpm: 100_000 });
    const sub = json(await postJson(address, '/subkeys/create', acct.apiKey, JSON.stringify({ name: 'r', monthly_limit: 5, allowed_tools: ['compute'] })));
    expect((await getBalance(address, sub.api_key)).statusCode).toBe(200);
    await from(address, { method: 'DELETE', url: `/subkeys/${sub.key_id}`, headers: { authorization: `Bearer ${acct.apiKey}` } });
    expectEnvelope(await getBalance(address, sub.api_key), 401, 'key_not_found');
    const spy = vi.spyOn(h.container.accounts, 'findKeyByHash');
    try {
      for (let i = 0; i < 5; i++) expectEnvelope(await getBalance(address, sub.api_key), 401, 'key_not_found');
      expect(spy).not.toHaveBeenCalled();
    } finally {
      spy.mockRestore();
    }
  });
});

describe('VIP keys follow their account', () => {
  it('401 key_not_found once the account is no longer elite or no longer enterprise; back again when it is', async () => {
    const address = newAddress();
    const acct = await h.account('enterprise', 100, { rpm: 100_000 });
    await h.admin.setAccount(acct.accountId, { elite: true });
    const vip = await h.key(acct.accountId, 'vip');
    const call = () => postJson(address, '/tools/compute', vip.apiKey, '{"expression":"1+1"}');
    expect((await call()).statusCode).toBe(200);

    const refused = async () => {
      // The change reaches every replica's key cache through the broadcast.
      await vi.waitFor(async () => expect((await call()).statusCode).toBe(401), { timeout: 2_000, interval: 20 });
      const err = expectEnvelope(await call(), 401, 'key_not_found');
      expect(err.message).toMatch(/this VIP key's account is no longer enterprise and elite/);
    };
    const works = () => vi.waitFor(async () => expect((await call()).statusCode).toBe(200), { timeout: 2_000, interval: 20 });

    await h.admin.setAccount(acct.accountId, { elite: false });
    await refused();
    await h.admin.setAccount(acct.accountId, { elite: true });
    await works();
    await h.admin.setAccount(acct.accountId, { plan: 'pro' });
    await refused();
    await h.admin.setAccount(acct.accountId, { plan: 'enterprise' });
    await works();
    // Other keys of the account are not affected by its elite status.
    await h.admin.setAccount(acct.accountId, { elite: false });
    await refused();
    expect((await postJson(address, '/tools/compute', acct.apiKey, '{"expression":"1+1"}')).statusCode).toBe(200);
  });
});

describe('VIP keys and the address throttle', () => {
  it('a VIP key refused for its account is a real key, not a guess: 401 even from a throttled address, and not counted', async () => {
    const address = newAddress();
    const acct = await h.account('enterprise', 100, { rpm: 100_000 });
    await h.admin.setAccount(acct.accountId, { elite: true });
    const vip = await h.key(acct.accountId, 'vip');
    await h.admin.setAccount(acct.accountId, { elite: false });
    await vi.waitFor(async () => expect((await getBalance(address, vip.apiKey)).statusCode).toBe(401), { timeout: 2_000, interval: 20 });
    for (let i = 0; i < h.config.AUTH_FAIL_PER_MINUTE + 5; i++) await getBalance(address, vip.apiKey);
    expectEnvelope(await getBalance(address, randomKey()), 401, 'key_not_found'); // the address is not throttled
    for (let i = 0; i < h.config.AUTH_FAIL_PER_MINUTE; i++) await getBalance(address);
    expectEnvelope(await getBalance(address), 429, 'rate_limited'); // now it is
    expectEnvelope(await getBalance(address, vip.apiKey), 401, 'key_not_found');
  });
});

describe('MCP batches', () => {
  const list = (id: number) => ({ jsonrpc: '2.0', id, method: 'tools/list' });
  const batch = (n: number) => JSON.stringify(Array.from({ length: n }, (_, i) => list(i + 1)));

  it('a batch of 100 tools/list is refused whole: 400, JSON-RPC -32600, a small answer, counted once', async () => {
    const acct = await h.account('pro', 0);
    const res = await postMcp(newAddress(), acct.apiKey, batch(100));
    expect(res.statusCode).toBe(400);
    expect(json(res)).toEqual({
      jsonrpc: '2.0',
      id: null,
      error: { code: -32600, message: 'Invalid Request: a batch may hold at most 20 messages; this one has 100' },
    });
    expect(res.body.length).toBeLessThan(300);
    expect(res.headers['x-ratelimit-remaining']).toBe('59');
  });

  it('a batch of 5 counts 5 against the rate limit', async () => {
    const acct = await h.account('pro', 0);
    const address = newAddress();
    const one = await postMcp(address, acct.apiKey, JSON.stringify(list(1)));
    expect(one.statusCode).toBe(200);
    expect(one.headers['x-ratelimit-remaining']).toBe('59');
    const five = await postMcp(address, acct.apiKey, batch(5));
    expect(five.statusCode).toBe(200);
    expect(json<unknown[]>(five)).toHaveLength(5);
    expect(five.headers['x-ratelimit-remaining']).toBe('54');
  });

  it('a batch is admitted only if all its messages fit in the window', async () => {
    const acct = await h.account('free', 0); // 10 per minute
    const address = newAddress();
    expect((await postMcp(address, acct.apiKey, batch(5))).statusCode).toBe(200); // 5 used
    expect((await postMcp(address, acct.apiKey, JSON.stringify(list(1)))).statusCode).toBe(200); // 6
    const res = await postMcp(address, acct.apiKey, batch(5)); // 1 more counted on arrival (7); 4 more do not fit
    expectEnvelope(res, 429, 'rate_limited');
    expect(Number(res.headers['retry-after'])).toBeGreaterThan(0);
    const three = await postMcp(address, acct.apiKey, batch(3)); // 10 used
    expect(three.statusCode).toBe(200);
    expect(three.headers['x-ratelimit-remaining']).toBe('0');
    expect((await postMcp(address, acct.apiKey, JSON.stringify(list(1)))).statusCode).toBe(429);
  });

  it('a batch longer than the key may ever send in a minute is 400, not a 429 that retrying cannot cure', async () => {
    const acct = await h.account('free', 0);
    const res = await postMcp(newAddress(), acct.apiKey, batch(15));
    expect(res.statusCode).toBe(400);
    expect(json(res).error).toMatchObject({ code: -32600 });
  });
});

describe('x402 payers are rate-limited per address', () => {
  const PaymentRow = z.object({ status: z.string(), error: z.string().nullable() });
  const Count = z.object({ n: z.number() });

  it('the 61st paid call in a minute is 429 with Retry-After, runs nothing, and its payment is not settled', async () => {
    const rpm = h.config.X402_RPM;
    const key = generatePrivateKey();
    const payer = privateKeyToAccount(key).address.toLowerCase();
    const offer = await h.call('compute', { expression: '1+1' });
    expect(offer.statusCode).toBe(402);
    const requirements = json(offer).accepts[0];
    const payments = await Promise.all(Array.from({ length: rpm + 1 }, async () => toHeader(await signPayment(requirements, { privateKey: key }))));
    const paid = (payment: string) => h.call('compute', { expression: '1+1' }, undefined, { 'x-payment': payment });

    const statuses: number[] = [];
    for (let i = 0; i < rpm; i += 5) {
      const group = await Promise.all(payments.slice(i, i + 5).map(paid));
      statuses.push(...group.map((r) => r.statusCode));
    }
    expect(statuses).toEqual(Array(rpm).fill(200));

    const last = await paid(payments[rpm]!);
    const err = expectEnvelope(last, 429, 'rate_limited');
    expect(Number(last.headers['retry-after'])).toBeGreaterThan(0);
    expect(err.retry_after).toBe(Number(last.headers['retry-after']));
    expect(last.headers['x-payment-response']).toBeUndefined();

    const rows = await h.container.pool.any(sql.type(PaymentRow)`
      SELECT status, error FROM x402_payments WHERE payer = ${payer} ORDER BY created_at, id`);
    expect(rows).toHaveLength(rpm + 1);
    expect(rows.filter((r) => r.status === 'failed')).toEqual([{ status: 'failed', error: 'call: rate_limited' }]);
    const ledger = await h.container.pool.oneFirst(sql.type(Count)`SELECT count(*)::bigint AS n FROM ledger WHERE payer = ${payer}`);
    expect(ledger).toBe(rpm);
  }, 60_000);
});

describe('edge tokens', () => {
  const TOKENS = ['tok-abc\r\nX-Injected: yes', 'tok-\u00e9t\u00e9-123456', 'tok-\u2603-snowman', 'tok with space'];
  let key: string;
  beforeAll(async () => {
    key = (await h.account('pro', 100)).apiKey;
  });

  const noEcho = (res: { body: string }, token: string) => {
    expect(res.body).not.toContain(token);
    expect(res.body).not.toContain(JSON.stringify(token).slice(1, -1));
    expect(h.logs.join('')).not.toContain(JSON.stringify(token).slice(1, -1));
  };

  it.each(TOKENS)('%j in edge_token is 400 invalid_input naming the field, never echoed (REST)', async (token) => {
    const res = await postJson(newAddress(), '/tools/cf_list_zones', key, JSON.stringify({ edge_token: token }));
    const err = expectEnvelope(res, 400, 'invalid_input');
    expect(err.message).toMatch(/X-Edge-Token header or edge_token field/);
    expect(err.issues).toEqual([{ path: ['X-Edge-Token'], message: expect.any(String) }]);
    noEcho(res, token);
  });

  it('in the X-Edge-Token header (a non-Latin-1 character arrives as Latin-1 bytes): 400', async () => {
    const token = Buffer.from('tok-\u00e9t\u00e9-123456', 'utf8').toString('latin1');
    const res = await postJson(newAddress(), '/tools/cf_list_zones', key, '{}', { 'x-edge-token': token });
    expectEnvelope(res, 400, 'invalid_input');
    noEcho(res, token);
  });

  it.each([
    ['direct', { m: 'cf_list_zones', q: 'example.com' }],
    ['parallel', { parallel: ['compute', 'cf_list_zones'], q: '1' }],
    ['a later chain step', { chain: ['compute', 'cf_list_zones'], q: '1' }],
  ])('on the root protocol (%s): 400 before anything runs', async (_l, body) => {
    const token = TOKENS[0]!;
    const res = await postJson(newAddress(), '/', key, JSON.stringify({ ...body, edge_token: token }));
    expectEnvelope(res, 400, 'invalid_input');
    noEcho(res, token);
  });

  it('over MCP: an invalid_input tool result, never echoed', async () => {
    const token = TOKENS[1]!;
    const res = await postMcp(
      newAddress(),
      key,
      JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'cf_list_zones', arguments: { edge_token: token } } }),
    );
    expect(res.statusCode).toBe(200);
    expect(json(res).result).toMatchObject({ isError: true, structuredContent: { error: { code: 'invalid_input' } } });
    noEcho(res, token);
  });

  it('a token of visible ASCII passes this check', async () => {
    // Answered at once with a 202: no edge workers run here, so the job only waits in its queue.
    const res = await postJson(newAddress(), '/tools/cf_list_zones', key, '{}', {
      'x-edge-token': 'Ab0_-.~!"#$%&()*+,/:;<=>?@[]^`{|}',
      prefer: 'respond-async',
    });
    expect(res.statusCode).toBe(202);
  });
});
