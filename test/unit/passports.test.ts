import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { connectRedis, deleteByPrefix, type Redis } from '../../src/queue/redis.js';
import { ConfigError } from '../../src/config.js';
import { isAppError } from '../../src/errors.js';
import { PassportService, passportKey, predecessorsFrom, recipientsFrom, type PassportDeps, type PassportScope } from '../../src/access/passports.js';
import type { KeyInfo } from '../../src/access/accounts.js';
import { accountTag } from '../../src/queue/keyspace.js';

/** An account's passport namespace as the service names it (in its account's cluster slot). */
const ns = (prefix: string, accountId: string) => `${prefix}:pp:${accountTag(accountId)}:${accountId}`;

/** The passport service against a real Redis, each test under its own random prefix. */

let redis: Redis;
const prefixes: string[] = [];
const KEY_HEX = randomBytes(32).toString('hex');

beforeAll(() => {
  redis = connectRedis(inject('redisUrl'));
});

afterAll(async () => {
  for (const p of prefixes) await deleteByPrefix(redis, p);
  await redis.quit();
});

function service(over: Partial<PassportDeps['config']> = {}, deps: Partial<PassportDeps> = {}) {
  const prefix = `tpp${randomBytes(5).toString('hex')}`;
  prefixes.push(prefix);
  const config = { REDIS_PREFIX: prefix, PASSPORT_KEY: KEY_HEX, PASSPORT_MAX_BYTES: 256 * 1024, PASSPORTS_PER_ACCOUNT: 1000, ...over };
  return { svc: new PassportService({ redis, config, ...deps }), prefix, config };
}

const scope = (accountId: string = randomUUID(), callerKeyId: string | null = randomUUID(), sandbox = false): PassportScope => ({
  accountId,
  callerKeyId,
  sandbox,
});

async function code(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (e) {
    if (isAppError(e)) return e.code;
    throw e;
  }
  return 'ok';
}

async function keysUnder(prefix: string): Promise<string[]> {
  const out: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
    cursor = next;
    out.push(...keys);
  } while (cursor !== '0');
  return out.sort();
}

const sha = (s: string) => createHash('sha256').update(Buffer.from(s, 'utf8')).digest('hex');

describe('put and get', () => {
  it('round-trips non-ASCII text byte for byte with the same sha256', async () => {
    const { svc } = service();
    const s = scope();
    const content = 'Grüße, 世界 🚀\r\n\ttabs, "quotes", \\ and a NUL \u0000 too';
    const put = await svc.put(s, { content, label: 'hi', ttl_s: 120 });
    expect(put.handle).toMatch(/^pp_[A-Za-z0-9_-]{32}$/);
    expect(put.bytes).toBe(Buffer.byteLength(content, 'utf8'));
    expect(put.sha256).toBe(sha(content));
    const got = await svc.get(s, put.handle);
    expect(Buffer.from(got.content, 'utf8').equals(Buffer.from(content, 'utf8'))).toBe(true);
    expect(got).toMatchObject({
      handle: put.handle,
      sha256: put.sha256,
      bytes: put.bytes,
      label: 'hi',
      expires_at: put.expires_at,
      from_key_id: s.callerKeyId,
    });
    expect(Date.parse(got.expires_at) - Date.parse(got.created_at)).toBe(120_000);
  });

  it('takes content of exactly PASSPORT_MAX_BYTES and refuses one byte more', async () => {
    const { svc } = service({ PASSPORT_MAX_BYTES: 4096 });
    const s = scope();
    const full = 'é'.repeat(2048); // 4096 bytes of UTF-8
    const put = await svc.put(s, { content: full });
    expect(put.bytes).toBe(4096);
    expect((await svc.get(s, put.handle)).content).toBe(full);
    expect(await code(svc.put(s, { content: `${full}x` }))).toBe('limit_exceeded');
  });

  it('refuses a lone surrogate (it could not come back as sent), a bad TTL and a long label', async () => {
    const { svc } = service();
    const s = scope();
    expect(await code(svc.put(s, { content: 'a\ud800b' }))).toBe('invalid_input');
    expect(await code(svc.put(s, { content: 'x', ttl_s: 59 }))).toBe('invalid_input');
    expect(await code(svc.put(s, { content: 'x', ttl_s: 30 * 86400 + 1 }))).toBe('invalid_input');
    expect(await code(svc.put(s, { content: 'x', label: 'l'.repeat(201) }))).toBe('invalid_input');
    expect(await code(svc.put(s, { content: '😀', ttl_s: 30 * 86400 }))).toBe('ok');
  });

  it('handles are unguessable and unique', async () => {
    const { svc } = service();
    const s = scope();
    const handles = await Promise.all(Array.from({ length: 30 }, () => svc.put(s, { content: 'same' }).then((p) => p.handle)));
    expect(new Set(handles).size).toBe(30);
  });
});

describe('at rest', () => {
  it('Redis never holds the content, label or sha256 in clear, and every key has a TTL', async () => {
    const { svc, prefix } = service();
    const s = scope();
    const content = 'TOP-SECRET-PLAINTEXT-4711 ünïcödé';
    const put = await svc.put(s, { content, label: 'LABEL-IN-CLEAR-9', ttl_s: 600 });
    const other = scope(s.accountId);
    await svc.send(s, { to: 'self', handle: put.handle });
    await svc.send(other, { to: 'self', content: 'SECOND-SECRET-55' });
    const keys = await keysUnder(prefix);
    expect(keys.length).toBeGreaterThanOrEqual(6);
    for (const k of keys) expect(k.startsWith(`${ns(prefix, s.accountId)}:`)).toBe(true);
    for (const k of keys) {
      const type = await redis.type(k);
      const values: Buffer[] =
        type === 'hash'
          ? Object.values(await redis.hgetallBuffer(k))
          : type === 'string'
            ? [(await redis.getBuffer(k))!]
            : (await redis.zrange(k, 0, -1)).map((m) => Buffer.from(m));
      for (const v of values) {
        for (const secret of ['TOP-SECRET', 'ünïcödé', 'LABEL-IN-CLEAR', put.sha256, 'SECOND-SECRET'])
          expect(v.includes(Buffer.from(secret, 'utf8'))).toBe(false);
      }
      const pttl = await redis.pttl(k);
      expect(pttl, k).toBeGreaterThan(0);
      expect(pttl).toBeLessThanOrEqual(86_400_000);
    }
  });

  it('a blob copied under another handle or account does not open; another PASSPORT_KEY cannot read it', async () => {
    const { svc, prefix, config } = service();
    const a = scope();
    const b = scope();
    const put = await svc.put(a, { content: 'secret' });
    const src = `${ns(prefix, a.accountId)}:p:${put.handle}`;
    // Copy A's record into B's namespace under the same handle, and into A's under another handle.
    const fake = `pp_${'A'.repeat(32)}`;
    await redis.copy(src, `${ns(prefix, b.accountId)}:p:${put.handle}`);
    await redis.copy(src, `${ns(prefix, a.accountId)}:p:${fake}`);
    expect(await code(svc.get(b, put.handle))).toBe('not_found');
    expect(await code(svc.get(a, fake))).toBe('not_found');
    const other = new PassportService({ redis, config: { ...config, PASSPORT_KEY: randomBytes(32).toString('base64') } });
    expect(await code(other.get(a, put.handle))).toBe('not_found');
    expect((await svc.get(a, put.handle)).content).toBe('secret');
    await redis.del(`${ns(prefix, b.accountId)}:p:${put.handle}`, `${ns(prefix, a.accountId)}:p:${fake}`);
  });

  it('PASSPORT_KEY: hex or base64 of 32 bytes; anything else is a config error; unset, one random key per process, warned once', () => {
    const raw = randomBytes(32);
    expect(passportKey({ PASSPORT_KEY: raw.toString('hex') }).equals(raw)).toBe(true);
    expect(passportKey({ PASSPORT_KEY: raw.toString('base64') }).equals(raw)).toBe(true);
    expect(() => passportKey({ PASSPORT_KEY: randomBytes(16).toString('hex') })).toThrow(ConfigError);
    const warnings: string[] = [];
    const log = { warn: (m: string) => warnings.push(m) };
    const k1 = passportKey({ PASSPORT_KEY: '' }, log);
    const k2 = passportKey({ PASSPORT_KEY: '' }, log);
    expect(k1.length).toBe(32);
    expect(k1.equals(k2)).toBe(true);
    expect(warnings.length).toBeLessThanOrEqual(1);
  });
});

describe('isolation', () => {
  it("another account's handle is not found, for get, delete and send; sandbox keys have their own namespace", async () => {
    const { svc } = service();
    const a = scope();
    const b = scope();
    const put = await svc.put(a, { content: 'mine' });
    expect(await code(svc.get(b, put.handle))).toBe('not_found');
    expect(await code(svc.delete(b, put.handle))).toBe('not_found');
    expect(await code(svc.send(b, { to: 'self', handle: put.handle }))).toBe('not_found');
    expect((await svc.list(b)).total).toBe(0);
    const sandboxA = scope(a.accountId, randomUUID(), true);
    expect(await code(svc.get(sandboxA, put.handle))).toBe('not_found');
    expect((await svc.list(sandboxA)).total).toBe(0);
    const sp = await svc.put(sandboxA, { content: 'sandboxed' });
    expect(await code(svc.get(a, sp.handle))).toBe('not_found');
    expect((await svc.get(sandboxA, sp.handle)).content).toBe('sandboxed');
    expect((await svc.list(a)).passports.map((p) => p.handle)).toEqual([put.handle]);
    expect(await code(svc.get(a, 'pp_nope'))).toBe('not_found');
  });
});

describe('expiry and the per-account cap', () => {
  it('exactly the cap succeeds under 20 concurrent puts; an expired or deleted passport stops counting', async () => {
    let now = Date.now();
    const { svc } = service({ PASSPORTS_PER_ACCOUNT: 5 }, { now: () => now });
    const s = scope();
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => code(svc.put(s, { content: `n${i}`, ttl_s: 60 + i }))));
    expect(results.filter((r) => r === 'ok')).toHaveLength(5);
    expect(results.filter((r) => r === 'limit_exceeded')).toHaveLength(15);
    expect((await svc.list(s)).total).toBe(5);
    // Another account is not affected.
    expect(await code(svc.put(scope(), { content: 'x' }))).toBe('ok');
    // Time passes the first expiry: that passport no longer counts.
    const first = (await svc.list(s)).passports[0]!;
    now = Date.parse(first.expires_at) + 1;
    expect((await svc.list(s)).total).toBe(4);
    expect(await code(svc.put(s, { content: 'after expiry' }))).toBe('ok');
    expect(await code(svc.put(s, { content: 'over' }))).toBe('limit_exceeded');
    // Deleting frees a place at once.
    await svc.delete(s, (await svc.list(s)).passports[0]!.handle);
    expect(await code(svc.put(s, { content: 'after delete' }))).toBe('ok');
  });

  it('a passport whose record Redis dropped (forced expiry, eviction) leaves the list and the count', async () => {
    const { svc, prefix } = service({ PASSPORTS_PER_ACCOUNT: 2 });
    const s = scope();
    const p1 = await svc.put(s, { content: 'one', ttl_s: 60 });
    await svc.put(s, { content: 'two', ttl_s: 60 });
    const key = `${ns(prefix, s.accountId)}:p:${p1.handle}`;
    const ttl = await redis.pttl(key);
    expect(ttl).toBeGreaterThan(55_000);
    expect(ttl).toBeLessThanOrEqual(60_000);
    await redis.pexpire(key, 1);
    await new Promise((r) => setTimeout(r, 20));
    expect(await code(svc.get(s, p1.handle))).toBe('not_found');
    expect(await code(svc.put(s, { content: 'three' }))).toBe('ok');
    const list = await svc.list(s);
    expect(list.total).toBe(2);
    expect(list.passports.map((p) => p.handle)).not.toContain(p1.handle);
  });

  it('list pages through every live passport, soonest expiry first, metadata only', async () => {
    const { svc } = service();
    const s = scope();
    const handles: string[] = [];
    for (let i = 0; i < 7; i++) handles.push((await svc.put(s, { content: `c${i}`, label: `l${i}`, ttl_s: 100 + i })).handle);
    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const page = await svc.list(s, { limit: 3, cursor });
      expect(page.total).toBe(7);
      for (const p of page.passports) {
        expect(p).not.toHaveProperty('content');
        seen.push(p.handle);
      }
      cursor = page.next_cursor ?? undefined;
      pages++;
    } while (cursor);
    expect(pages).toBe(3);
    expect(seen).toEqual(handles);
    expect(await code(svc.list(s, { limit: 101 }))).toBe('invalid_input');
    expect(await code(svc.list(s, { cursor: 'abc' }))).toBe('invalid_input');
  });
});

describe('send and inbox', () => {
  const accountA = randomUUID();
  const keyA = randomUUID();
  const keyB = randomUUID();
  // Recipients of accountA: keyB; anything else unknown.
  const resolveRecipient = async (accountId: string, to: string) => (accountId === accountA && (to === keyB || to === 'reviewer') ? keyB : null);

  it("B's inbox lists A's delivery (new content and an existing handle); A's does not; B reads it", async () => {
    const { svc } = service({}, { resolveRecipient });
    const a = scope(accountA, keyA);
    const b = scope(accountA, keyB);
    const sent = await svc.send(a, { to: 'reviewer', content: 'review this', label: 'pr-1', ttl_s: 300 });
    expect(sent).toMatchObject({ to_key_id: keyB, handle: expect.stringMatching(/^pp_/), delivery_id: expect.stringMatching(/^dl_/) });
    expect(sent).not.toHaveProperty('dry_run');
    const put = await svc.put(a, { content: 'long-lived', ttl_s: 3600 });
    const sent2 = await svc.send(a, { to: keyB, handle: put.handle, ttl_s: 600 });
    expect(Date.parse(sent2.expires_at)).toBeLessThan(Date.parse(put.expires_at));
    const inbox = await svc.inbox(b);
    expect(inbox.total).toBe(2);
    expect(inbox.deliveries.map((d) => d.delivery_id).sort()).toEqual([sent.delivery_id, sent2.delivery_id].sort());
    const d = inbox.deliveries.find((x) => x.delivery_id === sent.delivery_id)!;
    expect(d).toMatchObject({ handle: sent.handle, from_key_id: keyA, label: 'pr-1', bytes: 11, sha256: sha('review this'), expires_at: sent.expires_at });
    expect((await svc.get(b, d.handle)).content).toBe('review this');
    expect((await svc.inbox(a)).total).toBe(0);
    // Deleting the passport takes its delivery out of the inbox; dismissing removes one delivery.
    await svc.delete(a, sent.handle);
    expect((await svc.inbox(b)).deliveries.map((x) => x.delivery_id)).toEqual([sent2.delivery_id]);
    await svc.dismiss(b, sent2.delivery_id);
    expect((await svc.inbox(b)).total).toBe(0);
    expect(await code(svc.dismiss(b, sent2.delivery_id))).toBe('not_found');
    expect((await svc.get(a, put.handle)).content).toBe('long-lived');
  });

  it('an unknown recipient, or one in another account, is not found and nothing is stored', async () => {
    const { svc, prefix } = service({}, { resolveRecipient });
    const a = scope(accountA, keyA);
    expect(await code(svc.send(a, { to: randomUUID(), content: 'x' }))).toBe('not_found');
    expect(await code(svc.send(scope(randomUUID(), keyA), { to: keyB, content: 'x' }))).toBe('not_found');
    expect(await code(svc.send(a, { to: keyB }))).toBe('invalid_input');
    expect(await code(svc.send(a, { to: keyB, content: 'x', handle: `pp_${'a'.repeat(32)}` }))).toBe('invalid_input');
    expect(await keysUnder(prefix)).toEqual([]);
  });

  it('a sandbox send is a dry run: checked, answered, nothing stored or delivered', async () => {
    const { svc, prefix } = service({}, { resolveRecipient });
    const s = scope(accountA, keyA, true);
    const out = await svc.send(s, { to: keyB, content: 'dry', ttl_s: 60 });
    expect(out).toMatchObject({ dry_run: true, to_key_id: keyB });
    expect(await keysUnder(prefix)).toEqual([]);
    expect(await code(svc.send(s, { to: randomUUID(), content: 'dry' }))).toBe('not_found');
    expect((await svc.inbox(scope(accountA, keyB))).total).toBe(0);
  });

  it('a recipient whose inbox is full is refused, and the passport made for the send is removed', async () => {
    const { svc } = service({ PASSPORTS_PER_ACCOUNT: 2 }, { resolveRecipient });
    const a = scope(accountA, keyA);
    const first = await svc.send(a, { to: keyB, content: '1' });
    await svc.send(a, { to: keyB, handle: first.handle });
    expect((await svc.inbox(scope(accountA, keyB))).total).toBe(2);
    expect(await code(svc.send(a, { to: keyB, handle: first.handle }))).toBe('limit_exceeded');
    expect(await code(svc.send(a, { to: keyB, content: '2' }))).toBe('limit_exceeded');
    expect((await svc.list(a)).passports.map((p) => p.handle)).toEqual([first.handle]);
  });
});

describe('recipientsFrom', () => {
  const now = Date.now();
  const key = (over: Partial<KeyInfo>): KeyInfo => ({
    key_id: randomUUID(),
    type: 'agent',
    display_prefix: 'x',
    name: null,
    created_at: new Date(now).toISOString(),
    last_used_at: null,
    revoked_at: null,
    expires_at: null,
    replaced_by_key_id: null,
    ...over,
  });
  it('finds live keys by id and agents by name (the unreplaced one); never revoked, expired or sandbox keys', async () => {
    const prod = key({ type: 'production' });
    const oldAgent = key({ name: 'bot', expires_at: new Date(now + 60_000).toISOString() });
    const newAgent = key({ name: 'bot' });
    oldAgent.replaced_by_key_id = newAgent.key_id;
    const revoked = key({ revoked_at: new Date(now - 1).toISOString(), name: 'gone' });
    const expired = key({ expires_at: new Date(now - 1).toISOString(), name: 'late' });
    const test = key({ type: 'test', name: 'tester' });
    const resolve = recipientsFrom({ listKeys: async () => [oldAgent, newAgent, prod, revoked, expired, test] }, () => now);
    expect(await resolve('acct', prod.key_id)).toBe(prod.key_id);
    expect(await resolve('acct', prod.key_id.toUpperCase())).toBe(prod.key_id);
    expect(await resolve('acct', 'bot')).toBe(newAgent.key_id);
    expect(await resolve('acct', oldAgent.key_id)).toBe(oldAgent.key_id);
    for (const k of [revoked, expired, test]) expect(await resolve('acct', k.key_id)).toBeNull();
    expect(await resolve('acct', 'gone')).toBeNull();
    expect(await resolve('acct', 'tester')).toBeNull();
    expect(await resolve('acct', randomUUID())).toBeNull();
  });

  it("a rotated key's id reaches its replacement once it has expired (through several rotations); a revoked one does not", async () => {
    const k3 = key({ name: 'bot' });
    const k2 = key({ name: 'bot', expires_at: new Date(now - 10).toISOString(), replaced_by_key_id: k3.key_id });
    const k1 = key({ name: 'bot', expires_at: new Date(now - 20).toISOString(), replaced_by_key_id: k2.key_id });
    const r2 = key({ name: 'x' });
    const r1 = key({ name: 'x', revoked_at: new Date(now - 1).toISOString(), replaced_by_key_id: r2.key_id });
    const accounts = { listKeys: async () => [k3, k2, k1, r2, r1] };
    const resolve = recipientsFrom(accounts, () => now);
    expect(await resolve('acct', k1.key_id)).toBe(k3.key_id);
    expect(await resolve('acct', k2.key_id)).toBe(k3.key_id);
    expect(await resolve('acct', r1.key_id)).toBeNull();
    expect((await predecessorsFrom(accounts)('acct', k3.key_id)).sort()).toEqual([k1.key_id, k2.key_id].sort());
    expect(await predecessorsFrom(accounts)('acct', k1.key_id)).toEqual([]);
  });
});

describe('a job that runs again', () => {
  it('derives the same handle and delivery id from its job id: one passport, one delivery, even at the cap', async () => {
    const { svc } = service({ PASSPORTS_PER_ACCOUNT: 1 }, { resolveRecipient: async (_a, to) => to });
    const accountId = randomUUID();
    const recipient = randomUUID();
    const run = { ...scope(accountId), callId: '1234' };
    const first = await svc.send(run, { to: recipient, content: 'once' });
    const again = await svc.send(run, { to: recipient, content: 'once' });
    expect(again.handle).toBe(first.handle);
    expect(again.delivery_id).toBe(first.delivery_id);
    expect(first.handle).toMatch(/^pp_[A-Za-z0-9_-]{32}$/);
    expect(first.delivery_id).toMatch(/^dl_[A-Za-z0-9_-]{22}$/);
    expect((await svc.list(run)).total).toBe(1);
    expect((await svc.inbox(scope(accountId, recipient))).total).toBe(1);
    expect((await svc.get(run, first.handle)).content).toBe('once');
    // Another job is a new passport (refused here: the cap is 1); another account derives another handle.
    expect(await code(svc.put({ ...run, callId: '1235' }, { content: 'twice' }))).toBe('limit_exceeded');
    const elsewhere = await svc.put({ ...scope(), callId: '1234' }, { content: 'once' });
    expect(elsewhere.handle).not.toBe(first.handle);
  });
});

describe('rotation', () => {
  it("a replacement key's inbox takes over what was delivered to the keys it replaced, with its TTL", async () => {
    const accountId = randomUUID();
    const [oldKey, midKey, newKey, sender] = [randomUUID(), randomUUID(), randomUUID(), randomUUID()];
    const { svc, prefix } = service(
      {},
      {
        resolveRecipient: async (_a, to) => to,
        predecessors: async (_a, k) => (k === newKey ? [oldKey, midKey] : []),
      },
    );
    const from = scope(accountId, sender);
    const d1 = await svc.send(from, { to: oldKey, content: 'one', ttl_s: 300 });
    const d2 = await svc.send(from, { to: midKey, content: 'two', ttl_s: 600 });
    const d3 = await svc.send(from, { to: newKey, content: 'three', ttl_s: 120 });
    const inbox = await svc.inbox(scope(accountId, newKey));
    expect(inbox.deliveries.map((d) => d.delivery_id)).toEqual([d3.delivery_id, d1.delivery_id, d2.delivery_id]);
    const set = `${ns(prefix, accountId)}:inbox:${newKey}`;
    expect(await redis.exists(`${ns(prefix, accountId)}:inbox:${oldKey}`)).toBe(0);
    const pttl = await redis.pttl(set);
    expect(pttl).toBeGreaterThan(590_000);
    expect(pttl).toBeLessThanOrEqual(600_000);
    expect((await svc.inbox(scope(accountId, newKey))).total).toBe(3);
  });
});
