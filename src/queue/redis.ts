import { Cluster, Redis as SingleRedis, type RedisOptions } from 'ioredis';
import { AppError, isAppError } from '../errors.js';

/**
 * A connection to Redis: one server, or a Redis Cluster (ioredis `Cluster`) when REDIS_URL is a
 * `redis+cluster://` address (REDIS_CLUSTER_NODES builds one). Both speak the same commands; what a
 * cluster adds is that a script, MULTI or pipeline may only touch keys of one slot
 * (src/queue/keyspace.ts says how keys are tagged for that).
 */
export type Redis = SingleRedis | Cluster;

/** The seed nodes and credentials of a `redis+cluster://[user:password@]host:port,host:port` (or `rediss+cluster://`) address. */
export interface ClusterAddress {
  nodes: Array<{ host: string; port: number }>;
  username?: string;
  password?: string;
  tls: boolean;
}

const CLUSTER_URL = /^(rediss?)\+cluster:\/\/(?:([^:@/]*)(?::([^@/]*))?@)?([^@/]+?)\/?$/;

/** The cluster a REDIS_URL names, or null for a single server. */
export function parseClusterUrl(url: string): ClusterAddress | null {
  const m = CLUSTER_URL.exec(url);
  if (!m) return null;
  const nodes = m[4]!.split(',').map((hp) => {
    const at = hp.lastIndexOf(':');
    const host = hp.slice(0, at).replace(/^\[|\]$/g, '');
    const port = Number(hp.slice(at + 1));
    if (at <= 0 || !host || !Number.isInteger(port) || port < 1 || port > 65535) throw new Error(`bad cluster node "${hp}" (expected host:port)`);
    return { host, port };
  });
  const decode = (v: string | undefined) => (v ? decodeURIComponent(v) : undefined);
  return { nodes, username: decode(m[2]), password: decode(m[3]), tls: m[1] === 'rediss' };
}

/**
 * Opens a single-server or cluster connection. The options are ioredis's single-server ones; for a
 * cluster, the connection-level ones (lazyConnect, enableOfflineQueue, enableReadyCheck,
 * retryStrategy) apply to the cluster and the rest to each node's connection.
 */
function open(url: string, opts: RedisOptions): Redis {
  const cluster = parseClusterUrl(url);
  if (!cluster) return coalesceWrites(new SingleRedis(url, opts));
  const { lazyConnect, enableOfflineQueue, enableReadyCheck, retryStrategy, ...node } = opts;
  const c = new Cluster(cluster.nodes, {
    lazyConnect,
    enableOfflineQueue,
    enableReadyCheck,
    clusterRetryStrategy: retryStrategy ? (times) => retryStrategy(times) : undefined,
    // While a primary fails over, commands to its slots wait for the new one (bounded by the
    // per-command limits) instead of failing at once.
    retryDelayOnFailover: 100,
    retryDelayOnClusterDown: 200,
    retryDelayOnTryAgain: 100,
    // MOVED answers while the nodes still disagree about a failed-over slot: spread the redirections
    // (at most 16) over a second or so instead of spending them at once.
    retryDelayOnMoved: 100,
    slotsRefreshTimeout: 2_000,
    redisOptions: { ...node, username: cluster.username, password: cluster.password, ...(cluster.tls ? { tls: {} } : {}) },
  });
  c.on('+node', (n: SingleRedis) => coalesceWrites(n));
  return c;
}

/**
 * ioredis writes every command to its socket at once: one system call per command, and on a busy
 * machine each one also wakes Redis. Under load many calls send commands in the same pass of the
 * event loop over its ready sockets, so the socket is corked at the first write and uncorked once
 * that pass is done (setImmediate, as ioredis's own auto-pipelining does): one write for all of them.
 * Nothing waits longer than the current pass (idle, that is at once), and the order of commands on
 * the connection is unchanged. Applied again on every reconnect (a new socket). Measured with
 * `npm run bench:ab`: uncorking at process.nextTick (per callback) saved less than per pass.
 */
export function coalesceWrites<T extends SingleRedis>(redis: T): T {
  redis.on('connect', () => {
    const socket = (redis as unknown as { stream?: import('node:net').Socket }).stream;
    if (!socket || (socket as { tgCorked?: boolean }).tgCorked) return;
    (socket as { tgCorked?: boolean }).tgCorked = true;
    const write = socket.write;
    let corked = false;
    const uncork = () => {
      corked = false;
      socket.uncork();
    };
    socket.write = function (this: import('node:net').Socket, ...args: Parameters<typeof write>) {
      if (!corked) {
        corked = true;
        socket.cork();
        setImmediate(uncork);
      }
      return write.apply(this, args);
    } as typeof write;
  });
  return redis;
}

/** Whether a connection is to a Redis Cluster. */
export function isCluster(redis: Redis): redis is Cluster {
  return (redis as Cluster).isCluster === true;
}

/**
 * A Redis connection as BullMQ's blocking clients want it (Worker, QueueEvents: no per-command retry
 * limit, commands wait offline for the reconnect). Workers use these: a job in hand should finish and
 * settle once Redis is back, not fail.
 */
export function connectRedis(url: string, opts: RedisOptions = {}): Redis {
  return open(url, { maxRetriesPerRequest: null, enableReadyCheck: true, lazyConnect: false, ...opts });
}

/** Per-command deadline of the API's command connection. */
export const COMMAND_TIMEOUT_MS = 1_000;

/**
 * The API's command connection (admission, enqueue, rate limits, idempotency; BullMQ's Queue and
 * FlowProducer share it, which BullMQ allows for non-blocking clients). It fails fast so a caller gets
 * a 503 at once instead of waiting on a Redis that is gone, and it never sends a command later than
 * the request that made it:
 * - `enableOfflineQueue: false`: while disconnected a command is refused at once, never queued to be
 *   sent on reconnect (an enqueue the client gave up on must not run minutes later);
 * - `autoResendUnfulfilledCommands: false`: commands in flight when the connection dropped are failed,
 *   not sent again on reconnect;
 * - `maxRetriesPerRequest: 1` and `commandTimeout`: a command on a connection that hangs is failed
 *   after COMMAND_TIMEOUT_MS. (It may still have run: an enqueue in that state is the one ambiguous
 *   case, which the reconciler's grace period and job checks are built around.)
 * The connection itself keeps reconnecting in the background (ioredis's default retry strategy).
 */
export function connectCommandRedis(url: string, opts: RedisOptions = {}): Redis {
  return open(url, {
    enableReadyCheck: true,
    lazyConnect: false,
    enableOfflineQueue: false,
    autoResendUnfulfilledCommands: false,
    maxRetriesPerRequest: 1,
    commandTimeout: COMMAND_TIMEOUT_MS,
    // Reconnect quickly after Redis comes back, so service resumes within a second or so.
    retryStrategy: (times) => Math.min(100 * times, 1_000),
    ...opts,
  });
}

/**
 * Every key of a deployment, a page at a time: under `${prefix}:` and under its queues' `{prefix}:`
 * (src/queue/keyspace.ts). On a cluster every primary is scanned; each page comes with the server
 * that holds it.
 */
export async function* deploymentKeys(redis: Redis, prefix: string): AsyncGenerator<{ server: SingleRedis; keys: string[] }> {
  const servers: SingleRedis[] = isCluster(redis) ? redis.nodes('master') : [redis];
  for (const server of servers) {
    for (const pattern of [`${prefix}:*`, `{${prefix}}:*`]) {
      let cursor = '0';
      do {
        const [next, keys] = await server.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
        cursor = next;
        if (keys.length) yield { server, keys };
      } while (cursor !== '0');
    }
  }
}

/** Deletes every key of a deployment (test and benchmark runs clean up after themselves). */
export async function deleteByPrefix(redis: Redis, prefix: string): Promise<void> {
  for await (const { server, keys } of deploymentKeys(redis, prefix)) {
    // One key per command on a cluster: a multi-key UNLINK must stay within one slot.
    if (isCluster(redis)) await Promise.all(keys.map((k) => server.unlink(k)));
    else await server.unlink(...keys);
  }
}

/** Whether an error means Redis or Postgres could not be reached or did not answer in time. */
export function isDependencyError(e: unknown): boolean {
  if (!e || typeof e !== 'object') return false;
  const err = e as { name?: string; code?: string; message?: string; cause?: unknown; errno?: unknown };
  const msg = err.message ?? '';
  // ioredis: offline queue disabled, connection closed, per-command timeout, retries exhausted.
  if (err.name === 'MaxRetriesPerRequestError') return true;
  if (/enableOfflineQueue|Connection is closed|Command timed out|Stream isn't writeable|connect ECONNREFUSED|Reached the max retries/i.test(msg)) return true;
  // A Redis Cluster mid-failover: the slot's primary is gone and its replica not yet promoted, the
  // slot map is being refreshed, or the node is still loading. Transient, like a dropped connection.
  if (
    /^(CLUSTERDOWN|TRYAGAIN|MASTERDOWN|LOADING|READONLY)\b|Too many Cluster redirections|Failed to refresh slots cache|None of startup nodes is available|Cluster isn't ready/i.test(
      msg,
    )
  )
    return true;
  // Sockets (either dependency).
  if (
    typeof err.code === 'string' &&
    ['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN'].includes(err.code)
  )
    return true;
  // Postgres: connection exceptions (08xxx), server shutting down (57P01-57P03), too many connections.
  if (typeof err.code === 'string' && (/^08/.test(err.code) || ['57P01', '57P02', '57P03', '53300'].includes(err.code))) return true;
  // slonik wraps driver failures.
  if (err.name === 'ConnectionError' || err.name === 'BackendTerminatedError') return true;
  if (/Connection terminated|timeout exceeded when trying to connect|Cannot use a pool after calling end|Client has encountered a connection error/i.test(msg))
    return true;
  return err.cause !== undefined && err.cause !== e ? isDependencyError(err.cause) : false;
}

/** Seconds a caller is asked to wait when Redis or Postgres cannot be reached. */
const DEPENDENCY_RETRY_AFTER = 1;

/**
 * Redis or Postgres unreachable (refused, closed, timed out): 503 service_unavailable with
 * Retry-After, in the usual envelope. Nothing was charged: admission did not happen or is given back.
 */
export function dependencyUnavailable(): AppError {
  return new AppError(
    'service_unavailable',
    'The service cannot reach its data stores right now; nothing was charged. Retry shortly.',
    { retry_after: DEPENDENCY_RETRY_AFTER },
    { headers: { 'retry-after': String(DEPENDENCY_RETRY_AFTER) }, retryable: true },
  );
}

/** A dependency failure as the 503 above; anything else unchanged. */
export function asDependencyError(e: unknown): unknown {
  return !isAppError(e) && isDependencyError(e) ? dependencyUnavailable() : e;
}
