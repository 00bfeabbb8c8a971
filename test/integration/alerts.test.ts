import { randomBytes } from 'node:crypto';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Webhook } from 'standardwebhooks';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from '../../src/db/pool.js';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { until } from '../helpers/wait.js';

/**
 * Spend alerts (issue 30, part 4) on two API replicas sharing Postgres and a Redis prefix, each with
 * its own core workers, so calls are admitted by both and settled by both: every threshold crossed
 * sends one event, verified with the `standardwebhooks` package as a receiver would.
 */

interface Received {
  path: string;
  headers: IncomingHttpHeaders;
  raw: string;
}

let a: Harness;
let b: Harness;
let server: Server;
let base: string;
const received: Received[] = [];

beforeAll(async () => {
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      received.push({ path: req.url ?? '/', headers: req.headers, raw: Buffer.concat(chunks).toString('utf8') });
      res.end();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  base = `http://127.0.0.1:${port}`;
  const env = {
    REDIS_PREFIX: `t${randomBytes(5).toString('hex')}`,
    // Both replicas open the same sealed webhook secrets.
    EDGE_TOKEN_KEY: randomBytes(32).toString('hex'),
    WEBHOOK_ALLOWED_HOSTS: `127.0.0.1:${port}`,
    WEBHOOK_BACKOFF_MS: '50',
    // A busy machine may take long over a call: still answered, not 202.
    SYNC_TIMEOUT_MS: '120000',
  };
  [a, b] = await Promise.all([startHarness(env, { workers: ['core'] }), startHarness(env, { workers: ['core'] })]);
});

afterAll(async () => {
  await b?.close();
  await a?.close();
  await new Promise((r) => server.close(r));
});

const bearer = (key: string) => ({ authorization: `Bearer ${key}` });
const auth = (key: string) => ({ ...bearer(key), 'content-type': 'application/json' });

function putAlerts(h: Harness, key: string, body: unknown) {
  return h.request({ method: 'PUT', url: '/alerts', headers: auth(key), payload: JSON.stringify(body) });
}

async function secretOf(acct: TestAccount): Promise<string> {
  return json(await a.request({ method: 'GET', url: '/webhooks/secret', headers: bearer(acct.apiKey) })).secret;
}

/** What arrived at `path`, each verified as Standard Webhooks says (throws on a bad signature). */
function verified(path: string, secret: string) {
  const wh = new Webhook(secret);
  return received
    .filter((r) => r.path === path)
    .map((r) => {
      const headers = {
        'webhook-id': String(r.headers['webhook-id']),
        'webhook-timestamp': String(r.headers['webhook-timestamp']),
        'webhook-signature': String(r.headers['webhook-signature']),
      };
      const event = wh.verify(r.raw, headers) as { type: string; timestamp: string; data: Record<string, any> };
      return { id: headers['webhook-id'], kind: r.headers['tollgate-event'], ...event };
    });
}

async function eventRows(accountId: string) {
  return a.container.pool.any(
    sql.type(
      z.object({ type: z.string(), threshold: z.number() }),
    )`SELECT type, threshold FROM alert_events WHERE account_id = ${accountId} ORDER BY threshold`,
  );
}

/** The machine may be busy: calls and deliveries get a liveness bound, not a speed target. */
const SLOW = 120_000;

/** Lets late duplicates (a second replica's delivery, a retry) arrive before counting. */
const settle = () => new Promise((r) => setTimeout(r, 1_000));

describe('a sub-key crossing 50, 80 and 100% of its cap across two replicas', () => {
  it(
    'sends each event once, signed, and lists each in GET /alerts',
    async () => {
      const acct = await a.account('enterprise', 100_000);
      const sub = json(
        await a.request({
          method: 'POST',
          url: '/subkeys/create',
          headers: auth(acct.apiKey),
          payload: JSON.stringify({ name: 'agent', monthly_limit: 40, allowed_tools: ['compute'] }),
        }),
      );
      expect(sub.api_key).toMatch(/^cv_sub_/);
      const put = await putAlerts(a, acct.apiKey, { cap_percents: [100, 50, 80, 50], url: `${base}/caps` });
      expect(put.statusCode, put.body).toBe(200);
      expect(json(put)).toMatchObject({ cap_percents: [50, 80, 100], balance_below_cents: null, url: `${base}/caps` });

      // 2 cents a call, a 40-cent cap: 20 calls reach it, all at once, half through each replica; 4 more are refused.
      const results = await Promise.all(Array.from({ length: 24 }, (_, i) => (i % 2 ? a : b).call('compute', { expression: `${i} + 1` }, sub.api_key)));
      const codes = results.map((r) => r.statusCode).sort();
      expect(
        codes.filter((c) => c === 200),
        JSON.stringify(results.filter((r) => r.statusCode !== 200).map((r) => r.body)),
      ).toHaveLength(20);
      expect(codes.filter((c) => c === 402)).toHaveLength(4);

      const secret = await secretOf(acct);
      await until('three events', () => verified('/caps', secret).length >= 3, SLOW);
      await settle();
      const events = verified('/caps', secret);
      expect(events.map((e) => e.data.percent).sort((x, y) => x - y)).toEqual([50, 80, 100]);
      for (const e of events) {
        expect(e.type).toBe('spend.threshold_crossed');
        expect(e.kind).toBe('spend.threshold_crossed');
        expect(e.data).toMatchObject({ key_id: sub.key_id, key_type: 'sub', key_name: 'agent', cap_cents: 40, period: new Date().toISOString().slice(0, 7) });
        expect(e.data.used_cents).toBeGreaterThanOrEqual((40 * e.data.percent) / 100);
        expect(e.id).toMatch(/^evt_/);
      }
      expect(new Set(events.map((e) => e.id)).size).toBe(3);
      expect(await eventRows(acct.accountId)).toHaveLength(3);

      // Listed by either replica, each with its delivery.
      const list = json(await b.request({ method: 'GET', url: '/alerts', headers: bearer(acct.apiKey) }));
      expect(list.settings).toMatchObject({ cap_percents: [50, 80, 100], url: `${base}/caps` });
      expect(list.events.map((e: any) => e.id).sort()).toEqual(events.map((e) => e.id).sort());
      for (const e of list.events) {
        expect(e.webhook.delivered_at).not.toBeNull();
        expect(e.webhook.deliveries).toEqual([expect.objectContaining({ ok: true, status: 200 })]);
      }

      // Paged: one at a time, newest first, each once.
      const first = json(await a.request({ method: 'GET', url: '/alerts?limit=2', headers: bearer(acct.apiKey) }));
      expect(first.events).toHaveLength(2);
      const rest = json(await a.request({ method: 'GET', url: `/alerts?limit=2&cursor=${first.next_cursor}`, headers: bearer(acct.apiKey) }));
      expect(rest.events).toHaveLength(1);
      expect(rest.next_cursor).toBeNull();
      expect([...first.events, ...rest.events].map((e: any) => e.id)).toEqual(list.events.map((e: any) => e.id));

      // Saving the same alerts again checks them again: nothing new is sent for thresholds already sent this month.
      expect((await putAlerts(b, acct.apiKey, { cap_percents: [50, 80, 100], url: `${base}/caps` })).statusCode).toBe(200);
      await settle();
      expect(verified('/caps', secret)).toHaveLength(3);
    },
    SLOW,
  );

  it(
    'many checks racing on both replicas insert and deliver each threshold once',
    async () => {
      const acct = await a.account('enterprise', 100_000);
      const sub = json(
        await a.request({
          method: 'POST',
          url: '/subkeys/create',
          headers: auth(acct.apiKey),
          payload: JSON.stringify({ name: 'racer', monthly_limit: 10, allowed_tools: ['compute'] }),
        }),
      );
      // Spend first (no alerts yet: nothing is sent), then set alerts without the immediate check's help:
      // straight into the table, so only the racing checks below can find the crossings.
      for (let i = 0; i < 4; i++) expect((await a.call('compute', { expression: `${i} * 2` }, sub.api_key)).statusCode).toBe(200);
      await a.container.pool.query(
        sql.unsafe`INSERT INTO alert_settings (account_id, cap_percents, url) VALUES (${acct.accountId}, ${sql.array([10, 50, 80, 90], 'int4')}, ${`${base}/race`})`,
      );
      const entry = { accountId: acct.accountId, keyId: sub.key_id as string };
      await Promise.all(Array.from({ length: 20 }, (_, i) => (i % 2 ? a : b).container.alerts!.check([entry])));
      const secret = await secretOf(acct);
      await until('three events', () => verified('/race', secret).length >= 3, SLOW);
      await settle();
      // 8 of 10 cents: 10, 50 and 80 percent, not 90.
      expect(
        verified('/race', secret)
          .map((e) => e.data.percent)
          .sort((x, y) => x - y),
      ).toEqual([10, 50, 80]);
      expect((await eventRows(acct.accountId)).map((r) => r.threshold)).toEqual([10, 50, 80]);
    },
    SLOW,
  );
});

describe("an OAuth grant's cap", () => {
  it(
    "counts like a sub-key's: its settled charges cross the percents",
    async () => {
      const acct = await a.account('pro', 10_000);
      // A grant as the OAuth token exchange writes it (src/access/oauth.ts); its charges settle like any key's.
      const grantId = await a.container.pool.oneFirst(sql.type(z.object({ id: z.string() }))`
      INSERT INTO api_keys (account_id, key_hash, display_prefix, type, name, monthly_limit_cents, allowed_tools)
      VALUES (${acct.accountId}, ${`grant-test-${randomBytes(8).toString('hex')}`}, 'cv_oat_', 'grant', 'an agent', 100, ${sql.array(['compute'], 'text')})
      RETURNING id`);
      expect((await putAlerts(a, acct.apiKey, { cap_percents: [50, 100], url: `${base}/grant` })).statusCode).toBe(200);
      const settle1 = (jobId: string, cents: number) =>
        (jobId.length % 2 ? a : b).container.settler.settle({
          jobId,
          accountId: acct.accountId,
          keyId: grantId,
          tool: 'compute',
          status: 'completed',
          amount: cents,
          costCents: cents,
          result: { value: 1 },
          sandbox: false,
          agentName: null,
          usage: null,
          createdAt: null,
          holdId: null,
        });
      await Promise.all([settle1(`core-${randomBytes(6).toString('hex')}`, 30), settle1(`core-${randomBytes(7).toString('hex')}`, 30)]);
      const secret = await secretOf(acct);
      await until('the 50% event', () => verified('/grant', secret).length >= 1, SLOW);
      await settle();
      const events = verified('/grant', secret);
      expect(events).toHaveLength(1);
      expect(events[0]!.data).toMatchObject({ key_id: grantId, key_type: 'grant', percent: 50, used_cents: 60, cap_cents: 100 });
      // An event's id is no job: GET /jobs/{id} knows nothing of it, and tells nothing of its delivery.
      const asJob = await a.request({ method: 'GET', url: `/jobs/${events[0]!.id}`, headers: bearer(acct.apiKey) });
      expect(asJob.statusCode).toBe(404);
      expect(asJob.body).not.toContain('webhook');
    },
    SLOW,
  );
});

describe('balance.low', () => {
  it(
    'is sent once under the threshold, and again only after the balance rose back to it',
    async () => {
      const acct = await a.account('pro', 30);
      const secret = await secretOf(acct);
      expect((await putAlerts(b, acct.apiKey, { balance_below_cents: 25, url: `${base}/low` })).statusCode).toBe(200);
      // 30 -> 28 -> 26 -> 24 (under 25) -> 22 -> 20, half through each replica.
      for (let i = 0; i < 5; i++) expect((await (i % 2 ? a : b).call('compute', { expression: `${i} + 2` }, acct.apiKey)).statusCode).toBe(200);
      await until('balance.low', () => verified('/low', secret).length >= 1, SLOW);
      await settle();
      const [low, ...more] = verified('/low', secret);
      expect(more).toEqual([]);
      expect(low).toMatchObject({ type: 'balance.low', data: { balance_cents: 24, threshold_cents: 25 } });

      // A top-up that leaves it under the threshold does not start a new period.
      await a.admin.addCredits(acct.accountId, 2);
      expect((await a.call('compute', { expression: '1 + 1' }, acct.apiKey)).statusCode).toBe(200);
      await settle();
      expect(verified('/low', secret)).toHaveLength(1);

      // Risen back over it: the next fall under it is told again.
      await a.admin.addCredits(acct.accountId, 10);
      expect(await a.credits(acct.accountId)).toBe(30);
      for (let i = 0; i < 3; i++) expect((await b.call('compute', { expression: `${i} + 3` }, acct.apiKey)).statusCode).toBe(200);
      await until('the second balance.low', () => verified('/low', secret).length >= 2, SLOW);
      await settle();
      const all = verified('/low', secret);
      expect(all).toHaveLength(2);
      expect(all[1]).toMatchObject({ type: 'balance.low', data: { balance_cents: 24, threshold_cents: 25 } });
      expect(json(await a.request({ method: 'GET', url: '/alerts', headers: bearer(acct.apiKey) })).events).toHaveLength(2);
    },
    SLOW,
  );

  it(
    'a balance already under the threshold is told when the alert is saved',
    async () => {
      const acct = await a.account('free', 10);
      const secret = await secretOf(acct);
      expect((await putAlerts(a, acct.apiKey, { balance_below_cents: 500, url: `${base}/already` })).statusCode).toBe(200);
      await until('balance.low', () => verified('/already', secret).length >= 1, SLOW);
      expect(verified('/already', secret)[0]).toMatchObject({ data: { balance_cents: 10, threshold_cents: 500 } });
    },
    SLOW,
  );
});

describe('PUT /alerts refuses what it must', () => {
  let acct: TestAccount;
  beforeAll(async () => {
    acct = await a.account('enterprise', 1_000);
  });

  it.each([
    ['percent 0', { cap_percents: [0], url: 'https://example.com/h' }, 'cap_percents'],
    ['percent over 100', { cap_percents: [50, 101], url: 'https://example.com/h' }, 'cap_percents'],
    ['a fractional percent', { cap_percents: [12.5], url: 'https://example.com/h' }, 'cap_percents'],
    ['a percent as a string', { cap_percents: ['50'], url: 'https://example.com/h' }, 'cap_percents'],
    ['no threshold at all', { url: 'https://example.com/h' }, 'cap_percents'],
    ['a negative balance', { balance_below_cents: -5, url: 'https://example.com/h' }, 'balance_below_cents'],
    ['too many percents', { cap_percents: Array.from({ length: 11 }, (_, i) => i + 1), url: 'https://example.com/h' }, 'cap_percents'],
    ['an unknown field', { cap_percents: [50], url: 'https://example.com/h', secret: 'x' }, ''],
    ['no url', { cap_percents: [50] }, 'url'],
    ['not a URL', { cap_percents: [50], url: 'not a url' }, 'url'],
    ['plain http', { cap_percents: [50], url: 'http://example.com/h' }, 'url'],
    ['a private address', { cap_percents: [50], url: 'https://10.0.0.7/h' }, 'url'],
    ['loopback', { cap_percents: [50], url: 'https://127.0.0.1:8443/h' }, 'url'],
    ['link-local metadata', { cap_percents: [50], url: 'https://169.254.169.254/latest' }, 'url'],
    ['credentials in the URL', { cap_percents: [50], url: 'https://user:pw@example.com/h' }, 'url'],
    ['a huge URL', { cap_percents: [50], url: `https://example.com/${'a'.repeat(3000)}` }, 'url'],
  ])('400 for %s, and nothing saved', async (_name, body, field) => {
    const res = await putAlerts(a, acct.apiKey, body);
    expect(res.statusCode, res.body).toBe(400);
    const err = json(res).error;
    expect(err.code).toBe('invalid_input');
    if (field) expect(JSON.stringify(err.issues)).toContain(field);
    expect(json(await a.request({ method: 'GET', url: '/alerts', headers: bearer(acct.apiKey) })).settings).toBeNull();
  });

  it(
    '400 for a malformed body and a bad cursor',
    async () => {
      const res = await a.request({ method: 'PUT', url: '/alerts', headers: auth(acct.apiKey), payload: '{"cap_percents": [50' });
      expect(res.statusCode).toBe(400);
      const page = await a.request({ method: 'GET', url: '/alerts?cursor=bm9wZQ', headers: bearer(acct.apiKey) });
      expect(page.statusCode).toBe(400);
      expect((await a.request({ method: 'GET', url: '/alerts?limit=0', headers: bearer(acct.apiKey) })).statusCode).toBe(400);
    },
    SLOW,
  );

  it(
    'only the production key manages alerts; 401 without a key',
    async () => {
      const agent = await a.key(acct.accountId, 'agent');
      const body = { cap_percents: [50], url: `${base}/x` };
      expect((await putAlerts(a, agent.apiKey, body)).statusCode).toBe(403);
      expect((await a.request({ method: 'GET', url: '/alerts', headers: bearer(agent.apiKey) })).statusCode).toBe(403);
      expect((await a.request({ method: 'DELETE', url: '/alerts', headers: bearer(agent.apiKey) })).statusCode).toBe(403);
      expect((await a.request({ method: 'GET', url: '/alerts' })).statusCode).toBe(401);
    },
    SLOW,
  );

  it(
    'DELETE removes the settings; the events sent stay listed',
    async () => {
      const other = await a.account('pro', 5);
      expect((await putAlerts(a, other.apiKey, { balance_below_cents: 100, url: `${base}/gone` })).statusCode).toBe(200);
      const secret = await secretOf(other);
      await until('balance.low', () => verified('/gone', secret).length >= 1, SLOW);
      expect(json(await a.request({ method: 'DELETE', url: '/alerts', headers: bearer(other.apiKey) }))).toEqual({ removed: true });
      expect(json(await a.request({ method: 'DELETE', url: '/alerts', headers: bearer(other.apiKey) }))).toEqual({ removed: false });
      const view = json(await a.request({ method: 'GET', url: '/alerts', headers: bearer(other.apiKey) }));
      expect(view.settings).toBeNull();
      expect(view.events).toHaveLength(1);
      // Another account sees none of them.
      expect(json(await a.request({ method: 'GET', url: '/alerts', headers: bearer(acct.apiKey) })).events).toEqual([]);
    },
    SLOW,
  );
});
