-- Webhooks for async jobs (src/calls/webhooks.ts).
--
-- webhook_secrets: one signing secret per account, sealed (AES-256-GCM under EDGE_TOKEN_KEY, the
-- sealer of src/services/edge-token.ts), so a database dump does not hand out the secrets.
CREATE TABLE webhook_secrets (
  account_id  uuid PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
  sealed      text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now()
);

-- webhook_jobs: a job that ended with a Callback-Url, written when its delivery is queued (by
-- settlement, worker side). delivered_at is set by the first 2xx.
CREATE TABLE webhook_jobs (
  job_id        text PRIMARY KEY,
  account_id    uuid NOT NULL,
  url           text NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT now(),
  delivered_at  timestamptz
);
CREATE INDEX webhook_jobs_created_brin ON webhook_jobs USING brin (created_at);

-- webhook_deliveries: every delivery attempt, as GET /jobs/{id} shows them.
CREATE TABLE webhook_deliveries (
  id           bigserial PRIMARY KEY,
  job_id       text NOT NULL REFERENCES webhook_jobs (job_id) ON DELETE CASCADE,
  delivery_id  text NOT NULL,
  attempt      integer NOT NULL,
  at           timestamptz NOT NULL DEFAULT now(),
  -- HTTP status of the answer; null when there was none (refused, timeout, connection error).
  status       integer,
  ok           boolean NOT NULL,
  error        text
);
CREATE INDEX webhook_deliveries_job_idx ON webhook_deliveries (job_id, id);
