import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectRedis } from '../../src/queue/redis.js';
import { startFakeCloudflare, type FakeCloudflare } from '../helpers/fake-cloudflare.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';

/**
 * The caller's edge-network token must never be kept in clear text: not in Redis (job data included),
 * not in Postgres, not in logs or error messages. A distinctive token goes through successes,
 * failures, the async path and the sandbox, then every store is searched for it.
 */
const TOKEN = `edgetok${randomBytes(12).toString('hex')}`;

let fake: FakeCloudflare;
let h: Harness;
let acct: TestAccount;
let sandboxKey: string;

beforeAll(async () => {
  fake = await startFakeCloudflare({ token: TOKEN });
  fake.addZone('example.com');
  h = await startHarness({ CF_API_BASE_URL: fake.url, LOG_LEVEL: 'trace' });
  acct = await h.account('pro', 1000);
  sandboxKey = (await h.key(acct.accountId, 'test')).apiKey;
});
afterAll(async () => {
  await h.close();
  await fake.close();
});

const callEdge = (tool: string, body: Record<string, unknown>, opts: { key?: string; header?: boolean; extra?: Record<string, string> } = {}) =>
  h.call(tool, opts.header === false ? { ...body, edge_token: TOKEN } : body, opts.key ?? acct.apiKey, {
    ...(opts.header === false ? {} : { 'x-edge-token': TOKEN }),
    ...opts.extra,
  });

async function redisDump(): Promise<string> {
  const redis = connectRedis(h.config.REDIS_URL);
  const out: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'COUNT', 1000);
    cursor = next;
    for (const key of keys) {
      out.push(key);
      const type = await redis.type(key);
      if (type === 'string') out.push((await redis.getBuffer(key))?.toString('latin1') ?? '');
      else if (type === 'hash') out.push(JSON.stringify(await redis.hgetall(key)));
      else if (type === 'list') out.push(JSON.stringify(await redis.lrange(key, 0, -1)));
      else if (type === 'set') out.push(JSON.stringify(await redis.smembers(key)));
      else if (type === 'zset') out.push(JSON.stringify(await redis.zrange(key, 0, -1, 'WITHSCORES')));
      else if (type === 'stream') out.push(JSON.stringify(await redis.xrange(key, '-', '+')));
    }
  } while (cursor !== '0');
  await redis.quit();
  return out.join('\n');
}

describe('edge-network token secrecy', () => {
  it('cf_* calls succeed and fail through the queue with the token from header or body', async () => {
    const list = await callEdge('cf_list_zones', {});
    expect(list.statusCode).toBe(200);
    expect(JSON.stringify(json(list).result)).toContain('example.com');

    const viaBody = await callEdge('cf_get_zone', { zone: 'example.com' }, { header: false });
    expect(viaBody.statusCode).toBe(200);

    const write = await callEdge('cf_create_dns', { zone: 'example.com', type: 'A', name: 'www', content: '203.0.113.7' });
    expect(write.statusCode).toBe(200);
    expect(json(write).cost_cents).toBe(2);

    const dry = await callEdge('cf_purge_all', { zone: 'example.com' }, { key: sandboxKey });
    expect(json(dry)).toMatchObject({ cost_cents: 0, sandbox: true, result: { dry_run: true } });

    fake.failNext({ status: 401, errors: [{ code: 10000, message: `Authentication error for ${TOKEN}` }] });
    const rejected = await callEdge('cf_list_dns', { zone: 'example.com' });
    expect(rejected.statusCode).toBe(403);
    expect(json(rejected).error.code).toBe('edge_token_rejected');

    fake.failNext({
      status: 429,
      headers: { 'retry-after': '17' },
      errors: [{ code: 971, message: 'Please wait and consider throttling your request speed' }],
    });
    const limited = await callEdge('cf_list_dns', { zone: 'example.com' });
    expect(limited.statusCode).toBe(429);
    expect(limited.headers['retry-after']).toBe('17');

    fake.failNext({ status: 400, errors: [{ code: 81057, message: 'Record already exists.' }] });
    const failed = await callEdge('cf_create_dns', { zone: 'example.com', type: 'A', name: 'dup', content: '203.0.113.8' });
    expect(failed.statusCode).toBe(422);
    expect(json(failed).error.cloudflare.errors[0].code).toBe(81057);

    const async = await callEdge('cf_list_zones', {}, { extra: { prefer: 'respond-async' } });
    expect(async.statusCode).toBe(202);
    let done: any;
    for (;;) {
      done = json(await h.request({ method: 'GET', url: json(async).status_url, headers: { authorization: `Bearer ${acct.apiKey}` } }));
      if (done.status === 'completed') break;
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(JSON.stringify(done.result)).toContain('example.com');

    // Missing token: a clear 400 naming the header, and nothing queued.
    const missing = await h.call('cf_list_zones', {}, acct.apiKey);
    expect(missing.statusCode).toBe(400);
    expect(json(missing).error.message).toMatch(/X-Edge-Token/);

    // Failed and finished jobs that carried the token are gone from BullMQ.
    for (const res of [list, viaBody, write, rejected, failed]) {
      expect(await h.container.queues.getJob(res.headers['x-job-id'] as string)).toBeNull();
    }
    // Every request reached Cloudflare with the caller's token.
    expect(fake.requests.length).toBeGreaterThan(5);
  });

  it('the token is nowhere in Redis, Postgres or the logs', { timeout: 120_000 }, async () => {
    const redis = await redisDump();
    expect(redis.length).toBeGreaterThan(0);
    expect(redis).not.toContain(TOKEN);

    // The whole database, searched where it lives: every row of every table, as text, by Postgres
    // itself (no dump to hold, and no pg_dump whose version must match the server's).
    const db = new pg.Client({ connectionString: h.config.DATABASE_URL });
    await db.connect();
    try {
      const tables = (
        await db.query<{ t: string }>(
          "SELECT quote_ident(table_schema) || '.' || quote_ident(table_name) AS t FROM information_schema.tables WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')",
        )
      ).rows.map((r) => r.t);
      expect(tables.length).toBeGreaterThan(5);
      const count = async (needle: string) => {
        let n = 0;
        for (const t of tables)
          n += (await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${t} x WHERE strpos(x::text, $1) > 0`, [needle])).rows[0]!.n;
        return n;
      };
      expect(await count(acct.accountId)).toBeGreaterThan(0);
      expect(await count(TOKEN)).toBe(0);
    } finally {
      await db.end();
    }

    const logs = h.logs.join('');
    expect(logs.length).toBeGreaterThan(0);
    expect(logs).not.toContain(TOKEN);
  });
});
