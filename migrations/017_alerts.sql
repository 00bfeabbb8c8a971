-- Spend alerts (src/calls/alerts.ts, issue 30): an account's thresholds, and every event they sent.
--
-- alert_settings: one row per account (PUT /alerts). cap_percents are percents of each sub-key's or
-- OAuth grant's monthly cap; balance_below_cents a balance under which balance.low is sent.
-- balance_since starts the current balance.low period: set when the settings change, and by the
-- trigger below whenever the balance rises from under the threshold to at or over it again.
CREATE TABLE alert_settings (
  account_id           uuid PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
  cap_percents         integer[] NOT NULL DEFAULT '{}',
  balance_below_cents  bigint CHECK (balance_below_cents IS NULL OR balance_below_cents > 0),
  url                  text NOT NULL,
  balance_since        timestamptz NOT NULL DEFAULT now(),
  created_at           timestamptz NOT NULL DEFAULT now(),
  updated_at           timestamptz NOT NULL DEFAULT now(),
  CHECK (1 <= ALL (cap_percents) AND 100 >= ALL (cap_percents))
);

-- alert_events: one row per threshold crossed per period, which is what makes an event exactly once:
-- every replica that sees a crossing inserts the same (account, key, threshold, period) with
-- ON CONFLICT DO NOTHING, and only the one whose insert lands delivers it. Spend thresholds: key_id
-- the key, threshold the percent, period the calendar month (UTC, YYYY-MM). balance.low: key_id
-- NULL, threshold the cents, period balance_since. Its delivery is a webhook_jobs row 'evt_<id>'
-- (src/calls/webhooks.ts); queued_at is set once it is on the delivery queue, so one whose queueing
-- was lost (a crash, Redis down) is queued by the next check of its account.
CREATE TABLE alert_events (
  id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  seq         bigserial NOT NULL UNIQUE,
  account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  type        text NOT NULL CHECK (type IN ('spend.threshold_crossed', 'balance.low')),
  key_id      uuid REFERENCES api_keys (id),
  threshold   bigint NOT NULL,
  period      text NOT NULL,
  url         text NOT NULL,
  body        jsonb NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  queued_at   timestamptz
);
CREATE UNIQUE INDEX alert_events_once ON alert_events
  (account_id, type, COALESCE(key_id, '00000000-0000-0000-0000-000000000000'::uuid), threshold, period);
-- GET /alerts pages an account's events, newest first.
CREATE INDEX alert_events_account_seq ON alert_events (account_id, seq);
CREATE INDEX alert_events_unqueued ON alert_events (account_id) WHERE queued_at IS NULL;

-- A new balance.low period whenever the balance rises back to the threshold or over it, whatever
-- raised it (a top-up, an operator's credit). Charges lower the balance, so the WHEN clause keeps
-- this off the settlement path.
CREATE FUNCTION alert_balance_rearm() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE alert_settings SET balance_since = clock_timestamp()
  WHERE account_id = NEW.id AND balance_below_cents IS NOT NULL
    AND OLD.credits < balance_below_cents AND NEW.credits >= balance_below_cents;
  RETURN NULL;
END;
$$;
CREATE TRIGGER accounts_alert_rearm AFTER UPDATE OF credits ON accounts
  FOR EACH ROW WHEN (NEW.credits > OLD.credits) EXECUTE FUNCTION alert_balance_rearm();

-- One check of an account's thresholds (src/calls/alerts.ts), run after a settlement batch commits
-- and when settings are saved. `batch`: [{account_id, key_id}], the keys charged (key_id null: the
-- balance only). It reads the state as committed when it starts, so of two replicas' checks the later
-- sees both charges: a threshold is never missed, and the unique index above sends it once.
-- Returns the events to queue: those inserted now, and earlier ones of these accounts not yet queued.
CREATE FUNCTION alert_check(batch jsonb)
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
    -- The delivery's record (what GET /alerts shows of its attempts), written with the event.
    INSERT INTO webhook_jobs (job_id, account_id, url, body)
    SELECT 'evt_' || ins.id, ins.account_id, ins.url, ins.body FROM ins
    ON CONFLICT (job_id) DO NOTHING
  )
  SELECT ins.id, ins.account_id, ins.type, ins.url, ins.body FROM ins
  UNION ALL
  SELECT e.id, e.account_id, e.type, e.url, e.body FROM alert_events e
  WHERE e.account_id IN (SELECT i.account_id FROM input i) AND e.queued_at IS NULL;
END;
$$;
