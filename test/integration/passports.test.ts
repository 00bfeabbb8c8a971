import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LightMyRequestResponse } from 'fastify';
import { findTool } from '../../src/tools/index.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { accountTag } from '../../src/queue/keyspace.js';

/**
 * passport_store and passport_send through the whole path (HTTP, queue, worker, settlement), with
 * real Redis and Postgres. The harness caps accounts at 5 passports so the cap test is cheap; every
 * other test uses its own account and stays under it.
 */

const CAP = 5;
const MAX_BYTES = 256 * 1024;
let h: Harness;

beforeAll(async () => {
  h = await startHarness({ PASSPORT_KEY: randomBytes(32).toString('hex'), PASSPORTS_PER_ACCOUNT: String(CAP) }, { workers: ['core'] });
});

afterAll(async () => {
  await h?.close();
});

const account = () => h.account('enterprise', 1000, { rpm: 100_000, maxInFlight: 100 });
const sha = (s: string) => createHash('sha256').update(Buffer.from(s, 'utf8')).digest('hex');

/** A 200 whose result satisfies the tool's output schema; returns the result. */
function ok(tool: string, res: LightMyRequestResponse): Record<string, any> {
  expect(res.statusCode, res.body.slice(0, 500)).toBe(200);
  const result = json(res).result;
  const parsed = findTool(tool)!.outputSchema!.safeParse(result);
  expect(parsed.success, parsed.success ? '' : JSON.stringify(parsed.error.issues.slice(0, 3))).toBe(true);
  return result;
}

const store = (body: unknown, key: string) => h.call('passport_store', body, key);
const send = (body: unknown, key: string) => h.call('passport_send', body, key);

async function ppKeys(): Promise<string[]> {
  const out: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await h.container.redis!.scan(cursor, 'MATCH', `${h.config.REDIS_PREFIX}:pp:*`, 'COUNT', 1000);
    cursor = next;
    out.push(...keys);
  } while (cursor !== '0');
  return out;
}

describe('passport_store', () => {
  let a: TestAccount;
  beforeAll(async () => {
    a = await account();
  });

  it('put then get round-trips non-ASCII and near-cap content byte for byte with the same sha256; over the cap is 422', async () => {
    const small = 'Übergabe: 日本語, emoji 🧭, quotes "x", backslash \\, newline\n, tab\t.';
    // Exactly PASSPORT_MAX_BYTES of UTF-8 with multi-byte characters (3 + 4 bytes each).
    const big = `${'€𝄞'.repeat(Math.floor(MAX_BYTES / 7))}${'a'.repeat(MAX_BYTES % 7)}`;
    expect(Buffer.byteLength(big)).toBe(MAX_BYTES);
    for (const content of [small, big]) {
      const put = ok('passport_store', await store({ action: 'put', content, label: 'note', ttl_s: 600 }, a.apiKey));
      expect(put).toMatchObject({ action: 'put', bytes: Buffer.byteLength(content), sha256: sha(content) });
      const got = ok('passport_store', await store({ action: 'get', handle: put.handle }, a.apiKey));
      expect(got.sha256).toBe(put.sha256);
      expect(sha(got.content)).toBe(put.sha256);
      expect(got.content === content).toBe(true);
      expect(got).toMatchObject({ label: 'note', from_key_id: a.keyId, expires_at: put.expires_at });
    }
    const before = await h.credits(a.accountId);
    const over = await store({ action: 'put', content: `${big}x` }, a.apiKey);
    expect(over.statusCode).toBe(422);
    expect(json(over).error).toMatchObject({ code: 'limit_exceeded', limit: 'passport_bytes', limit_value: MAX_BYTES });
    expect(await h.credits(a.accountId)).toBe(before);
    // q fills content: a put.
    const viaQ = ok('passport_store', await store({ content: 'from q' }, a.apiKey));
    expect(viaQ.action).toBe('put');
    const list = ok('passport_store', await store({ action: 'list' }, a.apiKey));
    expect(list.total).toBe(3);
    expect(list.passports.every((p: Record<string, unknown>) => !('content' in p))).toBe(true);
  });

  it('Redis holds only ciphertext under the pp namespace, every key with a TTL', async () => {
    const secret = `PLAINTEXT-${randomUUID()}`;
    const put = ok('passport_store', await store({ action: 'put', content: `${secret} ünï`, label: `LABEL-${secret}` }, a.apiKey));
    const keys = await ppKeys();
    expect(keys.some((k) => k.endsWith(`:p:${put.handle}`))).toBe(true);
    const redis = h.container.redis!;
    for (const k of keys) {
      const type = await redis.type(k);
      const values: Buffer[] =
        type === 'hash'
          ? Object.values(await redis.hgetallBuffer(k))
          : type === 'string'
            ? [(await redis.getBuffer(k))!]
            : (await redis.zrange(k, 0, -1)).map((m) => Buffer.from(m));
      expect(values.length).toBeGreaterThan(0);
      for (const v of values) {
        expect(v.includes(Buffer.from(secret))).toBe(false);
        expect(v.includes(Buffer.from(put.sha256))).toBe(false);
      }
      expect(await redis.pttl(k), k).toBeGreaterThan(0);
    }
  });

  it("another account's handle is 404 not_found for get and delete", async () => {
    const put = ok('passport_store', await store({ action: 'put', content: 'mine' }, a.apiKey));
    const other = await account();
    for (const body of [
      { action: 'get', handle: put.handle },
      { action: 'delete', handle: put.handle },
    ]) {
      const res = await store(body, other.apiKey);
      expect(res.statusCode).toBe(404);
      expect(json(res).error.code).toBe('not_found');
    }
    // Still there for its owner; delete then removes it.
    ok('passport_store', await store({ action: 'get', handle: put.handle }, a.apiKey));
    expect(ok('passport_store', await store({ action: 'delete', handle: put.handle }, a.apiKey))).toMatchObject({ deleted: true, handle: put.handle });
    expect((await store({ action: 'get', handle: put.handle }, a.apiKey)).statusCode).toBe(404);
  });

  it('ttl_s sets the Redis TTL; once Redis drops the passport it is gone from get and list', async () => {
    const b = await account();
    const put = ok('passport_store', await store({ action: 'put', content: 'short-lived', ttl_s: 60 }, b.apiKey));
    expect(Date.parse(put.expires_at) - Date.now()).toBeLessThanOrEqual(60_000);
    const key = `${h.config.REDIS_PREFIX}:pp:${accountTag(b.accountId)}:${b.accountId}:p:${put.handle}`;
    const pttl = await h.container.redis!.pttl(key);
    expect(pttl).toBeGreaterThan(45_000);
    expect(pttl).toBeLessThanOrEqual(60_000);
    expect((await store({ action: 'put', content: 'x', ttl_s: 59 }, b.apiKey)).statusCode).toBe(400);
    await h.container.redis!.pexpire(key, 1);
    await new Promise((r) => setTimeout(r, 20));
    expect((await store({ action: 'get', handle: put.handle }, b.apiKey)).statusCode).toBe(404);
    expect(ok('passport_store', await store({ action: 'list' }, b.apiKey))).toMatchObject({ total: 0, passports: [] });
  });

  it(`holds the per-account cap (${CAP}) under 20 concurrent puts`, async () => {
    const c = await account();
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => store({ action: 'put', content: `c${i}` }, c.apiKey)));
    const codes = results.map((r) => r.statusCode);
    expect(codes.filter((s) => s === 200)).toHaveLength(CAP);
    expect(codes.filter((s) => s === 422)).toHaveLength(20 - CAP);
    for (const r of results.filter((x) => x.statusCode === 422))
      expect(json(r).error).toMatchObject({ code: 'limit_exceeded', limit: 'passports_per_account' });
    expect(ok('passport_store', await store({ action: 'list' }, c.apiKey)).total).toBe(CAP);
    // A sandbox key of the account has its own namespace: it neither sees nor is limited by these.
    const test = await h.key(c.accountId, 'test');
    expect(ok('passport_store', await store({ action: 'list' }, test.apiKey)).total).toBe(0);
    ok('passport_store', await store({ action: 'put', content: 'sandbox' }, test.apiKey));
  });
});

describe('passport_send', () => {
  let a: TestAccount;
  let agent: { keyId: string; apiKey: string };
  beforeAll(async () => {
    a = await account();
    agent = await h.key(a.accountId, 'agent', 'reviewer');
  });

  it("delivers to an agent of the same account, charged exactly 5 cents once; the agent's inbox lists it and reads it", async () => {
    const credits = await h.credits(a.accountId);
    const charges = await h.ledgerCharges(a.accountId);
    const res = await send({ to: 'reviewer', content: 'Review PR 42: café ☕', ttl_s: 600 }, a.apiKey);
    const sent = ok('passport_send', res);
    expect(json(res).cost_cents).toBe(5);
    expect(sent).toMatchObject({ to_key_id: agent.keyId, handle: expect.stringMatching(/^pp_/), delivery_id: expect.stringMatching(/^dl_/) });
    expect(sent).not.toHaveProperty('dry_run');
    expect(await h.credits(a.accountId)).toBe(credits - 5);
    expect(await h.ledgerCharges(a.accountId)).toBe(charges + 1);
    // By key id too, an existing handle.
    const byId = ok('passport_send', await send({ to: agent.keyId, handle: sent.handle }, a.apiKey));
    expect(byId.handle).toBe(sent.handle);
    expect(await h.credits(a.accountId)).toBe(credits - 10);

    const inbox = ok('passport_store', await store({ action: 'inbox' }, agent.apiKey));
    expect(inbox.total).toBe(2);
    const d = inbox.deliveries.find((x: Record<string, unknown>) => x.delivery_id === sent.delivery_id);
    expect(d).toMatchObject({ handle: sent.handle, from_key_id: a.keyId, sha256: sha('Review PR 42: café ☕'), expires_at: sent.expires_at });
    const got = ok('passport_store', await store({ action: 'get', handle: d.handle }, agent.apiKey));
    expect(got.content).toBe('Review PR 42: café ☕');
    // The sender's own inbox is empty; the agent dismisses one delivery.
    expect(ok('passport_store', await store({ action: 'inbox' }, a.apiKey)).total).toBe(0);
    ok('passport_store', await store({ action: 'delete', delivery_id: sent.delivery_id }, agent.apiKey));
    expect(ok('passport_store', await store({ action: 'inbox' }, agent.apiKey)).deliveries.map((x: any) => x.delivery_id)).toEqual([byId.delivery_id]);
  });

  it('a recipient in another account, or unknown, is refused with 404 and not charged', async () => {
    const other = await account();
    const otherAgent = await h.key(other.accountId, 'agent', 'outsider');
    const credits = await h.credits(a.accountId);
    const charges = await h.ledgerCharges(a.accountId);
    const stored = ok('passport_store', await store({ action: 'list' }, a.apiKey)).total;
    for (const to of [other.keyId, otherAgent.keyId, 'outsider', randomUUID(), 'nobody']) {
      const res = await send({ to, content: 'leak?' }, a.apiKey);
      expect(res.statusCode, to).toBe(404);
      expect(json(res).error.code).toBe('not_found');
    }
    expect(await h.credits(a.accountId)).toBe(credits);
    expect(await h.ledgerCharges(a.accountId)).toBe(charges);
    expect(ok('passport_store', await store({ action: 'inbox' }, otherAgent.apiKey)).total).toBe(0);
    expect(ok('passport_store', await store({ action: 'inbox' }, other.apiKey)).total).toBe(0);
    // Nothing was stored for the refused sends.
    expect(ok('passport_store', await store({ action: 'list' }, a.apiKey)).total).toBe(stored);
  });

  it('a sandbox key gets a dry run: answered, uncharged, nothing stored or delivered', async () => {
    const b = await account();
    const bAgent = await h.key(b.accountId, 'agent', 'planner');
    const test = await h.key(b.accountId, 'test');
    const credits = await h.credits(b.accountId);
    const before = (await ppKeys()).filter((k) => k.includes(b.accountId));
    const res = await send({ to: bAgent.keyId, content: 'dry run', ttl_s: 120 }, test.apiKey);
    const out = ok('passport_send', res);
    expect(out).toMatchObject({ dry_run: true, to_key_id: bAgent.keyId });
    expect(json(res).cost_cents).toBe(0);
    expect(await h.credits(b.accountId)).toBe(credits);
    expect((await ppKeys()).filter((k) => k.includes(b.accountId))).toEqual(before);
    expect(ok('passport_store', await store({ action: 'inbox' }, bAgent.apiKey)).total).toBe(0);
    // A sandbox send is checked like a real one.
    expect((await send({ to: randomUUID(), content: 'x' }, test.apiKey)).statusCode).toBe(404);
  });

  it("a rotated agent's replacement key finds what was sent to the old key in its inbox; the agent's name reaches the replacement", async () => {
    const b = await account();
    const bot = await h.key(b.accountId, 'agent', 'courier');
    const before = ok('passport_send', await send({ to: bot.keyId, content: 'sent before the rotation' }, b.apiKey));
    const rotated = await h.request({ method: 'POST', url: `/keys/${bot.keyId}/rotate`, headers: { authorization: `Bearer ${b.apiKey}` } });
    expect(rotated.statusCode, rotated.body).toBe(201);
    const fresh = json(rotated) as { key_id: string; api_key: string };
    const after = ok('passport_send', await send({ to: 'courier', content: 'sent after' }, b.apiKey));
    expect(after.to_key_id).toBe(fresh.key_id);
    const inbox = ok('passport_store', await store({ action: 'inbox' }, fresh.api_key));
    expect(inbox.deliveries.map((d: any) => d.delivery_id).sort()).toEqual([before.delivery_id, after.delivery_id].sort());
  });

  it('a sub-key sends from its own key id and has its own inbox; a revoked key cannot receive', async () => {
    const b = await account();
    const created = await h.request({
      method: 'POST',
      url: '/subkeys/create',
      headers: { authorization: `Bearer ${b.apiKey}`, 'content-type': 'application/json' },
      payload: { name: 'worker', monthly_limit: 500, allowed_tools: ['passport_store', 'passport_send'] },
    });
    expect(created.statusCode, created.body).toBe(201);
    const sub = json(created) as { key_id: string; api_key: string };
    const toSub = ok('passport_send', await send({ to: sub.key_id, content: 'for the sub-key' }, b.apiKey));
    const subInbox = ok('passport_store', await store({ action: 'inbox' }, sub.api_key));
    expect(subInbox.deliveries.map((d: any) => d.delivery_id)).toEqual([toSub.delivery_id]);
    const back = ok('passport_send', await send({ to: b.keyId, handle: toSub.handle }, sub.api_key));
    expect(ok('passport_store', await store({ action: 'inbox' }, b.apiKey)).deliveries).toEqual([
      expect.objectContaining({ delivery_id: back.delivery_id, from_key_id: sub.key_id, handle: toSub.handle }),
    ]);
    const gone = await h.key(b.accountId, 'agent', 'retired');
    await h.admin.revokeKey(gone.keyId);
    for (const to of [gone.keyId, 'retired']) expect((await send({ to, content: 'x' }, b.apiKey)).statusCode).toBe(404);
  });
});
