-- A replacement key reads and cancels the jobs of the keys it replaced: authentication walks
-- replaced_by_key_id backwards from the key, so that walk needs its index.
CREATE INDEX IF NOT EXISTS api_keys_replaced_by_idx ON api_keys (replaced_by_key_id) WHERE replaced_by_key_id IS NOT NULL;
