import { execFile } from 'node:child_process';
import { userInfo } from 'node:os';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { sql } from '../../src/db/pool.js';
import { tokenFingerprint } from '../../src/ops/audit.js';

/**
 * The admin API under /admin/v1 against real Postgres and Redis: each resource, the audit record each
 * change leaves (who, what, before, after, request id, never a key), 401 without the token, 404
 * without ADMIN_TOKEN, the throttle on failed attempts, and the CLI writing the same records through
 * the same service.
 */

const TOKEN = 'admin-api-test-token-7c1e9b2d4f';
const root = fileURLToPath(new URL('../../', import.meta.url));
const run = promisify(execFile);
let h: Harness;
let address = 0;

beforeAll(async () => {
  h = await startHarness({ ADMIN_TOKEN: TOKEN }, { workers: [] });
}, 60_000);
afterAll(() => h?.close());

/** Each test from its own address, so only the throttle test meets the throttle. */
function admin(method: 'GET' | 'POST' | 'PATCH', url: string, body?: unknown, opts: { token?: string | null; remoteAddress?: string } = {}) {
  const token = opts.token === undefined ? TOKEN : opts.token;
  return h.request({
    method,
    url: `/admin/v1${url}`,
    remoteAddress: opts.remoteAddress ?? `10.9.0.${(++address % 250) + 1}`,
    headers: { ...(token ? { authorization: `Bearer ${token}` } : {}), ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
    ...(body !== undefined ? { payload: JSON.stringify(body) } : {}),
  });
}

async function audit(query: string) {
  const res = await admin('GET', `/audit?${query}`);
  expect(res.statusCode, res.body).toBe(200);
  return json(res).records as Array<Record<string, any>>;
}

async function newAccount(body: Record<string, unknown> = { plan: 'pro', credits: 1000 }) {
  const res = await admin('POST', '/accounts', body);
  expect(res.statusCode, res.body).toBe(201);
  return json(res) as { account_id: string; api_key: string; key_id: string };
}

const fingerprint = tokenFingerprint(TOKEN);

describe('authentication', () => {
  it('401 in the envelope without the token or with a wrong one; the token itself is never in an answer', async () => {
    for (const token of [null, 'wrong-token', `${TOKEN}x`]) {
      const res = await admin('GET', '/accounts', undefined, { token });
      expect(res.statusCode).toBe(401);
      expect(json(res).error).toMatchObject({ code: 'unauthorized', request_id: expect.any(String) });
      expect(res.headers['www-authenticate']).toMatch(/^Bearer/);
    }
    // Every route, a change included: nothing is created without the token.
    const before = await h.container.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM admin_audit`);
    const res = await admin('POST', '/accounts', { plan: 'pro', credits: 5 }, { token: null });
    expect(res.statusCode).toBe(401);
    expect(await h.container.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM admin_audit`)).toBe(before);
  });

  it('failed attempts are throttled per address: past the limit even the right token gets 429 there, other addresses are unaffected', async () => {
    const remoteAddress = '10.77.0.1';
    const codes: number[] = [];
    for (let i = 0; i < 21; i++) codes.push((await admin('GET', '/accounts', undefined, { token: 'guess-' + i, remoteAddress })).statusCode);
    expect(codes.slice(0, 20).every((c) => c === 401)).toBe(true);
    expect(codes[20]).toBe(429);
    const right = await admin('GET', '/accounts', undefined, { remoteAddress });
    expect(right.statusCode).toBe(429);
    expect(Number(right.headers['retry-after'])).toBeGreaterThan(0);
    expect((await admin('GET', '/accounts', undefined, { remoteAddress: '10.77.0.2' })).statusCode).toBe(200);
  });

  it('without ADMIN_TOKEN every route answers 404 like an unknown one', async () => {
    const other = await startHarness({}, { workers: [] });
    try {
      for (const [method, url] of [
        ['GET', '/admin/v1/accounts'],
        ['POST', '/admin/v1/accounts'],
        ['GET', '/admin/v1/audit'],
      ] as const) {
        const res = await other.request({ method, url, headers: { authorization: 'Bearer anything' } });
        expect(res.statusCode).toBe(404);
        expect(json(res).error.code).toBe('not_found');
      }
    } finally {
      await other.close();
    }
  });
});

describe('accounts', () => {
  it('create: the key is shown once and never recorded; the record says who, what, after and the request id', async () => {
    const res = await admin('POST', '/accounts', { plan: 'starter', credits: 250, name: 'Audit Co' });
    expect(res.statusCode).toBe(201);
    const a = json(res);
    expect(a).toMatchObject({ plan: 'starter', credits: 250, api_key: expect.stringMatching(/^cv_/) });
    const [rec] = await audit(`account_id=${a.account_id}`);
    expect(rec).toMatchObject({
      action: 'account.create',
      actor: { kind: 'admin-api', id: fingerprint },
      request_id: res.headers['x-request-id'],
      account_id: a.account_id,
      before: null,
      after: { account_id: a.account_id, plan: 'starter', credits: 250, name: 'Audit Co', key: { key_id: a.key_id, type: 'production' } },
    });
    expect(JSON.stringify(rec)).not.toContain(a.api_key);
    expect(JSON.stringify(rec)).not.toContain(a.api_key.slice(-20));
    expect(JSON.stringify(rec)).not.toContain(TOKEN);
  });

  it('list: filters by plan, name and creation time, paged with a cursor that neither repeats nor skips', async () => {
    const tag = `lst-${Date.now().toString(36)}`;
    const made: string[] = [];
    for (let i = 0; i < 5; i++) made.push((await newAccount({ plan: 'enterprise', credits: 0, name: `${tag}-${i}` })).account_id);
    await newAccount({ plan: 'free', credits: 0, name: `${tag}-free` });
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const res = await admin('GET', `/accounts?plan=enterprise&name_contains=${tag.toUpperCase()}&limit=2${cursor ? `&cursor=${cursor}` : ''}`);
      expect(res.statusCode, res.body).toBe(200);
      const page: { accounts: Array<{ account_id: string }>; next_cursor: string | null } = json(res);
      expect(page.accounts.length).toBeLessThanOrEqual(2);
      seen.push(...page.accounts.map((x) => x.account_id));
      cursor = page.next_cursor;
    } while (cursor);
    expect(seen).toEqual([...made].reverse());
    // A LIKE wildcard in the text is matched literally.
    expect(json(await admin('GET', `/accounts?name_contains=${encodeURIComponent(`${tag}%`)}`)).accounts).toEqual([]);
    const future = json(await admin('GET', `/accounts?name_contains=${tag}&created_from=${encodeURIComponent(new Date(Date.now() + 60_000).toISOString())}`));
    expect(future.accounts).toEqual([]);
    const bad = await admin('GET', '/accounts?plan=gold&created_from=yesterday&limit=0');
    expect(bad.statusCode).toBe(400);
    expect(json(bad).error.code).toBe('invalid_input');
  });

  it('show and change plan and limits: every replica applies them, the record has before and after', async () => {
    const a = await newAccount();
    const res = await admin('PATCH', `/accounts/${a.account_id}`, { plan: 'enterprise', rpm: 600, max_in_flight: 7 });
    expect(res.statusCode, res.body).toBe(200);
    expect(json(res)).toMatchObject({ plan: 'enterprise', rpm: 600, max_in_flight: 7 });
    const reset = await admin('PATCH', `/accounts/${a.account_id}`, { max_in_flight: null });
    expect(json(reset)).toMatchObject({ plan: 'enterprise', rpm: 600, max_in_flight: null });
    expect(json(await admin('GET', `/accounts/${a.account_id}`))).toMatchObject({ plan: 'enterprise', rpm: 600, max_in_flight: null, used_this_month: 0 });
    const [second, first] = await audit(`account_id=${a.account_id}&action=account.update`);
    expect(first).toMatchObject({
      before: { plan: 'pro', rpm: null, max_in_flight: null, elite: false },
      after: { plan: 'enterprise', rpm: 600, max_in_flight: 7, elite: false },
    });
    expect(second).toMatchObject({ before: { max_in_flight: 7 }, after: { max_in_flight: null } });
    // The caller's key sees the new plan at once (the key cache was emptied).
    const bal = await h.request({ method: 'GET', url: '/balance', headers: { authorization: `Bearer ${a.api_key}` } });
    expect(json(bal)).toMatchObject({ plan: 'enterprise' });
  });

  it('bad input is a 400 that changes nothing; an unknown account is a 404', async () => {
    const a = await newAccount();
    for (const body of [{}, { plan: 'gold' }, { rpm: -1 }, { rpm: 1.5 }, { owner: 'x' }]) {
      const res = await admin('PATCH', `/accounts/${a.account_id}`, body);
      expect(res.statusCode, JSON.stringify(body)).toBe(400);
    }
    expect((await admin('PATCH', '/accounts/not-a-uuid', { plan: 'pro' })).statusCode).toBe(400);
    expect((await admin('GET', '/accounts/00000000-0000-4000-8000-000000000000')).statusCode).toBe(404);
    expect((await admin('POST', '/accounts', { plan: 'pro', credits: -5 })).statusCode).toBe(400);
    const malformed = await h.request({
      method: 'POST',
      url: '/admin/v1/accounts',
      headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
      payload: '{"plan":',
    });
    expect(malformed.statusCode).toBe(400);
    expect(await audit(`account_id=${a.account_id}&action=account.update`)).toEqual([]);
  });
});

describe('credits', () => {
  it('add and remove through the ledger: exact, with a reason, one record each; the ledger still sums to the balance', async () => {
    const a = await newAccount({ plan: 'pro', credits: 1000 });
    const add = await admin('POST', `/accounts/${a.account_id}/credits/add`, { cents: 250, reason: 'goodwill' });
    expect(json(add)).toEqual({ account_id: a.account_id, credits: 1250 });
    const rm = await admin('POST', `/accounts/${a.account_id}/credits/remove`, { cents: 400, reason: 'refunded by card' });
    expect(rm.statusCode, rm.body).toBe(200);
    expect(json(rm)).toEqual({ account_id: a.account_id, credits: 850 });
    expect(await h.credits(a.account_id)).toBe(850);
    expect(await h.ledgerSum(a.account_id)).toBe(850);
    // Admission's view in Redis moved by the same amounts.
    expect(await h.container.credits.available(a.account_id)).toBe(850);
    const [removed, added] = await audit(`account_id=${a.account_id}&action=credits.add`).then(async (adds) => [
      (await audit(`account_id=${a.account_id}&action=credits.remove`))[0],
      adds[0],
    ]);
    expect(added).toMatchObject({ before: { credits: 1000 }, after: { credits: 1250, delta_cents: 250, reason: 'goodwill' } });
    expect(removed).toMatchObject({ before: { credits: 1250 }, after: { credits: 850, delta_cents: -400, reason: 'refunded by card' } });
  });

  it('remove: never more than admission could still spend, a reason required; refused changes leave no record', async () => {
    const a = await newAccount({ plan: 'pro', credits: 300 });
    const over = await admin('POST', `/accounts/${a.account_id}/credits/remove`, { cents: 301, reason: 'too much' });
    expect(over.statusCode).toBe(402);
    expect(json(over).error).toMatchObject({ code: 'insufficient_credits', available_cents: 300 });
    expect((await admin('POST', `/accounts/${a.account_id}/credits/remove`, { cents: 10 })).statusCode).toBe(400);
    expect((await admin('POST', `/accounts/${a.account_id}/credits/remove`, { cents: 10, reason: '   ' })).statusCode).toBe(400);
    for (const cents of [0, -5, 1.5, '10', 1e13]) {
      expect((await admin('POST', `/accounts/${a.account_id}/credits/add`, { cents })).statusCode, String(cents)).toBe(400);
    }
    // A hold of a call in flight is not removable.
    await h.container.credits.reserve(a.account_id, [{ holdId: `test-hold-${a.account_id}`, amount: 200 }], null);
    const held = await admin('POST', `/accounts/${a.account_id}/credits/remove`, { cents: 150, reason: 'while a call runs' });
    expect(held.statusCode).toBe(402);
    expect(json(held).error.available_cents).toBe(100);
    await h.container.credits.release(a.account_id, [`test-hold-${a.account_id}`]);
    expect(await h.credits(a.account_id)).toBe(300);
    expect(await h.container.credits.available(a.account_id)).toBe(300);
    expect(await audit(`account_id=${a.account_id}&action=credits.remove`)).toEqual([]);
  });

  it('concurrent removals never take the balance below zero; each that passed is on the ledger once', async () => {
    const a = await newAccount({ plan: 'pro', credits: 1000 });
    const results = await Promise.all(
      Array.from({ length: 8 }, () => admin('POST', `/accounts/${a.account_id}/credits/remove`, { cents: 300, reason: 'race' })),
    );
    const ok = results.filter((r) => r.statusCode === 200).length;
    expect(ok).toBe(3);
    expect(results.filter((r) => r.statusCode === 402).length).toBe(5);
    expect(await h.credits(a.account_id)).toBe(100);
    expect(await h.ledgerSum(a.account_id)).toBe(100);
    expect(await h.container.credits.available(a.account_id)).toBe(100);
    expect(await audit(`account_id=${a.account_id}&action=credits.remove`)).toHaveLength(3);
  });

  it('an idempotency key makes a retry (even two at once) change nothing; reused for another change: 422', async () => {
    const a = await newAccount({ plan: 'pro', credits: 0 });
    const body = { cents: 500, reason: 'ticket 1', idempotency_key: `ticket-${a.account_id}` };
    const [x, y] = await Promise.all([
      admin('POST', `/accounts/${a.account_id}/credits/add`, body),
      admin('POST', `/accounts/${a.account_id}/credits/add`, body),
    ]);
    expect([x.statusCode, y.statusCode]).toEqual([200, 200]);
    expect([json(x).replayed, json(y).replayed].filter(Boolean)).toHaveLength(1);
    expect(await h.credits(a.account_id)).toBe(500);
    expect(await h.container.credits.available(a.account_id)).toBe(500);
    const other = await admin('POST', `/accounts/${a.account_id}/credits/remove`, { ...body, cents: 500 });
    expect(other.statusCode).toBe(422);
    expect(json(other).error.code).toBe('idempotency_key_reused');
    expect(await h.container.credits.available(a.account_id)).toBe(500);
    expect(await audit(`account_id=${a.account_id}&action=credits.add`)).toHaveLength(1);
  });

  it('paid credits earn nothing without a partner but are recorded as revenue on the ledger line', async () => {
    const a = await newAccount({ plan: 'pro', credits: 0 });
    const res = await admin('POST', `/accounts/${a.account_id}/credits/add`, { cents: 1000, paid_cents: 900, reason: 'invoice 7' });
    expect(json(res)).toEqual({ account_id: a.account_id, credits: 1000, paid_cents: 900 });
    const paid = await h.container.pool.oneFirst(
      sql.type(z.object({ p: z.number() }))`SELECT paid_cents AS p FROM ledger WHERE account_id = ${a.account_id} AND kind = 'topup'`,
    );
    expect(paid).toBe(900);
    const [rec] = await audit(`account_id=${a.account_id}&action=credits.add`);
    expect(rec!.after).toMatchObject({ paid_cents: 900, delta_cents: 1000 });
  });
});

describe('keys', () => {
  it('list, create (shown once, never recorded) and revoke: the key stops at once, the record has ids and prefixes only', async () => {
    const a = await newAccount();
    const created = await admin('POST', `/accounts/${a.account_id}/keys`, { type: 'agent', name: 'crawler' });
    expect(created.statusCode, created.body).toBe(201);
    const k = json(created);
    expect(k).toMatchObject({ type: 'agent', name: 'crawler', api_key: expect.any(String), display_prefix: expect.any(String) });
    const listed = json(await admin('GET', `/accounts/${a.account_id}/keys`));
    expect(listed.keys.map((x: { key_id: string }) => x.key_id).sort()).toEqual([a.key_id, k.key_id].sort());
    expect(JSON.stringify(listed)).not.toContain(k.api_key);

    // The key works, then is revoked and stops working at once.
    const before = await h.request({ method: 'GET', url: '/balance', headers: { authorization: `Bearer ${k.api_key}` } });
    expect(before.statusCode).toBe(200);
    const revoked = await admin('POST', `/keys/${k.key_id}/revoke`);
    expect(json(revoked)).toMatchObject({ key_id: k.key_id, account_id: a.account_id, type: 'agent', revoked: true, revoked_at: expect.any(String) });
    const after = await h.request({ method: 'GET', url: '/balance', headers: { authorization: `Bearer ${k.api_key}` } });
    expect(after.statusCode).toBe(401);
    // Again: the first revocation, no second record.
    expect(json(await admin('POST', `/keys/${k.key_id}/revoke`)).revoked_at).toBe(json(revoked).revoked_at);

    const records = await audit(`account_id=${a.account_id}`);
    const revokes = records.filter((r) => r.action === 'key.revoke');
    expect(revokes).toHaveLength(1);
    expect(revokes[0]).toMatchObject({
      target_id: k.key_id,
      before: { revoked_at: null, display_prefix: k.display_prefix },
      after: { revoked_at: json(revoked).revoked_at },
    });
    expect(records.find((r) => r.action === 'key.create')).toMatchObject({ target_id: k.key_id, after: { type: 'agent', display_prefix: k.display_prefix } });
    for (const secret of [k.api_key, a.api_key]) expect(JSON.stringify(records)).not.toContain(secret);
  });

  it('refuses what the CLI refuses: VIP keys for accounts that are not elite enterprise, sub-keys, unknown keys', async () => {
    const a = await newAccount();
    expect((await admin('POST', `/accounts/${a.account_id}/keys`, { type: 'vip' })).statusCode).toBe(403);
    expect((await admin('POST', `/accounts/${a.account_id}/keys`, { type: 'sub' })).statusCode).toBe(400);
    expect((await admin('POST', '/keys/00000000-0000-4000-8000-000000000000/revoke')).statusCode).toBe(404);
    expect((await admin('GET', '/accounts/00000000-0000-4000-8000-000000000000/keys')).statusCode).toBe(404);
    expect(await audit(`account_id=${a.account_id}&action=key.create`)).toEqual([]);
  });
});

describe('partners and payments', () => {
  it('partner create (recorded), duplicate codes refused, and the report', async () => {
    const code = `P${Date.now().toString(36).toUpperCase()}`;
    const res = await admin('POST', '/partners', { name: 'Audit Agency', code });
    expect(res.statusCode, res.body).toBe(201);
    const p = json(res);
    const dup = await admin('POST', '/partners', { name: 'Copy', code: code.toLowerCase() });
    expect(dup.statusCode).toBe(400);
    expect(json(dup).error.reason).toBe('code_taken');
    const [rec] = await audit('action=partner.create&limit=1');
    expect(rec).toMatchObject({ target_id: p.partner_id, after: { name: 'Audit Agency', code } });
    const report = json(await admin('GET', `/partners/report?month=${new Date().toISOString().slice(0, 7)}`));
    expect(report.partners.find((x: { partner_id: string }) => x.partner_id === p.partner_id)).toMatchObject({ referred_accounts: 0, revenue_cents: 0 });
    expect((await admin('GET', '/partners/report?month=2026-13')).statusCode).toBe(400);
  });

  it('payments: listed, marked settled or failed once (recorded with the state before), settle needs a collector', async () => {
    const ids = await h.container.pool.anyFirst(sql.type(z.object({ id: z.string() }))`
      INSERT INTO x402_payments (chain_id, asset, pay_to, network, payer, nonce, value_atomic, tool, resource, valid_before, payment_payload, payment_requirements, status)
      SELECT 84532, '0x036cbd53842c5426634e7929541ec2318f3dcf7e', '0x' || repeat('2', 40), 'eip155:84532', '0x' || repeat('1', 40),
             '0x' || encode(gen_random_bytes(32), 'hex'), 1000, 'compute', 'http://x/tools/compute',
             extract(epoch FROM now())::bigint + 3600, '{}'::jsonb, '{}'::jsonb, 'awaiting_settlement'
      FROM generate_series(1, 2) RETURNING id`);
    const [settleId, failId] = ids as [string, string];
    const settled = await admin('POST', `/payments/${settleId}/mark-settled`, { tx_hash: `0x${'AB'.repeat(32)}` });
    expect(settled.statusCode, settled.body).toBe(200);
    expect(json(settled)).toEqual({ id: settleId, status: 'settled', tx_hash: `0x${'ab'.repeat(32)}` });
    expect((await admin('POST', `/payments/${settleId}/mark-failed`, { reason: 'late' })).statusCode).toBe(404);
    expect(json(await admin('POST', `/payments/${failId}/mark-failed`, { reason: 'payer cancelled' }))).toMatchObject({
      status: 'failed',
      error: 'operator: payer cancelled',
    });
    expect((await admin('POST', `/payments/${failId}/mark-settled`, { tx_hash: 'nope' })).statusCode).toBe(400);
    const marks = await audit('action=payment.mark_settled&limit=5');
    expect(marks.find((r) => r.target_id === settleId)).toMatchObject({ before: { status: 'awaiting_settlement' }, after: { status: 'settled' } });
    expect((await audit('action=payment.mark_failed&limit=5')).find((r) => r.target_id === failId)).toMatchObject({ after: { status: 'failed' } });
    const list = json(await admin('GET', '/payments'));
    expect(list.payments.map((p: { id: string }) => p.id)).not.toContain(settleId);
    const settle = await admin('POST', '/payments/settle');
    expect(settle.statusCode).toBe(400);
    expect(json(settle).error.message).toMatch(/X402_/);
  });
});

describe('the audit log', () => {
  it('is append-only: Postgres refuses UPDATE, DELETE and TRUNCATE on it', async () => {
    await newAccount();
    for (const stmt of [sql.unsafe`UPDATE admin_audit SET actor_id = 'x'`, sql.unsafe`DELETE FROM admin_audit`, sql.unsafe`TRUNCATE admin_audit`]) {
      await expect(h.container.pool.query(stmt)).rejects.toThrow(/append-only/);
    }
  });

  it('pages newest first without repeats, filters, and refuses a malformed cursor or filter', async () => {
    const a = await newAccount();
    for (let i = 0; i < 3; i++) await admin('POST', `/accounts/${a.account_id}/credits/add`, { cents: 1 + i });
    const ids: number[] = [];
    let cursor: string | null = null;
    do {
      const page: { records: Array<{ id: number }>; next_cursor: string | null } = json(
        await admin('GET', `/audit?account_id=${a.account_id}&limit=1${cursor ? `&cursor=${cursor}` : ''}`),
      );
      ids.push(...page.records.map((r) => r.id));
      cursor = page.next_cursor;
    } while (cursor);
    expect(ids).toHaveLength(4);
    expect([...ids].sort((x, y) => y - x)).toEqual(ids);
    for (const q of ['cursor=abc', 'action=account.delete', 'since=never', 'limit=500', 'actor_kind=root']) {
      expect((await admin('GET', `/audit?${q}`)).statusCode, q).toBe(400);
    }
    expect(await audit(`account_id=${a.account_id}&since=${encodeURIComponent(new Date(Date.now() + 60_000).toISOString())}`)).toEqual([]);
  });
});

describe('the CLI is a client of the same service', () => {
  const env = () => ({
    ...process.env,
    DATABASE_URL: h.config.DATABASE_URL,
    REDIS_URL: h.config.REDIS_URL,
    REDIS_PREFIX: h.config.REDIS_PREFIX,
    LOG_LEVEL: 'warn',
  });
  async function cli(args: string[]) {
    try {
      const { stdout } = await run(process.execPath, ['--import', 'tsx', 'src/cli/admin.ts', ...args], { cwd: root, env: env() });
      return { code: 0, out: JSON.parse(stdout), stderr: '' };
    } catch (e) {
      const err = e as { code: number; stderr: string };
      return { code: err.code, out: null, stderr: err.stderr };
    }
  }

  it('credits remove and account set write the same record shape as the API, as "cli" and the OS user', async () => {
    const a = await newAccount({ plan: 'pro', credits: 500 });
    const viaCli = await cli(['credits', 'remove', '--account', a.account_id, '--cents', '200', '--reason', 'refund from the CLI']);
    expect(viaCli).toMatchObject({ code: 0, out: { account_id: a.account_id, credits: 300 } });
    await admin('POST', `/accounts/${a.account_id}/credits/remove`, { cents: 100, reason: 'refund from the API' });
    const [fromApi, fromCli] = await audit(`account_id=${a.account_id}&action=credits.remove`);
    expect(fromCli).toMatchObject({
      actor: { kind: 'cli', id: userInfo().username },
      request_id: expect.stringMatching(/^cli-/),
      before: { credits: 500 },
      after: { credits: 300, delta_cents: -200, reason: 'refund from the CLI' },
    });
    expect(fromApi!.actor).toEqual({ kind: 'admin-api', id: fingerprint });
    const shape = (r: Record<string, any>) => ({ top: Object.keys(r).sort(), before: Object.keys(r.before).sort(), after: Object.keys(r.after).sort() });
    expect(shape(fromCli!)).toEqual(shape(fromApi!));
    expect(await h.container.credits.available(a.account_id)).toBe(200);

    expect((await cli(['account', 'set', '--account', a.account_id, '--max-in-flight', '3'])).code).toBe(0);
    expect((await cli(['account', 'set', '--account', a.account_id, '--max-in-flight', 'default'])).out).toMatchObject({ max_in_flight: null });
    const updates = await audit(`account_id=${a.account_id}&action=account.update&actor_kind=cli`);
    expect(updates.map((r) => r.after.max_in_flight)).toEqual([null, 3]);
  }, 180_000);

  it('account list and key list; key create is recorded without the key', async () => {
    const name = `cli-${Date.now().toString(36)}`;
    const a = await newAccount({ plan: 'free', credits: 0, name });
    const list = await cli(['account', 'list', '--name-contains', name, '--plan', 'free']);
    expect(list.out.accounts.map((x: { account_id: string }) => x.account_id)).toEqual([a.account_id]);
    const key = await cli(['key', 'create', '--account', a.account_id, '--type', 'test']);
    expect(key.code).toBe(0);
    const keys = await cli(['key', 'list', '--account', a.account_id]);
    expect(keys.out.keys).toHaveLength(2);
    const [rec] = await audit(`account_id=${a.account_id}&action=key.create`);
    expect(rec).toMatchObject({ actor: { kind: 'cli' }, target_id: key.out.key_id });
    expect(JSON.stringify(rec)).not.toContain(key.out.api_key);
  }, 180_000);

  it('a usage error prints one plain line and the usage, exit code 2', async () => {
    for (const args of [
      ['account', 'frob'],
      ['credits', 'remove', '--account', 'nope', '--cents', '5'],
      ['key', 'list', '--bogus', 'x'],
    ]) {
      const r = await cli(args);
      expect(r.code, args.join(' ')).toBe(2);
      const [first, blank, usage] = r.stderr.split('\n');
      expect(first).toMatch(/^error: /);
      expect(first).not.toMatch(/[{}"]/);
      expect(blank).toBe('');
      expect(usage).toMatch(/^usage: /);
    }
    const missing = await cli(['credits', 'remove', '--account', '00000000-0000-4000-8000-000000000000', '--cents', '5']);
    expect(missing.stderr.split('\n')[0]).toBe('error: credits remove: --reason is required');
    // Four CLI starts under tsx: 10-20 s each on a loaded two-core machine (the compiled CLI starts in under 1 s).
  }, 240_000);
});
