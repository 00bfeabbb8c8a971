-- The operators' audit log (src/ops/audit.ts): one row per change made through the admin API or the
-- admin CLI, written in the same transaction as the change when the change is in Postgres. Who (the
-- API with its token's fingerprint, or the CLI with the OS user), what, the state before and after,
-- when and the request id. Never a key or token: keys appear by id and display prefix only.
CREATE TABLE admin_audit (
  id          bigserial PRIMARY KEY,
  at          timestamptz NOT NULL DEFAULT now(),
  actor_kind  text NOT NULL CHECK (actor_kind IN ('admin-api', 'cli', 'system')),
  -- admin-api: 'sha256:' and the first 16 hex digits of SHA-256(ADMIN_TOKEN); cli: the OS user name.
  actor_id    text NOT NULL CHECK (length(actor_id) BETWEEN 1 AND 200),
  request_id  text CHECK (request_id IS NULL OR length(request_id) <= 200),
  action      text NOT NULL CHECK (action ~ '^[a-z_]+\.[a-z_]+$'),
  -- The account changed, when the change is an account's (partners and payments have none).
  account_id  uuid REFERENCES accounts (id),
  -- What else was changed: a key id, a partner id, a payment id.
  target_id   text,
  before      jsonb,
  after       jsonb
);
CREATE INDEX admin_audit_account_idx ON admin_audit (account_id, id) WHERE account_id IS NOT NULL;
CREATE INDEX admin_audit_action_idx ON admin_audit (action, id);

-- Append-only: no path in the code updates or deletes a row, and the table refuses it anyway.
CREATE FUNCTION admin_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'admin_audit is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER admin_audit_no_update_delete BEFORE UPDATE OR DELETE ON admin_audit
  FOR EACH ROW EXECUTE FUNCTION admin_audit_append_only();
CREATE TRIGGER admin_audit_no_truncate BEFORE TRUNCATE ON admin_audit
  FOR EACH STATEMENT EXECUTE FUNCTION admin_audit_append_only();
