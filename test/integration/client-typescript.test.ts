import { execFile } from 'node:child_process';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { promisify } from 'node:util';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  ConflictError,
  InvalidInputError,
  NotFoundError,
  PaymentRequiredError,
  RateLimitedError,
  type StreamEvent,
  Tollgate,
  TollgateError,
  verifyWebhook,
  WebhookVerificationError,
} from '../../clients/typescript/src/index.js';
import { startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { registerSlowTools } from '../helpers/slow-tools.js';
import { until } from '../helpers/wait.js';

/** One request the client made, as it left and as it was answered. */
interface Seen {
  method: string;
  url: string;
  headers: Record<string, string>;
  at: number;
  status?: number;
  response?: Headers;
}

/** The global fetch, with every request and answer written to `log`. */
function recording(log: Seen[], inner: typeof fetch = fetch): typeof fetch {
  return async (input, init) => {
    const seen: Seen = { method: init?.method ?? 'GET', url: String(input), headers: Object.fromEntries(new Headers(init?.headers).entries()), at: Date.now() };
    log.push(seen);
    const res = await inner(input, init);
    seen.status = res.status;
    seen.response = res.headers;
    return res;
  };
}

/**
 * A fetch whose first event stream breaks after its first event: the bytes up to the end of that
 * event are passed on, then the real connection to the service is cancelled and the body fails as a
 * reset connection does.
 */
function dropsFirstStream(inner: typeof fetch): typeof fetch {
  let dropped = false;
  return async (input, init) => {
    const res = await inner(input, init);
    if (dropped || !(res.headers.get('content-type') ?? '').startsWith('text/event-stream') || !res.body) return res;
    dropped = true;
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let text = '';
    let sent = false;
    const body = new ReadableStream<Uint8Array>({
      async pull(ctrl) {
        if (sent) {
          ctrl.error(new TypeError('terminated: other side closed'));
          return;
        }
        for (;;) {
          const start = text.search(/(^|\n)event:/);
          const end = start < 0 ? -1 : text.indexOf('\n\n', start);
          if (end >= 0) {
            ctrl.enqueue(new TextEncoder().encode(text.slice(0, end + 2)));
            sent = true;
            await reader.cancel();
            return;
          }
          const { done, value } = await reader.read();
          if (done) {
            ctrl.close();
            return;
          }
          text += decoder.decode(value, { stream: true });
        }
      },
    });
    return new Response(body, { status: res.status, headers: res.headers });
  };
}

async function collect<R>(it: AsyncIterable<StreamEvent<R>>): Promise<StreamEvent<R>[]> {
  const out: StreamEvent<R>[] = [];
  for await (const ev of it) out.push(ev);
  return out;
}

async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection');
}

interface Delivery {
  headers: IncomingHttpHeaders;
  raw: string;
}

let h: Harness;
let baseUrl: string;
let receiver: Server;
let hookBase: string;
const deliveries: Delivery[] = [];
let rich: TestAccount;
let broke: TestAccount;
let limited: TestAccount;
let capped: TestAccount;

beforeAll(async () => {
  receiver = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      deliveries.push({ headers: req.headers, raw: Buffer.concat(chunks).toString('utf8') });
      res.end('ok');
    });
  });
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
  const port = (receiver.address() as AddressInfo).port;
  hookBase = `http://127.0.0.1:${port}`;
  registerSlowTools();
  h = await startHarness({ WEBHOOK_ALLOWED_HOSTS: `127.0.0.1:${port}` }, {});
  baseUrl = await h.app.listen({ port: 0, host: '127.0.0.1' });
  rich = await h.account('enterprise', 100000);
  broke = await h.account('enterprise', 0);
  limited = await h.account('enterprise', 1000, { rpm: 1 });
  capped = await h.account('enterprise', 1000, { maxInFlight: 1 });
});

afterAll(async () => {
  await h?.close();
  await new Promise((r) => receiver?.close(r));
});

const client = (acct: TestAccount, extra: Partial<ConstructorParameters<typeof Tollgate>[0]> = {}) => new Tollgate({ apiKey: acct.apiKey, baseUrl, ...extra });

describe('@tollgate/client against a running service', () => {
  it('call(): a synchronous call answers the typed result, its cost and the balance left', async () => {
    const tg = client(rich);
    const out = await tg.call('compute', { expression: '6 * 7' });
    expect(out.result.value).toBe(42);
    expect(out.result.result).toBe('42');
    expect(out.cost_cents).toBe(2);
    expect(out.remaining_credits).toBe(await h.credits(rich.accountId));
    const bal = await tg.balance();
    expect(bal).toMatchObject({ credits: out.remaining_credits, plan: 'enterprise', key_type: 'production' });
  });

  it('submit() + wait() + getJob(): an async job, Prefer: respond-async, polled to its result', async () => {
    const log: Seen[] = [];
    const tg = client(rich, { fetch: recording(log) });
    const job = await tg.submit('compute', { expression: 'sqrt(16) * 2' });
    expect(log[0]?.headers.prefer).toBe('respond-async');
    expect(log[0]?.status).toBe(202);
    expect(job.job_id).toMatch(/\S/);
    expect(job.status_url).toBe(`/jobs/${job.job_id}`);
    const done = await tg.wait<{ value: number }>(job.job_id, { timeoutMs: 10_000, pollMs: 50 });
    expect(done.result.value).toBe(8);
    expect(done.cost_cents).toBe(2);
    const again = await tg.getJob(job.job_id);
    expect(again).toMatchObject({ job_id: job.job_id, status: 'completed', result: { value: 8 } });
  });

  it('cancel(): a running job is cancelled, and waiting on it throws ConflictError `cancelled`', async () => {
    const tg = client(rich);
    const before = await h.credits(rich.accountId);
    const job = await tg.submit('test_wait_signal', { ms: 20_000, tag: 'ts-client-cancel' });
    const cancelled = await tg.cancel(job.job_id);
    expect(cancelled).toMatchObject({ job_id: job.job_id, status: 'cancelled', cancelled: true });
    const err = await rejection(tg.wait(job.job_id, { timeoutMs: 10_000, pollMs: 50 }));
    expect(err).toBeInstanceOf(ConflictError);
    expect(err).toMatchObject({ status: 409, code: 'cancelled' });
    expect(await h.credits(rich.accountId)).toBe(before);
  });

  it('stream(): a connection dropped after the first event resumes with Last-Event-ID and yields the result once', async () => {
    const log: Seen[] = [];
    const tg = client(rich, { fetch: recording(log, dropsFirstStream(fetch)) });
    const charges = await h.ledgerCharges(rich.accountId);
    // A paid test tool that runs 600 ms: the drop lands while the job runs.
    const events = await collect(tg.stream('test_wait_signal', { ms: 600, tag: 'ts-client-stream' }));
    expect(events.map((e) => e.event)).toEqual(['queued', 'result']);
    const [queued, result] = events;
    if (queued?.event !== 'queued' || result?.event !== 'result') throw new Error('unexpected events');
    expect(result.data.result).toEqual({ waited: 600, tag: 'ts-client-stream' });
    expect(result.data.cost_cents).toBe(2);
    // One POST, then one GET of the job's events carrying the id of the event seen.
    expect(log.map((s) => `${s.method} ${new URL(s.url).pathname}`)).toEqual(['POST /tools/test_wait_signal', `GET /jobs/${queued.data.job_id}/events`]);
    expect(log[1]?.headers['last-event-id']).toBe(queued.id);
    expect(await h.ledgerCharges(rich.accountId)).toBe(charges + 1);

    // The same on a typed tool whose result is ready before the drop: the replay brings it once.
    const fast = client(rich, { fetch: dropsFirstStream(fetch) });
    const evs = await collect(fast.stream('compute', { expression: '2 ^ 10' }));
    expect(evs.map((e) => e.event)).toEqual(['queued', 'result']);
    const last = evs[1];
    if (last?.event !== 'result') throw new Error('no result');
    expect(last.data.result.value).toBe(1024);
  });

  it('stream(): an AbortSignal stops the iteration; the job itself runs on', async () => {
    const tg = client(rich);
    const ac = new AbortController();
    const seen: string[] = [];
    let jobId = '';
    const err = await rejection(
      (async () => {
        for await (const ev of tg.stream('test_wait_signal', { ms: 400, tag: 'ts-client-abort' }, { signal: ac.signal })) {
          seen.push(ev.event);
          if (ev.event === 'queued') {
            jobId = ev.data.job_id;
            ac.abort();
          }
        }
      })(),
    );
    expect((err as Error).name).toBe('AbortError');
    expect(seen).toEqual(['queued']);
    const done = await tg.wait(jobId, { timeoutMs: 10_000, pollMs: 50 });
    expect(done.result).toEqual({ waited: 400, tag: 'ts-client-abort' });
  });

  it('Idempotency-Key: the same key twice charges once and the second answer is the first, replayed', async () => {
    const log: Seen[] = [];
    const tg = client(rich, { fetch: recording(log) });
    const charges = await h.ledgerCharges(rich.accountId);
    const key = `ts-client-${crypto.randomUUID()}`;
    const first = await tg.call('compute', { expression: '3 * 14' }, { idempotencyKey: key });
    const second = await tg.call('compute', { expression: '3 * 14' }, { idempotencyKey: key });
    expect(second).toEqual(first);
    expect(log.map((s) => s.headers['idempotency-key'])).toEqual([key, key]);
    expect(log[0]?.response?.get('idempotent-replayed')).toBeNull();
    expect(log[1]?.response?.get('idempotent-replayed')).toBe('true');
    expect(await h.ledgerCharges(rich.accountId)).toBe(charges + 1);

    // The same key with another body: 422 idempotency_key_reused, a TollgateError with its code.
    const reused = await rejection(tg.call('compute', { expression: '1 + 1' }, { idempotencyKey: key }));
    expect(reused).toBeInstanceOf(TollgateError);
    expect(reused).toMatchObject({ status: 422, code: 'idempotency_key_reused' });
  });

  it('retries: an answer lost on the way back is retried with the same automatic key and replayed, charged once', async () => {
    const log: Seen[] = [];
    let lost = false;
    // The request reaches the service and runs; its answer never reaches the client.
    const losesFirstAnswer: typeof fetch = async (input, init) => {
      const res = await fetch(input, init);
      if (!lost) {
        lost = true;
        await res.arrayBuffer();
        throw new TypeError('fetch failed');
      }
      return res;
    };
    const tg = client(rich, { fetch: recording(log, losesFirstAnswer) });
    const charges = await h.ledgerCharges(rich.accountId);
    const out = await tg.call('compute', { expression: '100 / 4' });
    expect(out.result.value).toBe(25);
    expect(log).toHaveLength(2);
    const keys = log.map((s) => s.headers['idempotency-key']);
    expect(keys[0]).toMatch(/^[0-9a-f-]{36}$/);
    expect(keys[1]).toBe(keys[0]);
    expect(log[1]?.response?.get('idempotent-replayed')).toBe('true');
    expect(await h.ledgerCharges(rich.accountId)).toBe(charges + 1);

    // Each logical call has its own key.
    await tg.call('compute', { expression: '1' });
    expect(log[2]?.headers['idempotency-key']).not.toBe(keys[0]);
  });

  it('retries: a 429 concurrency_limited is retried after its Retry-After, with the same key', async () => {
    const log: Seen[] = [];
    const tg = client(capped, { fetch: recording(log), maxRetries: 4 });
    await tg.submit('test_wait_signal', { ms: 1200, tag: 'ts-client-capped' });
    log.length = 0;
    const started = Date.now();
    const out = await tg.call('compute', { expression: '6 * 7' });
    expect(out.result.value).toBe(42);
    expect(log[0]?.status).toBe(429);
    expect(log.at(-1)?.status).toBe(200);
    expect(new Set(log.map((s) => s.headers['idempotency-key'])).size).toBe(1);
    // Retry-After: 1 was honoured between the attempts.
    expect((log[1]?.at ?? 0) - (log[0]?.at ?? 0)).toBeGreaterThanOrEqual(950);
    expect(Date.now() - started).toBeGreaterThanOrEqual(950);
  });

  it('errors: 402 insufficient_credits and 429 rate_limited are typed, with code, requestId and retryAfter', async () => {
    const poor = client(broke);
    const e402 = await rejection(poor.call('compute', { expression: '1 + 1' }));
    expect(e402).toBeInstanceOf(PaymentRequiredError);
    expect(e402).toBeInstanceOf(TollgateError);
    expect(e402).toMatchObject({ status: 402, code: 'insufficient_credits', name: 'PaymentRequiredError' });
    expect((e402 as TollgateError).requestId).toMatch(/\S/);
    expect((e402 as TollgateError).details).toMatchObject({ required_cents: 2, available_cents: 0 });

    const log: Seen[] = [];
    const slow = client(limited, { fetch: recording(log), maxRetries: 0 });
    await slow.call('compute', { expression: '1 + 1' });
    const e429 = await rejection(slow.call('compute', { expression: '2 + 2' }));
    expect(e429).toBeInstanceOf(RateLimitedError);
    expect(e429).toMatchObject({ status: 429, code: 'rate_limited' });
    const rl = e429 as RateLimitedError;
    expect(rl.requestId).toBe(log[1]?.response?.get('x-request-id'));
    expect(rl.retryAfter).toBeGreaterThan(0);
    expect(rl.retryAfter).toBe(Number(log[1]?.response?.get('retry-after')));
    expect(log).toHaveLength(2); // maxRetries: 0 made no retry
  });

  it('errors: 400 invalid_input with its issues, 404 not_found for an unknown job', async () => {
    const tg = client(rich);
    const bad = await rejection(tg.call('compute', { expression: '' }));
    expect(bad).toBeInstanceOf(InvalidInputError);
    expect(bad).toMatchObject({ status: 400, code: 'invalid_input' });
    expect((bad as TollgateError).details.issues).toEqual([expect.objectContaining({ path: ['expression'] })]);
    const missing = await rejection(tg.getJob('core-no-such-job'));
    expect(missing).toBeInstanceOf(NotFoundError);
    expect(missing).toMatchObject({ status: 404, code: 'not_found' });
  });

  it('verifyWebhook(): a real delivery verifies; a changed body, an old timestamp and a wrong secret do not', async () => {
    const tg = client(rich);
    const { secret } = await tg.webhookSecret();
    const out = await tg.call('compute', { expression: '7 * 6' }, { callbackUrl: `${hookBase}/hook` });
    expect(out.result.value).toBe(42);
    const delivery = await until('the delivery', () => deliveries.find((d) => JSON.parse(d.raw).result?.expression === '7 * 6'));
    const body = verifyWebhook<{ result: { value: number } }>(secret, delivery.headers, delivery.raw);
    expect(body.result.value).toBe(42);
    // A Headers object and a Uint8Array body work the same.
    const asHeaders = new Headers(Object.entries(delivery.headers).map(([k, v]): [string, string] => [k, String(v)]));
    expect(verifyWebhook(secret, asHeaders, new TextEncoder().encode(delivery.raw))).toEqual(body);

    expect(() => verifyWebhook(secret, delivery.headers, delivery.raw.replace('42', '43'))).toThrow(WebhookVerificationError);
    const otherSecret = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
    expect(() => verifyWebhook(otherSecret, delivery.headers, delivery.raw)).toThrow(WebhookVerificationError);
    expect(() => verifyWebhook(secret, { ...delivery.headers, 'webhook-signature': undefined }, delivery.raw)).toThrow(WebhookVerificationError);

    // Signed by the Standard Webhooks reference library: accepted now, refused 10 minutes late.
    const wh = new Webhook(secret);
    const payload = JSON.stringify({ job_id: 'x', status: 'completed' });
    const fresh = { 'webhook-id': 'msg_1', 'webhook-timestamp': String(Math.floor(Date.now() / 1000)) };
    expect(verifyWebhook(secret, { ...fresh, 'webhook-signature': wh.sign('msg_1', new Date(), payload) }, payload)).toEqual({
      job_id: 'x',
      status: 'completed',
    });
    const then = new Date(Date.now() - 600_000);
    const old = { 'webhook-id': 'msg_2', 'webhook-timestamp': String(Math.floor(then.getTime() / 1000)), 'webhook-signature': wh.sign('msg_2', then, payload) };
    expect(() => verifyWebhook(secret, old, payload)).toThrow(/too old/);
    expect(verifyWebhook(secret, old, payload, { toleranceSeconds: 900 })).toEqual({ job_id: 'x', status: 'completed' });
  });

  it('the client type-checks on its own (npx tsc -p clients/typescript)', { timeout: 60_000 }, async () => {
    const { stdout, stderr } = await promisify(execFile)('npx', ['tsc', '-p', 'clients/typescript'], { cwd: process.cwd() }).catch((e) => e);
    expect(`${stdout}${stderr}`.trim()).toBe('');
  });
});
