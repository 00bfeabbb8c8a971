import { randomBytes, randomUUID } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { migrate } from '../../src/db/migrate.js';
import { ensureDatabase } from '../../src/db/pool.js';

/**
 * Settlement's statements walk their indexes however little Postgres knows about the tables
 * (migrations/024_plans_without_statistics.sql). On a fresh database whose tables were analysed while
 * empty (the statistics say 0 rows) and are never analysed again, one long-lived connection settles
 * batch after batch, as a pooled connection does, and Postgres's own counters must show no
 * sequential scan of job_results, ledger or accounts. Before the fix the same run scanned job_results
 * once per call of each batch (20,302 scans reading 201 million rows over 20,000 calls).
 */

const BATCHES = 150;
const SIZE = 50;
const TABLES = ['accounts', 'job_results', 'ledger'];

let url: string;
let admin: pg.Client;
let c: pg.Client;

beforeAll(async () => {
  const u = new URL(inject('databaseUrl'));
  u.pathname = `/tollgate_plans_${randomBytes(4).toString('hex')}`;
  url = u.toString();
  await ensureDatabase(url);
  await migrate(url);
  c = new pg.Client({ connectionString: url });
  await c.connect();
  admin = new pg.Client({ connectionString: inject('databaseUrl') });
  await admin.connect();
  for (const t of TABLES) {
    // Whatever the server's autovacuum setting: these statistics are the only ones the tables get.
    await c.query(`ALTER TABLE ${t} SET (autovacuum_enabled = false)`);
    await c.query(`ANALYZE ${t}`);
  }
}, 60_000);

afterAll(async () => {
  await c?.end();
  await admin?.query(`DROP DATABASE IF EXISTS ${new URL(url).pathname.slice(1)} WITH (FORCE)`);
  await admin?.end();
});

/** Sequential scans of each table so far, and rows read through its indexes, as Postgres counts them (this session's counts flushed first). */
async function scans(): Promise<{ seq: Record<string, number>; indexRows: Record<string, number> }> {
  await c.query('SELECT pg_stat_force_next_flush()');
  const { rows } = await c.query<{ relname: string; seq_scan: string; idx_tup_read: string }>(
    `SELECT s.relname, s.seq_scan, COALESCE(sum(i.idx_tup_read), 0) AS idx_tup_read
     FROM pg_stat_user_tables s LEFT JOIN pg_stat_user_indexes i ON i.relid = s.relid
     WHERE s.relname = ANY($1::text[]) GROUP BY s.relname, s.seq_scan`,
    [TABLES],
  );
  return {
    seq: Object.fromEntries(rows.map((r) => [r.relname, Number(r.seq_scan)])),
    indexRows: Object.fromEntries(rows.map((r) => [r.relname, Number(r.idx_tup_read)])),
  };
}

describe('plans that do not depend on statistics', () => {
  it(`${BATCHES} settlement batches of ${SIZE} on one connection, tables analysed while empty: no sequential scan`, async () => {
    const { rows } = await c.query<{ id: string }>(`INSERT INTO accounts (plan, credits) SELECT 'pro', 1000000000 FROM generate_series(1, 20) RETURNING id`);
    const accounts = rows.map((r) => r.id);
    const before = await scans();
    let charged = 0;
    for (let b = 0; b < BATCHES; b++) {
      const batch = Array.from({ length: SIZE }, (_, i) => ({
        job_id: `core-${randomUUID()}`,
        account_id: accounts[(b + i) % accounts.length],
        key_id: null,
        tool: 'compute',
        amount: 2,
        agent_name: null,
        usage: null,
        // A few failures: their path checks the ledger for a charge under the same key.
        status: i % 10 === 9 ? 'failed' : 'completed',
        cost: 2,
        sandbox: false,
        truncated: false,
        created_ms: Date.now(),
        result: i % 10 === 9 ? { error: { code: 'upstream_error', message: 'x' } } : { value: 2 },
      }));
      const out = await c.query({
        name: 'settle_calls',
        text: 'SELECT job_id, credits, stored, prior_status, prior_body, prior_truncated FROM settle_calls($1::jsonb)',
        values: [JSON.stringify(batch)],
      });
      expect(out.rows).toHaveLength(SIZE);
      charged += batch.filter((x) => x.status === 'completed').length;
    }
    const after = await scans();
    expect(Object.fromEntries(TABLES.map((t) => [t, after.seq[t]! - before.seq[t]!]))).toEqual({ accounts: 0, job_results: 0, ledger: 0 });
    // Lookups, not walks: a plan that hashed a whole index would read the growing table once per batch
    // (about BATCHES^2 * SIZE / 2 rows in all); lookups read a few rows per call.
    for (const t of TABLES) expect(after.indexRows[t]! - before.indexRows[t]!, t).toBeLessThan(BATCHES * SIZE * 5);
    // And the batches did what settlement does: every call's answer stored, every completed call charged once.
    const { rows: counts } = await c.query<{ results: string; charges: string }>(
      `SELECT (SELECT count(*) FROM job_results) AS results, (SELECT count(*) FROM ledger WHERE kind = 'charge') AS charges`,
    );
    expect(counts[0]).toEqual({ results: String(BATCHES * SIZE), charges: String(charged) });
  }, 120_000);
});
