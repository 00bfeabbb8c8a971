-- Usage export (src/pay/export): every ledger entry sent once, in order, to each billing target.
--
-- Ledger ids come from a sequence, but settlement batches from many processes commit out of id
-- order, so "id > last exported id" would skip a row whose transaction commits after a higher id was
-- exported. Each row therefore records the transaction that inserted it, and the exporter reads only
-- rows whose transaction is older than every transaction still running (the snapshot's xmin): no row
-- can appear later below that line. Rows are read in (xact, id) order with the cursor on that pair.
--
-- The column is added without a default first so the existing rows stay NULL (a volatile default
-- would rewrite the whole table); they were all committed before this migration, and count as
-- transaction 0, so they are exported first, by id. Only the default touches the settlement path:
-- settle_calls and every other INSERT INTO ledger are unchanged.
ALTER TABLE ledger ADD COLUMN xact xid8;
ALTER TABLE ledger ALTER COLUMN xact SET DEFAULT pg_current_xact_id();

-- The one index the export reads by: a range scan from the cursor in export order, which the planner
-- picks for ORDER BY ... LIMIT even without statistics (autovacuum may be off).
CREATE INDEX ledger_export_idx ON ledger ((COALESCE(xact, '0'::xid8)), id);

-- One cursor per target: the last (xact, id) the target accepted. Moved only forward, only after
-- the target answered the batch.
CREATE TABLE export_cursors (
  target      text PRIMARY KEY CHECK (target IN ('cloudevents', 'stripe')),
  xact        xid8 NOT NULL DEFAULT '0',
  last_id     bigint NOT NULL DEFAULT 0,
  exported    bigint NOT NULL DEFAULT 0,
  updated_at  timestamptz NOT NULL DEFAULT now()
);
