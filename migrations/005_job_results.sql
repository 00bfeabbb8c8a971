-- The answer of every call made with a key, kept in Postgres next to its charge: a charge and its
-- result are one fact, written by one statement (settle_calls below), so a call that was charged can
-- always be answered, even after Redis lost the job. Kept JOB_RESULT_DAYS (src/money/results.ts prunes).
--
-- No foreign keys: this table is written on the hot path of every call and pruned in bulk; the
-- ledger row written in the same statement already carries the account and key references.
CREATE TABLE job_results (
  job_id       text PRIMARY KEY,
  account_id   uuid NOT NULL,
  -- The key that made the call; only that key can read it (GET /jobs, GET /jobs/{id}).
  key_id       uuid,
  tool         text NOT NULL,
  status       text NOT NULL CHECK (status IN ('completed', 'failed')),
  -- What the caller was told it paid (0 for free tools and sandbox keys).
  cost_cents   bigint NOT NULL DEFAULT 0,
  -- completed: the CallResult a sync call answers {result, cost_cents, remaining_credits, sandbox?};
  -- failed: the error {code, message, details?}.
  body         jsonb NOT NULL,
  -- The result was over RESULT_MAX_BYTES: body.result holds the start of its JSON text, as a string.
  truncated    boolean NOT NULL DEFAULT false,
  -- When the job was queued, and when its outcome was written.
  created_at   timestamptz NOT NULL,
  finished_at  timestamptz NOT NULL DEFAULT now()
);
-- GET /jobs: one key's calls, newest first, keyset pagination on (created_at, job_id).
CREATE INDEX job_results_key_idx ON job_results (key_id, created_at DESC, job_id DESC);
-- Pruning by age: rows arrive in finished_at order, so a BRIN index finds old ones for almost no
-- write cost on the hot path.
CREATE INDEX job_results_finished_brin ON job_results USING brin (finished_at);

-- Settlement of a batch of finished calls in one call (replaces settle_charges on the hot path; that
-- one stays for anything else still calling it). Planned once per connection and reused.
--
-- Input: a JSON array of {job_id, account_id, key_id, tool, amount, agent_name, usage, status, cost,
-- sandbox, truncated, created_ms, result}:
--   status 'completed': `amount` > 0 inserts a ledger row keyed by job_id (ON CONFLICT: skipped) and
--     moves the account's balance by the rows actually inserted; every row stores its answer
--     {result, cost_cents: cost, remaining_credits: the account's balance after the batch, sandbox?}.
--     A stored 'failed' outcome is replaced: the charge is real, so the call completed.
--   status 'failed': `result` is the error; stored unless the job already has an outcome or a charge.
-- Output, one row per input row: the account's balance after the batch, whether this row's outcome was
-- stored, and when not (the job already had one: a redelivery), that stored outcome, so the caller
-- answers with what was charged and recorded the first time.
CREATE FUNCTION settle_calls(batch jsonb)
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
    -- A failure is not recorded over a charge (the completed outcome is what stands).
    WHERE CASE WHEN i.status = 'completed' THEN true
      ELSE NOT EXISTS (SELECT 1 FROM ledger l WHERE l.entry_key = i.job_id) END
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
END;
$$;
