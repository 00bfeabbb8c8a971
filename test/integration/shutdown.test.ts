import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, type Harness } from '../helpers/harness.js';
import { closedPort, startHttpTarget, type HttpTarget } from '../helpers/http-targets.js';
import { alive, descendants, listening } from '../helpers/processes.js';

/**
 * `kill -TERM` of `npm start` while 50 calls are in flight: every caller is answered, the process tree
 * exits 0 and nothing is left listening. The API and its workers run as `npm start` runs them.
 */

let h: Harness; // only for seeding accounts in the same database and Redis prefix
let target: HttpTarget;
let server: ChildProcess | null = null;

beforeAll(async () => {
  target = await startHttpTarget((_req, res) => {
    setTimeout(() => res.writeHead(200, { 'content-type': 'text/html' }).end('<title>slow</title><p>done</p>'), 1_500);
  });
  h = await startHarness({}, { workers: [] });
});

afterAll(async () => {
  if (server && server.exitCode === null) server.kill('SIGKILL');
  await h?.close();
  await target?.close();
});

describe('graceful stop', () => {
  it('answers all 50 calls in flight, exits 0 and leaves nothing listening', async () => {
    const port = await closedPort();
    const acct = await h.account('enterprise', 0, { rpm: 100_000, maxInFlight: 100 });
    server = spawn('npm', ['start'], {
      env: {
        ...process.env,
        PORT: String(port),
        HOST: '127.0.0.1',
        REDIS_URL: h.config.REDIS_URL,
        DATABASE_URL: h.config.DATABASE_URL,
        REDIS_PREFIX: h.config.REDIS_PREFIX,
        FETCH_ALLOWED_HOSTS: target.hostPort,
        CONCURRENCY_WEB: '60',
        WEB_PER_HOST: '60',
        FAIR_SHARE: '1',
        LOG_LEVEL: 'warn',
      },
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    const exited = once(server, 'exit');
    for (let i = 0; ; i++) {
      const ok = await fetch(`http://127.0.0.1:${port}/health`).then(
        (r) => r.status < 500,
        () => false,
      );
      if (ok) break;
      if (i > 300) throw new Error('the service did not start');
      await new Promise((r) => setTimeout(r, 100));
    }
    const tree = descendants(server.pid!);
    expect(tree.length).toBeGreaterThan(0);

    const calls = Array.from({ length: 50 }, (_, i) =>
      fetch(`http://127.0.0.1:${port}/tools/page_fetch`, {
        method: 'POST',
        headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({ url: target.url(`/page-${i}`) }),
      }).then(async (r) => ({ status: r.status, body: await r.text() })),
    );
    // Every call is running (its page requested) when the signal comes.
    const start = Date.now();
    while (target.requests.length < 50 && Date.now() - start < 15_000) await new Promise((r) => setTimeout(r, 20));
    expect(target.requests.length).toBe(50);
    server.kill('SIGTERM');

    const answers = await Promise.all(calls);
    expect(answers.map((a) => a.status)).toEqual(Array(50).fill(200));
    for (const a of answers) expect(JSON.parse(a.body).result.title).toBe('slow');
    const [code] = await exited;
    expect(code).toBe(0);
    expect(await listening(port)).toBe(false);
    // npm exits with its child; give the kernel a moment to reap the tree.
    for (let i = 0; i < 50 && tree.some(alive); i++) await new Promise((r) => setTimeout(r, 100));
    expect(tree.filter(alive)).toEqual([]);
  }, 60_000);
});
