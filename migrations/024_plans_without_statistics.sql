-- The hot-path functions keep one cached plan per connection, pinned to index lookups: no sequential
-- scan, no hash or merge join, whatever the planner's statistics say.
--
-- PL/pgSQL caches each statement's plan per connection and, after five calls, keeps a generic plan. A
-- connection that settled its first batches while job_results was nearly empty kept a plan that scanned
-- job_results once per call of every batch, for as long as the pooled connection lived, whatever
-- ANALYZE later learned. Every join in these functions starts from the batch (at most a few hundred
-- rows from jsonb_to_recordset) and looks up rows by primary or unique key, so a nested loop over index
-- lookups is the right plan for a table of any size, statistics or none. With only the scans priced
-- out a generic plan still hashed a whole index; with the joins pinned too it does not. Replanning
-- every call instead (plan_cache_mode = force_custom_plan) also stayed flat, but cost more per batch.
-- Measured on a fresh database with autovacuum off, one connection settling batches (ms per batch,
-- first 200 batches against last 200):
--   nothing pinned                     batches of 50:  17.8 -> 234 over 20,000 calls (a scan per call)
--   custom plans, scans off            batches of 50:  6.4 -> 6.5     batches of 1: 1.9 -> 1.5
--   this                               batches of 50:  4.3 -> 3.8     batches of 1: 1.0 -> 0.7
-- The settings hold only while the function runs.
--
-- settle_calls is also replaced (as in 009_cancel.sql, one clause changed): its check that a failure
-- is not recorded over a charge was a NOT EXISTS inside a CASE, which Postgres ran as a hashed subplan
-- reading the whole ledger in every batch with a failure; it is a join looked up per call now.
-- CREATE OR REPLACE drops a function's settings, so they are set after it.
CREATE OR REPLACE FUNCTION settle_calls(batch jsonb)
RETURNS TABLE (job_id text, credits bigint, stored boolean, prior_status text, prior_body jsonb, prior_truncated boolean)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY
  WITH input AS (
    SELECT * FROM jsonb_to_recordset(batch) AS x(
      job_id text, account_id uuid, key_id uuid, tool text, amount bigint, agent_name text, usage jsonb,
      status text, cost bigint, sandbox boolean, truncated boolean, created_ms bigint, result jsonb)
  ), ins AS (
    INSERT INTO ledger (entry_key, account_id, key_id, kind, tool, delta_cents, agent_name, usage)
    SELECT i.job_id, i.account_id, i.key_id, 'charge', i.tool, -i.amount, i.agent_name, i.usage
    FROM input i WHERE i.status = 'completed' AND i.amount > 0
      -- A cancelled job is never charged (DELETE /jobs/{id} wrote its outcome first).
      AND NOT EXISTS (SELECT 1 FROM job_results c WHERE c.job_id = i.job_id AND c.status = 'cancelled')
    ON CONFLICT (entry_key) DO NOTHING
    RETURNING ledger.account_id, ledger.delta_cents
  ), agg AS (
    SELECT ins.account_id, SUM(ins.delta_cents) AS d FROM ins GROUP BY ins.account_id
  ), upd AS (
    UPDATE accounts a SET credits = a.credits + agg.d FROM agg WHERE a.id = agg.account_id
    RETURNING a.id, a.credits
  ), bal AS (
    SELECT a.id, COALESCE(upd.credits, a.credits) AS credits
    FROM accounts a LEFT JOIN upd ON upd.id = a.id
    WHERE a.id IN (SELECT i.account_id FROM input i)
  ), res AS (
    INSERT INTO job_results AS r (job_id, account_id, key_id, tool, status, cost_cents, body, truncated, created_at)
    SELECT i.job_id, i.account_id, i.key_id, i.tool, i.status, COALESCE(i.cost, 0),
      CASE WHEN i.status = 'completed'
        THEN jsonb_build_object('result', i.result, 'cost_cents', COALESCE(i.cost, 0), 'remaining_credits', b.credits)
          || CASE WHEN i.sandbox THEN '{"sandbox": true}'::jsonb ELSE '{}'::jsonb END
        ELSE i.result END,
      COALESCE(i.truncated, false),
      COALESCE('epoch'::timestamptz + i.created_ms * interval '1 millisecond', now())
    FROM input i LEFT JOIN bal b ON b.id = i.account_id
    -- A failure is not recorded over a charge (the completed outcome is what stands). A join, looked
    -- up per call: as a NOT EXISTS under CASE it became a hashed subplan reading all of ledger.
    LEFT JOIN ledger charged ON charged.entry_key = i.job_id AND i.status <> 'completed'
    WHERE i.status = 'completed' OR charged.entry_key IS NULL
    ON CONFLICT ON CONSTRAINT job_results_pkey DO UPDATE
      SET status = EXCLUDED.status, cost_cents = EXCLUDED.cost_cents, body = EXCLUDED.body,
          truncated = EXCLUDED.truncated, finished_at = EXCLUDED.finished_at
      WHERE r.status = 'failed' AND EXCLUDED.status = 'completed'
    RETURNING r.job_id
  )
  SELECT i.job_id, b.credits, res.job_id IS NOT NULL, p.status, p.body, p.truncated
  FROM input i
  LEFT JOIN bal b ON b.id = i.account_id
  LEFT JOIN res ON res.job_id = i.job_id
  -- The outcome already there (read from the statement's snapshot, so never the row written above).
  LEFT JOIN job_results p ON p.job_id = i.job_id AND res.job_id IS NULL;
  -- A cancel that committed after this statement's snapshot was taken (so the guard above missed it)
  -- and before its job_results insert (which then found the cancelled row): the charge inserted above
  -- must not stand. Read now, with a fresh snapshot that sees that cancel; the whole batch is retried
  -- (40001, src/money/settlement.ts) and then skips the charge.
  IF EXISTS (
    SELECT 1 FROM jsonb_to_recordset(batch) AS x(job_id text, status text, amount bigint)
    JOIN job_results c ON c.job_id = x.job_id AND c.status = 'cancelled'
    JOIN ledger l ON l.entry_key = x.job_id
    WHERE x.status = 'completed' AND x.amount > 0
  ) THEN
    RAISE EXCEPTION 'a job of this batch was cancelled while it settled' USING ERRCODE = '40001';
  END IF;
END;
$$;

ALTER FUNCTION settle_calls(jsonb) SET enable_seqscan = off;
ALTER FUNCTION settle_calls(jsonb) SET enable_hashjoin = off;
ALTER FUNCTION settle_calls(jsonb) SET enable_mergejoin = off;
ALTER FUNCTION alert_check(jsonb, text) SET enable_seqscan = off;
ALTER FUNCTION alert_check(jsonb, text) SET enable_hashjoin = off;
ALTER FUNCTION alert_check(jsonb, text) SET enable_mergejoin = off;
