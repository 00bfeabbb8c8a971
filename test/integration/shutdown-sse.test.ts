import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { closedPort } from '../helpers/http-targets.js';
import { registerSlowTools } from '../helpers/slow-tools.js';

/**
 * SIGTERM while a Server-Sent Events stream is open: the stream ends with a terminal event, the
 * result when it comes within the grace, else a `reconnect` event naming the Last-Event-ID another
 * replica resumes from. The service runs as its own process (test/helpers/slow-server.ts: the
 * production entry with the test-only tools); only that child is signalled.
 */

let h: Harness; // seeds accounts in the same database and Redis prefix; runs no workers
let acct: TestAccount;
const children: ChildProcess[] = [];
const harnesses: Harness[] = [];

beforeAll(async () => {
  registerSlowTools();
  h = await startHarness({}, { workers: [] });
  acct = await h.account('pro', 1000);
});
afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  for (const x of harnesses) await x.close();
  await h?.close();
});

async function startService(env: Record<string, string>): Promise<{ child: ChildProcess; port: number; exited: Promise<unknown[]> }> {
  const port = await closedPort();
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/helpers/slow-server.ts'], {
    env: {
      ...process.env,
      PORT: String(port),
      HOST: '127.0.0.1',
      REDIS_URL: h.config.REDIS_URL,
      DATABASE_URL: h.config.DATABASE_URL,
      REDIS_PREFIX: h.config.REDIS_PREFIX,
      LOG_LEVEL: 'warn',
      ...env,
    },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  children.push(child);
  const exited = once(child, 'exit');
  for (let i = 0; ; i++) {
    const up = await fetch(`http://127.0.0.1:${port}/health`).then(
      () => true,
      () => false,
    );
    if (up) break;
    if (i > 300 || child.exitCode !== null) throw new Error('the service did not start');
    await new Promise((r) => setTimeout(r, 100));
  }
  return { child, port, exited };
}

interface Event {
  id?: string;
  event: string;
  data: unknown;
}

function parseEvents(text: string): Event[] {
  return text
    .split('\n\n')
    .map((block) => block.split('\n').filter((l) => l && !l.startsWith(':')))
    .filter((lines) => lines.some((l) => l.startsWith('event: ')))
    .map((lines) => {
      const field = (name: string) => lines.find((l) => l.startsWith(`${name}: `))?.slice(name.length + 2);
      const id = field('id');
      return { ...(id ? { id } : {}), event: field('event')!, data: JSON.parse(field('data')!) };
    });
}

/** Opens a stream of a test_sleep call; resolves once `queued` arrived, with the rest of the stream to come. */
async function openStream(port: number, ms: number) {
  const res = await fetch(`http://127.0.0.1:${port}/tools/test_sleep`, {
    method: 'POST',
    headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify({ ms }),
  });
  expect(res.status).toBe(200);
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while (!parseEvents(text).some((e) => e.event === 'queued')) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`the stream ended before queued: ${text}`);
    text += decoder.decode(value, { stream: true });
  }
  const rest = (async () => {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return parseEvents(text);
      text += decoder.decode(value, { stream: true });
    }
  })();
  return { jobId: String(res.headers.get('x-job-id')), rest };
}

describe('SIGTERM with an SSE stream open', () => {
  it('ends the stream with the result when it comes within the grace, and exits 0', async () => {
    const { child, port, exited } = await startService({ SHUTDOWN_GRACE_MS: '20000' });
    const { jobId, rest } = await openStream(port, 2_000);
    child.kill('SIGTERM');
    const events = await rest;
    const last = events[events.length - 1]!;
    expect(events[0]).toMatchObject({ event: 'queued', id: `${jobId}:0` });
    expect(last).toMatchObject({ event: 'result', id: `${jobId}:end`, data: { result: { slept: 2_000 }, cost_cents: 0 } });
    const [code] = await exited;
    expect(code).toBe(0);
  }, 60_000);

  it('ends the stream with a reconnect event past the grace; another server resumes it from Last-Event-ID', async () => {
    // An API without workers: the call waits in the queue, so its result cannot come before the grace.
    const { child, port, exited } = await startService({ WORKERS: 'off', SHUTDOWN_GRACE_MS: '1500' });
    const { jobId, rest } = await openStream(port, 50);
    const t0 = Date.now();
    child.kill('SIGTERM');
    const events = await rest;
    // Four fifths of the grace, then the stream ends: before the process cuts what is left.
    expect(Date.now() - t0).toBeGreaterThanOrEqual(1_100);
    expect(Date.now() - t0).toBeLessThan(1_500);
    expect(events.map((e) => e.event)).toEqual(['queued', 'reconnect']);
    const reconnect = events[1]!;
    // No id: an EventSource keeps the last one it got and sends it when it reconnects.
    expect(reconnect.id).toBeUndefined();
    expect(reconnect.data).toMatchObject({ job_id: jobId, reason: 'shutting_down', last_event_id: `${jobId}:0` });
    expect((reconnect.data as { message: string }).message).toContain(`Last-Event-ID: ${jobId}:0`);
    const [code] = await exited;
    expect(code).toBe(0);

    // Another server (with a worker for the call's family) resumes after queued and ends with the result.
    const other = await startHarness({ REDIS_PREFIX: h.config.REDIS_PREFIX }, { workers: ['web'] });
    harnesses.push(other);
    const resumed = await other.request({
      method: 'GET',
      url: `/jobs/${jobId}/events`,
      headers: { authorization: `Bearer ${acct.apiKey}`, accept: 'text/event-stream', 'last-event-id': `${jobId}:0` },
    });
    expect(resumed.statusCode).toBe(200);
    const after = parseEvents(resumed.body);
    expect(after.map((e) => e.event)).toEqual(['result']);
    expect(after[0]).toMatchObject({ id: `${jobId}:end`, data: { result: { slept: 50 } } });
  }, 60_000);
});
