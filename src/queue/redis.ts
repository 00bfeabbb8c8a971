import { Redis, type RedisOptions } from 'ioredis';
import { AppError, isAppError } from '../errors.js';

/**
 * A Redis connection as BullMQ's blocking clients want it (Worker, QueueEvents: no per-command retry
 * limit, commands wait offline for the reconnect). Workers use these: a job in hand should finish and
 * settle once Redis is back, not fail.
 */
export function connectRedis(url: string, opts: RedisOptions = {}): Redis {
  return new Redis(url, { maxRetriesPerRequest: null, enableReadyCheck: true, lazyConnect: false, ...opts });
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
  return new Redis(url, {
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

export type { Redis };

/** Deletes every key under `${prefix}:` (test and benchmark runs clean up after themselves). */
export async function deleteByPrefix(redis: Redis, prefix: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length) await redis.unlink(...keys);
  } while (cursor !== '0');
}

/** Whether an error means Redis or Postgres could not be reached or did not answer in time. */
export function isDependencyError(e: unknown): boolean {
  if (!e || typeof e !== 'object') return false;
  const err = e as { name?: string; code?: string; message?: string; cause?: unknown; errno?: unknown };
  const msg = err.message ?? '';
  // ioredis: offline queue disabled, connection closed, per-command timeout, retries exhausted.
  if (err.name === 'MaxRetriesPerRequestError') return true;
  if (/enableOfflineQueue|Connection is closed|Command timed out|Stream isn't writeable|connect ECONNREFUSED|Reached the max retries/i.test(msg)) return true;
  // Sockets (either dependency).
  if (typeof err.code === 'string' && ['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN'].includes(err.code)) return true;
  // Postgres: connection exceptions (08xxx), server shutting down (57P01-57P03), too many connections.
  if (typeof err.code === 'string' && (/^08/.test(err.code) || ['57P01', '57P02', '57P03', '53300'].includes(err.code))) return true;
  // slonik wraps driver failures.
  if (err.name === 'ConnectionError' || err.name === 'BackendTerminatedError') return true;
  if (/Connection terminated|timeout exceeded when trying to connect|Cannot use a pool after calling end|Client has encountered a connection error/i.test(msg)) return true;
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
