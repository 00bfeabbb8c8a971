-- Accounts, API keys and the append-only credit ledger.
CREATE EXTENSION IF NOT EXISTS pgcrypto;

CREATE TABLE accounts (
  id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  name        text,
  plan        text NOT NULL CHECK (plan IN ('free', 'starter', 'pro', 'enterprise')),
  -- Integer cents. Admission reserves in Redis; settlement moves this in batched transactions.
  credits     bigint NOT NULL DEFAULT 0,
  -- Custom requests-per-minute for enterprise accounts (NULL = the default).
  rpm         integer CHECK (rpm IS NULL OR rpm > 0),
  elite       boolean NOT NULL DEFAULT false,
  created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
  id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  account_id           uuid NOT NULL REFERENCES accounts (id),
  -- SHA-256 of the whole key, hex. The key itself is never stored.
  key_hash             text NOT NULL UNIQUE,
  display_prefix       text NOT NULL,
  type                 text NOT NULL CHECK (type IN ('production', 'sub', 'test', 'agent', 'vip')),
  name                 text,
  -- Sub-keys only: monthly spending cap in cents and the tools they may call.
  monthly_limit_cents  bigint CHECK (monthly_limit_cents IS NULL OR monthly_limit_cents > 0),
  allowed_tools        text[],
  created_by_key_id    uuid REFERENCES api_keys (id),
  created_at           timestamptz NOT NULL DEFAULT now(),
  revoked_at           timestamptz
);
CREATE INDEX api_keys_account_idx ON api_keys (account_id);

-- Every movement of credits. A charge is keyed by its job id, so settling the same job twice is a
-- no-op. Top-ups and the opening balance are entries too, so SUM(delta_cents) = accounts.credits.
CREATE TABLE ledger (
  id           bigserial PRIMARY KEY,
  entry_key    text NOT NULL UNIQUE,
  -- NULL only for calls paid per call (x402), which are recorded under the payer's address.
  account_id   uuid REFERENCES accounts (id),
  key_id       uuid REFERENCES api_keys (id),
  kind         text NOT NULL CHECK (kind IN ('charge', 'topup', 'opening', 'payment')),
  tool         text,
  delta_cents  bigint NOT NULL,
  agent_name   text,
  payer        text,
  usage        jsonb,
  created_at   timestamptz NOT NULL DEFAULT now(),
  CHECK (account_id IS NOT NULL OR payer IS NOT NULL)
);
CREATE INDEX ledger_account_idx ON ledger (account_id, created_at);
CREATE INDEX ledger_key_month_idx ON ledger (key_id, created_at) WHERE key_id IS NOT NULL;
