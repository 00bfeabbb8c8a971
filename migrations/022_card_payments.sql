-- Card payments through Stripe (src/pay/card). Every webhook event is recorded here in the same
-- transaction as its effect, so a replayed, duplicated or concurrently delivered event (two API
-- replicas) changes nothing the second time.
CREATE TABLE stripe_events (
  id           text PRIMARY KEY CHECK (id ~ '^evt_[A-Za-z0-9_]+$'),
  type         text NOT NULL,
  account_id   uuid REFERENCES accounts (id),
  received_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per Checkout top-up credited: what was paid, and how much of it has been taken back by
-- refunds (refunded_cents: Stripe's cumulative amount_refunded already handled) and how much of
-- those refunds could not be debited because the credits were already spent (shortfall_cents).
CREATE TABLE card_topups (
  session_id       text PRIMARY KEY CHECK (session_id ~ '^cs_[A-Za-z0-9_]+$'),
  account_id       uuid NOT NULL REFERENCES accounts (id),
  payment_intent   text UNIQUE,
  amount_cents     bigint NOT NULL CHECK (amount_cents > 0),
  refunded_cents   bigint NOT NULL DEFAULT 0 CHECK (refunded_cents >= 0 AND refunded_cents <= amount_cents),
  shortfall_cents  bigint NOT NULL DEFAULT 0 CHECK (shortfall_cents >= 0),
  created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX card_topups_account_idx ON card_topups (account_id, created_at);

-- A dispute freezes what it covers: debited when first seen open, given back if it is won, kept if
-- lost. debited_cents is what was actually taken (never more than the balance then);
-- shortfall_cents what could not be.
CREATE TABLE card_disputes (
  dispute_id       text PRIMARY KEY CHECK (dispute_id ~ '^dp_[A-Za-z0-9_]+$'),
  session_id       text NOT NULL REFERENCES card_topups (session_id),
  account_id       uuid NOT NULL REFERENCES accounts (id),
  amount_cents     bigint NOT NULL CHECK (amount_cents >= 0),
  debited_cents    bigint NOT NULL DEFAULT 0 CHECK (debited_cents >= 0),
  shortfall_cents  bigint NOT NULL DEFAULT 0 CHECK (shortfall_cents >= 0),
  status           text NOT NULL CHECK (status IN ('open', 'won', 'lost')),
  updated_at       timestamptz NOT NULL DEFAULT now()
);

-- The plan a subscription gives its account. `plan` is the one in force; `period_end` ends the
-- period it was paid for; `pending_plan` a lower plan (or 'free' for a cancellation) that takes
-- effect when that period ends.
CREATE TABLE card_subscriptions (
  subscription_id       text PRIMARY KEY CHECK (subscription_id ~ '^sub_[A-Za-z0-9_]+$'),
  account_id            uuid NOT NULL REFERENCES accounts (id),
  customer_id           text NOT NULL,
  status                text NOT NULL,
  price_id              text,
  plan                  text NOT NULL CHECK (plan IN ('free', 'starter', 'pro', 'enterprise')),
  pending_plan          text CHECK (pending_plan IN ('free', 'starter', 'pro', 'enterprise')),
  period_end            timestamptz,
  cancel_at_period_end  boolean NOT NULL DEFAULT false,
  updated_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX card_subscriptions_account_idx ON card_subscriptions (account_id);
