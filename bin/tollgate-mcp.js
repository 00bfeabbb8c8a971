#!/usr/bin/env node
// @ts-check
/**
 * tollgate-mcp: a stdio MCP server that relays tools/list and tools/call to a Tollgate service's
 * /mcp endpoint, for MCP hosts that only launch local stdio servers. Plain ESM JavaScript so that
 * `node` runs it as it is, with no build step.
 *
 * Environment:
 *   TOLLGATE_API_KEY     your API key (required)
 *   TOLLGATE_URL         the service's base URL (default http://127.0.0.1:8080)
 *   TOLLGATE_EDGE_TOKEN  optional Cloudflare API token, sent as X-Edge-Token for the cf_* tools
 */
import { readFileSync } from 'node:fs';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { CallToolRequestSchema, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js';

/** A tool call may wait in the queue and then generate for a while; progress resets this clock. */
const CALL_TIMEOUT_MS = 10 * 60_000;

const { version } = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));

/** stdout carries the protocol, so every human-readable line goes to stderr. @param {string} line */
function say(line) {
  process.stderr.write(`tollgate-mcp: ${line}\n`);
}

const apiKey = process.env.TOLLGATE_API_KEY?.trim();
if (!apiKey) {
  say('set TOLLGATE_API_KEY to your Tollgate API key (cv_...)');
  process.exit(1);
}
const base = (process.env.TOLLGATE_URL?.trim() || 'http://127.0.0.1:8080').replace(/\/*$/, '/');
/** @type {URL} */
let endpoint;
try {
  // Relative to the base, so a service mounted under a path prefix works too.
  endpoint = new URL('mcp', base);
} catch {
  say(`TOLLGATE_URL is not a URL: ${process.env.TOLLGATE_URL}`);
  process.exit(1);
}
// The host's narrowing of /mcp (?tools=, ?families=, ?set=): fewer tools in the agent's context.
for (const [variable, param] of [
  ['TOLLGATE_TOOLS', 'tools'],
  ['TOLLGATE_FAMILIES', 'families'],
  ['TOLLGATE_SET', 'set'],
]) {
  const value = process.env[variable]?.trim();
  if (value) endpoint.searchParams.set(param, value);
}
/** @type {Record<string, string>} */
const headers = { authorization: `Bearer ${apiKey}` };
const edgeToken = process.env.TOLLGATE_EDGE_TOKEN?.trim();
if (edgeToken) headers['x-edge-token'] = edgeToken;

/** @type {Promise<Client> | undefined} */
let upstream;

/**
 * The service's /mcp is stateless, so one client serves every relayed request; if connecting fails
 * (service down, bad key) the next request tries again.
 * @returns {Promise<Client>}
 */
function connect() {
  upstream ??= (async () => {
    const client = new Client({ name: 'tollgate-mcp', version });
    await client.connect(new StreamableHTTPClientTransport(endpoint, { requestInit: { headers } }));
    return client;
  })().catch((e) => {
    upstream = undefined;
    // A plain Error reaches the host as a JSON-RPC internal error carrying this message.
    // fetch hides the useful part (ECONNREFUSED, ENOTFOUND...) in its cause.
    const cause = e instanceof Error && e.cause instanceof Error ? ` (${/** @type {any} */ (e.cause).code ?? e.cause.message})` : '';
    throw new Error(`Cannot use Tollgate at ${endpoint}: ${e instanceof Error ? e.message : String(e)}${cause}`);
  });
  return upstream;
}

// Connecting first lets the host see the service's own instructions; a failure is reported and retried later.
const first = await connect().catch((e) => {
  say(e.message);
  return undefined;
});

const server = new Server({ name: 'tollgate', version }, { capabilities: { tools: {} }, instructions: first?.getInstructions() });

server.setRequestHandler(ListToolsRequestSchema, async (request) => (await connect()).listTools(request.params));

server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
  const client = await connect();
  const progressToken = request.params._meta?.progressToken;
  return client.callTool(request.params, undefined, {
    signal: extra.signal,
    timeout: CALL_TIMEOUT_MS,
    resetTimeoutOnProgress: true,
    // The service reports real progress (tokens generated...); pass it on under the host's token.
    ...(progressToken !== undefined
      ? {
          onprogress: (p) => {
            extra.sendNotification({ method: 'notifications/progress', params: { ...p, progressToken } }).catch(() => {});
          },
        }
      : {}),
  });
});

server.onclose = () => {
  void upstream
    ?.then((c) => c.close())
    .catch(() => {})
    .finally(() => process.exit(0));
  if (!upstream) process.exit(0);
};

await server.connect(new StdioServerTransport());
say(`relaying to ${endpoint}`);
