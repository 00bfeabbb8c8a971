-- Named tool sets of an account (src/access/tool-sets.ts): tool names and whole families, used to
-- narrow /mcp's list (?set=) and as a key's default set, which every surface enforces at call time.
-- A set is resolved against the registry when used: a family named here brings in tools added to it
-- later, and a tool name the registry no longer has is left out.
CREATE TABLE tool_sets (
  id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  account_id  uuid NOT NULL REFERENCES accounts (id),
  name        text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
  tools       text[] NOT NULL DEFAULT '{}',
  families    text[] NOT NULL DEFAULT '{}',
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  UNIQUE (account_id, name),
  -- The target of api_keys' composite reference below: a key names only a set of its own account.
  UNIQUE (id, account_id),
  CHECK (cardinality(tools) + cardinality(families) > 0),
  CHECK (cardinality(tools) <= 200 AND cardinality(families) <= 20)
);

-- A key's default tool set: it may call only the set's tools (with a sub-key's allowed_tools, both
-- apply). Deleting a set that a live key names is refused (409); revoked and expired keys let go of it.
ALTER TABLE api_keys ADD COLUMN tool_set_id uuid;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_tool_set_fk
  FOREIGN KEY (tool_set_id, account_id) REFERENCES tool_sets (id, account_id);
CREATE INDEX api_keys_tool_set_idx ON api_keys (tool_set_id) WHERE tool_set_id IS NOT NULL;
