import http from 'node:http';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import type { Browser } from 'playwright-core';
import type { OAuthClientProvider } from '@modelcontextprotocol/sdk/client/auth.js';
import type { OAuthClientInformationMixed, OAuthClientMetadata, OAuthTokens } from '@modelcontextprotocol/sdk/shared/auth.js';

/**
 * An MCP client's side of the OAuth flow for tests: the SDK's OAuthClientProvider kept in memory,
 * a loopback redirect target that catches the code, and a person in Chromium who signs in with an
 * API key and fills the consent page.
 */
export interface Redirects {
  url: string;
  /** Resolves with the next redirect's query parameters. */
  next(): Promise<URLSearchParams>;
  close(): Promise<void>;
}

export async function startRedirectTarget(): Promise<Redirects> {
  const waiting: Array<(q: URLSearchParams) => void> = [];
  const arrived: URLSearchParams[] = [];
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    if (url.pathname !== '/callback') {
      res.writeHead(404).end(); // the browser's favicon request, say
      return;
    }
    const q = url.searchParams;
    const w = waiting.shift();
    if (w) w(q);
    else arrived.push(q);
    res.writeHead(200, { 'content-type': 'text/html' }).end('<p>You can close this window.</p>');
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/callback`,
    next: () => (arrived.length ? Promise.resolve(arrived.shift()!) : new Promise((resolve) => waiting.push(resolve))),
    close: async () => {
      server.closeAllConnections();
      server.close();
    },
  };
}

export class MemoryProvider implements OAuthClientProvider {
  info: OAuthClientInformationMixed | undefined;
  saved: OAuthTokens | undefined;
  verifier = '';
  /** The authorization URL the SDK sent the person to. */
  authorizationUrl: URL | undefined;

  constructor(
    private readonly redirect: string,
    private readonly opts: { metadataUrl?: string; name?: string } = {},
  ) {}

  get redirectUrl() {
    return this.redirect;
  }
  get clientMetadataUrl() {
    return this.opts.metadataUrl;
  }
  get clientMetadata(): OAuthClientMetadata {
    return {
      client_name: this.opts.name ?? 'Test agent',
      redirect_uris: [this.redirect],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    };
  }
  clientInformation() {
    return this.info;
  }
  saveClientInformation(info: OAuthClientInformationMixed) {
    this.info = info;
  }
  tokens() {
    return this.saved;
  }
  saveTokens(tokens: OAuthTokens) {
    this.saved = tokens;
  }
  redirectToAuthorization(url: URL) {
    this.authorizationUrl = url;
  }
  saveCodeVerifier(v: string) {
    this.verifier = v;
  }
  codeVerifier() {
    return this.verifier;
  }
}

/** A person in Chromium: opens the authorization URL, signs in with `apiKey`, picks tools and a cap, allows. */
export async function consentInBrowser(
  browser: Browser,
  authorizationUrl: URL,
  choice: { apiKey: string; tools?: string[]; families?: string[]; capDollars?: string; deny?: boolean },
): Promise<void> {
  const context = await browser.newContext({ javaScriptEnabled: false });
  const page = await context.newPage();
  try {
    await page.goto(authorizationUrl.href);
    await page.fill('#api_key', choice.apiKey);
    await Promise.all([page.waitForURL(/\/oauth\/consent/, { timeout: 10_000 }), page.click('button[type=submit]')]);
    for (const t of choice.tools ?? []) await page.check(`input[name=tools][value="${t}"]`, { timeout: 5_000 });
    for (const f of choice.families ?? []) await page.check(`input[name=families][value="${f}"]`, { timeout: 5_000 });
    if (choice.capDollars) await page.fill('#monthly_cap', choice.capDollars);
    // The redirect lands on the loopback target, which answers a small page.
    await Promise.all([
      page.waitForURL((u) => !u.pathname.startsWith('/oauth/'), { timeout: 10_000 }),
      page.click(`button[name=decision][value=${choice.deny ? 'deny' : 'approve'}]`),
    ]);
  } catch (e) {
    // What the person saw when it went wrong, so a failure says more than a timeout.
    const text = await page.textContent('body').catch(() => '(no page)');
    throw new Error(`${(e as Error).message}\nat ${page.url()}: ${text?.replace(/\s+/g, ' ').slice(0, 600)}`);
  } finally {
    await context.close();
  }
}
