-- Self-service usage and key rotation (issue 15).
-- expires_at: a rotated key keeps working until then (KEY_ROTATION_GRACE_SECONDS); authentication
-- compares it with the clock on every request, cached or not. NULL: no expiry.
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS expires_at timestamptz;
-- Written at most once a minute per key (a Redis SET NX EX 60 guards the write), so not exact.
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS last_used_at timestamptz;
-- The key a rotation issued in this one's place.
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS replaced_by_key_id uuid REFERENCES api_keys (id);

-- GET /usage/entries pages by id, newest first, for an account or for one key.
CREATE INDEX IF NOT EXISTS ledger_account_id_idx ON ledger (account_id, id) WHERE account_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS ledger_key_id_idx ON ledger (key_id, id) WHERE key_id IS NOT NULL;
