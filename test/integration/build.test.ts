import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { once } from 'node:events';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, type Harness } from '../helpers/harness.js';
import { closedPort } from '../helpers/http-targets.js';
import { listening } from '../helpers/processes.js';

/**
 * The production build: `npm run build` into dist/, then `npm run start:prod` (plain node, no tsx)
 * runs migrations, the API and the inline workers from dist/, an isolated tool (compute) runs in a
 * sandbox thread started from dist/src/sandbox/thread.js, and SIGTERM stops it with exit code 0.
 */

const run = promisify(execFile);
let h: Harness; // only for seeding an account in the same database and Redis prefix
let server: ChildProcess | null = null;

beforeAll(async () => {
  h = await startHarness({}, { workers: [] });
});

afterAll(async () => {
  if (server && server.exitCode === null && server.signalCode === null) server.kill('SIGKILL');
  await h?.close();
});

describe('production build', () => {
  it('builds, starts from dist/ with plain node, answers a compute call and stops on SIGTERM', async () => {
    await run('npm', ['run', '-s', 'build'], { env: process.env, maxBuffer: 16 * 1024 * 1024 });
    for (const f of ['dist/src/server.js', 'dist/workers/index.js', 'dist/src/cli/admin.js', 'dist/src/cli/migrate.js', 'dist/src/sandbox/thread.js']) {
      expect(existsSync(f), f).toBe(true);
    }

    const port = await closedPort();
    const acct = await h.account('pro', 1_000);
    let output = '';
    server = spawn('npm', ['run', '-s', 'start:prod'], {
      env: {
        ...process.env,
        // Nothing from the test runner's loader may leak in: the built code runs on plain node.
        NODE_OPTIONS: '',
        PORT: String(port),
        HOST: '127.0.0.1',
        REDIS_URL: h.config.REDIS_URL,
        DATABASE_URL: h.config.DATABASE_URL,
        REDIS_PREFIX: h.config.REDIS_PREFIX,
        ISOLATION: 'threads',
        LOG_LEVEL: 'warn',
        // The compiled build is production: it does not start without these.
        EDGE_TOKEN_KEY: randomBytes(32).toString('hex'),
        PASSPORT_KEY: randomBytes(32).toString('hex'),
        PUBLIC_BASE_URL: `http://127.0.0.1:${port}`,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    server.stdout!.on('data', (d) => (output += d));
    server.stderr!.on('data', (d) => (output += d));
    const exited = once(server, 'exit');
    for (let i = 0; ; i++) {
      const ok = await fetch(`http://127.0.0.1:${port}/health`).then(
        (r) => r.status < 500,
        () => false,
      );
      if (ok) break;
      if (server.exitCode !== null || i > 300) throw new Error(`the built service did not start:\n${output}`);
      await new Promise((r) => setTimeout(r, 100));
    }

    const res = await fetch(`http://127.0.0.1:${port}/tools/compute`, {
      method: 'POST',
      headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ expression: '2 + 3 * 4' }),
    });
    const body = await res.text();
    expect(res.status, body).toBe(200);
    expect(JSON.parse(body).result.value).toBe(14);

    server.kill('SIGTERM');
    const [code] = await exited;
    expect(code, output).toBe(0);
    expect(await listening(port)).toBe(false);
    // A liveness bound: about 20 s alone, a full compile while the other fork runs the heaviest suites takes longer.
  }, 180_000);
});
