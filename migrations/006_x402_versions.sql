-- x402 protocol version 2 beside version 1 (issue 14): which version the payer used, so the record
-- says how the payment arrived (the stored payload is always the v1 form, on our network name).
ALTER TABLE x402_payments ADD COLUMN x402_version smallint NOT NULL DEFAULT 1 CHECK (x402_version IN (1, 2));

-- Deferred settlement caps what each payer may have unsettled at once (X402_DEFERRED_MAX_CENTS):
-- the sum over a payer's open payments is read on every deferred admission.
CREATE INDEX x402_payments_open_by_payer ON x402_payments (payer) WHERE status IN ('reserved', 'awaiting_settlement');
