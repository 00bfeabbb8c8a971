import { createHash, randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser } from 'playwright-core';
import { launchChromium } from '../helpers/browser.js';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2, UnauthorizedError as UnauthorizedErrorV2 } from '@modelcontextprotocol/client';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { MemoryProvider, consentInBrowser, startRedirectTarget, type Redirects } from '../helpers/mcp-oauth-client.js';
import { getTool } from '../../src/tools/index.js';
import { generateKey, hashKey } from '../../src/access/key-format.js';
import { sql } from '../../src/db/pool.js';
import { z } from 'zod';
import { SCENARIOS, passed, runScenario, startKeyProxy } from '../../scripts/conformance.js';

let h: Harness;
let browser: Browser;
let redirects: Redirects;
let base: string;
let mcpUrl: URL;

beforeAll(async () => {
  h = await startHarness({ OAUTH_REGISTRATIONS_PER_HOUR: '40' }, { workers: ['core'] });
  const address = await h.app.listen({ port: 0, host: '127.0.0.1' });
  base = address.replace('localhost', '127.0.0.1');
  mcpUrl = new URL('/mcp', base);
  redirects = await startRedirectTarget();
  browser = await launchChromium();
});
afterAll(async () => {
  await browser?.close();
  await redirects?.close();
  await h?.close();
});

/** Connects with the SDK's own OAuth support: a 401, discovery, registration, then (first time) a redirect for a person. */
async function connectWithOAuth(provider: MemoryProvider): Promise<{ client: Client; transport: StreamableHTTPClientTransport }> {
  const client = new Client({ name: 'oauth-test', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider });
  await client.connect(transport);
  return { client, transport };
}

/** The whole first connection: the SDK starts, a person consents in Chromium, the SDK finishes with the code. */
async function authorize(provider: MemoryProvider, acct: TestAccount, choice: { tools?: string[]; families?: string[]; capDollars?: string }) {
  const first = new Client({ name: 'oauth-test', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider });
  await expect(first.connect(transport)).rejects.toBeInstanceOf(UnauthorizedError);
  expect(provider.authorizationUrl).toBeDefined();
  const arrived = redirects.next();
  await consentInBrowser(browser, provider.authorizationUrl!, { apiKey: acct.apiKey, ...choice });
  const q = await arrived;
  expect(q.get('iss')).toBe(base);
  const code = q.get('code');
  expect(code, `redirect carried ${q.toString()}`).toBeTruthy();
  await transport.finishAuth(code!);
  return connectWithOAuth(provider);
}

const grantOf = async (accountId: string) =>
  h.container.pool.one(sql.type(
    z.object({ id: z.string(), monthly_limit_cents: z.number(), allowed_tools: z.array(z.string()), revoked_at: z.string().nullable() }),
  )`
    SELECT id, monthly_limit_cents, allowed_tools, revoked_at FROM api_keys WHERE account_id = ${accountId} AND type = 'grant' ORDER BY created_at DESC LIMIT 1`);

describe('discovery: /mcp as an OAuth 2.1 protected resource', () => {
  it('answers 401 with the resource metadata URL, and the metadata names this service as its authorization server', async () => {
    const res = await fetch(mcpUrl, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: '{}',
    });
    expect(res.status).toBe(401);
    expect(res.headers.get('www-authenticate')).toBe(`Bearer resource_metadata="${base}/.well-known/oauth-protected-resource", scope="mcp"`);
    const prm = await (await fetch(`${base}/.well-known/oauth-protected-resource`)).json();
    expect(prm).toMatchObject({ resource: `${base}/mcp`, authorization_servers: [base], bearer_methods_supported: ['header'] });
    expect(await (await fetch(`${base}/.well-known/oauth-protected-resource/mcp`)).json()).toEqual(prm);
    const as = await (await fetch(`${base}/.well-known/oauth-authorization-server`)).json();
    expect(as).toMatchObject({
      issuer: base,
      authorization_endpoint: `${base}/oauth/authorize`,
      token_endpoint: `${base}/oauth/token`,
      registration_endpoint: `${base}/oauth/register`,
      revocation_endpoint: `${base}/oauth/revoke`,
      code_challenge_methods_supported: ['S256'],
      client_id_metadata_document_supported: true,
    });
  });

  it('a wrong key on /mcp says invalid_token in the challenge', async () => {
    const res = await fetch(mcpUrl, {
      method: 'POST',
      headers: { authorization: `Bearer cv_${'x'.repeat(40)}`, 'content-type': 'application/json' },
      body: '{}',
    });
    expect(res.status).toBe(401);
    expect(res.headers.get('www-authenticate')).toContain('error="invalid_token"');
  });
});

describe('the MCP SDK OAuth client, dynamic registration, consent in Chromium', () => {
  it('connects with no pre-shared secret, sees and calls only the granted tools, charged to the account and capped by the grant; refresh rotates; revocation is a 401 at once', async () => {
    const acct = await h.account('pro', 500);
    const provider = new MemoryProvider(redirects.url, { name: 'Research agent' });
    const compute = getTool('compute');
    // A cap of exactly two calls of compute.
    const { client } = await authorize(provider, acct, { tools: ['compute', 'check_balance'], capDollars: ((2 * compute.priceCents) / 100).toFixed(2) });
    expect(provider.info?.client_id).toMatch(/^tgc_/);
    expect(provider.saved?.access_token).toMatch(/^cv_oat_/);

    const { tools } = await client.listTools();
    expect(tools.map((t) => t.name).sort()).toEqual(['check_balance', 'compute']);

    const before = await h.credits(acct.accountId);
    const ok = await client.callTool({ name: 'compute', arguments: { expression: '6 * 7' } });
    expect(ok.isError).toBeFalsy();
    expect(JSON.stringify(ok.structuredContent)).toContain('42');
    expect(await h.credits(acct.accountId)).toBe(before - compute.priceCents);
    const grant = await grantOf(acct.accountId);
    expect(grant).toMatchObject({ monthly_limit_cents: 2 * compute.priceCents, allowed_tools: ['compute', 'check_balance'], revoked_at: null });

    // Outside the grant: refused, nothing charged.
    const refused = await client.callTool({ name: 'page_fetch', arguments: { url: 'https://example.com' } });
    expect(refused.isError).toBe(true);
    await client.callTool({ name: 'compute', arguments: { expression: '1+1' } });
    const capped = await client.callTool({ name: 'compute', arguments: { expression: '2+2' } });
    expect(capped.isError).toBe(true);
    expect(JSON.stringify(capped.content)).toMatch(/monthly_limit_exceeded/);
    expect(await h.credits(acct.accountId)).toBe(before - 2 * compute.priceCents);

    // The grant is a key of the account: listed under GET /keys.
    const keys = json<{ keys: Array<{ key_id: string; type: string; name: string | null }> }>(
      await h.request({ method: 'GET', url: '/keys', headers: { authorization: `Bearer ${acct.apiKey}` } }),
    );
    expect(keys.keys).toContainEqual(expect.objectContaining({ key_id: grant.id, type: 'grant', name: 'Research agent' }));

    // Refresh with rotation: a new pair; the old refresh token presented again revokes the grant (tested below on another grant).
    const old = provider.saved!;
    const refreshed = await tokenRequest({ grant_type: 'refresh_token', refresh_token: old.refresh_token!, client_id: provider.info!.client_id });
    expect(refreshed.status).toBe(200);
    const pair = (await refreshed.json()) as { access_token: string; refresh_token: string };
    expect(pair.refresh_token).not.toBe(old.refresh_token);
    // The SDK's own refresh: an access token the service does not know (as an expired one) makes it
    // refresh with the stored refresh token and retry.
    provider.saveTokens({ ...old, ...pair, access_token: generateKey('grant').key });
    const afterRefresh = await connectWithOAuth(provider);
    expect((await afterRefresh.client.listTools()).tools).toHaveLength(2);
    const latest = provider.saved!;
    expect(latest.refresh_token).not.toBe(pair.refresh_token);
    await afterRefresh.client.close();

    // Revocation: the next request is a 401.
    const revoked = await fetch(`${base}/oauth/revoke`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ token: latest.refresh_token!, client_id: provider.info!.client_id }),
    });
    expect(revoked.status).toBe(200);
    const res = await fetch(mcpUrl, {
      method: 'POST',
      headers: { authorization: `Bearer ${latest.access_token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    expect(res.status).toBe(401);
    expect((await grantOf(acct.accountId)).revoked_at).not.toBeNull();
    await client.close();
    // Keys and tokens never reach a log line.
    const logs = h.logs.join('\n');
    for (const secret of [acct.apiKey, old.access_token, old.refresh_token!, pair.access_token, pair.refresh_token, latest.access_token, latest.refresh_token!])
      expect(logs).not.toContain(secret);
  });
});

async function tokenRequest(params: Record<string, string>): Promise<Response> {
  return fetch(`${base}/oauth/token`, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: new URLSearchParams(params) });
}

async function registerClient(body: Record<string, unknown>) {
  return fetch(`${base}/oauth/register`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
}

const pkce = () => {
  const verifier = randomBytes(32).toString('base64url');
  return { verifier, challenge: createHash('sha256').update(verifier).digest('base64url') };
};

describe('tokens bound to /mcp, and the attacks on the flow', () => {
  it('an access token is refused everywhere but /mcp, and a token for another resource cannot be had', async () => {
    const acct = await h.account('pro', 100);
    const provider = new MemoryProvider(redirects.url);
    const { client } = await authorize(provider, acct, { families: ['core'] });
    await client.close();
    const token = provider.saved!.access_token;
    const rest = await h.request({ method: 'POST', url: '/tools/compute', headers: { authorization: `Bearer ${token}` }, payload: { expression: '1+1' } });
    expect(rest.statusCode).toBe(401);
    expect(json<{ error: { message: string } }>(rest).error.message).toMatch(/\/mcp only/);
    const balance = await h.request({ method: 'GET', url: '/balance', headers: { authorization: `Bearer ${token}` } });
    expect(balance.statusCode).toBe(401);

    // A token of the same grant minted for another resource (as another authorization server sharing
    // this store would): /mcp refuses it.
    const foreign = generateKey('grant').key;
    const grant = await grantOf(acct.accountId);
    await h.container.pool.query(sql.unsafe`
      INSERT INTO oauth_tokens (token_hash, kind, grant_key_id, client_id, resource, scope, expires_at)
      VALUES (${hashKey(foreign)}, 'access', ${grant.id}, ${provider.info!.client_id}, 'https://other.example/mcp', 'mcp', now() + interval '1 hour')`);
    const elsewhere = await fetch(mcpUrl, {
      method: 'POST',
      headers: { authorization: `Bearer ${foreign}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    expect(elsewhere.status).toBe(401);
    expect(((await elsewhere.json()) as { error: { message: string } }).error.message).toMatch(/other\.example\/mcp only/);

    // Authorization for another resource is refused back to the client (invalid_target).
    const { challenge } = pkce();
    const u = new URL(`${base}/oauth/authorize`);
    for (const [k, v] of Object.entries({
      response_type: 'code',
      client_id: provider.info!.client_id,
      redirect_uri: redirects.url,
      code_challenge: challenge,
      code_challenge_method: 'S256',
      resource: 'https://other.example/mcp',
      state: 's1',
    }))
      u.searchParams.set(k, v);
    const res = await fetch(u, { redirect: 'manual' });
    expect(res.status).toBe(303);
    const back = new URL(res.headers.get('location')!);
    expect(back.searchParams.get('error')).toBe('invalid_target');
    expect(back.searchParams.get('state')).toBe('s1');
  });

  it('refuses what an attacker would try at the authorization endpoint without redirecting to unregistered places', async () => {
    const reg = (await (await registerClient({ redirect_uris: [redirects.url], token_endpoint_auth_method: 'none', client_name: 'x' })).json()) as {
      client_id: string;
    };
    const { challenge } = pkce();
    const at = (q: Record<string, string>) => {
      const u = new URL(`${base}/oauth/authorize`);
      for (const [k, v] of Object.entries(q)) u.searchParams.set(k, v);
      return fetch(u, { redirect: 'manual' });
    };
    const good = { response_type: 'code', client_id: reg.client_id, redirect_uri: redirects.url, code_challenge: challenge, code_challenge_method: 'S256' };
    // An unregistered redirect_uri: a page here, never a redirect there.
    const evil = await at({ ...good, redirect_uri: 'https://evil.example/cb' });
    expect(evil.status).toBe(400);
    expect(evil.headers.get('location')).toBeNull();
    expect(await evil.text()).toMatch(/did not register/);
    expect((await at({ ...good, client_id: 'tgc_nope' })).status).toBe(400);
    // No PKCE, or plain PKCE: back to the client with invalid_request.
    const { code_challenge: _c, ...noPkce } = good;
    expect(new URL((await at(noPkce)).headers.get('location')!).searchParams.get('error')).toBe('invalid_request');
    expect(new URL((await at({ ...good, code_challenge_method: 'plain' })).headers.get('location')!).searchParams.get('error')).toBe('invalid_request');
    // A client's name is shown escaped: a registered name cannot put markup on the page.
    const xss = (await (
      await registerClient({ redirect_uris: [redirects.url], token_endpoint_auth_method: 'none', client_name: '<img src=x onerror=alert(1)>' })
    ).json()) as { client_id: string };
    const named = await (await at({ ...good, client_id: xss.client_id })).text();
    expect(named).toContain('&lt;img src=x onerror=alert(1)&gt;');
    expect(named).not.toContain('<img');
    // The page cannot be framed and runs no script.
    const page = await at(good);
    expect(page.status).toBe(200);
    expect(page.headers.get('x-frame-options')).toBe('DENY');
    expect(page.headers.get('content-security-policy')).toContain("frame-ancestors 'none'");
  });

  it('registration refuses dangerous redirect URIs and answers RFC 7591 errors', async () => {
    for (const uri of ['javascript:alert(1)', 'http://evil.example/cb', 'https://a.example/cb#frag', 'not a uri']) {
      const res = await registerClient({ redirect_uris: [uri] });
      expect(res.status, uri).toBe(400);
      expect(((await res.json()) as { error: string }).error).toBe('invalid_redirect_uri');
    }
    const bad = await registerClient({ redirect_uris: [redirects.url], token_endpoint_auth_method: 'private_key_jwt' });
    expect(((await bad.json()) as { error: string }).error).toBe('invalid_client_metadata');
    const confidential = await registerClient({ redirect_uris: [redirects.url], token_endpoint_auth_method: 'client_secret_basic' });
    expect(confidential.status).toBe(201);
    expect(((await confidential.json()) as { client_secret?: string }).client_secret).toMatch(/^tgs_/);
  });

  it('a code works once, only with its verifier, and a second use revokes what the first made; a used refresh token revokes the grant', async () => {
    const acct = await h.account('pro', 100);
    const provider = new MemoryProvider(redirects.url);
    const first = new Client({ name: 'oauth-test', version: '1.0.0' });
    const transport = new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider });
    await expect(first.connect(transport)).rejects.toBeInstanceOf(UnauthorizedError);
    const arrived = redirects.next();
    await consentInBrowser(browser, provider.authorizationUrl!, { apiKey: acct.apiKey, tools: ['compute'] });
    const code = (await arrived).get('code')!;
    const clientId = provider.info!.client_id;
    const wrong = await tokenRequest({
      grant_type: 'authorization_code',
      code,
      code_verifier: 'a'.repeat(43),
      redirect_uri: redirects.url,
      client_id: clientId,
    });
    expect(wrong.status).toBe(400);
    expect(((await wrong.json()) as { error: string }).error).toBe('invalid_grant');
    // The failed attempt spent the code: codes are one-shot whatever happens.
    const right = await tokenRequest({
      grant_type: 'authorization_code',
      code,
      code_verifier: provider.verifier,
      redirect_uri: redirects.url,
      client_id: clientId,
    });
    expect(right.status).toBe(400);

    // A fresh code, exchanged twice: the second exchange revokes the grant the first made.
    const again = new Client({ name: 'oauth-test', version: '1.0.0' });
    const t2 = new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider });
    await expect(again.connect(t2)).rejects.toBeInstanceOf(UnauthorizedError);
    const arrived2 = redirects.next();
    await consentInBrowser(browser, provider.authorizationUrl!, { apiKey: acct.apiKey, tools: ['compute'] });
    const code2 = (await arrived2).get('code')!;
    const params = { grant_type: 'authorization_code', code: code2, code_verifier: provider.verifier, redirect_uri: redirects.url, client_id: clientId };
    const once = await tokenRequest(params);
    expect(once.status).toBe(200);
    const pair = (await once.json()) as { access_token: string; refresh_token: string };
    expect((await tokenRequest(params)).status).toBe(400);
    expect((await grantOf(acct.accountId)).revoked_at).not.toBeNull();

    // Refresh token reuse on a third grant.
    const t3 = new StreamableHTTPClientTransport(mcpUrl, { authProvider: new MemoryProvider(redirects.url) });
    void t3;
    const p3 = new MemoryProvider(redirects.url);
    const { client: c3 } = await authorize(p3, acct, { tools: ['compute'] });
    await c3.close();
    const r1 = await tokenRequest({ grant_type: 'refresh_token', refresh_token: p3.saved!.refresh_token!, client_id: p3.info!.client_id });
    expect(r1.status).toBe(200);
    const reuse = await tokenRequest({ grant_type: 'refresh_token', refresh_token: p3.saved!.refresh_token!, client_id: p3.info!.client_id });
    expect(reuse.status).toBe(400);
    const next = (await r1.json()) as { access_token: string };
    const res = await fetch(mcpUrl, {
      method: 'POST',
      headers: { authorization: `Bearer ${next.access_token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    expect(res.status).toBe(401);
    void pair;
  });
});

describe('signing in with a one-time link, choosing a tool set', () => {
  it('a link made with the key signs the browser in once; the consent offers the account\u2019s tool sets and the grant gets exactly the set', async () => {
    const acct = await h.account('pro', 100);
    const auth = { authorization: `Bearer ${acct.apiKey}` };
    const set = await h.request({ method: 'POST', url: '/toolsets', headers: auth, payload: { name: 'maths', tools: ['compute', 'check_balance'] } });
    expect(set.statusCode).toBe(201);
    const provider = new MemoryProvider(redirects.url, { name: 'Link agent' });
    const first = new Client({ name: 'oauth-test', version: '1.0.0' });
    await expect(first.connect(new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider }))).rejects.toBeInstanceOf(UnauthorizedError);

    const made = await fetch(`${base}/oauth/sign-in-links`, { method: 'POST', headers: auth });
    expect(made.status).toBe(201);
    const { url: link } = (await made.json()) as { url: string };
    expect(link).toMatch(new RegExp(`^${base}/oauth/sign-in/`));
    // Only the account's production key makes links.
    const sub = await h.key(acct.accountId, 'test');
    expect((await fetch(`${base}/oauth/sign-in-links`, { method: 'POST', headers: { authorization: `Bearer ${sub.apiKey}` } })).status).toBe(403);

    const context = await browser.newContext({ javaScriptEnabled: false });
    try {
      const page = await context.newPage();
      await page.goto(provider.authorizationUrl!.href);
      expect(await page.textContent('h1')).toContain('Link agent');
      // Opening the link spends nothing; its button signs in and goes on to the consent page.
      await page.goto(link);
      await Promise.all([page.waitForURL(/\/oauth\/consent/, { timeout: 10_000 }), page.click('button[type=submit]')]);
      await page.check('input[name=sets][value="maths"]', { timeout: 5_000 });
      const arrived = redirects.next();
      await Promise.all([page.waitForURL((u) => !u.pathname.startsWith('/oauth/'), { timeout: 10_000 }), page.click('button[name=decision][value=approve]')]);
      const q = await arrived;
      await new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider }).finishAuth(q.get('code')!);
      // The link works once.
      const again = await context.newPage();
      await again.goto(link);
      await again.click('button[type=submit]');
      expect(await again.textContent('body')).toMatch(/already used/);
    } finally {
      await context.close();
    }
    // The link is a credential: no log line carries it.
    const secret = link.split('/').pop()!;
    expect(h.logs.join('\n')).not.toContain(secret);
    const { client } = await connectWithOAuth(provider);
    expect((await client.listTools()).tools.map((t) => t.name).sort()).toEqual(['check_balance', 'compute']);
    expect((await grantOf(acct.accountId)).allowed_tools.sort()).toEqual(['check_balance', 'compute']);
    await client.close();
  });
});

/**
 * MCP Inspector 2.12 needs Node 22.19 or later (its package's engines), so it cannot run on this
 * service's Node 20. Its MCP client is @modelcontextprotocol/client 2.3.1 (the SDK's version 2), which
 * runs on Node 20: the same OAuth flow through that library.
 */
describe('the MCP client library MCP Inspector 2.12 is built on (@modelcontextprotocol/client 2.3.1)', () => {
  it('registers, is authorized in Chromium, lists and calls the granted tool', async () => {
    const acct = await h.account('pro', 100);
    const provider = new MemoryProvider(redirects.url, { name: 'Inspector' });
    const first = new ClientV2({ name: 'inspector-like', version: '2.12.0' });
    await expect(first.connect(new TransportV2(mcpUrl, { authProvider: provider }))).rejects.toBeInstanceOf(UnauthorizedErrorV2);
    const arrived = redirects.next();
    await consentInBrowser(browser, provider.authorizationUrl!, { apiKey: acct.apiKey, tools: ['compute'] });
    // The whole callback: the v2 client checks its iss against the issuer it discovered (RFC 9207).
    await new TransportV2(mcpUrl, { authProvider: provider }).finishAuth(await arrived);
    const client = new ClientV2({ name: 'inspector-like', version: '2.12.0' });
    await client.connect(new TransportV2(mcpUrl, { authProvider: provider }));
    const { tools } = await client.listTools();
    expect(tools.map((t) => t.name)).toEqual(['compute']);
    expect(tools[0]!.outputSchema).toBeDefined();
    const result = await client.callTool({ name: 'compute', arguments: { expression: '3 * 14' } });
    expect(result.isError).toBeFalsy();
    expect(JSON.stringify(result.structuredContent)).toContain('42');
    await client.close();
  });
});

describe('the MCP conformance suite (@modelcontextprotocol/conformance 0.1.13, the newest that runs on Node 20) with an OAuth access token', () => {
  it('passes its server scenarios (initialize, tools-list, ping) on /mcp authorized by OAuth instead of a key', async () => {
    const acct = await h.account('enterprise', 100);
    const provider = new MemoryProvider(redirects.url, { name: 'Conformance' });
    const { client } = await authorize(provider, acct, { families: ['core'] });
    await client.close();
    const proxy = await startKeyProxy(base, provider.saved!.access_token, { asTarget: true });
    try {
      // dns-rebinding-protection sends a Host naming the proxy, which this proxy replaces with the
      // service's (the token's resource); that scenario runs with a key in mcp.test.ts.
      for (const scenario of SCENARIOS.filter((s) => s !== 'dns-rebinding-protection')) {
        const r = await runScenario(`${proxy.url}/mcp`, scenario);
        expect(
          r.checks.filter((c) => c.status === 'FAILURE'),
          `${scenario}: ${r.output}`,
        ).toEqual([]);
        expect(passed(r), `${scenario}: ${r.output}`).toBe(true);
      }
    } finally {
      await proxy.close();
    }
  }, 120_000);
});

describe('registration is throttled per address', () => {
  it('past OAUTH_REGISTRATIONS_PER_HOUR an address gets 429 with Retry-After, and nothing is stored', async () => {
    const count = async () => h.container.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM oauth_clients`);
    let refused: Response | undefined;
    for (let i = 0; i < 41 && !refused; i++) {
      const res = await registerClient({ redirect_uris: [redirects.url], token_endpoint_auth_method: 'none' });
      if (res.status === 429) refused = res;
      else expect(res.status).toBe(201);
    }
    expect(refused, 'no 429 within the limit').toBeDefined();
    // The window's real remainder, at most an hour.
    const retryAfter = Number(refused!.headers.get('retry-after'));
    expect(retryAfter).toBeGreaterThan(0);
    expect(retryAfter).toBeLessThanOrEqual(3600);
    const before = await count();
    expect((await registerClient({ redirect_uris: [redirects.url] })).status).toBe(429);
    expect(await count()).toBe(before);
  });
});
