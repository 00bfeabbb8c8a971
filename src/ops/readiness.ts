/**
 * Whether this process can serve: the answer behind GET /readyz on the API's port and on every
 * process's METRICS_PORT listener. Redis answers, Postgres answers, every migration file this code
 * ships is applied, and the process has not started draining (SIGTERM or SIGINT). Worker families are
 * not part of it: an API replica serves /balance, keys and async submissions whatever the workers do,
 * so a missing family is GET /health's business (for people and dashboards), never a reason to take
 * the replica out of rotation.
 */
import { migrationFiles, migrationVersion } from '../db/migrate.js';
import { sql, type DatabasePool } from '../db/pool.js';
import type { Redis } from '../queue/redis.js';
import { within } from './metrics.js';

/** Each check gives up after this long (they run side by side), so /readyz answers well within 2 s when a dependency hangs. */
export const READY_CHECK_MS = 1_000;

export interface Readiness {
  status: 'ready' | 'not_ready';
  checks: { redis: 'ok' | 'down'; postgres: 'ok' | 'down'; migrations: 'ok' | 'pending' | 'unknown' };
  /** Migration files not yet applied (present while `migrations` is `pending`). */
  pending_migrations?: string[];
  /** True once SIGTERM or SIGINT arrived: the process finishes what it holds and takes nothing new. */
  draining: boolean;
  time: string;
}

let drainingSince: number | null = null;

/** Marks this process as draining: /readyz is 503 from now on, while the process finishes its work. */
export function startDraining(): void {
  drainingSince ??= Date.now();
}

/** Drains on the first SIGTERM or SIGINT (the signals the graceful stop, src/bootstrap.ts, answers). */
export function drainOnStopSignal(): void {
  process.once('SIGTERM', startDraining);
  process.once('SIGINT', startDraining);
}

// The files this code ships do not change while it runs: read once.
let shipped: Promise<string[]> | null = null;

/** Postgres's code for a table that does not exist: here, a database no migration ever ran on. */
const UNDEFINED_TABLE = '42P01';

/** Applied versions from schema_migrations (none when the table is missing); null when Postgres did not answer. */
async function appliedVersions(pool: DatabasePool): Promise<Set<string> | null> {
  const rows = await within(READY_CHECK_MS, () =>
    pool.anyFirst(sql.unsafe`SELECT version FROM schema_migrations`).catch((e: { code?: string }) => (e.code === UNDEFINED_TABLE ? [] : Promise.reject(e))),
  );
  return rows === null ? null : new Set(rows.map(String));
}

type Deps = { redis: Redis; pool: DatabasePool };
type Checked = Pick<Readiness, 'checks' | 'pending_migrations'>;

// One check at a time per process's connections: requests that arrive while one runs share its answer,
// so a flood of unauthenticated probes costs one PING and one query at a time, not a pool's worth.
const running = new WeakMap<Deps, Promise<Checked>>();

async function check(deps: Deps): Promise<Checked> {
  shipped ??= migrationFiles();
  const [pong, applied, files] = await Promise.all([within(READY_CHECK_MS, () => deps.redis.ping()), appliedVersions(deps.pool), shipped]);
  const pending = applied ? files.filter((f) => !applied.has(migrationVersion(f))) : [];
  return {
    checks: {
      redis: pong === null ? 'down' : 'ok',
      postgres: applied === null ? 'down' : 'ok',
      migrations: applied === null ? 'unknown' : pending.length ? 'pending' : 'ok',
    },
    ...(pending.length ? { pending_migrations: pending } : {}),
  };
}

/** Checks Redis, Postgres and the migrations at once, each bounded by READY_CHECK_MS. */
export async function readiness(deps: Deps): Promise<Readiness> {
  let shared = running.get(deps);
  if (!shared) {
    shared = check(deps).finally(() => running.delete(deps));
    running.set(deps, shared);
  }
  const { checks, pending_migrations } = await shared;
  const draining = drainingSince !== null;
  const ready = checks.redis === 'ok' && checks.postgres === 'ok' && checks.migrations === 'ok' && !draining;
  return {
    status: ready ? 'ready' : 'not_ready',
    checks,
    ...(pending_migrations ? { pending_migrations } : {}),
    draining,
    time: new Date().toISOString(),
  };
}

/** The same check in the shape a METRICS_PORT listener takes (src/ops/metrics.ts). */
export const readinessProbe = (deps: Deps) => async () => {
  const body = await readiness(deps);
  return { ready: body.status === 'ready', body };
};
