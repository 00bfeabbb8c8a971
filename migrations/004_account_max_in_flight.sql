-- Per-account cap on jobs in flight (queued or running). NULL: the plan's default
-- (free 2, starter 5, pro 20, enterprise ENTERPRISE_DEFAULT_MAX_IN_FLIGHT).
ALTER TABLE accounts ADD COLUMN IF NOT EXISTS max_in_flight integer CHECK (max_in_flight > 0);
