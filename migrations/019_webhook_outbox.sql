-- Webhook deliveries through a Postgres outbox (src/calls/webhooks.ts, issue #31): a Redis outage or
-- a Redis that comes back empty delays a delivery, never drops one.
--
-- webhook_jobs becomes the outbox. Its row is written in the same transaction as what it reports: a
-- job's settlement (src/money/settlement.ts runs settle_calls and this insert as one statement), a
-- spend alert's event (alert_check below), a cancel (after its job_results row), a chain or parallel
-- request's acceptance (before its flow is queued). The job id is the key, so a job settled twice has
-- one row. A relay in every worker process claims due rows (FOR UPDATE SKIP LOCKED, so replicas never
-- send one row at the same time), POSTs them and records the outcome here: a row is done once it was
-- delivered or given up after WEBHOOK_ATTEMPTS, and until then it is due again (a retry's backoff, or
-- the lease of a relay that died mid-attempt).
--
-- scope: the deployment's REDIS_PREFIX. Replicas of one deployment share it; deployments (and test
--   runs) sharing a database deliver their own rows only. Rows from before this migration have ''
--   and are adopted by the first relay that starts.
-- delivery_id: Standard Webhooks' webhook-id, fixed when the row is written, so every attempt (and a
--   resend after a crash) carries the same one and receivers can drop duplicates.
-- event: an account event's type (sent as tollgate-event), null for a job's outcome.
-- flow: a chain or parallel request, whose body is stored when it ends; it is not sent before.
-- attempts: attempts started (counted when claimed, so one that died mid-way still counts).
-- next_at: when the row is next due (its next attempt, or its next look at a flow that runs).
-- done_at: delivered (delivered_at too) or given up; the row then leaves the partial index.
ALTER TABLE webhook_jobs
  ADD COLUMN scope text NOT NULL DEFAULT '',
  ADD COLUMN delivery_id text,
  ADD COLUMN event text,
  ADD COLUMN flow boolean NOT NULL DEFAULT false,
  ADD COLUMN attempts integer NOT NULL DEFAULT 0,
  ADD COLUMN next_at timestamptz NOT NULL DEFAULT now(),
  ADD COLUMN done_at timestamptz;

-- Rows from before: an event's id is its webhook-id; a job's is the one its attempts carried.
UPDATE webhook_jobs w SET delivery_id = 'evt_' || e.id, event = e.type FROM alert_events e WHERE w.job_id = 'evt_' || e.id;
UPDATE webhook_jobs w SET delivery_id = d.delivery_id, attempts = d.n
FROM (SELECT job_id, max(delivery_id) AS delivery_id, count(*)::int AS n FROM webhook_deliveries GROUP BY job_id) d
WHERE w.job_id = d.job_id AND w.delivery_id IS NULL;
UPDATE webhook_jobs SET delivery_id = 'dlv_' || gen_random_uuid() WHERE delivery_id IS NULL;
-- Delivered, or older than the whole retry policy (its queue gave up long since): done. The others
-- (their deliveries were on the Redis queue this replaces) are due now, with their attempts so far.
UPDATE webhook_jobs SET done_at = COALESCE(delivered_at, now())
WHERE delivered_at IS NOT NULL OR created_at < now() - interval '2 days';

ALTER TABLE webhook_jobs
  ALTER COLUMN delivery_id SET DEFAULT 'dlv_' || gen_random_uuid(),
  ALTER COLUMN delivery_id SET NOT NULL;

-- The relay's claim: undone rows of one deployment by when they are due. Partial, so it holds only
-- what is outstanding; the claim's shape (scope equal, next_at ordered, LIMIT) uses it on a table
-- never analysed.
CREATE INDEX webhook_jobs_due ON webhook_jobs (scope, next_at) WHERE done_at IS NULL;

-- An event is in the outbox in the statement that inserts it (below), so "queued" is no longer a state.
DROP INDEX alert_events_unqueued;
ALTER TABLE alert_events DROP COLUMN queued_at;

-- alert_check as in 017_alerts.sql, except: the event's outbox row carries its webhook-id, type and
-- scope, and only the events inserted now are returned (nothing waits to be queued any more).
DROP FUNCTION alert_check(jsonb);
CREATE FUNCTION alert_check(batch jsonb, outbox_scope text)
RETURNS TABLE (id uuid, account_id uuid, type text, url text, body jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  month_start timestamptz := date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
  month text := to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM');
BEGIN
  RETURN QUERY
  WITH input AS (
    SELECT DISTINCT x.account_id, x.key_id FROM jsonb_to_recordset(batch) AS x(account_id uuid, key_id uuid)
  ), s AS (
    SELECT st.* FROM alert_settings st WHERE st.account_id IN (SELECT i.account_id FROM input i)
  ), capped AS (
    SELECT k.id AS key_id, k.type AS key_type, k.name AS key_name, k.monthly_limit_cents AS cap, s.account_id, s.cap_percents, s.url,
      (SELECT COALESCE(-SUM(l.delta_cents), 0) FROM ledger l
        WHERE l.key_id = k.id AND l.kind = 'charge' AND l.created_at >= month_start)::bigint AS used
    FROM s JOIN input i ON i.account_id = s.account_id
    JOIN api_keys k ON k.id = i.key_id AND k.account_id = s.account_id
    WHERE k.type IN ('sub', 'grant') AND k.monthly_limit_cents IS NOT NULL AND cardinality(s.cap_percents) > 0
  ), crossed AS (
    SELECT c.account_id, 'spend.threshold_crossed'::text AS type, c.key_id, p::bigint AS threshold, month AS period, c.url,
      jsonb_build_object('type', 'spend.threshold_crossed', 'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
        'data', jsonb_build_object('key_id', c.key_id, 'key_type', c.key_type, 'key_name', c.key_name, 'percent', p,
          'used_cents', c.used, 'cap_cents', c.cap, 'period', month)) AS body
    FROM capped c CROSS JOIN LATERAL unnest(c.cap_percents) AS p
    WHERE c.used * 100 >= p::bigint * c.cap
    UNION ALL
    SELECT s.account_id, 'balance.low', NULL::uuid, s.balance_below_cents, to_char(s.balance_since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), s.url,
      jsonb_build_object('type', 'balance.low', 'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
        'data', jsonb_build_object('balance_cents', a.credits, 'threshold_cents', s.balance_below_cents))
    FROM s JOIN accounts a ON a.id = s.account_id
    WHERE s.balance_below_cents IS NOT NULL AND a.credits < s.balance_below_cents
  ), ins AS (
    INSERT INTO alert_events AS e (account_id, type, key_id, threshold, period, url, body)
    SELECT * FROM crossed
    ON CONFLICT (account_id, type, COALESCE(key_id, '00000000-0000-0000-0000-000000000000'::uuid), threshold, period) DO NOTHING
    RETURNING e.id, e.account_id, e.type, e.url, e.body
  ), hooks AS (
    -- The event's outbox row (its delivery, and what GET /alerts shows of its attempts), written with it.
    INSERT INTO webhook_jobs (job_id, account_id, url, body, scope, delivery_id, event)
    SELECT 'evt_' || ins.id, ins.account_id, ins.url, ins.body, outbox_scope, 'evt_' || ins.id, ins.type FROM ins
    ON CONFLICT (job_id) DO NOTHING
  )
  SELECT ins.id, ins.account_id, ins.type, ins.url, ins.body FROM ins;
END;
$$;
