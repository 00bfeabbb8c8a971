import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { z } from 'zod';
import type { Config } from '../config.js';
import { sql, type DatabasePool } from '../db/pool.js';
import type { Redis } from '../queue/redis.js';
import { isAppError } from '../errors.js';
import { createGuardedHttp } from '../tools/web/guarded-http.js';
import type { DnsResolver } from '../tools/web/resolver.js';
import { generateKey, hashKey, randomBase62 } from './key-format.js';

/**
 * OAuth 2.1 authorization for /mcp, as the MCP specification asks of a server (its authorization
 * section): this service is both the resource server and its own authorization server.
 *
 * - Clients: registered dynamically (RFC 7591, stored in Postgres), or identified by a Client ID
 *   Metadata Document (an https URL whose JSON names its redirect URIs; fetched through the SSRF
 *   guard the web tools use, at most 5 KB, cached a few minutes).
 * - An account holder signs in on the consent page (an API key, or a one-time link made with one),
 *   picks the tools and a monthly cap, and the client gets an authorization code (PKCE S256 only,
 *   60 s, one use), exchanged for tokens bound to the /mcp resource (RFC 8707).
 * - A grant is an api_keys row of type 'grant': a delegated key with a sub-key's limits, listed in
 *   GET /keys and revocable there. Access tokens (cv_oat_, an hour) authenticate as it; refresh
 *   tokens (cv_ort_) rotate on every use, and one presented twice revokes the grant (it was stolen).
 * - Codes, pending authorization requests, browser sessions and sign-in links live in Redis with
 *   their TTLs, by hash; tokens live in Postgres by hash. No secret is stored in clear.
 */

export const OAUTH_SCOPE = 'mcp';
export const AUTH_METHODS = ['none', 'client_secret_post', 'client_secret_basic'] as const;
export type AuthMethod = (typeof AUTH_METHODS)[number];

const REFRESH_PREFIX = 'cv_ort_';
const CODE_TTL_S = 60;
export const PENDING_TTL_S = 600;
export const SESSION_TTL_S = 900;
export const LINK_TTL_S = 600;
const METADATA_CACHE_S = 300;
const METADATA_MAX_BYTES = 5 * 1024;
const METADATA_TIMEOUT_MS = 5_000;

/** An OAuth error answer (RFC 6749 §5.2, RFC 7591 §3.2.2): `{error, error_description}`, not the service's envelope. */
export class OAuthError extends Error {
  constructor(
    readonly error: string,
    readonly description: string,
    readonly status = 400,
  ) {
    super(description);
  }
}

export interface OAuthClient {
  clientId: string;
  authMethod: AuthMethod;
  name: string | null;
  redirectUris: string[];
  /** Identified by a Client ID Metadata Document (its client_id is that document's URL). */
  metadataDocument: boolean;
  secretHash: string | null;
}

/** An authorization request waiting for the account holder's decision. */
export interface PendingAuthorization {
  clientId: string;
  clientName: string | null;
  redirectUri: string;
  state: string | null;
  codeChallenge: string;
  resource: string;
  scope: string;
}

/** What the account holder chose on the consent page. */
export interface GrantChoice {
  accountId: string;
  /** The key the holder signed in with. */
  signedInKeyId: string;
  tools: string[];
  monthlyLimitCents: number;
}

export interface TokenSet {
  access_token: string;
  token_type: 'Bearer';
  expires_in: number;
  refresh_token: string;
  scope: string;
}

export interface Session {
  accountId: string;
  keyId: string;
  /** Bound into every consent form, so another site cannot post one (CSRF). */
  csrf: string;
}

const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');
const token = (bytes = 32) => randomBytes(bytes).toString('base64url');

/** The PKCE S256 challenge of a verifier (RFC 7636 §4.2). */
export function s256(verifier: string): string {
  return createHash('sha256').update(verifier).digest('base64url');
}

function equalHashes(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

const BLOCKED_SCHEMES = new Set(['javascript:', 'data:', 'file:', 'vbscript:', 'about:', 'blob:', 'ws:', 'wss:', 'ftp:']);
const LOOPBACK = new Set(['localhost', '127.0.0.1', '[::1]']);

/**
 * Why a redirect URI is refused, or null: https anywhere, http only to a loopback host (native apps,
 * RFC 8252 §7.3), a private-use scheme (RFC 8252 §7.1, e.g. cursor://...), never a fragment or one of
 * the schemes a browser would run or read locally.
 */
export function redirectUriProblem(uri: string): string | null {
  let url: URL;
  try {
    url = new URL(uri);
  } catch {
    return `${uri} is not an absolute URI`;
  }
  if (url.hash || uri.includes('#')) return `${uri} has a fragment, which redirect URIs may not have`;
  if (BLOCKED_SCHEMES.has(url.protocol)) return `${url.protocol} redirect URIs are not allowed`;
  if (url.protocol === 'http:' && !LOOPBACK.has(url.hostname)) return `${uri}: http redirect URIs must point at localhost, 127.0.0.1 or [::1]; use https`;
  if (url.username || url.password) return `${uri} carries credentials`;
  return null;
}

const RedirectUris = z
  .array(z.string().max(2000))
  .min(1, 'list at least one redirect URI')
  .max(10, 'at most 10 redirect URIs')
  .superRefine((uris, ctx) => {
    for (const uri of uris) {
      const problem = redirectUriProblem(uri);
      if (problem) ctx.addIssue({ code: 'custom', message: problem });
    }
  });

const optionalText = (max: number) => z.string().max(max).optional();

/** RFC 7591 client metadata this service reads; anything else a client sends is ignored (§2). */
export const RegistrationSchema = z.object({
  redirect_uris: RedirectUris,
  client_name: z.string().trim().min(1).max(100).optional(),
  token_endpoint_auth_method: z.enum(AUTH_METHODS).default('client_secret_basic'),
  grant_types: z
    .array(z.enum(['authorization_code', 'refresh_token']))
    .max(2)
    .default(['authorization_code']),
  response_types: z.array(z.literal('code')).max(1).default(['code']),
  scope: optionalText(200),
  client_uri: optionalText(2000),
  logo_uri: optionalText(2000),
  tos_uri: optionalText(2000),
  policy_uri: optionalText(2000),
  software_id: optionalText(200),
  software_version: optionalText(100),
  contacts: z.array(z.string().max(254)).max(5).optional(),
});
export type Registration = z.infer<typeof RegistrationSchema>;

/** A Client ID Metadata Document (draft-ietf-oauth-client-id-metadata-document): its own URL as client_id. */
const MetadataDocumentSchema = z.object({
  client_id: z.string(),
  client_name: z.string().trim().min(1).max(100).optional(),
  redirect_uris: RedirectUris,
  token_endpoint_auth_method: z
    .literal('none', { errorMap: () => ({ message: 'only public clients (token_endpoint_auth_method "none") may be identified by a metadata document here' }) })
    .default('none'),
  grant_types: z.array(z.string()).max(10).optional(),
  response_types: z.array(z.string()).max(5).optional(),
});

/** Whether a client_id names a metadata document: an https URL with a path (what MCP clients send). */
export function isMetadataDocumentId(clientId: string): boolean {
  if (!clientId.startsWith('https://') || clientId.length > 2000) return false;
  try {
    const url = new URL(clientId);
    return url.pathname !== '/' && !url.hash && !url.username && !url.password;
  } catch {
    return false;
  }
}

function firstIssue(e: z.ZodError): string {
  const issue = e.issues[0]!;
  return issue.path.length ? `${issue.path.join('.')}: ${issue.message}` : issue.message;
}

export interface OAuthDeps {
  pool: DatabasePool;
  redis: Redis;
  config: Config;
  resolver: DnsResolver;
  /** Called after a grant is revoked: every replica must forget the grant's cached key at once. */
  onGrantRevoked(): Promise<void>;
}

export class OAuthService {
  private readonly prefix: string;

  constructor(private readonly deps: OAuthDeps) {
    this.prefix = `${deps.config.REDIS_PREFIX}:oauth`;
  }

  get accessTokenSeconds(): number {
    return this.deps.config.OAUTH_ACCESS_TOKEN_SECONDS;
  }

  // ------------------------------------------------------------------------------------------
  // Clients

  /** RFC 7591 dynamic registration: a public client gets no secret; a confidential one gets one, once. */
  async register(body: unknown): Promise<{ client: OAuthClient; secret: string | null; metadata: Registration; issuedAt: number }> {
    const parsed = RegistrationSchema.safeParse(body ?? {});
    if (!parsed.success) {
      const redirect = parsed.error.issues.some((i) => i.path[0] === 'redirect_uris');
      throw new OAuthError(redirect ? 'invalid_redirect_uri' : 'invalid_client_metadata', firstIssue(parsed.error));
    }
    const metadata = parsed.data;
    if (metadata.grant_types.includes('refresh_token') === false) metadata.grant_types = [...metadata.grant_types, 'refresh_token'];
    const clientId = `tgc_${randomBase62(32)}`;
    const secret = metadata.token_endpoint_auth_method === 'none' ? null : `tgs_${randomBase62(40)}`;
    const row = await this.deps.pool.one(sql.type(z.object({ issued: z.number() }))`
      INSERT INTO oauth_clients (client_id, secret_hash, auth_method, client_name, redirect_uris, metadata)
      VALUES (${clientId}, ${secret ? sha256(secret) : null}, ${metadata.token_endpoint_auth_method}, ${metadata.client_name ?? null},
              ${sql.array(metadata.redirect_uris, 'text')}, ${sql.jsonb(metadata as never)})
      RETURNING extract(epoch FROM created_at)::bigint AS issued`);
    return {
      client: {
        clientId,
        authMethod: metadata.token_endpoint_auth_method,
        name: metadata.client_name ?? null,
        redirectUris: metadata.redirect_uris,
        metadataDocument: false,
        secretHash: secret ? sha256(secret) : null,
      },
      secret,
      metadata,
      issuedAt: Number(row.issued),
    };
  }

  /** A client by id: registered here, or its metadata document fetched (and cached). Null when unknown. */
  async findClient(clientId: string): Promise<OAuthClient | null> {
    if (isMetadataDocumentId(clientId)) return this.metadataDocumentClient(clientId);
    if (!/^tgc_[A-Za-z0-9]{32}$/.test(clientId)) return null;
    const row = await this.deps.pool.maybeOne(
      sql.type(
        z.object({
          client_id: z.string(),
          secret_hash: z.string().nullable(),
          auth_method: z.enum(AUTH_METHODS),
          client_name: z.string().nullable(),
          redirect_uris: z.array(z.string()),
        }),
      )`SELECT client_id, secret_hash, auth_method, client_name, redirect_uris FROM oauth_clients WHERE client_id = ${clientId}`,
    );
    if (!row) return null;
    return {
      clientId,
      authMethod: row.auth_method,
      name: row.client_name,
      redirectUris: row.redirect_uris,
      metadataDocument: false,
      secretHash: row.secret_hash,
    };
  }

  private async metadataDocumentClient(url: string): Promise<OAuthClient> {
    const cacheKey = `${this.prefix}:cimd:${sha256(url)}`;
    const cached = await this.deps.redis.get(cacheKey);
    if (cached) return JSON.parse(cached) as OAuthClient;
    const http = createGuardedHttp({
      config: this.deps.config,
      resolver: this.deps.resolver,
      tool: 'client metadata document',
      signal: AbortSignal.timeout(METADATA_TIMEOUT_MS),
      failCode: 'invalid_input',
      maxBytes: METADATA_MAX_BYTES,
      timeoutMs: METADATA_TIMEOUT_MS,
    });
    let doc: unknown;
    try {
      const res = await http.fetch(url, { followRedirects: false, headers: { accept: 'application/json' } });
      if (res.status !== 200) throw new OAuthError('invalid_client', `the client metadata document at ${url} answered HTTP ${res.status}`);
      if (res.truncated) throw new OAuthError('invalid_client', `the client metadata document at ${url} is larger than ${METADATA_MAX_BYTES} bytes`);
      doc = JSON.parse(res.text());
    } catch (e) {
      if (e instanceof OAuthError) throw e;
      const why = isAppError(e) ? e.message : e instanceof SyntaxError ? 'it is not JSON' : 'it could not be fetched';
      throw new OAuthError('invalid_client', `the client metadata document at ${url} could not be used: ${why}`);
    }
    const parsed = MetadataDocumentSchema.safeParse(doc);
    if (!parsed.success) throw new OAuthError('invalid_client', `the client metadata document at ${url} is invalid: ${firstIssue(parsed.error)}`);
    if (parsed.data.client_id !== url) {
      throw new OAuthError('invalid_client', `the client metadata document at ${url} names another client_id (${parsed.data.client_id.slice(0, 200)})`);
    }
    const client: OAuthClient = {
      clientId: url,
      authMethod: 'none',
      name: parsed.data.client_name ?? null,
      redirectUris: parsed.data.redirect_uris,
      metadataDocument: true,
      secretHash: null,
    };
    await this.deps.redis.set(cacheKey, JSON.stringify(client), 'EX', METADATA_CACHE_S);
    return client;
  }

  /**
   * The client a token or revocation request comes from, authenticated as it registered:
   * `client_secret_basic` (Authorization: Basic), `client_secret_post` (client_secret in the body)
   * or `none` (client_id only: a public client, which PKCE protects).
   */
  async authenticateClient(authorization: string | undefined, form: Record<string, string>): Promise<OAuthClient> {
    let clientId = form.client_id;
    let secret = form.client_secret;
    let basic = false;
    if (authorization?.toLowerCase().startsWith('basic ')) {
      const decoded = Buffer.from(authorization.slice(6).trim(), 'base64').toString('utf8');
      const colon = decoded.indexOf(':');
      if (colon < 0) throw new OAuthError('invalid_client', 'the Basic credentials are not client_id:client_secret', 401);
      clientId = decodeURIComponent(decoded.slice(0, colon));
      secret = decodeURIComponent(decoded.slice(colon + 1));
      basic = true;
    }
    if (!clientId) throw new OAuthError('invalid_client', 'client_id is required', 401);
    const client = await this.findClient(clientId);
    if (!client) throw new OAuthError('invalid_client', 'unknown client_id; register the client first', 401);
    if (client.authMethod === 'none') {
      if (secret) throw new OAuthError('invalid_client', 'this client is public: it has no secret to send', 401);
      return client;
    }
    if ((client.authMethod === 'client_secret_basic') !== basic || !secret) {
      throw new OAuthError('invalid_client', `this client authenticates with ${client.authMethod}`, 401);
    }
    if (!equalHashes(sha256(secret), client.secretHash ?? '')) throw new OAuthError('invalid_client', 'wrong client secret', 401);
    return client;
  }

  // ------------------------------------------------------------------------------------------
  // Pending requests, browser sessions and one-time sign-in links (Redis, by hash, with TTLs)

  async savePending(p: PendingAuthorization): Promise<string> {
    const id = token(24);
    await this.deps.redis.set(`${this.prefix}:req:${sha256(id)}`, JSON.stringify(p), 'EX', PENDING_TTL_S);
    return id;
  }

  async pending(id: string | undefined): Promise<PendingAuthorization | null> {
    if (!id || id.length > 100) return null;
    const raw = await this.deps.redis.get(`${this.prefix}:req:${sha256(id)}`);
    return raw ? (JSON.parse(raw) as PendingAuthorization) : null;
  }

  /** Ends a pending request once it is decided, so its consent form cannot be posted twice. */
  async takePending(id: string): Promise<PendingAuthorization | null> {
    const raw = await this.deps.redis.getdel(`${this.prefix}:req:${sha256(id)}`);
    return raw ? (JSON.parse(raw) as PendingAuthorization) : null;
  }

  async createSession(accountId: string, keyId: string): Promise<string> {
    const id = token(32);
    const session: Session = { accountId, keyId, csrf: token(24) };
    await this.deps.redis.set(`${this.prefix}:session:${sha256(id)}`, JSON.stringify(session), 'EX', SESSION_TTL_S);
    return id;
  }

  async session(id: string | undefined): Promise<Session | null> {
    if (!id || id.length > 100) return null;
    const raw = await this.deps.redis.get(`${this.prefix}:session:${sha256(id)}`);
    return raw ? (JSON.parse(raw) as Session) : null;
  }

  async endSession(id: string | undefined): Promise<void> {
    if (id && id.length <= 100) await this.deps.redis.del(`${this.prefix}:session:${sha256(id)}`);
  }

  /** A one-time sign-in link's secret, for an account holder who has a key on a server but a browser elsewhere. */
  async createSignInLink(accountId: string, keyId: string): Promise<string> {
    const secret = token(32);
    await this.deps.redis.set(`${this.prefix}:link:${sha256(secret)}`, JSON.stringify({ accountId, keyId }), 'EX', LINK_TTL_S);
    return secret;
  }

  /** Uses a sign-in link: valid once, within LINK_TTL_S. */
  async redeemSignInLink(secret: string): Promise<{ accountId: string; keyId: string } | null> {
    if (!secret || secret.length > 100) return null;
    const raw = await this.deps.redis.getdel(`${this.prefix}:link:${sha256(secret)}`);
    return raw ? (JSON.parse(raw) as { accountId: string; keyId: string }) : null;
  }

  // ------------------------------------------------------------------------------------------
  // Codes and tokens

  async issueCode(p: PendingAuthorization, choice: GrantChoice): Promise<string> {
    const code = token(32);
    await this.deps.redis.set(`${this.prefix}:code:${sha256(code)}`, JSON.stringify({ ...p, ...choice }), 'EX', CODE_TTL_S);
    return code;
  }

  /**
   * The authorization_code grant: the code (one use), its client, redirect URI, PKCE verifier and
   * resource must all match what was authorized. Creates the grant and its first tokens in one
   * transaction. A code presented twice revokes what the first use made (RFC 6749 §4.1.2).
   */
  async exchangeCode(client: OAuthClient, form: Record<string, string>): Promise<{ tokens: TokenSet; grantKeyId: string }> {
    const code = form.code ?? '';
    const verifier = form.code_verifier ?? '';
    if (!code || code.length > 200) throw new OAuthError('invalid_request', 'code is required');
    if (!/^[A-Za-z0-9._~-]{43,128}$/.test(verifier))
      throw new OAuthError('invalid_request', 'code_verifier is required: 43 to 128 characters of [A-Za-z0-9._~-] (PKCE)');
    const key = `${this.prefix}:code:${sha256(code)}`;
    const raw = await this.deps.redis.getdel(key);
    if (!raw) {
      const used = await this.deps.redis.get(`${key}:used`);
      if (used) await this.revokeGrant(used);
      throw new OAuthError('invalid_grant', 'the authorization code is unknown, expired or already used');
    }
    const c = JSON.parse(raw) as PendingAuthorization & GrantChoice;
    if (c.clientId !== client.clientId) throw new OAuthError('invalid_grant', 'the authorization code was issued to another client');
    if ((form.redirect_uri ?? c.redirectUri) !== c.redirectUri) throw new OAuthError('invalid_grant', 'redirect_uri differs from the one authorized');
    if (!equalHashes(s256(verifier), c.codeChallenge)) throw new OAuthError('invalid_grant', 'code_verifier does not match the code_challenge (PKCE)');
    if (form.resource !== undefined && form.resource !== c.resource) {
      throw new OAuthError('invalid_target', `the code was authorized for ${c.resource}, not ${form.resource.slice(0, 200)}`);
    }
    const grantKeyId = await this.deps.pool.oneFirst(sql.type(z.object({ id: z.string() }))`
        INSERT INTO api_keys (account_id, key_hash, display_prefix, type, name, monthly_limit_cents, allowed_tools, created_by_key_id)
        VALUES (${c.accountId}, ${hashKey(`grant:${token(32)}`)}, 'cv_oat_', 'grant', ${(c.clientName ?? c.clientId).slice(0, 100)},
                ${c.monthlyLimitCents}, ${sql.array(c.tools, 'text')}, ${c.signedInKeyId})
        RETURNING id`);
    // Remembered for the code's lifetime and a little more: a second use of this code revokes the grant.
    await this.deps.redis.set(`${key}:used`, grantKeyId, 'EX', CODE_TTL_S * 10);
    const tokens = await this.mint(grantKeyId, client.clientId, c.resource, c.scope);
    return { tokens, grantKeyId };
  }

  /**
   * The refresh_token grant, with rotation: the token is spent and a new pair issued in one
   * transaction. A spent token presented again means it was copied: the grant is revoked.
   */
  async refresh(client: OAuthClient, form: Record<string, string>): Promise<{ tokens: TokenSet }> {
    const refresh = form.refresh_token ?? '';
    if (!refresh.startsWith(REFRESH_PREFIX) || refresh.length > 200) throw new OAuthError('invalid_grant', 'the refresh token is unknown, expired or revoked');
    const hash = hashKey(refresh);
    const spent = await this.deps.pool.maybeOne(sql.type(
      z.object({ grant_key_id: z.string(), client_id: z.string(), resource: z.string(), scope: z.string(), live: z.boolean(), revoked: z.boolean() }),
    )`
      UPDATE oauth_tokens t SET used_at = now()
      FROM api_keys k
      WHERE t.token_hash = ${hash} AND t.kind = 'refresh' AND k.id = t.grant_key_id AND t.used_at IS NULL
      RETURNING t.grant_key_id, t.client_id, t.resource, t.scope, t.expires_at > now() AS live, k.revoked_at IS NOT NULL AS revoked`);
    if (!spent) {
      const reused = await this.deps.pool.maybeOneFirst(sql.type(z.object({ grant_key_id: z.string() }))`
        SELECT grant_key_id FROM oauth_tokens WHERE token_hash = ${hash} AND kind = 'refresh' AND used_at IS NOT NULL`);
      if (reused) {
        await this.revokeGrant(reused);
        throw new OAuthError('invalid_grant', 'this refresh token was already used; the grant is revoked (a used refresh token came back)');
      }
      throw new OAuthError('invalid_grant', 'the refresh token is unknown, expired or revoked');
    }
    if (spent.client_id !== client.clientId) throw new OAuthError('invalid_grant', 'the refresh token was issued to another client');
    if (!spent.live || spent.revoked) throw new OAuthError('invalid_grant', 'the refresh token is unknown, expired or revoked');
    if (form.resource !== undefined && form.resource !== spent.resource) {
      throw new OAuthError('invalid_target', `the grant is for ${spent.resource}, not ${form.resource.slice(0, 200)}`);
    }
    return { tokens: await this.mint(spent.grant_key_id, client.clientId, spent.resource, spent.scope) };
  }

  private async mint(grantKeyId: string, clientId: string, resource: string, scope: string): Promise<TokenSet> {
    const access = generateKey('grant').key;
    const refresh = REFRESH_PREFIX + randomBase62(48);
    const { OAUTH_ACCESS_TOKEN_SECONDS: accessS, OAUTH_REFRESH_TOKEN_DAYS: refreshDays } = this.deps.config;
    await this.deps.pool.query(sql.unsafe`
      INSERT INTO oauth_tokens (token_hash, kind, grant_key_id, client_id, resource, scope, expires_at) VALUES
        (${hashKey(access)}, 'access', ${grantKeyId}, ${clientId}, ${resource}, ${scope}, now() + make_interval(secs => ${accessS})),
        (${hashKey(refresh)}, 'refresh', ${grantKeyId}, ${clientId}, ${resource}, ${scope}, now() + make_interval(days => ${refreshDays}))`);
    return { access_token: access, token_type: 'Bearer', expires_in: accessS, refresh_token: refresh, scope };
  }

  /**
   * RFC 7009 revocation by the client the token was issued to. Either token ends the whole grant:
   * a client revokes when its user disconnects it. Unknown tokens are not an error (§2.2). Returns
   * the revoked grant's key id, for the caller to tell every replica.
   */
  async revoke(client: OAuthClient, tokenValue: string): Promise<string | null> {
    if (!tokenValue || tokenValue.length > 200) return null;
    const grant = await this.deps.pool.maybeOneFirst(sql.type(z.object({ grant_key_id: z.string() }))`
      SELECT grant_key_id FROM oauth_tokens WHERE token_hash = ${hashKey(tokenValue)} AND client_id = ${client.clientId}`);
    if (!grant) return null;
    await this.revokeGrant(grant);
    return grant;
  }

  /** Revokes a grant's key (every token of it stops at once) and deletes its tokens. */
  async revokeGrant(grantKeyId: string): Promise<void> {
    await this.deps.pool.transaction(async (tx) => {
      await tx.query(sql.unsafe`UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now()) WHERE id = ${grantKeyId} AND type = 'grant'`);
      await tx.query(sql.unsafe`DELETE FROM oauth_tokens WHERE grant_key_id = ${grantKeyId}`);
    });
    await this.deps.onGrantRevoked();
  }
}
