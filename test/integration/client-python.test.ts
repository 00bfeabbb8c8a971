import { execFile } from 'node:child_process';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, type Harness } from '../helpers/harness.js';
import { registerSlowTools } from '../helpers/slow-tools.js';

/** The Python client's own suite (clients/python/tests), run against a real service with workers. */

const CLIENT_DIR = join(import.meta.dirname, '../../clients/python');
/** Every test in clients/python/tests/test_client.py: all of them must run, none skipped. */
const EXPECTED_TESTS = 22;

let h: Harness;
let baseUrl: string;
let receiver: string;

/** A port free right now, for the Python suite's webhook receiver (the service may deliver only there). */
async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

function run(file: string, args: string[], opts: { cwd: string; env: NodeJS.ProcessEnv; timeout: number }) {
  return new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    execFile(file, args, opts, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : null) : 0;
      resolve({ code, stdout: String(stdout), stderr: String(stderr) });
    });
  });
}

beforeAll(async () => {
  receiver = `127.0.0.1:${await freePort()}`;
  // test_wait_signal (slow, paid, cancellable) and a 1 s sync timeout: the suite's 202, cancel and wait-timeout tests.
  registerSlowTools();
  h = await startHarness({ WEBHOOK_ALLOWED_HOSTS: receiver, SYNC_TIMEOUT_MS: '1000' }, {});
  baseUrl = await h.app.listen({ port: 0, host: '127.0.0.1' });
});
afterAll(async () => {
  await h?.close();
});

describe('the Python client (clients/python)', () => {
  it('passes its whole unittest suite against this service, nothing skipped', async () => {
    const rich = await h.account('enterprise', 100_000);
    const poor = await h.account('enterprise', 0);
    const limited = await h.account('enterprise', 100_000, { rpm: 1 });
    const env: NodeJS.ProcessEnv = {
      ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('TOLLGATE_'))),
      TOLLGATE_URL: baseUrl,
      TOLLGATE_KEY: rich.apiKey,
      TOLLGATE_POOR_KEY: poor.apiKey,
      TOLLGATE_LIMITED_KEY: limited.apiKey,
      TOLLGATE_WEBHOOK_RECEIVER: receiver,
      TOLLGATE_TEST_TOOLS: '1',
      PYTHONDONTWRITEBYTECODE: '1',
      PYTHONUNBUFFERED: '1',
    };
    const out = await run('python3', ['-m', 'unittest', 'discover', '-s', 'tests', '-v'], { cwd: CLIENT_DIR, env, timeout: 50_000 });
    const report = `${out.stdout}\n${out.stderr}`;
    expect(out.code, report).toBe(0);
    expect(report).toMatch(new RegExp(`\\nRan ${EXPECTED_TESTS} tests? in `));
    expect(report).toMatch(/\nOK\s*$/);
    expect(report).not.toMatch(/skipped/);
  }, 55_000);
});
