-- Job intents (src/calls/intents.ts, issue 31): one narrow row per job a key's call was admitted for,
-- committed before the caller is told the job id (202, x-job-id, a stream's queued event) and before
-- the job is queued. It is the durable record that a job was accepted: if Redis loses the job, the
-- intent reconciler marks its intent 'lost' and GET /jobs/{id} answers 410 job_lost, never 404.
--
-- Written on the hot path (group commit: one multi-row INSERT for the admissions of a moment) and
-- never updated when things go right: a job is over once its job_results row exists (settlement,
-- a recorded failure, a cancel). Only the reconciler updates a row, 'accepted' -> 'lost'.
-- Kept JOB_RESULT_DAYS, like job_results. No foreign keys, for the same reason as job_results.
CREATE TABLE job_intents (
  -- The job id.
  id          text PRIMARY KEY,
  -- Which deployment's Redis has the job: the first four bytes of SHA-256 of its REDIS_PREFIX (several
  -- deployments, or test runs, may share one database; each reconciler looks only in its own Redis).
  deployment  integer NOT NULL,
  account_id  uuid NOT NULL,
  -- The key that made the call: only it (or its successors) reads the job.
  key_id      uuid,
  tool        text NOT NULL,
  -- SHA-256 of the request as its Idempotency-Key fingerprints it when the request had one (a retry
  -- with another body is refused), else of the tool's input.
  digest      bytea NOT NULL,
  -- SHA-256 of the Idempotency-Key with its scope (the key id), when the request had one: answers a
  -- retry after Redis lost the key's claim.
  idem        bytea,
  -- The request's root job, for steps of a chain or parallel request (a chain's root is its last step).
  root_id     text,
  state       text NOT NULL DEFAULT 'accepted' CHECK (state IN ('accepted', 'lost')),
  created_at  timestamptz NOT NULL DEFAULT now()
);
-- The reconciler's scan (from its watermark on) and pruning: rows arrive in created_at order, so a BRIN
-- index serves both for almost no write cost.
CREATE INDEX job_intents_created_brin ON job_intents USING brin (created_at);
-- A keyed retry after Redis lost the claim (only keyed requests pay for this index).
CREATE INDEX job_intents_idem_idx ON job_intents (idem) WHERE idem IS NOT NULL;
-- GET /jobs/{root} of a parallel request whose steps were lost (only chain and parallel steps).
CREATE INDEX job_intents_root_idx ON job_intents (root_id) WHERE root_id IS NOT NULL;

-- Per deployment, every intent created before `through` is resolved (its job_results row exists, it
-- was marked lost, or its job had ended in Redis when the reconciler looked): a pass scans from here on.
CREATE TABLE job_intents_watermark (
  deployment  integer PRIMARY KEY,
  through     timestamptz NOT NULL
);
