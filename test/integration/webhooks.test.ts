import { randomBytes } from 'node:crypto';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { sql } from '../../src/db/pool.js';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { registerSlowTools } from '../helpers/slow-tools.js';
import { until } from '../helpers/wait.js';

/** What the local receiver got. */
interface Received {
  path: string;
  headers: IncomingHttpHeaders;
  raw: string;
  answered: number;
}

/**
 * What the README tells a receiver to do: verify with a Standard Webhooks library (here the official
 * `standardwebhooks` npm package) over the raw body and the three `webhook-*` headers.
 */
function verifies(secret: string, r: Pick<Received, 'headers' | 'raw'>): boolean {
  try {
    new Webhook(secret).verify(r.raw, {
      'webhook-id': String(r.headers['webhook-id']),
      'webhook-timestamp': String(r.headers['webhook-timestamp']),
      'webhook-signature': String(r.headers['webhook-signature']),
    });
    return true;
  } catch {
    return false;
  }
}

function withoutKeys(body: Record<string, any>, ...keys: string[]) {
  const copy = structuredClone(body);
  for (const k of keys) delete copy[k];
  if (copy.error) for (const k of keys) delete copy.error[k];
  return copy;
}

let h: Harness;
let server: Server;
let base: string;
const received: Received[] = [];
/** Answers per path: `/flaky/<tag>` says 500 twice and then 200; anything else 200. */
const hits = new Map<string, number>();

beforeAll(async () => {
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = req.url ?? '/';
      const n = (hits.get(path) ?? 0) + 1;
      hits.set(path, n);
      if (path.startsWith('/hang/')) {
        received.push({ path, headers: req.headers, raw: Buffer.concat(chunks).toString('utf8'), answered: 0 });
        return; // never answers
      }
      const answered = path.startsWith('/flaky/') && n <= 2 ? 500 : path.startsWith('/redirect/') ? 307 : 200;
      received.push({ path, headers: req.headers, raw: Buffer.concat(chunks).toString('utf8'), answered });
      res.statusCode = answered;
      if (answered === 307) res.setHeader('location', `/followed${path}`);
      res.end(answered === 200 ? 'thanks'.repeat(5000) : 'not now');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  base = `http://127.0.0.1:${port}`;
  registerSlowTools();
  h = await startHarness({ WEBHOOK_ALLOWED_HOSTS: `127.0.0.1:${port}`, WEBHOOK_BACKOFF_MS: '200', WEBHOOK_ATTEMPTS: '5', WEBHOOK_TIMEOUT_MS: '1000' });
});

afterAll(async () => {
  await h?.close();
  await new Promise((r) => server?.close(r));
});

const auth = (apiKey: string) => ({ authorization: `Bearer ${apiKey}` });
/** Every account this file makes, so the last test can check every delivery against its account's secret. */
const keys = new Map<string, string>();
async function account() {
  const a = await h.account('pro', 100);
  keys.set(a.accountId, a.apiKey);
  return a;
}

describe('webhooks', () => {
  it('GET /webhooks/secret creates the secret once, POST rolls it; sandbox keys are refused', async () => {
    const acct = await account();
    const first = await h.request({ method: 'GET', url: '/webhooks/secret', headers: auth(acct.apiKey) });
    expect(first.statusCode).toBe(200);
    expect(first.headers['cache-control']).toBe('no-store');
    const secret = json(first).secret as string;
    // Standard Webhooks' symmetric secret: whsec_ and the standard base64 of 32 random bytes.
    expect(secret).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    expect(Buffer.from(secret.slice(6), 'base64')).toHaveLength(32);
    const again = await h.request({ method: 'GET', url: '/webhooks/secret', headers: auth(acct.apiKey) });
    expect(json(again).secret).toBe(secret);
    const rolled = await h.request({ method: 'POST', url: '/webhooks/secret', headers: auth(acct.apiKey) });
    expect(rolled.statusCode).toBe(200);
    expect(json(rolled).secret).not.toBe(secret);
    expect(json(await h.request({ method: 'GET', url: '/webhooks/secret', headers: auth(acct.apiKey) })).secret).toBe(json(rolled).secret);

    // At rest it is sealed, and it never reaches the logs.
    const sealed = await h.container.pool.oneFirst(
      sql.type(z.object({ sealed: z.string() }))`SELECT sealed FROM webhook_secrets WHERE account_id = ${acct.accountId}`,
    );
    expect(sealed).toMatch(/^v1\./);
    expect(sealed).not.toContain(json(rolled).secret.slice(6));
    expect(h.logs.join('')).not.toContain(secret);

    const sandbox = await h.key(acct.accountId, 'test');
    const refused = await h.request({ method: 'GET', url: '/webhooks/secret', headers: auth(sandbox.apiKey) });
    expect(refused.statusCode).toBe(403);
    expect(json(refused).error.code).toBe('forbidden');
    expect((await h.request({ method: 'POST', url: '/webhooks/secret', headers: auth(sandbox.apiKey) })).statusCode).toBe(403);
    expect((await h.request({ method: 'GET', url: '/webhooks/secret' })).statusCode).toBe(401);
  });

  it('a secret made before Standard Webhooks (whsec_ + base64url) keeps its bytes: shown in standard base64, deliveries verify with it', async () => {
    const acct = await account();
    // 24 bytes whose base64url has both URL-safe characters ('-' and '_'), as secrets were made before.
    const bytes = Buffer.concat([Buffer.from([0xfb, 0xef, 0xff]), randomBytes(21)]);
    const old = `whsec_${bytes.toString('base64url')}`;
    expect(old).toMatch(/[-_]/);
    await h.container.pool.query(sql.unsafe`INSERT INTO webhook_secrets (account_id, sealed) VALUES (${acct.accountId}, ${h.container.sealer.seal(old)})`);
    const shown = json(await h.request({ method: 'GET', url: '/webhooks/secret', headers: auth(acct.apiKey) })).secret as string;
    expect(shown).toBe(`whsec_${bytes.toString('base64')}`);
    // The libraries read standard base64 only: the old spelling is refused, the one shown now works.
    expect(() => new Webhook(old)).toThrow();
    const path = `/legacy/${acct.accountId}`;
    await h.call('compute', { expression: '3 * 3' }, acct.apiKey, { prefer: 'respond-async', 'callback-url': `${base}${path}` });
    const got = await until('the legacy-secret delivery', () => received.find((r) => r.path === path));
    expect(verifies(shown, got)).toBe(true);
  });

  it('delivers the signed GET /jobs/{id} body once after two 500s, and GET /jobs/{id} shows the three attempts', async () => {
    const acct = await account();
    const secret = json(await h.request({ method: 'GET', url: '/webhooks/secret', headers: auth(acct.apiKey) })).secret as string;
    const hook = `${base}/flaky/${acct.accountId}`;
    const started = Date.now();
    const res = await h.call('compute', { expression: '2 * (3 + 4)' }, acct.apiKey, { prefer: 'respond-async', 'callback-url': hook });
    expect(res.statusCode).toBe(202);
    const jobId = json(res).job_id as string;

    const ok = await until('a successful delivery', () => received.find((r) => r.path === `/flaky/${acct.accountId}` && r.answered === 200));
    const elapsed = Date.now() - started;
    // Backoff 200 ms then 400 ms: seconds, not a day.
    expect(elapsed).toBeLessThan(15_000);
    const mine = received.filter((r) => r.path === `/flaky/${acct.accountId}`);
    expect(mine.map((r) => r.answered)).toEqual([500, 500, 200]);
    for (const r of mine) {
      expect(r.headers['content-type']).toBe('application/json');
      expect(r.headers['tollgate-job-id']).toBe(jobId);
      // The same webhook-id on every retry (receivers dedupe on it); each attempt its own timestamp, in seconds.
      expect(r.headers['webhook-id']).toBe(mine[0]!.headers['webhook-id']);
      expect(Math.abs(Number(r.headers['webhook-timestamp']) - Date.now() / 1000)).toBeLessThan(60);
      expect(String(r.headers['webhook-signature'])).toMatch(/^v1,[A-Za-z0-9+/]{43}=$/);
      expect(verifies(secret, r)).toBe(true);
    }
    expect(String(ok.headers['webhook-id'])).toMatch(/^dlv_/);
    // A tampered body, another id or another secret does not verify.
    expect(verifies(secret, { ...ok, raw: ok.raw.replace('14', '15') })).toBe(false);
    expect(verifies(secret, { ...ok, headers: { ...ok.headers, 'webhook-id': 'dlv_other' } })).toBe(false);
    expect(verifies(`whsec_${randomBytes(32).toString('base64')}`, ok)).toBe(false);

    const delivered = JSON.parse(ok.raw);
    expect(delivered).toMatchObject({ job_id: jobId, status: 'completed', result: { value: 14 }, cost_cents: 2 });

    const view = await until('delivered_at', async () => {
      const j = json(await h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: auth(acct.apiKey) }));
      return j.webhook?.delivered_at ? j : undefined;
    });
    expect(withoutKeys(view, 'webhook')).toEqual(delivered);
    expect(view.webhook.url).toBe(hook);
    expect(view.webhook.deliveries.map((d: any) => [d.status, d.ok])).toEqual([
      [500, false],
      [500, false],
      [200, true],
    ]);
    expect(view.webhook.deliveries[0].error).toMatch(/500/);
    // Exactly one successful delivery, and nothing more arrives.
    await new Promise((r) => setTimeout(r, 800));
    expect(received.filter((r) => r.path === `/flaky/${acct.accountId}`)).toHaveLength(3);
    expect(h.logs.join('')).not.toContain(secret);
  });

  it('refuses a callback to loopback, private or metadata addresses with 400 before anything is queued or charged', async () => {
    const acct = await account();
    const counts = async () => Object.values(await h.container.queues.queue('core').getJobCounts()).reduce((a, b) => a + b, 0);
    const before = await counts();
    for (const url of [
      'http://127.0.0.1:9/hook',
      'https://127.0.0.1:9/hook',
      'https://localhost/',
      'http://169.254.169.254/',
      'https://169.254.169.254/latest/meta-data/',
      'https://10.1.2.3/hook',
      'https://[::1]/hook',
      'ftp://example.com/hook',
      'not a url',
      `https://user:pw@${base.slice(7)}/hook`,
    ]) {
      const res = await h.call('compute', { expression: '1 + 1' }, acct.apiKey, { prefer: 'respond-async', 'callback-url': url });
      expect(res.statusCode, url).toBe(400);
      const err = json(res).error;
      expect(err.code).toBe('invalid_input');
      expect(err.message).toMatch(/^Callback-Url refused/);
      expect(err.issues[0].path).toEqual(['Callback-Url']);
    }
    // The root protocol: the header, and callback_url in the body.
    const root = await h.request({
      method: 'POST',
      url: '/',
      headers: { ...auth(acct.apiKey), 'content-type': 'application/json', prefer: 'respond-async' },
      payload: { m: 'compute', q: '1 + 1', callback_url: 'http://169.254.169.254/' },
    });
    expect(root.statusCode).toBe(400);
    expect(json(root).error.issues[0].path).toEqual(['callback_url']);

    expect(await counts()).toBe(before);
    expect(await h.credits(acct.accountId)).toBe(100);
    expect(await h.ledgerCharges(acct.accountId)).toBe(0);
    expect(json(await h.request({ method: 'GET', url: '/jobs', headers: auth(acct.apiKey) })).jobs).toEqual([]);
  });

  it('delivers a failed job: the error body GET /jobs/{id} answers', async () => {
    const acct = await account();
    const secret = json(await h.request({ method: 'GET', url: '/webhooks/secret', headers: auth(acct.apiKey) })).secret as string;
    const path = `/failed/${acct.accountId}`;
    const res = await h.call('compute', { expression: 'f(x) = x' }, acct.apiKey, { prefer: 'respond-async', 'callback-url': `${base}${path}` });
    expect(res.statusCode).toBe(202);
    const jobId = json(res).job_id as string;
    const got = await until('the failure delivery', () => received.find((r) => r.path === path));
    expect(verifies(secret, got)).toBe(true);
    const delivered = JSON.parse(got.raw);
    expect(delivered.error).toMatchObject({ code: 'invalid_input', job_id: jobId });

    const view = await until('delivered_at', async () => {
      const r = await h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: auth(acct.apiKey) });
      return json(r).error?.webhook?.delivered_at ? r : undefined;
    });
    expect(view.statusCode).toBe(400);
    expect(withoutKeys(json(view), 'webhook', 'request_id')).toEqual(delivered);
    expect(json(view).error.webhook.deliveries).toEqual([expect.objectContaining({ status: 200, ok: true })]);
    expect(await h.ledgerCharges(acct.accountId)).toBe(0);
  });

  it('POST / in direct mode takes callback_url in the body', async () => {
    const acct = await account();
    const path = `/root/${acct.accountId}`;
    const res = await h.request({
      method: 'POST',
      url: '/',
      headers: { ...auth(acct.apiKey), 'content-type': 'application/json', prefer: 'respond-async' },
      payload: { m: 'compute', q: '6 * 7', callback_url: `${base}${path}` },
    });
    expect(res.statusCode).toBe(202);
    const jobId = json(res).job_id as string;
    const got = await until('the root delivery', () => received.find((r) => r.path === path));
    expect(JSON.parse(got.raw)).toMatchObject({ job_id: jobId, status: 'completed', result: { value: 42 } });
  });

  it('a chain and a parallel request are each delivered once, when every step has ended, with the body GET /jobs/{root} answers', async () => {
    const acct = await account();
    const secret = json(await h.request({ method: 'GET', url: '/webhooks/secret', headers: auth(acct.apiKey) })).secret as string;
    const send = async (payload: Record<string, unknown>, path: string) => {
      const res = await h.request({
        method: 'POST',
        url: '/',
        headers: { ...auth(acct.apiKey), 'content-type': 'application/json', prefer: 'respond-async', 'callback-url': `${base}${path}` },
        payload,
      });
      expect(res.statusCode).toBe(202);
      return json(res).job_id as string;
    };
    const chainPath = `/chain/${acct.accountId}`;
    const parallelPath = `/parallel/${acct.accountId}`;
    const failedPath = `/chain-failed/${acct.accountId}`;
    const chainId = await send({ chain: ['compute', 'compute'], q: '2 * 3' }, chainPath);
    const parallelId = await send({ parallel: ['compute', 'check_balance'], q: '6 * 7' }, parallelPath);
    // The second step gets "zeros(1000)"'s text and fails: the request fails, and that is delivered.
    const failedId = await send({ chain: ['compute', 'compute'], q: 'zeros(1000)' }, failedPath);

    for (const [path, id] of [
      [chainPath, chainId],
      [parallelPath, parallelId],
      [failedPath, failedId],
    ] as const) {
      const got = await until(`the delivery for ${path}`, () => received.find((r) => r.path === path));
      expect(got.headers['tollgate-job-id']).toBe(id);
      expect(verifies(secret, got)).toBe(true);
      const status = await h.request({ method: 'GET', url: `/jobs/${id}`, headers: auth(acct.apiKey) });
      expect(withoutKeys(JSON.parse(got.raw), 'request_id')).toEqual(withoutKeys(json(status), 'webhook', 'request_id'));
    }
    expect(JSON.parse(received.find((r) => r.path === chainPath)!.raw)).toMatchObject({ job_id: chainId, status: 'completed', steps: [{}, {}], cost_cents: 4 });
    expect(JSON.parse(received.find((r) => r.path === parallelPath)!.raw)).toMatchObject({ job_id: parallelId, status: 'completed', results: { compute: {} } });
    expect(JSON.parse(received.find((r) => r.path === failedPath)!.raw)).toMatchObject({ error: { code: 'invalid_input', job_id: failedId } });
    // Once each, and no step got a delivery of its own.
    await new Promise((r) => setTimeout(r, 1500));
    for (const path of [chainPath, parallelPath, failedPath]) expect(received.filter((r) => r.path === path)).toHaveLength(1);
  });

  it('a sync call that finishes in time still gets its delivery (once)', async () => {
    const acct = await account();
    const path = `/sync/${acct.accountId}`;
    const res = await h.call('compute', { expression: '1 + 2' }, acct.apiKey, { 'callback-url': `${base}${path}` });
    expect(res.statusCode).toBe(200);
    const got = await until('the sync delivery', () => received.find((r) => r.path === path));
    expect(JSON.parse(got.raw)).toMatchObject({ job_id: res.headers['x-job-id'], status: 'completed', result: { value: 3 } });
    await new Promise((r) => setTimeout(r, 500));
    expect(received.filter((r) => r.path === path)).toHaveLength(1);
  });

  it('delivers a cancelled job (DELETE /jobs/{id} while it runs) once', async () => {
    const acct = await account();
    const path = `/cancelled/${acct.accountId}`;
    // A paid tool: only charged calls take a Callback-Url.
    const res = await h.call('test_wait_signal', { ms: 20_000, tag: 'hooked' }, acct.apiKey, { prefer: 'respond-async', 'callback-url': `${base}${path}` });
    expect(res.statusCode).toBe(202);
    const jobId = json(res).job_id as string;
    await until('the job to run', async () => json(await h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: auth(acct.apiKey) })).status === 'running');
    const del = await h.request({ method: 'DELETE', url: `/jobs/${jobId}`, headers: auth(acct.apiKey) });
    expect(del.statusCode).toBe(200);
    const got = await until('the cancellation delivery', () => received.find((r) => r.path === path));
    const delivered = JSON.parse(got.raw);
    expect(delivered.error).toMatchObject({ code: 'cancelled', job_id: jobId });
    const view = await until('delivered_at', async () => {
      const r = await h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: auth(acct.apiKey) });
      return json(r).error?.webhook?.delivered_at ? r : undefined;
    });
    expect(withoutKeys(json(view), 'webhook', 'request_id')).toEqual(delivered);
    await new Promise((r) => setTimeout(r, 500));
    expect(received.filter((r) => r.path === path)).toHaveLength(1);
  });

  it('a job settled by a run that died before queueing its webhook is delivered by the redelivered run, once', async () => {
    const acct = await account();
    const path = `/redelivered/${acct.accountId}`;
    // A finished call without a callback stands for a run that settled and died before queueing the delivery.
    const res = await h.call('compute', { expression: '5 * 5' }, acct.apiKey);
    expect(res.statusCode).toBe(200);
    const jobId = String(res.headers['x-job-id']);
    const job = await h.container.queues.getJob(jobId);
    const data = { ...job!.data, callbackUrl: `${base}${path}` };
    const run = () =>
      h.container.runner.run(data, {
        id: jobId,
        attemptsMade: 1,
        maxAttempts: 3,
        redelivered: true,
        signal: new AbortController().signal,
        progress: async () => {},
        previousOutput: async () => undefined,
      });
    expect(await run()).toMatchObject({ result: { value: 25 } });
    await run();
    const got = await until('the redelivered job delivery', () => received.find((r) => r.path === path));
    expect(JSON.parse(got.raw)).toMatchObject({ job_id: jobId, status: 'completed', result: { value: 25 } });
    await new Promise((r) => setTimeout(r, 500));
    expect(received.filter((r) => r.path === path)).toHaveLength(1);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
  });

  it('does not follow redirects, and a receiver that never answers times out; both are retried and recorded', async () => {
    const acct = await account();
    const redirect = await h.call('compute', { expression: '1' }, acct.apiKey, {
      prefer: 'respond-async',
      'callback-url': `${base}/redirect/${acct.accountId}`,
    });
    const hang = await h.call('compute', { expression: '2' }, acct.apiKey, { prefer: 'respond-async', 'callback-url': `${base}/hang/${acct.accountId}` });
    const view = async (jobId: string) => json(await h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: auth(acct.apiKey) })).webhook;
    const r = await until('two redirect attempts', async () =>
      (await view(json(redirect).job_id))?.deliveries.length >= 2 ? view(json(redirect).job_id) : undefined,
    );
    expect(r.deliveries[0]).toMatchObject({ status: 307, ok: false });
    expect(r.delivered_at).toBeNull();
    expect(received.some((x) => x.path.startsWith('/followed/'))).toBe(false);
    const t = await until('a timed-out attempt', async () => ((await view(json(hang).job_id))?.deliveries.length >= 1 ? view(json(hang).job_id) : undefined));
    expect(t.deliveries[0]).toMatchObject({ status: null, ok: false });
    expect(t.deliveries[0].error).toMatch(/timed out|timeout/i);
  });

  it("every delivery this file received verifies with its account's secret (Standard Webhooks, `standardwebhooks`)", async () => {
    expect(received.length).toBeGreaterThan(10);
    for (const r of received) {
      const apiKey = keys.get(r.path.split('/')[2]!);
      expect(apiKey, r.path).toBeDefined();
      const secret = json(await h.request({ method: 'GET', url: '/webhooks/secret', headers: auth(apiKey!) })).secret as string;
      expect(verifies(secret, r), r.path).toBe(true);
    }
  });
});
