import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { closedPort } from '../helpers/http-targets.js';
import { defineTool } from '../../src/tools/types.js';
import { findTool, registerTool } from '../../src/tools/index.js';

/**
 * The request log: one line per request at `info` with route, status, duration, tool, job and cost;
 * the caller's failures and expected upstream failures at `warn` without a stack; faults at `error`
 * with one. And a caller's bad input found by the worker ends its job completed (not failed in
 * BullMQ, Bull Board or tollgate_queue_jobs), answered and stored as the failure it is.
 */

/** A tool with a bug: it throws a plain Error, as a fault of ours would. */
const faulty = defineTool({
  name: 'test_fault_logs',
  description: 'Test only: throws an unexpected error',
  tier: 'free',
  priceCents: 1,
  family: 'core',
  input: z.object({}),
  qField: '',
  output: 'never answers',
  examples: [{}],
  handler: async () => {
    throw new Error('boom in the handler');
  },
});

const METRICS = 'm'.repeat(32);
let h: Harness;
let acct: TestAccount;

beforeAll(async () => {
  if (!findTool(faulty.name)) registerTool(faulty);
  // Cloudflare unreachable: a closed port. One attempt, so a fault fails at once.
  h = await startHarness({ CF_API_BASE_URL: `http://127.0.0.1:${await closedPort()}`, JOB_ATTEMPTS: '1', METRICS_TOKEN: METRICS });
  acct = await h.account('pro', 1000);
});
afterAll(async () => {
  await h?.close();
});

type Line = Record<string, unknown> & { level: number; reqId?: string; msg: string };

/** The lines written for one request id, once its line is out (it is written as the answer finishes). */
async function linesOf(requestId: string): Promise<Line[]> {
  for (let i = 0; i < 50; i++) {
    const lines = h.logs.map((l) => JSON.parse(l) as Line).filter((l) => l.reqId === requestId);
    if (lines.length) return lines;
    await new Promise((r) => setTimeout(r, 20));
  }
  return [];
}

async function failedJobs(family: 'core' | 'edge'): Promise<{ failed: number; completed: number }> {
  const q = h.container.queues.queue(family);
  const c = await q.getJobCounts('failed', 'completed');
  return { failed: c.failed ?? 0, completed: c.completed ?? 0 };
}

/** tollgate_queue_jobs{family, state} as GET /metrics says it. */
function queueGauge(text: string, family: string, state: string): number | null {
  const labels = (l: string) => new Set(l.split(','));
  for (const m of text.matchAll(/^tollgate_queue_jobs\{([^}]*)\} (\d+)$/gm)) {
    const set = labels(m[1]!);
    if (set.has(`family="${family}"`) && set.has(`state="${state}"`)) return Number(m[2]);
  }
  return null;
}

describe('request log lines', () => {
  it('writes exactly one info line per call, with route, status, duration, tool, job and cost', async () => {
    const res = await h.call('compute', { expression: '2 * (3 + 4)' }, acct.apiKey);
    expect(res.statusCode).toBe(200);
    const lines = await linesOf(String(res.headers['x-request-id']));
    expect(lines).toHaveLength(1);
    const [line] = lines;
    expect(line).toMatchObject({
      level: 30,
      method: 'POST',
      route: '/tools/:name',
      status: 200,
      tool: 'compute',
      job: res.headers['x-job-id'],
      cost_cents: res.json().cost_cents,
    });
    expect(typeof line!.ms).toBe('number');
    expect(line!.ms as number).toBeGreaterThan(0);
    // The raw URL and the key never reach the line.
    expect(JSON.stringify(line)).not.toContain(acct.apiKey);
    expect(line).not.toHaveProperty('url');
  });

  it('writes one line for a request without a tool (no tool, job or cost fields)', async () => {
    const res = await h.request({ method: 'GET', url: '/balance', headers: { authorization: `Bearer ${acct.apiKey}` } });
    expect(res.statusCode).toBe(200);
    const lines = await linesOf(String(res.headers['x-request-id']));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: 30, route: '/balance', status: 200 });
    expect(lines[0]).not.toHaveProperty('tool');
    expect(lines[0]).not.toHaveProperty('cost_cents');
  });

  it('writes no line for a probe or /health that answers 200 (they are polled), as the production guide says', async () => {
    const ids: string[] = [];
    for (const url of ['/livez', '/readyz', '/health']) {
      const res = await h.request({ method: 'GET', url });
      expect(res.statusCode, url).toBe(200);
      ids.push(String(res.headers['x-request-id']));
    }
    // A request that does log, answered after the probes: once its line is out, theirs would be too.
    const marker = await h.request({ method: 'GET', url: '/balance', headers: { authorization: `Bearer ${acct.apiKey}` } });
    expect(await linesOf(String(marker.headers['x-request-id']))).toHaveLength(1);
    const all = h.logs.map((l) => JSON.parse(l) as Line);
    for (const id of ids) expect(all.filter((l) => l.reqId === id)).toEqual([]);
  });

  it("logs a caller's bad input once at warn, by code and message, without a stack", async () => {
    const res = await h.call('compute', { expression: 42 }, acct.apiKey);
    expect(res.statusCode).toBe(400);
    const lines = await linesOf(String(res.headers['x-request-id']));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: 40, status: 400, tool: 'compute', error: { code: 'invalid_input' } });
    expect(lines[0]).not.toHaveProperty('err');
    expect(JSON.stringify(lines[0])).not.toContain('    at ');
  });

  it('logs Cloudflare unreachable once at warn without a stack', async () => {
    const before = h.logs.length;
    const res = await h.call('cf_list_zones', {}, acct.apiKey, { 'x-edge-token': 'a'.repeat(40) });
    expect(res.statusCode).toBe(502);
    expect(res.json().error.code).toBe('upstream_error');
    const lines = await linesOf(String(res.headers['x-request-id']));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: 40, status: 502, tool: 'cf_list_zones', error: { code: 'upstream_error' } });
    // Nothing about it anywhere at error level, and no stack (the worker's lines included).
    const since = h.logs.slice(before).map((l) => JSON.parse(l) as Line);
    expect(since.filter((l) => l.level >= 50)).toEqual([]);
    expect(h.logs.slice(before).join('\n')).not.toContain('    at ');
  });

  it('logs a fault at error with its stack', async () => {
    const before = h.logs.length;
    const res = await h.call(faulty.name, {}, acct.apiKey);
    expect(res.statusCode).toBe(500);
    expect(res.json().error.code).toBe('internal_error');
    const lines = await linesOf(String(res.headers['x-request-id']));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: 50, status: 500, tool: faulty.name, error: { code: 'internal_error' } });
    expect((lines[0]!.err as { stack?: string }).stack).toContain('    at ');
    // The worker's own line has the tool's stack (where the bug is), not the caller's input.
    const worker = h.logs
      .slice(before)
      .map((l) => JSON.parse(l) as Line)
      .find((l) => l.msg === 'tool failed unexpectedly');
    expect(worker?.level).toBe(50);
    const stack = String((worker?.err as { stack?: string } | undefined)?.stack);
    expect(stack).toContain('boom in the handler');
    expect(stack).toContain('    at ');
  });
});

describe('how jobs end', () => {
  it("a caller's bad input found by the worker is not a failed job; it is still answered, stored and not charged", async () => {
    const credits = await h.credits(acct.accountId);
    const core = await failedJobs('core');
    // Well-formed for the API, refused by the tool in the worker.
    const res = await h.call('compute', { expression: '2 +* 3' }, acct.apiKey);
    expect(res.statusCode).toBe(400);
    expect(res.json().error.code).toBe('invalid_input');
    const jobId = String(res.headers['x-job-id']);
    expect(jobId).toMatch(/^core-/);
    const job = await h.container.queues.getJob(jobId);
    expect(await job!.getState()).toBe('completed');
    const after = await failedJobs('core');
    expect(after.failed).toBe(core.failed);
    // GET /jobs/{id} says how it ended, as before.
    const status = await h.request({ method: 'GET', url: `/jobs/${jobId}`, headers: { authorization: `Bearer ${acct.apiKey}` } });
    expect(status.json().error.code).toBe('invalid_input');
    expect(await h.credits(acct.accountId)).toBe(credits);
    const stored = await h.container.results.get(jobId);
    expect(stored?.status).toBe('failed');
    expect(stored?.costCents).toBe(0);
  });

  it("a chain step after a caller's failure does not run, is not a failed job, and frees its hold", async () => {
    const a = await h.account('pro', 10);
    const core = await failedJobs('core');
    const res = await h.request({
      method: 'POST',
      url: '/',
      headers: { authorization: `Bearer ${a.apiKey}`, 'content-type': 'application/json' },
      payload: JSON.stringify({ chain: ['compute', 'compute', 'compute'], q: '2 * apples' }),
    });
    expect(res.statusCode).toBe(400);
    const { error } = res.json();
    expect(error.failed_step).toMatchObject({ index: 0, tool: 'compute', error: { code: 'invalid_input' } });
    expect(error).toMatchObject({ steps: [], cost_cents: 0 });
    // The later steps end without running: completed in BullMQ, failed (uncharged) for the caller.
    const rootId = String(res.headers['x-job-id']);
    const root = h.container.queues;
    for (let i = 0; i < 100 && (await root.view(rootId))?.state === 'pending'; i++) await new Promise((r) => setTimeout(r, 20));
    const view = await root.view(rootId);
    expect(view?.state).toBe('failed');
    expect(await (await root.getJob(rootId))!.getState()).toBe('completed');
    expect(view?.state === 'failed' && view.error.message).toMatch(/^Not run: the chain step before it failed/);
    expect((await h.container.results.get(rootId))?.status).toBe('failed');
    expect((await failedJobs('core')).failed).toBe(core.failed);
    // Nothing charged, every hold back: the whole balance buys the same chain at once.
    expect(await h.credits(a.accountId)).toBe(10);
    const again = await h.request({
      method: 'POST',
      url: '/',
      headers: { authorization: `Bearer ${a.apiKey}`, 'content-type': 'application/json' },
      payload: JSON.stringify({ chain: ['compute', 'compute', 'compute'], q: '1 + 1' }),
    });
    expect(again.statusCode).toBe(200);
    expect(again.json().remaining_credits).toBe(4);
  });

  it("counts faults as failed jobs, and callers' failures not, in tollgate_queue_jobs", async () => {
    const res = await h.call(faulty.name, {}, acct.apiKey);
    expect(res.statusCode).toBe(500);
    const failedId = String(res.headers['x-job-id']);
    expect(await (await h.container.queues.getJob(failedId))!.getState()).toBe('failed');
    const counts = await failedJobs('core');
    const metrics = await h.request({ method: 'GET', url: '/metrics', headers: { authorization: `Bearer ${METRICS}` } });
    const text = metrics.body;
    expect(metrics.statusCode, text.slice(0, 200)).toBe(200);
    // Two faults so far (one per test above), and no bad input among the failed.
    expect(counts.failed).toBe(2);
    expect(queueGauge(text, 'core', 'failed')).toBe(2);
  });
});
