import { z } from 'zod';
import { sql, type DatabasePool } from '../../db/pool.js';

/** The billing systems an entry can be exported to; each keeps its own cursor (export_cursors). */
export const TARGETS = ['cloudevents', 'stripe'] as const;
export type TargetName = (typeof TARGETS)[number];

/**
 * A position in export order: the inserting transaction (xid8 as decimal text: it is 64-bit) and
 * the ledger id. Rows written before migration 023 have no transaction and sort as transaction 0.
 */
export const CursorSchema = z.object({ xact: z.string().regex(/^\d+$/), id: z.number().int().nonnegative() });
export type Cursor = z.infer<typeof CursorSchema>;

export const START: Cursor = { xact: '0', id: 0 };

export const LedgerEntrySchema = z.object({
  id: z.number().int(),
  xact: z.string(),
  entry_key: z.string(),
  account_id: z.string().nullable(),
  key_id: z.string().nullable(),
  kind: z.string(),
  tool: z.string().nullable(),
  delta_cents: z.number().int(),
  agent_name: z.string().nullable(),
  payer: z.string().nullable(),
  created_at: z.string(),
  /** The account's Stripe customer (stripe_customers), when it has one. */
  customer_id: z.string().nullable(),
});
export type LedgerEntry = z.infer<typeof LedgerEntrySchema>;

const Count = z.object({ n: z.number().int() });
const Moved = z.object({ target: z.string() });

/**
 * Counting the lag stops here: past it the gauge says "at least this many" and the scrape stays
 * cheap (the count walks the export index from the cursor, well under a second at the cap).
 */
export const LAG_CAP = 100_000;

/**
 * The export line: rows of transactions below it are all committed (or aborted) in the statement's
 * snapshot. It is the oldest transaction the snapshot still saw running (else its xmax), leaving out
 * those known to run in another database of the cluster: they cannot have written this ledger, and
 * a long write elsewhere (a bulk load, a migration) would otherwise hold the export back. A running
 * transaction is left out only when pg_stat_activity shows it in another database now, which it
 * therefore was in at the snapshot too; one that has ended since, or is not shown (a prepared
 * transaction, another role's session), keeps the line where it is.
 */
const LINE = sql.fragment`
  SELECT LEAST(pg_snapshot_xmax(s.snap), (
    SELECT min(x) FROM pg_snapshot_xip(s.snap) AS x
    WHERE NOT EXISTS (
      SELECT 1 FROM pg_stat_activity a WHERE a.backend_xid = xid(x) AND a.datname IS DISTINCT FROM current_database())))
  FROM (SELECT pg_current_snapshot() AS snap) s`;

/**
 * The ledger in export order, and the cursors. The read is gap-free: it returns only rows whose
 * transaction is older than the oldest transaction still running in the snapshot
 * (`pg_snapshot_xmin`), so every row that will ever sort before the last one returned is already
 * visible. A settlement batch that commits late is never skipped: its rows carry its own (older)
 * transaction id and wait below the line until it commits or aborts.
 */
export class LedgerFeed {
  constructor(private readonly db: DatabasePool) {}

  async cursor(target: TargetName): Promise<Cursor> {
    await this.db.query(sql.unsafe`INSERT INTO export_cursors (target) VALUES (${target}) ON CONFLICT (target) DO NOTHING`);
    const row = await this.db.one(sql.type(CursorSchema)`SELECT xact::text AS xact, last_id AS id FROM export_cursors WHERE target = ${target}`);
    return row;
  }

  /**
   * Up to `limit` entries after `after`, in (xact, id) order. The inner query is a bare keyset walk
   * (one range condition, ORDER BY, LIMIT): with no statistics the planner still walks
   * ledger_export_idx from the cursor and stops at `limit`, where a second range condition made it
   * pick a bitmap scan and a sort of everything past the cursor. The line (transactions older than
   * the snapshot's xmin) is applied outside: rows come in xact order, so it cuts a prefix, and what it
   * cuts is read again next time. The customer join runs on those rows only.
   */
  async after(after: Cursor, limit: number): Promise<readonly LedgerEntry[]> {
    return this.db.any(sql.type(LedgerEntrySchema)`
      SELECT l.id, l.xact::text AS xact, l.entry_key, l.account_id, l.key_id, l.kind, l.tool, l.delta_cents,
             l.agent_name, l.payer, l.created_at, sc.customer_id
      FROM (
        SELECT COALESCE(xact, '0'::xid8) AS xact, id, entry_key, account_id, key_id, kind, tool, delta_cents, agent_name, payer, created_at
        FROM ledger
        WHERE (COALESCE(xact, '0'::xid8), id) > (${after.xact}::xid8, ${after.id}::bigint)
        ORDER BY COALESCE(xact, '0'::xid8), id
        LIMIT ${limit}
      ) l
      LEFT JOIN stripe_customers sc ON sc.account_id = l.account_id
      WHERE l.xact < (${LINE})
      ORDER BY l.xact, l.id`);
  }

  /**
   * Moves the target's cursor to `to` if it is further on. Forward only, so an exporter that lost
   * its lock mid-batch and finishes late cannot move the cursor back over what another one sent.
   */
  async advance(target: TargetName, to: Cursor): Promise<boolean> {
    const moved = await this.db.maybeOne(sql.type(Moved)`
      UPDATE export_cursors SET xact = ${to.xact}::xid8, last_id = ${to.id}, updated_at = now()
      WHERE target = ${target} AND (xact, last_id) < (${to.xact}::xid8, ${to.id}::bigint)
      RETURNING target`);
    return moved !== null;
  }

  /** Ledger entries the target's cursor has not passed yet (capped at LAG_CAP). */
  async lag(target: TargetName): Promise<number> {
    const c = await this.cursor(target);
    const row = await this.db.one(sql.type(Count)`
      SELECT count(*)::int AS n FROM (
        SELECT 1 FROM ledger
        WHERE (COALESCE(xact, '0'::xid8), id) > (${c.xact}::xid8, ${c.id}::bigint)
        ORDER BY COALESCE(xact, '0'::xid8), id
        LIMIT ${LAG_CAP}
      ) behind`);
    return row.n;
  }
}
