import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import https from 'node:https';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser } from 'playwright-core';
import { launchChromium } from '../helpers/browser.js';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';
import { startHarness, testEnv, type Harness } from '../helpers/harness.js';
import { closedPort } from '../helpers/http-targets.js';
import { MemoryProvider, consentInBrowser, startRedirectTarget, type Redirects } from '../helpers/mcp-oauth-client.js';
import { until } from '../helpers/wait.js';

/**
 * A client identified by a Client ID Metadata Document: an https URL serving its metadata, which
 * the service fetches through its SSRF guard. The document's host is a local TLS server whose
 * certificate the service trusts the way an operator would add a private CA (NODE_EXTRA_CA_CERTS),
 * so the service runs as its own process (`npm start`'s command), as a new user runs it.
 */

const repo = fileURLToPath(new URL('../..', import.meta.url));

let h: Harness;
let dir: string;
let docServer: https.Server;
let docUrl: string;
let service: ChildProcess;
let base: string;
let browser: Browser;
let redirects: Redirects;
let output = '';

beforeAll(async () => {
  h = await startHarness({}, { workers: [] });
  redirects = await startRedirectTarget();
  dir = mkdtempSync(join(tmpdir(), 'tollgate-cimd-'));
  // A self-signed certificate for 127.0.0.1, trusted by the service below and nothing else.
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-days',
      '2',
      '-subj',
      '/CN=127.0.0.1',
      '-addext',
      'subjectAltName=IP:127.0.0.1',
      '-keyout',
      join(dir, 'key.pem'),
      '-out',
      join(dir, 'cert.pem'),
    ],
    { stdio: 'ignore' },
  );
  docServer = https.createServer({ key: readFileSync(join(dir, 'key.pem')), cert: readFileSync(join(dir, 'cert.pem')) }, (req, res) => {
    if (req.url !== '/oauth/client.json') return void res.writeHead(404).end();
    res
      .writeHead(200, { 'content-type': 'application/json' })
      .end(JSON.stringify({ client_id: docUrl, client_name: 'Metadata document agent', redirect_uris: [redirects.url], token_endpoint_auth_method: 'none' }));
  });
  docServer.listen(0, '127.0.0.1');
  await once(docServer, 'listening');
  const docPort = (docServer.address() as AddressInfo).port;
  docUrl = `https://127.0.0.1:${docPort}/oauth/client.json`;

  const port = await closedPort();
  base = `http://127.0.0.1:${port}`;
  service = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
    cwd: repo,
    env: {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      ...testEnv({ PORT: String(port), HOST: '127.0.0.1', WORKERS: 'inline', LOG_LEVEL: 'warn', FETCH_ALLOWED_HOSTS: `127.0.0.1:${docPort}` }),
      NODE_EXTRA_CA_CERTS: join(dir, 'cert.pem'),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  service.stdout!.on('data', (d) => (output += d));
  service.stderr!.on('data', (d) => (output += d));
  await until(
    `the service on ${base}: ${output}`,
    async () => (await fetch(`${base}/.well-known/oauth-authorization-server`).catch(() => null))?.ok === true,
    30_000,
  );
  browser = await launchChromium();
}, 60_000);

afterAll(async () => {
  await browser?.close();
  service?.kill('SIGTERM');
  if (service && service.exitCode === null) await once(service, 'exit');
  docServer?.close();
  await redirects?.close();
  await h?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('a client identified by its Client ID Metadata Document', () => {
  it('connects through the SDK with no registration: the service fetches the document over TLS, the person consents, the call is charged', async () => {
    const acct = await h.account('pro', 100);
    const provider = new MemoryProvider(redirects.url, { metadataUrl: docUrl });
    const mcpUrl = new URL('/mcp', base);
    const first = new Client({ name: 'cimd-test', version: '1.0.0' });
    await expect(first.connect(new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider }))).rejects.toBeInstanceOf(UnauthorizedError);
    // No registration happened: the client_id is the document's URL.
    expect(provider.info?.client_id).toBe(docUrl);
    const arrived = redirects.next();
    await consentInBrowser(browser, provider.authorizationUrl!, { apiKey: acct.apiKey, tools: ['compute'] });
    const q = await arrived;
    const transport = new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider });
    await transport.finishAuth(q.get('code')!);
    const client = new Client({ name: 'cimd-test', version: '1.0.0' });
    await client.connect(new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider }));
    expect((await client.listTools()).tools.map((t) => t.name)).toEqual(['compute']);
    const before = await h.credits(acct.accountId);
    const result = await client.callTool({ name: 'compute', arguments: { expression: '2 ^ 10' } });
    expect(result.isError, JSON.stringify(result)).toBeFalsy();
    expect(JSON.stringify(result.structuredContent)).toContain('1024');
    expect(await h.credits(acct.accountId)).toBeLessThan(before);
    await client.close();
    expect(output).not.toContain(acct.apiKey);
  }, 60_000);

  it('a document that names another client_id, or a redirect_uri it does not list, is refused on the page', async () => {
    const authorize = (clientId: string, redirectUri: string) => {
      const u = new URL(`${base}/oauth/authorize`);
      const q = { response_type: 'code', client_id: clientId, redirect_uri: redirectUri, code_challenge: 'a'.repeat(43), code_challenge_method: 'S256' };
      for (const [k, v] of Object.entries(q)) u.searchParams.set(k, v);
      return fetch(u, { redirect: 'manual' });
    };
    const wrongRedirect = await authorize(docUrl, 'http://127.0.0.1:1/elsewhere');
    expect(wrongRedirect.status).toBe(400);
    expect(wrongRedirect.headers.get('location')).toBeNull();
    // A URL on a host the SSRF guard blocks (not in FETCH_ALLOWED_HOSTS): never fetched.
    const internal = await authorize('https://127.0.0.2:9/client.json', redirects.url);
    expect(internal.status).toBe(400);
    expect(await internal.text()).toMatch(/could not be used/);
  });
});
