import { z } from 'zod';
import type { Logger } from 'pino';
import type { Redis } from '../queue/redis.js';
import { PeriodicPass, RedisLeader } from '../queue/leader.js';
import { sql, type DatabasePool } from '../db/pool.js';
import type { InFlightSlots, LiveJobs } from '../access/in-flight.js';
import type { CreditReservations, HoldSnapshot, PostgresView } from './holds.js';

/**
 * How old a hold must be before the reconciler may release it for want of a job. Admission takes the
 * hold and then queues the job: two Redis round trips, each bounded by the API connection's command
 * timeout (1 s, src/queue/redis.ts), plus whatever an idempotency record or flow record adds (a few
 * more). 15 s is several times the worst case of that path, including an event-loop stall of a few
 * seconds, and short enough that a leaked hold is back within one grace period plus one pass.
 */
export const HOLD_GRACE_MS = 15_000;

/** A disagreement is rebuilt only if it is still there this much later (a top-up or settlement in flight has landed by then). */
const CONFIRM_MS = 250;

export interface ReconcileReport {
  /** False when another process held the lock: nothing was done here. */
  ran: boolean;
  accounts: number;
  /** Holds given back (no job, or its job finished without a charge). */
  released: number;
  /** Holds dropped because their charge is in the ledger. */
  dropped: number;
  /** avail or sub-key month counters rebuilt from Postgres. */
  rebuilt: number;
  /** In-flight slots whose job is gone or finished. */
  slots: number;
}

const Row = z.object({
  credits: z.number().int(),
  charged: z.array(z.string()),
  subuse: z.record(z.string(), z.coerce.number().int()),
});

/**
 * Repairs what a crash leaves in Redis's money state. One pass, under a lock (`SET NX PX`) so one
 * process at a time does it whatever the number of replicas:
 *
 * 1. In-flight slots: every owner listed at admission has its slots older than the slots' grace
 *    period and without a live job (missing or finished) dropped; owners left without slots are unlisted.
 * 2. For every account listed in `credit:accounts` (added by the scripts that create an `avail` or a
 *    hold), in pages of SSCAN:
 *    a. SNAPSHOT: epoch, settle counter, Redis time, avail and every hold (old-format holds are
 *       stamped with the time now, so they count as taken now).
 *    b. Holds older than HOLD_GRACE_MS whose job is not live are candidates.
 *    c. One Postgres statement (one snapshot): the account's credits, which of its holds have a
 *       `charge` in the ledger (entry_key = job id), and each sub-key's settled cents this month.
 *    d. Candidates without a charge are released (avail and the sub-key month get them back);
 *       candidates with a charge are settled holds whose drop was lost: dropped without touching avail.
 *    e. REBUILD, dry: avail = credits - uncharged holds, subuse = settled this month + that key's
 *       uncharged holds. If anything is off (or charged holds linger), a, c and e run again after
 *       CONFIRM_MS and the second REBUILD writes, in one Lua script that refuses if a top-up (epoch)
 *       or a settlement (settle counter) moved since its snapshot. Admissions and releases change
 *       avail and the holds together, atomically, so they need no such guard.
 *
 * An `avail` that is missing (Redis flushed or restarted) is not created here: admission reloads it
 * from Postgres minus the holds in Redis (CreditReservations.loadAvail), so nothing keeps a stale value.
 */
export class Reconciler {
  private readonly leader: RedisLeader;
  private readonly passes: PeriodicPass<ReconcileReport>;

  constructor(
    private readonly deps: {
      redis: Redis;
      pool: DatabasePool;
      prefix: string;
      log: Logger;
      credits: CreditReservations;
      slots: InFlightSlots;
      liveJobs: LiveJobs;
      intervalSeconds: number;
      holdGraceMs?: number;
      lockMs?: number;
    },
  ) {
    this.leader = new RedisLeader(deps.redis, `${deps.prefix}:reconcile:lock`, deps.lockMs ?? 60_000);
    this.passes = new PeriodicPass(
      deps.intervalSeconds,
      () => this.pass(),
      (err) => deps.log.warn({ err: err.message }, 'reconciler pass failed'),
    );
  }

  /** Runs a pass every RECONCILE_SECONDS (with jitter, so replicas do not all try at once). */
  start(): void {
    this.passes.start();
  }

  async stop(): Promise<void> {
    await this.passes.stop();
  }

  /** One pass if no other process is running one. */
  runOnce(): Promise<ReconcileReport> {
    return this.passes.runOnce();
  }

  private async pass(): Promise<ReconcileReport> {
    const report: ReconcileReport = { ran: false, accounts: 0, released: 0, dropped: 0, rebuilt: 0, slots: 0 };
    return (await this.leader.run((keepLock) => this.repair(report, keepLock), 'reconciler lock lost')) ?? report;
  }

  private async repair(report: ReconcileReport, keepLock: () => Promise<void>): Promise<ReconcileReport> {
    report.ran = true;
    report.slots = await this.deps.slots.reconcile(keepLock);
    const { credits } = this.deps;
    // One registry per shard (src/queue/keyspace.ts), each in its own slot.
    for (const registry of credits.registryKeys()) {
      let cursor = '0';
      do {
        const [next, accounts] = await this.deps.redis.sscan(registry, cursor, 'COUNT', 200);
        cursor = next;
        for (const accountId of accounts) {
          report.accounts++;
          try {
            await this.account(accountId, report);
          } catch (err) {
            this.deps.log.warn({ err: (err as Error).message, accountId }, 'reconciling an account failed');
          }
          await keepLock();
        }
      } while (cursor !== '0');
    }
    if (report.released || report.dropped || report.rebuilt || report.slots) this.deps.log.warn(report, 'reconciler repaired money state');
    return report;
  }

  private async account(accountId: string, report: ReconcileReport): Promise<void> {
    const { credits, liveJobs } = this.deps;
    const grace = this.deps.holdGraceMs ?? HOLD_GRACE_MS;
    const snap = await credits.snapshot(accountId);
    const subKeys = await credits.subKeysOf(accountId);
    const old = snap.holds.filter((h) => snap.now - h.takenAt >= grace).map((h) => h.holdId);
    const live = old.length ? await liveJobs(old) : new Set<string>();
    const dead = old.filter((id) => !live.has(id));
    let view = await this.postgres(accountId, snap, subKeys);
    if (!view) return; // the account is gone from Postgres: nothing to compare with
    if (dead.length) {
      const charged = new Set(view.charged);
      const release = dead.filter((id) => !charged.has(id));
      if (release.length) {
        await credits.release(accountId, release);
        report.released += release.length;
      }
    }
    const dry = await credits.rebuild(accountId, snap, view, false);
    if (dry && !dry.off && !dry.charged) return;
    // Something is off, or a settlement or top-up moved meanwhile: look again a little later, and
    // write only what a fresh, unmoved snapshot still finds off.
    await new Promise((r) => setTimeout(r, CONFIRM_MS));
    const again = await credits.snapshot(accountId);
    view = await this.postgres(accountId, again, subKeys);
    if (!view) return;
    const done = await credits.rebuild(accountId, again, view, true);
    if (!done) return; // moved again: the next pass will see
    report.dropped += done.charged;
    report.rebuilt += done.off;
    if (done.off) {
      this.deps.log.warn({ accountId, avail: done.availBefore, rebuiltTo: done.availExpected }, 'rebuilt credit state from Postgres');
    }
  }

  /** Credits, charged holds and sub-keys' settled month in one statement, so from one snapshot. */
  private async postgres(accountId: string, snap: HoldSnapshot, subKeys: string[]): Promise<PostgresView | null> {
    const ids = snap.holds.map((h) => h.holdId);
    const row = await this.deps.pool.maybeOne(sql.type(Row)`
      SELECT a.credits,
        COALESCE((SELECT array_agg(l.entry_key) FROM ledger l
                  WHERE l.entry_key = ANY(${sql.array(ids, 'text')}) AND l.kind = 'charge'), '{}') AS charged,
        COALESCE((SELECT json_object_agg(u.key_id, u.used) FROM (
                    SELECT l.key_id::text AS key_id, -SUM(l.delta_cents)::bigint AS used FROM ledger l
                    WHERE l.key_id = ANY(${sql.array(subKeys, 'uuid')}) AND l.kind = 'charge'
                      AND l.created_at >= date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                    GROUP BY l.key_id) u), '{}'::json) AS subuse
      FROM accounts a WHERE a.id = ${accountId}`);
    if (!row) return null;
    const settledBySubuse = new Map<string, number>();
    for (const keyId of subKeys) settledBySubuse.set(this.deps.credits.subuseKey(accountId, keyId), row.subuse[keyId] ?? 0);
    return { credits: row.credits, charged: row.charged, settledBySubuse };
  }
}
