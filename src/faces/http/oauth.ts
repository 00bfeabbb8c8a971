import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { isAppError } from '../../errors.js';
import { KeyAuthenticator } from '../../access/auth.js';
import { requireKeyOwner } from '../../access/keys.js';
import {
  OAUTH_SCOPE,
  OAuthError,
  OAuthService,
  PENDING_TTL_S,
  SESSION_TTL_S,
  LINK_TTL_S,
  type OAuthClient,
  type PendingAuthorization,
} from '../../access/oauth.js';
import { ToolSetsRepo, resolveToolSet } from '../../access/tool-sets.js';
import { createResolver } from '../../tools/web/resolver.js';
import { TOOLS, dollars } from '../../tools/index.js';
import { planRank } from '../../tools/types.js';
import { baseUrl } from './meta.js';
import { throttlePerAddress } from './browser-pages.js';
import { RATE_LIMIT } from './openapi-components.js';
import { empty, errors, media, named, ok, type RouteSchema } from './route-schema.js';
import { PAGE_HEADERS, consentPage, linkPage, messagePage, signInPage, type ClientView } from './oauth-pages.js';

/**
 * OAuth 2.1 for /mcp (src/access/oauth.ts does the deciding; this file is the HTTP around it):
 * the metadata documents (RFC 9728, RFC 8414), dynamic registration (RFC 7591), the authorization
 * endpoint with its sign-in and consent pages, the token endpoint and revocation (RFC 7009).
 */

/** The resource /mcp is, as tokens name it (RFC 8707). */
export function mcpResource(app: FastifyInstance, req: FastifyRequest): string {
  return `${baseUrl(app, req)}/mcp`;
}

/** Where a 401 from /mcp points an MCP client (RFC 9728 §5.1). */
export function resourceMetadataUrl(app: FastifyInstance, req: FastifyRequest): string {
  return `${baseUrl(app, req)}/.well-known/oauth-protected-resource`;
}

const FORM = 'application/x-www-form-urlencoded';
const PENDING_COOKIE = 'tg_oauth_request';
const SESSION_COOKIE = 'tg_oauth_session';
/** Fields a consent form may repeat; everything else appears at most once (RFC 6749 §3.1). */
const REPEATABLE = new Set(['tools', 'families', 'sets']);

type Form = Record<string, string | string[]>;

const OAuthErrorSchema = named(
  'OAuthError',
  z
    .object({ error: z.string().describe('RFC 6749 §5.2 / RFC 7591 §3.2.2 code, e.g. invalid_grant.'), error_description: z.string() })
    .describe('An OAuth error: its own shape, as OAuth clients read it.'),
);

const ProtectedResourceSchema = named(
  'ProtectedResourceMetadata',
  z
    .object({
      resource: z.string().url(),
      authorization_servers: z.array(z.string().url()),
      scopes_supported: z.array(z.string()),
      bearer_methods_supported: z.array(z.string()),
      resource_name: z.string(),
      resource_documentation: z.string().url(),
    })
    .describe('RFC 9728 metadata of /mcp.'),
);

const AuthorizationServerSchema = named(
  'AuthorizationServerMetadata',
  z
    .object({
      issuer: z.string().url(),
      authorization_endpoint: z.string().url(),
      token_endpoint: z.string().url(),
      registration_endpoint: z.string().url(),
      revocation_endpoint: z.string().url(),
      response_types_supported: z.array(z.string()),
      grant_types_supported: z.array(z.string()),
      code_challenge_methods_supported: z.array(z.string()),
      token_endpoint_auth_methods_supported: z.array(z.string()),
      revocation_endpoint_auth_methods_supported: z.array(z.string()),
      scopes_supported: z.array(z.string()),
      client_id_metadata_document_supported: z.boolean(),
      authorization_response_iss_parameter_supported: z.boolean(),
      service_documentation: z.string().url(),
    })
    .describe('RFC 8414 metadata of this authorization server.'),
);

const RegistrationBody = named(
  'OAuthClientRegistration',
  z
    .object({
      redirect_uris: z.array(z.string()).describe('https URIs, http only to localhost/127.0.0.1/[::1], or a private-use scheme; no fragments; 1 to 10.'),
      client_name: z.string().optional().describe('Shown on the consent page; at most 100 characters.'),
      token_endpoint_auth_method: z.enum(['none', 'client_secret_post', 'client_secret_basic']).optional().describe('Default client_secret_basic (RFC 7591).'),
      grant_types: z.array(z.enum(['authorization_code', 'refresh_token'])).optional(),
      response_types: z.array(z.literal('code')).optional(),
      scope: z.string().optional(),
    })
    .passthrough()
    .describe('RFC 7591 client metadata; other fields are ignored.'),
);

const RegisteredClientSchema = named(
  'OAuthRegisteredClient',
  z
    .object({
      client_id: z.string(),
      client_secret: z.string().optional().describe('Only for confidential clients, shown once.'),
      client_id_issued_at: z.number().int(),
      client_secret_expires_at: z.literal(0).optional(),
      redirect_uris: z.array(z.string()),
      token_endpoint_auth_method: z.string(),
      grant_types: z.array(z.string()),
      response_types: z.array(z.string()),
      client_name: z.string().optional(),
    })
    .passthrough(),
);

const TokenBody = z
  .object({
    grant_type: z.enum(['authorization_code', 'refresh_token']),
    code: z.string().optional(),
    code_verifier: z.string().optional(),
    redirect_uri: z.string().optional(),
    refresh_token: z.string().optional(),
    resource: z.string().optional().describe('RFC 8707: must be this service’s /mcp URL.'),
    client_id: z.string().optional(),
    client_secret: z.string().optional(),
  })
  .describe('RFC 6749 token request, form-encoded.');

const TokenSchema = named(
  'OAuthTokens',
  z.object({
    access_token: z.string().describe('cv_oat_...: for /mcp only.'),
    token_type: z.literal('Bearer'),
    expires_in: z.number().int(),
    refresh_token: z.string().describe('cv_ort_...: one use; the answer carries the next.'),
    scope: z.string(),
  }),
);

const RevokeBody = z.object({
  token: z.string(),
  token_type_hint: z.string().optional(),
  client_id: z.string().optional(),
  client_secret: z.string().optional(),
});

const SignInLinkSchema = named(
  'SignInLink',
  z.object({
    url: z.string().url().describe('Open it in the browser where an app asks for access; it works once.'),
    expires_in: z.number().int().describe('Seconds.'),
  }),
);

const AuthorizeQuery = z.object({
  response_type: z.string().optional(),
  client_id: z.string().optional(),
  redirect_uri: z.string().optional(),
  code_challenge: z.string().optional(),
  code_challenge_method: z.string().optional(),
  state: z.string().optional(),
  scope: z.string().optional(),
  resource: z.string().optional(),
});

const PageForm = z.object({}).passthrough().describe('A form the page posts (no JavaScript needed).');

const html = (description: string) => media('text/html', description);
const redirect = (description: string) => empty(description);

function cookies(req: FastifyRequest): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of (req.headers.cookie ?? '').split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0) out[part.slice(0, eq).trim()] = part.slice(eq + 1).trim();
  }
  return out;
}

function parseForm(raw: string): Form {
  const out: Form = {};
  for (const [k, v] of new URLSearchParams(raw)) {
    const had = out[k];
    out[k] = had === undefined ? v : Array.isArray(had) ? [...had, v] : [had, v];
  }
  return out;
}

/** The body's fields, each once: OAuth parameters may not repeat (RFC 6749 §3.1). */
function single(body: unknown): Record<string, string> {
  if (!body || typeof body !== 'object' || Array.isArray(body)) throw new OAuthError('invalid_request', `send the parameters as ${FORM}`);
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(body as Form)) {
    if (Array.isArray(v)) throw new OAuthError('invalid_request', `${k} appears more than once`);
    if (typeof v !== 'string') throw new OAuthError('invalid_request', `${k} must be a string`);
    out[k] = v;
  }
  return out;
}

function list(v: string | string[] | undefined): string[] {
  return v === undefined ? [] : Array.isArray(v) ? v : [v];
}

export async function oauthRoutes(app: FastifyInstance): Promise<void> {
  const { config, pool, redis, accounts } = app.container;
  const auth = app.container.api!.auth;
  const oauth = new OAuthService({
    pool,
    redis,
    config,
    resolver: createResolver(config),
    onGrantRevoked: async () => {
      auth.clear();
      await KeyAuthenticator.broadcast(redis, config.REDIS_PREFIX);
    },
  });

  const toolSets = new ToolSetsRepo(pool);
  /** The account's named sets as the consent page offers them: each narrowed to what the plan allows. */
  const setsFor = async (accountId: string, allowed: ReadonlySet<string>) =>
    (await toolSets.list(accountId))
      .map((set) => ({ name: set.name, tools: [...resolveToolSet(set)].filter((t) => allowed.has(t)).sort() }))
      .filter((set) => set.tools.length > 0);

  // OAuth endpoints read form bodies (this plugin's scope only); 64 KiB is more than any needs.
  app.addContentTypeParser(FORM, { parseAs: 'string', bodyLimit: 64 * 1024 }, (_req, body, done) => done(null, parseForm(body as string)));

  const secure = (req: FastifyRequest) => baseUrl(app, req).startsWith('https://');
  const cookie = (req: FastifyRequest, name: string, value: string, maxAge: number) =>
    `${name}=${value}; Path=/oauth; HttpOnly; SameSite=Lax; Max-Age=${maxAge}${secure(req) ? '; Secure' : ''}`;

  const sendPage = (reply: FastifyReply, status: number, body: string) => reply.status(status).headers(PAGE_HEADERS).send(body);

  const oauthFailure = (reply: FastifyReply, e: unknown) => {
    if (e instanceof OAuthError) {
      return reply
        .status(e.status)
        .header('cache-control', 'no-store')
        .headers(e.status === 401 ? { 'www-authenticate': 'Basic realm="tollgate"' } : {})
        .send({ error: e.error, error_description: e.description });
    }
    throw e;
  };

  /** A form a page posted must come from this service's own pages (browsers send Origin on POST). */
  const sameOrigin = (req: FastifyRequest) => {
    const origin = req.headers.origin;
    return origin === undefined || origin === new URL(baseUrl(app, req)).origin;
  };

  const clientView = (client: OAuthClient, redirectUri: string): ClientView => {
    let host = redirectUri;
    try {
      const u = new URL(redirectUri);
      host = u.host || `${u.protocol}//`;
    } catch {}
    return { name: client.name ?? client.clientId, redirectHost: host };
  };

  // ------------------------------------------------------------------------------------------
  // Discovery

  const protectedResource = (req: FastifyRequest) => {
    const base = baseUrl(app, req);
    return {
      resource: `${base}/mcp`,
      authorization_servers: [base],
      scopes_supported: [OAUTH_SCOPE],
      bearer_methods_supported: ['header'],
      resource_name: 'Tollgate MCP',
      resource_documentation: `${base}/docs`,
    };
  };
  for (const path of ['/.well-known/oauth-protected-resource', '/.well-known/oauth-protected-resource/mcp']) {
    app.get(
      path,
      {
        schema: {
          operationId: path.endsWith('/mcp') ? 'protectedResourceMetadataMcp' : 'protectedResourceMetadata',
          tags: ['MCP'],
          summary: path.endsWith('/mcp') ? 'OAuth metadata of /mcp (RFC 9728, path form)' : 'OAuth metadata of /mcp (RFC 9728)',
          description: 'Names this service as the authorization server of /mcp. A 401 from /mcp points here in WWW-Authenticate.',
          security: 'none',
          response: { '200': ok(ProtectedResourceSchema, 'The metadata.'), ...errors([], { keyed: false }) },
        } satisfies RouteSchema,
      },
      async (req) => protectedResource(req),
    );
  }

  app.get(
    '/.well-known/oauth-authorization-server',
    {
      schema: {
        operationId: 'authorizationServerMetadata',
        tags: ['MCP'],
        summary: 'OAuth authorization server metadata (RFC 8414)',
        description: 'Authorization code with PKCE (S256), dynamic registration, Client ID Metadata Documents, refresh tokens, revocation.',
        security: 'none',
        response: { '200': ok(AuthorizationServerSchema, 'The metadata.'), ...errors([], { keyed: false }) },
      } satisfies RouteSchema,
    },
    async (req) => {
      const base = baseUrl(app, req);
      const methods = ['none', 'client_secret_post', 'client_secret_basic'];
      return {
        issuer: base,
        authorization_endpoint: `${base}/oauth/authorize`,
        token_endpoint: `${base}/oauth/token`,
        registration_endpoint: `${base}/oauth/register`,
        revocation_endpoint: `${base}/oauth/revoke`,
        response_types_supported: ['code'],
        grant_types_supported: ['authorization_code', 'refresh_token'],
        code_challenge_methods_supported: ['S256'],
        token_endpoint_auth_methods_supported: methods,
        revocation_endpoint_auth_methods_supported: methods,
        scopes_supported: [OAUTH_SCOPE],
        client_id_metadata_document_supported: true,
        authorization_response_iss_parameter_supported: true,
        service_documentation: `${base}/docs`,
      };
    },
  );

  // ------------------------------------------------------------------------------------------
  // Registration (RFC 7591): open, as MCP clients expect, and throttled per address.

  app.post(
    '/oauth/register',
    {
      schema: {
        operationId: 'registerOAuthClient',
        tags: ['MCP'],
        summary: 'Register an OAuth client (RFC 7591)',
        description:
          'Open registration for MCP clients. A public client (token_endpoint_auth_method "none") gets no secret and must use PKCE, as every client must. ' +
          'At most OAUTH_REGISTRATIONS_PER_HOUR registrations per address an hour (429).',
        security: 'none',
        body: RegistrationBody,
        bodyExamples: {
          public: {
            summary: 'A native MCP client',
            value: { client_name: 'My agent', redirect_uris: ['http://127.0.0.1:33418/callback'], token_endpoint_auth_method: 'none' },
          },
        },
        response: {
          '201': ok(RegisteredClientSchema, 'Registered.'),
          '400': ok(OAuthErrorSchema, 'invalid_redirect_uri or invalid_client_metadata.'),
          ...errors(['413', '415', '429'], { keyed: false }),
        },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      await throttlePerAddress(redis, config.REDIS_PREFIX, req, {
        what: 'oauth-register',
        limit: config.OAUTH_REGISTRATIONS_PER_HOUR,
        windowSeconds: 3600,
        says: `At most ${config.OAUTH_REGISTRATIONS_PER_HOUR} client registrations an hour from one address`,
      });
      try {
        const { client, secret, metadata, issuedAt } = await oauth.register(req.body);
        return reply
          .status(201)
          .header('cache-control', 'no-store')
          .send({
            ...metadata,
            client_id: client.clientId,
            ...(secret ? { client_secret: secret, client_secret_expires_at: 0 } : {}),
            client_id_issued_at: issuedAt,
          });
      } catch (e) {
        return oauthFailure(reply, e);
      }
    },
  );

  // ------------------------------------------------------------------------------------------
  // Authorization: the request is checked, kept in Redis, and the person signs in and decides.

  app.get(
    '/oauth/authorize',
    {
      schema: {
        operationId: 'authorize',
        tags: ['MCP'],
        summary: 'OAuth authorization endpoint (a page for a person)',
        description:
          'Checks the client, its redirect_uri, PKCE (code_challenge with S256, required) and resource (this service’s /mcp), then shows the sign-in or consent page. ' +
          'Problems with the client or redirect_uri are shown on the page; the rest go back to the client as ?error=.',
        security: 'none',
        querystring: AuthorizeQuery,
        response: {
          '200': html('The sign-in or consent page.'),
          '303': redirect('Back to the client with ?error= (and state, iss).'),
          '400': html('The client or its redirect_uri is not valid: nothing is sent back to it.'),
          ...errors([], { keyed: false }),
        },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const q = (req.query ?? {}) as Record<string, unknown>;
      const str = (k: string) => (typeof q[k] === 'string' ? (q[k] as string) : undefined);
      const clientId = str('client_id');
      if (!clientId) return sendPage(reply, 400, messagePage('Cannot continue', 'The app sent no client_id. Ask its maker to register it with this service.'));
      let client: OAuthClient | null;
      try {
        client = await oauth.findClient(clientId);
      } catch (e) {
        if (e instanceof OAuthError) return sendPage(reply, 400, messagePage('Cannot continue', e.description));
        throw e;
      }
      if (!client) return sendPage(reply, 400, messagePage('Cannot continue', 'This app is not registered with this service (unknown client_id).'));
      const asked = str('redirect_uri');
      const redirectUri = asked ?? (client.redirectUris.length === 1 ? client.redirectUris[0] : undefined);
      if (!redirectUri || !client.redirectUris.includes(redirectUri)) {
        return sendPage(reply, 400, messagePage('Cannot continue', 'The app asked to return to an address it did not register (redirect_uri).'));
      }
      const state = str('state');
      const back = (error: string, description: string) => {
        const url = new URL(redirectUri);
        url.searchParams.set('error', error);
        url.searchParams.set('error_description', description);
        if (state !== undefined) url.searchParams.set('state', state);
        url.searchParams.set('iss', baseUrl(app, req));
        return reply.status(303).header('location', url.href).header('cache-control', 'no-store').send();
      };
      if (str('response_type') !== 'code') return back('unsupported_response_type', 'response_type must be code');
      const challenge = str('code_challenge');
      if (!challenge || !/^[A-Za-z0-9_-]{43}$/.test(challenge)) return back('invalid_request', 'PKCE is required: code_challenge (S256, 43 characters)');
      if (str('code_challenge_method') !== 'S256') return back('invalid_request', 'code_challenge_method must be S256');
      const resource = str('resource') ?? mcpResource(app, req);
      if (resource !== mcpResource(app, req)) return back('invalid_target', `this service issues tokens for ${mcpResource(app, req)} only`);
      if (state !== undefined && state.length > 1000) return back('invalid_request', 'state is longer than 1000 characters');
      const pending: PendingAuthorization = {
        clientId: client.clientId,
        clientName: client.name,
        redirectUri,
        state: state ?? null,
        codeChallenge: challenge,
        resource,
        scope: OAUTH_SCOPE,
      };
      const requestId = await oauth.savePending(pending);
      reply.header('set-cookie', cookie(req, PENDING_COOKIE, requestId, PENDING_TTL_S));
      const session = await oauth.session(cookies(req)[SESSION_COOKIE]);
      if (session) return showConsent(reply, requestId, pending, session);
      return sendPage(reply, 200, signInPage({ client: clientView(client, redirectUri), requestId, base: baseUrl(app, req) }));
    },
  );

  async function showConsent(
    reply: FastifyReply,
    requestId: string,
    pending: PendingAuthorization,
    session: { accountId: string; csrf: string },
    error?: string,
    status = 200,
  ) {
    const account = await accounts.getAccount(session.accountId);
    const allowed = TOOLS.filter((t) => planRank(account.plan) >= planRank(t.tier));
    const tools = allowed.map((t) => ({ name: t.name, family: t.family, price: dollars(t.priceCents) }));
    const sets = await setsFor(session.accountId, new Set(allowed.map((t) => t.name)));
    const client = { name: pending.clientName ?? pending.clientId, redirectHost: clientView({ name: null } as OAuthClient, pending.redirectUri).redirectHost };
    return sendPage(
      reply,
      status,
      consentPage({
        client,
        requestId,
        csrf: session.csrf,
        tools,
        sets,
        defaultCapDollars: dollars(config.OAUTH_DEFAULT_MONTHLY_CAP_CENTS),
        ...(error ? { error } : {}),
      }),
    );
  }

  const pageForm = (summary: string, operationId: string, description: string, responses: RouteSchema['response']): RouteSchema => ({
    operationId,
    tags: ['MCP'],
    summary,
    description,
    security: 'none',
    body: PageForm,
    bodyMediaType: FORM,
    bodyExamples: { form: { summary: 'As the page posts it', value: {} } },
    response: { ...responses, ...errors(['403', '413', '415'], { keyed: false }) },
  });

  app.post(
    '/oauth/sign-in',
    {
      schema: pageForm(
        'Sign in on the authorization page with an API key',
        'oauthSignIn',
        "The account's current production key signs this browser in for 15 minutes (a cookie); then the consent page.",
        { '303': redirect('Signed in: on to the consent page.'), '401': html('The key does not work: the page again, saying why.') },
      ),
    },
    async (req, reply) => {
      if (!sameOrigin(req)) return sendPage(reply, 403, messagePage('Refused', 'This form can only be sent from this service’s own page.'));
      const form = (req.body ?? {}) as Form;
      const requestId = typeof form.request === 'string' ? form.request : '';
      const pending = await oauth.pending(requestId);
      if (!pending) return sendPage(reply, 400, messagePage('This request has expired', 'Go back to the app and connect again.'));
      const view = clientView({ name: pending.clientName ?? pending.clientId } as OAuthClient, pending.redirectUri);
      const key = typeof form.api_key === 'string' ? form.api_key.trim() : '';
      try {
        const caller = await auth.authenticate(`Bearer ${key}`, req.ip);
        requireKeyOwner(caller, 'approve access for an app');
        const session = await oauth.createSession(caller.accountId, caller.keyId);
        return reply
          .status(303)
          .header('set-cookie', cookie(req, SESSION_COOKIE, session, SESSION_TTL_S))
          .header('location', `/oauth/consent?request=${encodeURIComponent(requestId)}`)
          .send();
      } catch (e) {
        if (!isAppError(e)) throw e;
        const status = e.status === 429 ? 429 : e.status === 403 ? 403 : 401;
        return sendPage(reply, status, signInPage({ client: view, requestId, base: baseUrl(app, req), error: e.message }));
      }
    },
  );

  app.post(
    '/oauth/sign-in-links',
    {
      schema: {
        operationId: 'createSignInLink',
        tags: ['MCP'],
        summary: 'A one-time link that signs a browser in to approve an app',
        description:
          "For an account holder whose key is on a server and whose browser is elsewhere: open the link where an app asks for access. It works once, within 10 minutes. Only the account's current production key makes one.",
        response: { '201': ok(SignInLinkSchema, 'The link (shown once).', { headers: RATE_LIMIT }), ...errors(['403']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      requireKeyOwner(caller, 'make sign-in links');
      const secret = await oauth.createSignInLink(caller.accountId, caller.keyId);
      return reply
        .status(201)
        .header('cache-control', 'no-store')
        .send({ url: `${baseUrl(app, req)}/oauth/sign-in/${secret}`, expires_in: LINK_TTL_S });
    },
  );

  app.get(
    '/oauth/sign-in/:link',
    {
      // The path carries the link's secret: this route writes no request log lines.
      logLevel: 'silent',
      schema: {
        operationId: 'signInLinkPage',
        tags: ['MCP'],
        summary: 'The page a one-time sign-in link opens',
        description: 'Opening the link uses nothing (link scanners may open it): the button on the page signs in.',
        security: 'none',
        params: z.object({ link: z.string() }),
        response: { '200': html('A page with a Sign in button.'), ...errors([], { keyed: false }) },
      } satisfies RouteSchema,
    },
    async (req, reply) => sendPage(reply, 200, linkPage({ secret: String((req.params as { link?: unknown }).link ?? '') })),
  );

  app.post(
    '/oauth/sign-in/link',
    {
      schema: pageForm('Sign in with a one-time link', 'oauthSignInWithLink', 'Uses the link (once) and signs this browser in for 15 minutes.', {
        '303': redirect('Signed in: on to the consent page of the request this browser started.'),
        '200': html('Signed in, but this browser has no pending request: go back to the app.'),
        '401': html('The link is used, expired or wrong.'),
      }),
    },
    async (req, reply) => {
      if (!sameOrigin(req)) return sendPage(reply, 403, messagePage('Refused', 'This form can only be sent from this service’s own page.'));
      const form = (req.body ?? {}) as Form;
      const who = await oauth.redeemSignInLink(typeof form.link === 'string' ? form.link : '');
      if (!who)
        return sendPage(reply, 401, linkPage({ secret: '', error: 'This link was already used, has expired, or is not a sign-in link. Make a new one.' }));
      const session = await oauth.createSession(who.accountId, who.keyId);
      reply.header('set-cookie', cookie(req, SESSION_COOKIE, session, SESSION_TTL_S));
      const requestId = cookies(req)[PENDING_COOKIE];
      if (requestId && (await oauth.pending(requestId))) {
        return reply
          .status(303)
          .header('location', `/oauth/consent?request=${encodeURIComponent(requestId)}`)
          .send();
      }
      return sendPage(reply, 200, messagePage('Signed in', 'This browser is signed in for 15 minutes. Go back to the app and connect again.'));
    },
  );

  app.get(
    '/oauth/consent',
    {
      schema: {
        operationId: 'consentPage',
        tags: ['MCP'],
        summary: 'The consent page (after signing in)',
        security: 'none',
        querystring: z.object({ request: z.string().optional() }),
        response: { '200': html('Which tools, and the monthly cap.'), '400': html('The request expired.'), ...errors([], { keyed: false }) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const requestId = String((req.query as { request?: unknown }).request ?? '');
      const pending = await oauth.pending(requestId);
      if (!pending) return sendPage(reply, 400, messagePage('This request has expired', 'Go back to the app and connect again.'));
      const session = await oauth.session(cookies(req)[SESSION_COOKIE]);
      if (!session) {
        const client = await oauth.findClient(pending.clientId);
        return sendPage(reply, 200, signInPage({ client: clientView(client!, pending.redirectUri), requestId, base: baseUrl(app, req) }));
      }
      return showConsent(reply, requestId, pending, session);
    },
  );

  app.post(
    '/oauth/consent',
    {
      schema: pageForm(
        'Allow or deny an app',
        'oauthConsent',
        'Allow: the client gets an authorization code (60 s, one use) for a grant with the chosen tools and monthly cap. Deny: ?error=access_denied.',
        { '303': redirect('Back to the client with ?code= (or ?error=), state and iss.'), '400': html('The form again, saying what to fix.') },
      ),
    },
    async (req, reply) => {
      if (!sameOrigin(req)) return sendPage(reply, 403, messagePage('Refused', 'This form can only be sent from this service’s own page.'));
      const form = (req.body ?? {}) as Form;
      const requestId = typeof form.request === 'string' ? form.request : '';
      const session = await oauth.session(cookies(req)[SESSION_COOKIE]);
      if (!session || typeof form.csrf !== 'string' || form.csrf !== session.csrf) {
        return sendPage(
          reply,
          403,
          messagePage('Refused', 'Your sign-in expired or the form did not come from this page. Go back to the app and connect again.'),
        );
      }
      const pending = await oauth.pending(requestId);
      if (!pending) return sendPage(reply, 400, messagePage('This request has expired', 'Go back to the app and connect again.'));
      for (const [k, v] of Object.entries(form))
        if (Array.isArray(v) && !REPEATABLE.has(k)) return showConsent(reply, requestId, pending, session, `${k} appears more than once`, 400);

      const back = (params: Record<string, string>) => {
        const url = new URL(pending.redirectUri);
        for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
        if (pending.state !== null) url.searchParams.set('state', pending.state);
        url.searchParams.set('iss', baseUrl(app, req));
        return reply.status(303).header('location', url.href).header('cache-control', 'no-store').send();
      };
      if (form.decision === 'deny') {
        if (!(await oauth.takePending(requestId)))
          return sendPage(reply, 400, messagePage('This request has expired', 'Go back to the app and connect again.'));
        return back({ error: 'access_denied', error_description: 'The account holder denied access' });
      }
      if (form.decision !== 'approve') return showConsent(reply, requestId, pending, session, 'Choose Allow or Deny.', 400);

      const account = await accounts.getAccount(session.accountId);
      const allowed = TOOLS.filter((t) => planRank(account.plan) >= planRank(t.tier));
      const names = new Set(allowed.map((t) => t.name));
      const families = new Set(list(form.families));
      const asked = list(form.tools);
      const unknown = asked.filter((n) => !names.has(n));
      if (unknown.length) return showConsent(reply, requestId, pending, session, `Not tools this account may call: ${unknown.slice(0, 5).join(', ')}`, 400);
      const sets = await setsFor(session.accountId, names);
      const askedSets = list(form.sets);
      const missing = askedSets.filter((n) => !sets.some((set) => set.name === n));
      if (missing.length) return showConsent(reply, requestId, pending, session, `No such tool set on this account: ${missing.slice(0, 5).join(', ')}`, 400);
      const fromSets = new Set(sets.filter((set) => askedSets.includes(set.name)).flatMap((set) => set.tools));
      // A snapshot of what the person saw and chose: later changes to a set do not widen the grant.
      const chosen = allowed.filter((t) => asked.includes(t.name) || families.has(t.family) || fromSets.has(t.name)).map((t) => t.name);
      if (!chosen.length) return showConsent(reply, requestId, pending, session, 'Choose at least one tool, family or tool set.', 400);
      const cap = typeof form.monthly_cap === 'string' ? Number(form.monthly_cap) : Number.NaN;
      const cents = Math.round(cap * 100);
      if (!Number.isFinite(cap) || cents < 1 || cents > 1_000_000_000) {
        return showConsent(reply, requestId, pending, session, 'The monthly cap must be a dollar amount from 0.01 to 10,000,000.', 400);
      }
      // Taken before the code is issued: a form posted twice makes one code.
      if (!(await oauth.takePending(requestId))) return sendPage(reply, 400, messagePage('This request has expired', 'Go back to the app and connect again.'));
      const code = await oauth.issueCode(pending, { accountId: session.accountId, signedInKeyId: session.keyId, tools: chosen, monthlyLimitCents: cents });
      return back({ code });
    },
  );

  // ------------------------------------------------------------------------------------------
  // Tokens and revocation

  app.post(
    '/oauth/token',
    {
      schema: {
        operationId: 'oauthToken',
        tags: ['MCP'],
        summary: 'OAuth token endpoint: authorization_code (with PKCE) and refresh_token',
        description:
          'Access tokens (cv_oat_) work on /mcp only and last OAUTH_ACCESS_TOKEN_SECONDS; refresh tokens rotate (each works once; one presented again revokes the grant).',
        security: 'none',
        body: TokenBody,
        bodyMediaType: FORM,
        bodyExamples: {
          code: {
            summary: 'Exchange a code',
            value: {
              grant_type: 'authorization_code',
              code: '...',
              code_verifier: '...',
              redirect_uri: 'http://127.0.0.1:33418/callback',
              client_id: 'tgc_...',
            },
          },
        },
        response: {
          '200': ok(TokenSchema, 'Tokens (Cache-Control: no-store).'),
          '400': ok(OAuthErrorSchema, 'invalid_request, invalid_grant, invalid_target, unsupported_grant_type.'),
          '401': ok(OAuthErrorSchema, 'invalid_client.'),
          ...errors(['413', '415'], { keyed: false }),
        },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      try {
        const form = single(req.body);
        const client = await oauth.authenticateClient(req.headers.authorization, form);
        let tokens;
        if (form.grant_type === 'authorization_code') tokens = (await oauth.exchangeCode(client, form)).tokens;
        else if (form.grant_type === 'refresh_token') tokens = (await oauth.refresh(client, form)).tokens;
        else throw new OAuthError('unsupported_grant_type', 'grant_type must be authorization_code or refresh_token');
        return reply.header('cache-control', 'no-store').header('pragma', 'no-cache').send(tokens);
      } catch (e) {
        return oauthFailure(reply, e);
      }
    },
  );

  app.post(
    '/oauth/revoke',
    {
      schema: {
        operationId: 'oauthRevoke',
        tags: ['MCP'],
        summary: 'Revoke a token (RFC 7009): the whole grant ends',
        description: 'Either token ends the grant at once on every replica. An unknown token answers 200 too (RFC 7009 §2.2).',
        security: 'none',
        body: RevokeBody,
        bodyMediaType: FORM,
        bodyExamples: { revoke: { summary: 'Revoke a refresh token', value: { token: 'cv_ort_...', client_id: 'tgc_...' } } },
        response: {
          '200': empty('Revoked (or nothing to revoke).'),
          '400': ok(OAuthErrorSchema, 'invalid_request.'),
          '401': ok(OAuthErrorSchema, 'invalid_client.'),
          ...errors(['413', '415'], { keyed: false }),
        },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      try {
        const form = single(req.body);
        const client = await oauth.authenticateClient(req.headers.authorization, form);
        if (!form.token) throw new OAuthError('invalid_request', 'token is required');
        await oauth.revoke(client, form.token);
        return reply.status(200).header('cache-control', 'no-store').send();
      } catch (e) {
        return oauthFailure(reply, e);
      }
    },
  );
}
