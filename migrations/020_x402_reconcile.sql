-- x402 payments left 'reserved' by a crash (issue 31): what the payment reconciler
-- (src/pay/x402/reconcile.ts) needs to tell "never settled" from "settled, but the API died before it
-- recorded it", and what a retry of the same payment is answered with.
--
-- settling_at is written (compare-and-set from 'reserved') before the settlement is attempted, in the
-- same statement as the answer it pays for: a reserved row without it never reached settlement and is
-- released; one with it is looked up (the chain) and completed or released. A settlement that was
-- sent records its transaction at once (tx_hash), so its receipt decides.
ALTER TABLE x402_payments
  ADD COLUMN settling_at         timestamptz,
  -- The answer the payment buys ({status, headers, body}), kept so a retry of the same request with
  -- the same payment is answered with it once the payment is settled. NULL for top-ups.
  ADD COLUMN answer              jsonb,
  -- Idempotency fingerprint of the request (method, path, body): a retry must repeat it to get the answer.
  ADD COLUMN request_fingerprint text,
  -- The first job the payment paid for: the ledger entry's key (x402:<payment id>:<job id>).
  ADD COLUMN job_id              text;

-- The reconciler's pass: reserved rows oldest first. Partial, so it stays as small as the number of
-- calls in flight and serves the pass without statistics.
CREATE INDEX x402_payments_reserved_idx ON x402_payments (created_at) WHERE status = 'reserved';
