-- x402 pay-per-call: one row per signed payment authorization we accepted.
--
-- The unique key is the replay guard. EIP-3009 makes a nonce single-use per (token contract, payer),
-- and a contract address is only meaningful on its chain, so (chain_id, asset, payer, nonce) names
-- one authorization exactly. Inserting it is the atomic "this token is now spent" step: of two
-- requests carrying the same token, one insert wins and the other finds the row already there.
CREATE TABLE x402_payments (
  id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  chain_id              integer NOT NULL,
  -- Addresses and the nonce are stored lower-case so the unique key ignores checksum casing.
  asset                 text NOT NULL CHECK (asset ~ '^0x[0-9a-f]{40}$'),
  payer                 text NOT NULL CHECK (payer ~ '^0x[0-9a-f]{40}$'),
  nonce                 text NOT NULL CHECK (nonce ~ '^0x[0-9a-f]{64}$'),
  network               text NOT NULL,
  -- Token atomic units (USDC: 10,000 per cent); numeric because uint256 exceeds bigint.
  value_atomic          numeric(78, 0) NOT NULL CHECK (value_atomic > 0),
  pay_to                text NOT NULL CHECK (pay_to ~ '^0x[0-9a-f]{40}$'),
  tool                  text NOT NULL,
  resource              text NOT NULL,
  -- The authorization is worthless on chain after this (unix seconds); settle before it.
  valid_before          numeric(78, 0) NOT NULL,
  status                text NOT NULL DEFAULT 'reserved'
                        CHECK (status IN ('reserved', 'settled', 'awaiting_settlement', 'failed')),
  -- Everything a facilitator's /settle needs, as received and as offered: the signed PaymentPayload
  -- (signature + authorization) and the PaymentRequirements it was checked against.
  payment_payload       jsonb NOT NULL,
  payment_requirements  jsonb NOT NULL,
  tx_hash               text,
  error                 text,
  created_at            timestamptz NOT NULL DEFAULT now(),
  settled_at            timestamptz,
  UNIQUE (chain_id, asset, payer, nonce)
);

-- The operator's queue of locally verified payments still to be submitted on chain.
CREATE INDEX x402_payments_awaiting_idx ON x402_payments (created_at) WHERE status = 'awaiting_settlement';
CREATE INDEX x402_payments_payer_idx ON x402_payments (payer, created_at);
