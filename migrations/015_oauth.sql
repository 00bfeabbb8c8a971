-- OAuth 2.1 for /mcp (src/access/oauth.ts). A grant is an api_keys row of type 'grant': a delegated
-- key with a monthly cap and allowed tools, like a sub-key, whose secret nobody holds; callers
-- present the access tokens issued for it instead. Revoking the key ends every token at once.
ALTER TABLE api_keys DROP CONSTRAINT IF EXISTS api_keys_type_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_type_check CHECK (type IN ('production', 'sub', 'test', 'agent', 'vip', 'grant'));

-- Clients registered dynamically (RFC 7591). Clients identified by a Client ID Metadata Document
-- (an https URL) are not stored: their document is fetched when they ask for authorization.
CREATE TABLE IF NOT EXISTS oauth_clients (
  client_id           text PRIMARY KEY,
  -- SHA-256 (hex) of the client secret, for confidential clients; NULL for public ones ('none').
  secret_hash         text,
  auth_method         text NOT NULL CHECK (auth_method IN ('none', 'client_secret_post', 'client_secret_basic')),
  client_name         text,
  redirect_uris       text[] NOT NULL,
  metadata            jsonb NOT NULL,
  created_at          timestamptz NOT NULL DEFAULT now()
);

-- Access and refresh tokens, by SHA-256 of the token (hex); the tokens themselves are never stored.
CREATE TABLE IF NOT EXISTS oauth_tokens (
  token_hash      text PRIMARY KEY,
  kind            text NOT NULL CHECK (kind IN ('access', 'refresh')),
  grant_key_id    uuid NOT NULL REFERENCES api_keys (id),
  client_id       text NOT NULL,
  -- RFC 8707: the resource the token is for (the service's /mcp URL); refused anywhere else.
  resource        text NOT NULL,
  scope           text NOT NULL,
  expires_at      timestamptz NOT NULL,
  -- Refresh tokens rotate: set when one is exchanged; presenting it again revokes the grant.
  used_at         timestamptz,
  created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS oauth_tokens_grant_idx ON oauth_tokens (grant_key_id);
