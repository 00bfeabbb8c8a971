-- Self-service (issue 15, parts 3 and 6): top-ups paid with x402, sign-up, partner attribution.

-- A top-up payment names the account it credits before it is settled, so a crash between settlement
-- and the credit is repaired from this row alone (src/pay/topup.ts creditSettledTopups).
ALTER TABLE x402_payments ADD COLUMN account_id uuid REFERENCES accounts (id);
CREATE INDEX x402_payments_topups_idx ON x402_payments (settled_at) WHERE account_id IS NOT NULL AND status = 'settled';

-- Real money received for a ledger line (top-ups: the settled payment; `credits add --paid-cents`:
-- what the operator was paid). NULL: none (opening balances, gifts, charges). Partner shares are
-- computed from it.
ALTER TABLE ledger ADD COLUMN paid_cents bigint CHECK (paid_cents IS NULL OR paid_cents >= 0);

CREATE TABLE partners (
  id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
  code        text NOT NULL CHECK (code ~ '^[A-Za-z0-9_-]{3,32}$'),
  created_at  timestamptz NOT NULL DEFAULT now()
);
-- Codes are typed by people: unique regardless of case.
CREATE UNIQUE INDEX partners_code_idx ON partners (lower(code));

-- One row per self-service sign-up; partner_id is the referral (NULL: none).
CREATE TABLE signups (
  account_id      uuid PRIMARY KEY REFERENCES accounts (id),
  email           text NOT NULL,
  partner_id      uuid REFERENCES partners (id),
  client_address  text,
  created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX signups_email_idx ON signups (lower(email));
CREATE INDEX signups_partner_idx ON signups (partner_id, created_at) WHERE partner_id IS NOT NULL;

-- What partners earn: one line per paid ledger line of a referred account, keyed by that line's
-- entry_key so a share is written once, in the same transaction as the credit.
-- share_cents = floor(revenue_cents * share_pct / 100): the fraction stays with the platform.
CREATE TABLE partner_ledger (
  id             bigserial PRIMARY KEY,
  entry_key      text NOT NULL UNIQUE,
  partner_id     uuid NOT NULL REFERENCES partners (id),
  account_id     uuid NOT NULL REFERENCES accounts (id),
  revenue_cents  bigint NOT NULL CHECK (revenue_cents >= 0),
  share_pct      smallint NOT NULL CHECK (share_pct BETWEEN 0 AND 100),
  share_cents    bigint NOT NULL CHECK (share_cents >= 0),
  created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX partner_ledger_month_idx ON partner_ledger (partner_id, created_at);
