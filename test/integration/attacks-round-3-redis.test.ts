import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { startFixtureSite, type FixtureSite } from '../helpers/fixture-site.js';
import { startFakeCdx, type FakeCdx } from '../helpers/fake-cdx.js';
import { connectRedis, type Redis } from '../../src/queue/redis.js';
import { sql } from '../../src/db/pool.js';
import { checkMemoryPolicy, readMemoryPolicy } from '../../src/queue/memory-policy.js';
import { generatePrivateKey } from 'viem/accounts';
import { PAY_TO, signPayment, toHeader } from '../helpers/x402-sign.js';

/**
 * Issue 26, point 2: bounded answers and bounded Redis. A tool's final answer is held to
 * TOOL_MAX_RESULT_BYTES (grabr_sitemap and grabr_batch page or cut theirs to fit), a large answer is
 * stored once (job_results; BullMQ and its event stream hold a reference), a failed job keeps its
 * error and not the caller's input, and finished jobs leave Redis after JOB_REDIS_RETENTION_SECONDS,
 * so Redis memory stays flat in the number of calls while every answer stays readable.
 */

const CAP = 1_000_000;
/** A long path, so 50,000 entries make a 10 MB answer as in the report. */
const LONG = 'a'.repeat(150);

/** A 10,000-character text page: its page_fetch answer is over JOB_RESULT_INLINE_BYTES (4 KiB). */
const SENTENCES = 'The ledger settles every call once. '.repeat(300).slice(0, 10_000);

let site: FixtureSite;
let cdx: FakeCdx;
let h: Harness;
let redis: Redis;

const xmlUrlset = (locs: string[]) =>
  `<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">` +
  locs.map((l) => `<url><loc>${l}</loc><lastmod>2025-06-01</lastmod><priority>0.5</priority></url>`).join('') +
  '</urlset>';

/** Every Redis key of a harness (its REDIS_PREFIX, BullMQ's `{prefix}` included). */
async function keysOf(r: Redis, prefix: string): Promise<string[]> {
  const out: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await (r as import('ioredis').Redis).scan(cursor, 'MATCH', `*${prefix}*`, 'COUNT', 1000);
    cursor = next;
    out.push(...keys);
  } while (cursor !== '0');
  return out;
}

/** Every value stored under the harness's keys, as text (hashes, strings, streams, lists, sets). */
async function dumpPrefix(r: Redis, prefix: string): Promise<string> {
  const parts: string[] = [];
  for (const k of await keysOf(r, prefix)) {
    const type = await r.type(k);
    if (type === 'string') parts.push((await r.get(k)) ?? '');
    else if (type === 'hash') parts.push(JSON.stringify(await r.hgetall(k)));
    else if (type === 'stream') parts.push(JSON.stringify(await r.xrange(k, '-', '+')));
    else if (type === 'list') parts.push(JSON.stringify(await r.lrange(k, 0, -1)));
    else if (type === 'set') parts.push(JSON.stringify(await r.smembers(k)));
    else if (type === 'zset') parts.push(JSON.stringify(await r.zrange(k, 0, -1)));
  }
  return parts.join('\n');
}

/** Bytes Redis attributes to the harness's keys (MEMORY USAGE, sampled whole). */
async function prefixBytes(r: Redis, prefix: string): Promise<number> {
  let total = 0;
  for (const k of await keysOf(r, prefix)) total += Number((await (r as import('ioredis').Redis).call('MEMORY', 'USAGE', k, 'SAMPLES', '0')) ?? 0);
  return total;
}

async function usedMemory(r: Redis): Promise<number> {
  const info = await (r as import('ioredis').Redis).info('memory');
  return Number(/used_memory:(\d+)/.exec(info)![1]);
}

/** JSON with object keys sorted (Postgres jsonb orders keys its own way): equal bodies hash equal. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') {
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical((v as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v);
}
const digest = (v: unknown) => createHash('sha256').update(canonical(v)).digest('hex');

beforeAll(async () => {
  site = await startFixtureSite();
  site.route('/robots.txt', { headers: { 'content-type': 'text/plain' }, body: 'User-agent: *\nAllow: /\n' });
  // The report's case: a gzipped sitemap of 50,000 long URLs (about 10 MB of JSON as an answer).
  site.route('/long/sitemap.xml.gz', {
    headers: { 'content-type': 'application/gzip' },
    body: gzipSync(xmlUrlset(Array.from({ length: 50_000 }, (_, i) => site.url(`/p/${LONG}/${i}`)))),
  });
  // A smaller one whose first page is still as large as an answer may be.
  site.route('/mid/sitemap.xml.gz', {
    headers: { 'content-type': 'application/gzip' },
    body: gzipSync(xmlUrlset(Array.from({ length: 6_000 }, (_, i) => site.url(`/m/${LONG}/${i}`)))),
  });
  // Plain-text pages of 25,000 characters: 50 of them are more than an answer may hold.
  for (let i = 0; i < 50; i++)
    site.route(`/t/${i}`, { headers: { 'content-type': 'text/plain; charset=utf-8' }, body: `page ${i} `.padEnd(25_000, 'lorem ipsum ') });
  site.route('/small.txt', { headers: { 'content-type': 'text/plain; charset=utf-8' }, body: SENTENCES });
  cdx = await startFakeCdx();
  // Retention short enough to be seen passing in a test.
  h = await startHarness(
    {
      FETCH_ALLOWED_HOSTS: site.hostPort,
      WAYBACK_CDX_URL: cdx.cdxUrl,
      WAYBACK_BASE_URL: cdx.baseUrl,
      JOB_REDIS_RETENTION_SECONDS: '2',
      SYNC_TIMEOUT_MS: '60000',
      WEB_PER_HOST: '16',
    },
    { workers: ['web', 'text'] },
  );
  redis = connectRedis(h.config.REDIS_URL);
}, 60_000);

afterAll(async () => {
  await redis?.quit();
  await h?.close();
  await site?.close();
  await cdx?.close();
});

describe('bounded answers', () => {
  it('(a) grabr_sitemap with max_urls 50,000 over a gzipped sitemap of long URLs answers within TOOL_MAX_RESULT_BYTES, paged', async () => {
    const acct = await h.account('enterprise', 1000);
    const res = await h.call('grabr_sitemap', { url: site.url('/long/sitemap.xml.gz'), max_urls: 50_000 }, acct.apiKey);
    expect(res.statusCode, res.body.slice(0, 300)).toBe(200);
    const { result } = json(res);
    expect(Buffer.byteLength(JSON.stringify(result))).toBeLessThanOrEqual(CAP);
    expect(result.truncated).toBe(true);
    expect(result.total).toBe(50_000);
    const n = result.urls.length as number;
    expect(n).toBeGreaterThan(1_000);
    expect(n).toBeLessThan(50_000);
    expect(result.next_offset).toBe(n);
    expect(result.urls[n - 1].loc).toBe(site.url(`/p/${LONG}/${n - 1}`));
    // The next page starts where this one stopped.
    const next = await h.call('grabr_sitemap', { url: site.url('/long/sitemap.xml.gz'), max_urls: 50_000, offset: result.next_offset }, acct.apiKey);
    expect(next.statusCode).toBe(200);
    const page2 = json(next).result;
    expect(Buffer.byteLength(JSON.stringify(page2))).toBeLessThanOrEqual(CAP);
    expect(page2.urls[0].loc).toBe(site.url(`/p/${LONG}/${n}`));
    expect(page2.next_offset).toBe(n + page2.urls.length);
  }, 60_000);

  it('grabr_batch of 50 long pages stays within the cap: the longest texts are cut, every item kept', async () => {
    const acct = await h.account('enterprise', 1000);
    const urls = Array.from({ length: 50 }, (_, i) => site.url(`/t/${i}`));
    const res = await h.call('grabr_batch', { urls, concurrency: 8 }, acct.apiKey);
    expect(res.statusCode, res.body.slice(0, 300)).toBe(200);
    const { result } = json(res);
    expect(Buffer.byteLength(JSON.stringify(result))).toBeLessThanOrEqual(CAP);
    expect(result.items).toHaveLength(50);
    expect(result.items.every((i: any) => i.ok && i.result.truncated && i.result.text.startsWith(`page ${urls.indexOf(i.url)} `))).toBe(true);
    // Cut to a common length, not emptied.
    expect(Math.min(...result.items.map((i: any) => i.result.text.length))).toBeGreaterThan(15_000);
  }, 60_000);

  it('grabr_contact on a page of 50 forms with long actions and field names stays within the cap (truncated)', async () => {
    const acct = await h.account('enterprise', 1000);
    // Field names are cut at 300 characters and actions at 2,048: 50 such forms a page, two pages, are about 1.7 MB.
    const field = (j: number) => `<input name="${j}-${'f'.repeat(400)}">`;
    const form = (p: string, i: number) =>
      `<form action="/send/${p}/${'a'.repeat(1_900)}/${i}" method="post">${Array.from({ length: 50 }, (_, j) => field(j)).join('')}</form>`;
    const page = (p: string, extra = '') => `<html><body>${extra}${Array.from({ length: 50 }, (_, i) => form(p, i)).join('')}</body></html>`;
    site.route('/forms', { body: page('one', '<a href="/forms/contact">Contact us</a>') });
    site.route('/forms/contact', { body: page('two') });
    const res = await h.call('grabr_contact', { url: site.url('/forms'), max_pages: 2 }, acct.apiKey);
    expect(res.statusCode, res.body.slice(0, 300)).toBe(200);
    const { result } = json(res);
    expect(Buffer.byteLength(JSON.stringify(result))).toBeLessThanOrEqual(CAP);
    expect(result.truncated).toBe(true);
    expect(result.pages.map((p: any) => p.error)).toEqual([null, null]);
    expect(result.forms.length).toBeGreaterThan(30);
    expect(result.forms.length).toBeLessThan(100);
  }, 60_000);

  it('grabr_wayback with 1,000 captures of long URLs leaves out the oldest to stay within the cap, and says so', async () => {
    const acct = await h.account('enterprise', 1000);
    cdx.captures = Array.from({ length: 1_000 }, (_, i) => ({
      timestamp: String(20200101000000 + i * 100),
      original: `https://w.test/${'p'.repeat(1_500)}/${i}`,
      digest: `D${i}`,
    }));
    const res = await h.call('grabr_wayback', { url: 'https://w.test/', match: 'prefix', limit: 1_000 }, acct.apiKey);
    expect(res.statusCode, res.body.slice(0, 300)).toBe(200);
    const { result } = json(res);
    expect(Buffer.byteLength(JSON.stringify(result))).toBeLessThanOrEqual(CAP);
    const n = result.captures.length as number;
    expect(n).toBeGreaterThan(100);
    expect(n).toBeLessThan(1_000);
    expect(result.total).toBe(n);
    // The newest are kept (order: newest), listed oldest first.
    expect(result.last).toBe(String(20200101000000 + 999 * 100));
    expect(result.notes.some((m: string) => m.includes(`${1_000 - n} oldest captures left out`))).toBe(true);
  }, 60_000);
});

describe('the cap on a final answer (TOOL_MAX_RESULT_BYTES 2048)', () => {
  let low: Harness;
  beforeAll(async () => {
    low = await startHarness({ FETCH_ALLOWED_HOSTS: site.hostPort, TOOL_MAX_RESULT_BYTES: '2048' }, { workers: ['web', 'text'] });
  }, 60_000);
  afterAll(async () => {
    await low?.close();
  });

  it('(b) an answer assembled over the cap is 422 limit_exceeded (size), final, and charges nothing', async () => {
    const acct = await low.account('enterprise', 1000);
    // page_fetch reads a text page on the event loop (no pool task): only the check on the final answer sees its size.
    const res = await low.call('page_fetch', { url: site.url('/small.txt') }, acct.apiKey);
    expect(res.statusCode, res.body.slice(0, 300)).toBe(422);
    const err = json(res).error;
    expect(err).toMatchObject({ code: 'limit_exceeded', limit: 'size', limit_value: 2048 });
    expect(err.bytes).toBeGreaterThan(10_000);
    // A paid tool over the cap: not charged, its hold given back.
    const paid = await low.call('beacon_compress', { text: 'The ledger settles every call once. '.repeat(500), budget_tokens: 4000 }, acct.apiKey);
    expect(paid.statusCode, paid.body.slice(0, 300)).toBe(422);
    expect(json(paid).error).toMatchObject({ code: 'limit_exceeded', limit: 'size' });
    expect(await low.credits(acct.accountId)).toBe(1000);
    expect(await low.ledgerCharges(acct.accountId)).toBe(0);
    // Nothing held any more: Redis' available credit is the whole balance.
    expect(await low.container.credits.available(acct.accountId)).toBe(1000);
    // Final: run once, not retried (one fetch of the page).
    expect(site.requestsFor('/small.txt').length).toBe(1);
  }, 60_000);

  it('(c) a call that fails in the worker leaves its error in Redis, not its input', async () => {
    const acct = await low.account('enterprise', 1000);
    const marker = `MARKER-${Date.now()}-input-must-not-stay`;
    // 2,000 messages (the limit is 1,000), about 400 KB: refused by the tool, inside the worker.
    const transcript = Array.from({ length: 2_000 }, (_, i) => `user: ${marker} ${i} `.padEnd(190, 'z')).join('\n');
    expect(transcript.length).toBeGreaterThan(380_000);
    const res = await low.call('context_extract', { transcript }, acct.apiKey);
    expect(res.statusCode, res.body.slice(0, 300)).toBe(400);
    const jobId = res.headers['x-job-id'] as string;
    expect(jobId).toBeTruthy();
    const dump = await dumpPrefix(redis, low.config.REDIS_PREFIX);
    expect(dump.length).toBeGreaterThan(0);
    expect(dump.includes(marker)).toBe(false);
    // The error is still answered.
    const status = await low.request({ method: 'GET', url: `/jobs/${jobId}`, headers: { authorization: `Bearer ${acct.apiKey}` } });
    expect(status.statusCode).toBe(400);
    expect(json(status).error.code).toBe('invalid_input');
  }, 60_000);
});

/** The events of a finished Server-Sent Events body, in order. */
function sseEvents(body: string): Array<{ event: string; data: any }> {
  return body
    .split('\n\n')
    .filter((block) => block.includes('event: '))
    .map((block) => {
      const lines = block.split('\n');
      return { event: lines.find((l) => l.startsWith('event: '))!.slice(7), data: JSON.parse(lines.find((l) => l.startsWith('data: '))!.slice(6)) };
    });
}

describe('a large answer is stored once, and every reader gets it whole', () => {
  it('direct call, GET /jobs/{id}, a chain step feeding the next, its event replay, and both after Redis forgot the jobs', async () => {
    const acct = await h.account('enterprise', 1000);
    const auth = { authorization: `Bearer ${acct.apiKey}` };
    const prefix = h.config.REDIS_PREFIX;
    const res = await h.call('page_fetch', { url: site.url('/small.txt') }, acct.apiKey);
    expect(res.statusCode, res.body.slice(0, 300)).toBe(200);
    const body = json(res);
    expect(body.result.text).toBe(SENTENCES.trim());
    const jobId = res.headers['x-job-id'] as string;
    // BullMQ holds a reference, not the answer: in the job and in the queue's event stream.
    const job = await h.container.queues.getJob(jobId);
    expect(job?.returnvalue).toMatchObject({ stored: 'job_results', cost_cents: 0 });
    const stream = JSON.stringify(await (redis as import('ioredis').Redis).xrange(`{${prefix}}:tools-web:events`, '-', '+'));
    expect(stream).toContain(jobId);
    expect(stream).not.toContain(SENTENCES.slice(0, 500));
    // The stream itself is capped (BullMQ trims it to the length in the queue's meta hash).
    expect(await redis.hget(`{${prefix}}:tools-web:meta`, 'opts.maxLenEvents')).toBe(String(h.config.QUEUE_EVENTS_MAX_LEN));
    const status = await h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: auth });
    expect(status.statusCode).toBe(200);
    expect(json(status)).toEqual({ job_id: jobId, status: 'completed', ...body });

    // A chain: page_fetch's large answer is the next step's q (read back from job_results by the worker).
    const chain = await h.request({
      method: 'POST',
      url: '/',
      headers: { ...auth, 'content-type': 'application/json' },
      payload: { chain: ['page_fetch', 'beacon_compress'], q: site.url('/small.txt') },
    });
    expect(chain.statusCode, chain.body.slice(0, 300)).toBe(200);
    const chained = json(chain);
    expect(chained.steps[0].result.text).toBe(SENTENCES.trim());
    expect(chained.steps[1].result.tokens_before).toBeGreaterThan(1_000);
    expect(chained.cost_cents).toBe(2);
    const rootId = chain.headers['x-job-id'] as string;
    // Its event log holds references too; a replay gets the whole step.
    const replay = await h.request({ method: 'GET', url: `/jobs/${rootId}/events`, headers: { ...auth, accept: 'text/event-stream' } });
    const steps = sseEvents(replay.body).filter((e) => e.event === 'step');
    expect(steps.map((e) => e.data.index)).toEqual([0, 1]);
    expect(steps[0]!.data.result.text).toBe(SENTENCES.trim());
    expect(sseEvents(replay.body).find((e) => e.event === 'result')?.data).toEqual(chained);
    // The log goes after its last event plus ten minutes at most (not a day): Redis keeps a window of calls.
    const logTtl = await redis.ttl(`${prefix}:events:${rootId}`);
    expect(logTtl).toBeGreaterThan(0);
    expect(logTtl).toBeLessThanOrEqual(600);

    // Past the retention the jobs leave Redis; the same bodies come from job_results.
    await new Promise((r) => setTimeout(r, 2_500));
    expect((await h.call('page_fetch', { url: site.url('/robots.txt') }, acct.apiKey)).statusCode).toBe(200);
    expect((await h.call('context_extract', { transcript: 'user: TODO: one thing.' }, acct.apiKey)).statusCode).toBe(200);
    expect(await h.container.queues.getJob(jobId)).toBeNull();
    expect(await h.container.queues.getJob(rootId)).toBeNull();
    const later = await h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: auth });
    expect(json(later)).toEqual({ job_id: jobId, status: 'completed', ...body });
    const flowLater = await h.request({ method: 'GET', url: `/jobs/${rootId}`, headers: auth });
    expect(flowLater.statusCode).toBe(200);
    expect(json(flowLater)).toEqual({ job_id: rootId, status: 'completed', ...chained });
    const replayLater = await h.request({ method: 'GET', url: `/jobs/${rootId}/events`, headers: { ...auth, accept: 'text/event-stream' } });
    expect(sseEvents(replayLater.body).find((e) => e.event === 'result')?.data).toEqual(chained);
  }, 60_000);
});

describe('an Idempotency-Key keeps a reference to a large answer, not the answer', () => {
  it('the replay answers the same body, read back from job_results; the entry stays small', async () => {
    const acct = await h.account('enterprise', 1000);
    const headers = { 'idempotency-key': `big-${Date.now()}` };
    const fetched = site.requestsFor('/small.txt').length;
    const first = await h.call('page_fetch', { url: site.url('/small.txt') }, acct.apiKey, headers);
    expect(first.statusCode, first.body.slice(0, 300)).toBe(200);
    const entries = (await keysOf(redis, h.config.REDIS_PREFIX)).filter((k) => k.includes(':idem:'));
    expect(entries).toHaveLength(1);
    const entry = (await redis.get(entries[0]!))!;
    expect(entry.length).toBeLessThan(2_000);
    expect(entry).not.toContain(SENTENCES.slice(0, 200));
    const again = await h.call('page_fetch', { url: site.url('/small.txt') }, acct.apiKey, headers);
    expect(again.statusCode).toBe(200);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.headers['x-job-id']).toBe(first.headers['x-job-id']);
    expect(json(again)).toEqual(json(first));
    // Nothing ran twice.
    expect(site.requestsFor('/small.txt').length).toBe(fetched + 1);
    // A small answer is kept whole, as before.
    const small = { 'idempotency-key': `small-${Date.now()}` };
    const s1 = await h.call('page_fetch', { url: site.url('/robots.txt') }, acct.apiKey, small);
    const s2 = await h.call('page_fetch', { url: site.url('/robots.txt') }, acct.apiKey, small);
    expect(s2.headers['idempotent-replayed']).toBe('true');
    expect(json(s2)).toEqual(json(s1));
  }, 60_000);
});

describe('a call paid per call (x402)', () => {
  let xh: Harness;
  beforeAll(async () => {
    xh = await startHarness(
      { X402_ENABLED: 'true', X402_PAY_TO: PAY_TO, X402_SETTLEMENT: 'deferred', X402_DEFERRED_MAX_CENTS: '100000', JOB_REDIS_RETENTION_SECONDS: '30' },
      { workers: ['core'] },
    );
  }, 60_000);
  afterAll(async () => {
    await xh?.close();
  });

  it('gets its large answer whole; Redis keeps it once, under its job record for the retention time only', async () => {
    const body = { expression: 'range(0, 3000)' };
    const offer = await xh.call('compute', body);
    expect(offer.statusCode).toBe(402);
    const payment = toHeader(await signPayment(json(offer).accepts[0], { privateKey: generatePrivateKey() }));
    const res = await xh.call('compute', body, undefined, { 'x-payment': payment });
    expect(res.statusCode, res.body.slice(0, 300)).toBe(200);
    const answer = json(res);
    expect(Buffer.byteLength(JSON.stringify(answer.result))).toBeGreaterThan(xh.config.JOB_RESULT_INLINE_BYTES);
    const jobId = res.headers['x-job-id'] as string;
    const job = await xh.container.queues.getJob(jobId);
    expect(job?.returnvalue).toMatchObject({ stored: 'job_record' });
    const recKey = `${xh.config.REDIS_PREFIX}:jobrec:${jobId}`;
    const ttl = await redis.ttl(recKey);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(30);
    const rec = JSON.parse((await redis.get(recKey))!);
    expect(digest(rec.value)).toBe(digest(answer));
    // Nowhere else: the queue's event stream carries the reference.
    const stream = JSON.stringify(await (redis as import('ioredis').Redis).xrange(`{${xh.config.REDIS_PREFIX}}:tools-core:events`, '-', '+'));
    expect(stream).toContain('job_record');
    expect(JSON.stringify(answer)).toContain('2998, 2999');
    expect(stream).not.toContain('2998, 2999');
  }, 60_000);

  it('an Idempotency-Key keeps its large answer for the retention time only (no key can read it back later)', async () => {
    const body = { expression: 'range(0, 3000)' };
    const offer = await xh.call('compute', body);
    const idem = { 'idempotency-key': `x402-large-${Date.now()}` };
    const payer = generatePrivateKey();
    const pay = async () => toHeader(await signPayment(json(offer).accepts[0], { privateKey: payer }));
    const first = await xh.call('compute', body, undefined, { ...idem, 'x-payment': await pay() });
    expect(first.statusCode, first.body.slice(0, 300)).toBe(200);
    const keys = await redis.keys(`${xh.config.REDIS_PREFIX}:idem:*`);
    expect(keys).toHaveLength(1);
    const ttl = await redis.ttl(keys[0]!);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(30);
    // Within it, a retry is answered from the entry and its new payment is not taken.
    const again = await xh.call('compute', body, undefined, { ...idem, 'x-payment': await pay() });
    expect(again.statusCode).toBe(200);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(json(again)).toEqual(json(first));
  }, 60_000);
});

describe('Redis stays flat', () => {
  it('(d) 200 calls of the largest answers leave used_memory within 20 MB, every answer readable through GET /jobs/{id}', async () => {
    const acct = await h.account('enterprise', 1000);
    const auth = { authorization: `Bearer ${acct.apiKey}` };
    const prefix = h.config.REDIS_PREFIX;
    // Warm-up: the queues, their scripts and the first connections cost memory once.
    expect((await h.call('grabr_sitemap', { url: site.url('/mid/sitemap.xml.gz'), max_urls: 10 }, acct.apiKey)).statusCode).toBe(200);
    const beforeUsed = await usedMemory(redis);
    const beforePrefix = await prefixBytes(redis, prefix);

    const urls = Array.from({ length: 50 }, (_, i) => site.url(`/t/${i}`));
    // 1,000 messages of short todos: more items than max_items (5,000, the most the tool gives) lets through.
    const transcript = Array.from({ length: 1_000 }, (_, i) =>
      `user: ${Array.from({ length: 12 }, (_, j) => `TODO: fix ${i}-${j} now.`).join(' ')}`.padEnd(399, ' '),
    ).join('\n');
    const calls: Array<[string, unknown]> = [];
    // Tool by tool (the sandbox pool keeps threads per memory size: alternating tools would respawn them).
    const n = 200;
    for (let i = 0; i < n; i++) {
      if (i < n / 2) calls.push(['grabr_sitemap', { url: site.url('/mid/sitemap.xml.gz'), max_urls: 50_000 }]);
      else if (i < (3 * n) / 4) calls.push(['grabr_batch', { urls, concurrency: 8 }]);
      else calls.push(['context_extract', { transcript, max_items: 5000 }]);
    }
    const answers: Array<{ jobId: string; digest: string; bytes: number; tool: string }> = [];
    let next = 0;
    const worker = async () => {
      while (next < calls.length) {
        const [tool, body] = calls[next++]!;
        const res = await h.call(tool, body, acct.apiKey);
        expect(res.statusCode, `${tool}: ${res.body.slice(0, 300)}`).toBe(200);
        const b = json(res);
        answers.push({ jobId: res.headers['x-job-id'] as string, digest: digest(b), bytes: Buffer.byteLength(JSON.stringify(b.result)), tool });
      }
    };
    await Promise.all(Array.from({ length: 4 }, worker));
    expect(answers).toHaveLength(calls.length);
    const total = answers.reduce((s, a) => s + a.bytes, 0);
    const largest = (tool: string) => Math.max(...answers.filter((a) => a.tool === tool).map((a) => a.bytes));
    // The answers are as large as an answer may be (within the default cap).
    expect(largest('grabr_sitemap')).toBeGreaterThan(0.9 * CAP);
    expect(largest('grabr_batch')).toBeGreaterThan(0.9 * CAP);
    expect(largest('context_extract')).toBeGreaterThan(0.3 * CAP);
    for (const t of ['grabr_sitemap', 'grabr_batch', 'context_extract']) expect(largest(t)).toBeLessThanOrEqual(CAP);

    // Past the retention the workers' cleaner removes the finished jobs (no later call needed: it runs every second here).
    const last = answers[answers.length - 1]!.jobId;
    for (let i = 0; i < 100 && (await h.container.queues.getJob(last)); i++) await new Promise((r) => setTimeout(r, 100));
    expect(await h.container.queues.getJob(last)).toBeNull();
    const afterUsed = await usedMemory(redis);
    const afterPrefix = await prefixBytes(redis, prefix);
    console.log(
      `Redis used_memory: before ${beforeUsed} bytes, after ${afterUsed} bytes, delta ${afterUsed - beforeUsed} bytes; ` +
        `this test's keys: before ${beforePrefix} bytes, after ${afterPrefix} bytes; ` +
        `200 answers totalling ${total} bytes of JSON (largest: grabr_sitemap ${largest('grabr_sitemap')}, grabr_batch ${largest('grabr_batch')}, context_extract ${largest('context_extract')})`,
    );
    expect(afterPrefix - beforePrefix).toBeLessThan(20 * 1024 * 1024);
    expect(afterUsed - beforeUsed).toBeLessThan(20 * 1024 * 1024);

    // Every answer is still readable, with the same body it was first answered with.
    const jobs = await h.container.queues.getJob(answers[0]!.jobId);
    expect(jobs).toBeNull();
    for (const a of answers) {
      const res = await h.request({ method: 'GET', url: `/jobs/${a.jobId}`, headers: auth });
      expect(res.statusCode).toBe(200);
      const { job_id, status, ...body } = json(res);
      expect([job_id, status]).toEqual([a.jobId, 'completed']);
      expect(digest(body)).toBe(a.digest);
    }
    // 178 MB of answers would stay in the shared test database for JOB_RESULT_DAYS: this test's are its own to drop.
    await h.container.pool.query(sql.unsafe`DELETE FROM job_results WHERE account_id = ${acct.accountId}`);
  }, 300_000);
});

describe('Redis memory policy check', () => {
  it('warns once for an evicting policy and once for no maxmemory, and stays quiet when CONFIG is refused', async () => {
    const warned: string[] = [];
    const log = { warn: (m: string) => void warned.push(m) };
    const fake = (policy: string, max: string) =>
      ({ config: async (_op: string, name: string) => [name, name === 'maxmemory' ? max : policy] }) as unknown as Redis;
    expect(await checkMemoryPolicy(fake('allkeys-lru', '0'), log)).toHaveLength(2);
    expect(warned[0]).toMatch(/maxmemory-policy is allkeys-lru.*noeviction/);
    expect(warned[1]).toMatch(/maxmemory is 0/);
    expect(await checkMemoryPolicy(fake('noeviction', '1073741824'), log)).toEqual([]);
    const refused = { config: async () => Promise.reject(new Error("ERR unknown command 'CONFIG'")) } as unknown as Redis;
    expect(await checkMemoryPolicy(refused, log)).toEqual([]);
    expect(warned).toHaveLength(2);
    // The real server: one warning per setting that is off, as CONFIG GET reports them.
    const [real] = await readMemoryPolicy(redis);
    const realWarnings = await checkMemoryPolicy(redis, { warn: () => {} });
    expect(realWarnings.some((w) => w.includes('maxmemory is 0'))).toBe(real!.maxmemory === 0);
    expect(realWarnings.some((w) => w.includes('maxmemory-policy is'))).toBe(real!.policy !== null && real!.policy !== 'noeviction');
  });
});
