import { randomBytes } from 'node:crypto';
import { Writable } from 'node:stream';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EventSource } from 'eventsource';
import { z } from 'zod';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { loadConfig } from '../../src/config.js';
import { createContainer, type Container } from '../../src/container.js';
import { deploymentKeys, type Redis } from '../../src/queue/redis.js';
import { sql } from '../../src/db/pool.js';
import { findTool, TOOLS } from '../../src/tools/index.js';
import { JobSeal, JobSealError } from '../../src/queue/job-seal.js';

/**
 * Sensitive tools (passport_store, passport_send, handoff) leave nothing of their callers' text in
 * clear: after calls through every surface (synchronous, 202 and GET /jobs/{id}, POST / with stream,
 * GET /jobs/{id}/events, a chain), every Redis key of the deployment, whatever its type, and every
 * job_results row is searched for each secret and every 12-character piece of it. The callers still
 * get their text back on every surface. A worker whose key does not open a job fails it as a fault.
 */

const EDGE_KEY = randomBytes(32).toString('hex');
/** Letters and digits only, so JSON escaping cannot hide a copy from the search. */
const secret = (what: string) => `${what} ${randomBytes(24).toString('hex')} ends here`;

let h: Harness;
let base: string;
let acct: TestAccount;
const secrets: string[] = [];

beforeAll(async () => {
  h = await startHarness({ PASSPORT_KEY: randomBytes(32).toString('hex'), EDGE_TOKEN_KEY: EDGE_KEY }, { workers: ['core', 'text'] });
  base = await h.app.listen({ port: 0, host: '127.0.0.1' });
  acct = await h.account('enterprise', 10_000, { rpm: 100_000, maxInFlight: 50 });
});
afterAll(async () => {
  await h?.close();
});

const auth = () => ({ authorization: `Bearer ${acct.apiKey}` });

/** Every value held under the deployment's prefix, whatever the key's type, as text. */
async function everythingIn(redis: Redis, prefix: string): Promise<{ keys: number; types: Set<string>; text: string }> {
  const parts: string[] = [];
  const types = new Set<string>();
  let keys = 0;
  for await (const { server, keys: batch } of deploymentKeys(redis, prefix)) {
    for (const key of batch) {
      keys++;
      const type = await server.type(key);
      types.add(type);
      parts.push(key);
      if (type === 'string') parts.push((await server.getBuffer(key))?.toString('latin1') ?? '');
      else if (type === 'hash') for (const [f, v] of Object.entries(await server.hgetallBuffer(key))) parts.push(f, v.toString('latin1'));
      else if (type === 'list') parts.push(...(await server.lrange(key, 0, -1)));
      else if (type === 'set') parts.push(...(await server.smembers(key)));
      else if (type === 'zset') parts.push(...(await server.zrange(key, 0, -1, 'WITHSCORES')));
      else if (type === 'stream') for (const [id, fields] of await server.xrange(key, '-', '+')) parts.push(id, ...fields);
      else throw new Error(`key ${key} has a type this search does not read: ${type}`);
    }
  }
  return { keys, types, text: parts.join('\n') };
}

/** The secrets (or 12-character pieces of them) found in a text. */
function leaks(text: string): string[] {
  const found: string[] = [];
  for (const s of secrets) {
    for (let i = 0; i + 12 <= s.length; i++) {
      const piece = s.slice(i, i + 12);
      if (text.includes(piece)) {
        found.push(piece);
        break;
      }
    }
  }
  return found;
}

async function jobDone(jobId: string): Promise<Record<string, any>> {
  for (let i = 0; i < 200; i++) {
    const res = await h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: auth() });
    const body = json(res);
    if (body.status === 'completed' || body.error) return body;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`job ${jobId} did not finish`);
}

/** Server-Sent Events of a POST / stream or a GET, until the server ends them. */
function events(path: string, body?: unknown): Promise<Array<{ type: string; data: any }>> {
  const got: Array<{ type: string; data: any }> = [];
  return new Promise((resolve) => {
    const es = new EventSource(`${base}${path}`, {
      fetch: (input, init) =>
        fetch(input, {
          ...init,
          headers: { ...(init?.headers as Record<string, string>), ...auth(), ...(body ? { 'content-type': 'application/json' } : {}) },
          ...(body ? { method: 'POST', body: JSON.stringify(body) } : {}),
        }),
    });
    for (const type of ['queued', 'progress', 'step', 'result', 'error']) {
      es.addEventListener(type, (ev) => {
        if (typeof (ev as MessageEvent).data !== 'string') return;
        got.push({ type, data: JSON.parse((ev as MessageEvent).data) });
        if (type === 'result' || type === 'error') {
          es.close();
          resolve(got);
        }
      });
    }
  });
}

describe('sealed inputs and answers of sensitive tools', () => {
  it('marks the passport tools and handoff sensitive, and no other tool', () => {
    expect(
      TOOLS.filter((t) => t.sensitive)
        .map((t) => t.name)
        .sort(),
    ).toEqual(['handoff', 'passport_send', 'passport_store']);
  });

  it('answers every surface in clear while Redis and job_results hold none of it', async () => {
    // Synchronous put and get.
    const kept = secret('kept');
    secrets.push(kept);
    const put = await h.call('passport_store', { action: 'put', content: kept, ttl_s: 3600 }, acct.apiKey);
    expect(put.statusCode, put.body).toBe(200);
    const handle = json(put).result.handle as string;
    const got = await h.call('passport_store', { action: 'get', handle }, acct.apiKey);
    expect(got.statusCode, got.body).toBe(200);
    expect(json(got).result.content).toBe(kept);

    // 202 at once, then GET /jobs/{id}, and its events replayed by GET /jobs/{id}/events.
    const later = await h.call('passport_store', { action: 'get', handle }, acct.apiKey, { prefer: 'respond-async' });
    expect(later.statusCode, later.body).toBe(202);
    const jobId = json(later).job_id as string;
    expect((await jobDone(jobId)).result.content).toBe(kept);
    const replay = await events(`/jobs/${jobId}/events`);
    expect(replay.at(-1)).toMatchObject({ type: 'result', data: { result: { content: kept } } });

    // Sent to the caller's own key: new content, then read from the inbox.
    const sent = secret('sent');
    secrets.push(sent);
    const delivered = await h.call('passport_send', { to: 'self', content: sent, ttl_s: 3600 }, acct.apiKey);
    expect(delivered.statusCode, delivered.body).toBe(200);
    const sentGet = await h.call('passport_store', { action: 'get', handle: json(delivered).result.handle }, acct.apiKey);
    expect(json(sentGet).result.content).toBe(sent);

    // POST / with stream: handoff's brief keeps the transcript's last turns, and stores them as a passport.
    const said = secret('said');
    secrets.push(said);
    const transcript = `user: Please remember this. ${said}\nassistant: Noted. ${said}`;
    const streamed = await events('/', { stream: true, m: 'handoff', q: transcript });
    const result = streamed.at(-1)!;
    expect(result.type, JSON.stringify(result.data)).toBe('result');
    expect(result.data.result.brief_markdown).toContain(said);
    // Progress (if any) carries figures only.
    for (const e of streamed.filter((x) => x.type === 'progress')) expect(Object.keys(e.data).filter((k) => k === 'delta' || k === 'message')).toEqual([]);
    const stored = await h.call('handoff', { transcript, budget_tokens: 300, store: true }, acct.apiKey);
    expect(stored.statusCode, stored.body).toBe(200);
    const brief = await h.call('passport_store', { action: 'get', handle: json(stored).result.passport.handle }, acct.apiKey);
    expect(json(brief).result.content).toContain(said);

    // A chain: handoff's answer becomes passport_store's content (a flow, its steps' values in the event log).
    const chained = secret('chained');
    secrets.push(chained);
    const chain = await h.request({
      method: 'POST',
      url: '/',
      headers: { ...auth(), 'content-type': 'application/json' },
      payload: JSON.stringify({ chain: ['handoff', 'passport_store'], q: `user: ${chained}\nassistant: ok` }),
    });
    expect(chain.statusCode, chain.body).toBe(200);
    const chainHandle = json(chain).result.handle as string;
    expect(json(await h.call('passport_store', { action: 'get', handle: chainHandle }, acct.apiKey)).result.content).toContain(chained);

    // Under an Idempotency-Key: the answer is kept as a reference to its sealed job, and replays read it back.
    for (let n = 0; n < 2; n++) {
      const keyed = await h.call('passport_store', { action: 'get', handle }, acct.apiKey, { 'idempotency-key': 'sealed-get' });
      expect(keyed.statusCode, keyed.body).toBe(200);
      expect(json(keyed).result.content).toBe(kept);
      expect(keyed.headers['idempotent-replayed']).toBe(n === 0 ? undefined : 'true');
    }
    for (let n = 0; n < 2; n++) {
      const keyedChain = await h.request({
        method: 'POST',
        url: '/',
        headers: { ...auth(), 'content-type': 'application/json', 'idempotency-key': 'sealed-chain' },
        payload: JSON.stringify({ chain: ['handoff', 'passport_store'], q: `user: ${chained}\nassistant: again` }),
      });
      expect(keyedChain.statusCode, keyedChain.body).toBe(200);
      expect(keyedChain.headers['idempotent-replayed']).toBe(n === 0 ? undefined : 'true');
    }

    const redis = await everythingIn(h.container.redis!, h.config.REDIS_PREFIX);
    // The search saw the queue's job hashes and event streams, the event logs and the passports themselves.
    expect(redis.keys).toBeGreaterThan(20);
    for (const t of ['hash', 'stream', 'zset', 'string']) expect(redis.types).toContain(t);
    expect(leaks(redis.text)).toEqual([]);

    const rows = await h.container.pool.any(
      sql.type(z.object({ tool: z.string(), body: z.string() }))`SELECT tool, body::text AS body FROM job_results WHERE account_id = ${acct.accountId}`,
    );
    expect(rows.length).toBeGreaterThanOrEqual(9);
    expect(new Set(rows.map((r) => r.tool))).toEqual(new Set(['passport_store', 'passport_send', 'handoff']));
    expect(leaks(rows.map((r) => r.body).join('\n'))).toEqual([]);
    // Every completed answer in job_results is an envelope, not a result.
    for (const r of rows) expect(JSON.parse(r.body).result).toEqual({ $sealed: expect.stringMatching(/^s1\.[0-9a-f]{8}\./) });
    expect(leaks(h.logs.join('\n'))).toEqual([]);
  }, 120_000);

  it('costs a tool that is not sensitive nothing: its input and answer stay as they were', async () => {
    const res = await h.call('compute', { expression: '6 * 7' }, acct.apiKey);
    expect(res.statusCode, res.body).toBe(200);
    const jobId = res.headers['x-job-id'] as string;
    const row = await h.container.pool.one(sql.type(z.object({ body: z.record(z.unknown()) }))`SELECT body FROM job_results WHERE job_id = ${jobId}`);
    expect(row.body.result).toEqual(json(res).result);
    expect(findTool('compute')!.sensitive).toBeUndefined();
  }, 60_000);
});

describe('a worker whose key does not open the job', () => {
  let api: Harness;
  let worker: Container;
  const workerLogs: string[] = [];

  beforeAll(async () => {
    api = await startHarness(
      { EDGE_TOKEN_KEY: randomBytes(32).toString('hex'), PASSPORT_KEY: randomBytes(32).toString('hex'), JOB_ATTEMPTS: '1' },
      { workers: [] },
    );
    const config = loadConfig(
      {},
      {
        REDIS_URL: api.config.REDIS_URL,
        DATABASE_URL: api.config.DATABASE_URL,
        REDIS_PREFIX: api.config.REDIS_PREFIX,
        PASSPORT_KEY: api.config.PASSPORT_KEY,
        EDGE_TOKEN_KEY: randomBytes(32).toString('hex'),
        JOB_ATTEMPTS: '1',
      },
    );
    const sink = new Writable({
      write(chunk, _enc, cb) {
        workerLogs.push(String(chunk));
        cb();
      },
    });
    worker = await createContainer(config, pino({ level: 'info' }, sink), { api: false, workerFamilies: ['core'] });
  });
  afterAll(async () => {
    await worker?.close();
    await api?.close();
  });

  it('fails it as a fault (500 internal_error, nothing charged), with the text nowhere in clear', async () => {
    const a = await api.account('enterprise', 1000);
    const hidden = secret('hidden');
    secrets.push(hidden);
    const res = await api.call('passport_send', { to: 'self', content: hidden }, a.apiKey);
    expect(res.statusCode, res.body).toBe(500);
    expect(json(res).error.code).toBe('internal_error');
    expect(await api.ledgerCharges(a.accountId)).toBe(0);
    // The worker says why, naming keys by id only.
    expect(workerLogs.join('\n')).toMatch(/sealed job value is under key [0-9a-f]{8}/);
    const redis = await everythingIn(api.container.redis!, api.config.REDIS_PREFIX);
    expect(leaks(redis.text + workerLogs.join('\n') + api.logs.join('\n') + res.body)).toEqual([]);
  }, 60_000);
});

describe('JobSeal', () => {
  it('opens what an earlier key sealed once that key is listed as previous; a moved envelope does not open', () => {
    const old = randomBytes(32);
    const now = randomBytes(32);
    const sealed = new JobSeal(old).seal({ content: 'x' }, 'result:job-1');
    expect(() => new JobSeal(now).open(sealed, 'result:job-1')).toThrow(JobSealError);
    const rotated = new JobSeal(now, [old]);
    expect(rotated.open(sealed, 'result:job-1')).toEqual({ content: 'x' });
    expect(rotated.keyId).not.toBe(sealed.$sealed.split('.')[1]);
    expect(() => rotated.open(sealed, 'result:job-2')).toThrow(/does not open/);
  });
});
