import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ErrorCode, McpError, type Progress } from '@modelcontextprotocol/sdk/types.js';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import { startFakeCloudflare, type FakeCloudflare } from '../helpers/fake-cloudflare.js';
import { loadConfig } from '../../src/config.js';
import { originChecker } from '../../src/faces/mcp/routes.js';
import { SCENARIOS, passed, runScenario, startKeyProxy, type KeyProxy } from '../../scripts/conformance.js';
import { TOOLS } from '../../src/tools/index.js';
import { planRank, type Plan } from '../../src/tools/types.js';
import { deploymentKeys } from '../../src/queue/redis.js';

let h: Harness;
let llm: FakeOpenAI;
let cf: FakeCloudflare;
let url: URL;
const EDGE_TOKEN = 'cf-edge-token-do-not-store-7f3a9c2e41';
const ALLOWED_ORIGIN = 'https://console.example.com';

beforeAll(async () => {
  llm = await startFakeOpenAI();
  cf = await startFakeCloudflare({ token: EDGE_TOKEN });
  h = await startHarness({ LLM_BASE_URL: llm.baseURL, CF_API_BASE_URL: cf.url, MCP_ALLOWED_ORIGINS: ALLOWED_ORIGIN });
  const address = await h.app.listen({ port: 0, host: '127.0.0.1' });
  url = new URL('/mcp', address);
});
afterAll(async () => {
  await h.close();
  await llm.close();
  await cf.close();
});

async function connect(apiKey: string): Promise<Client> {
  const client = new Client({ name: 'tollgate-test', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(url, { requestInit: { headers: { authorization: `Bearer ${apiKey}` } } }));
  return client;
}

const namesFor = (plan: Plan) =>
  TOOLS.filter((t) => planRank(t.tier) <= planRank(plan))
    .map((t) => t.name)
    .sort();

describe('MCP with the SDK client over Streamable HTTP', () => {
  it('initializes against the stateless endpoint with tools capability and instructions', async () => {
    const acct = await h.account('pro', 0);
    const client = await connect(acct.apiKey);
    expect(client.getServerVersion()).toMatchObject({ name: 'tollgate' });
    expect(client.getServerCapabilities()?.tools).toBeDefined();
    expect(client.getInstructions()).toMatch(/charged/);
    await client.close();
  });

  it.each(['free', 'starter', 'pro'] as const)('tools/list shows exactly what a %s key may call', async (plan) => {
    const client = await connect((await h.account(plan, 0)).apiKey);
    // By name, in pages (test/integration/mcp-tool-sets.test.ts checks the paging itself).
    const tools = [];
    let cursor: string | undefined;
    do {
      const page = await client.listTools(cursor === undefined ? undefined : { cursor });
      tools.push(...page.tools);
      cursor = page.nextCursor;
    } while (cursor !== undefined);
    expect(tools.map((t) => t.name)).toEqual(namesFor(plan));
    await client.close();
  });

  it('each tool carries its input JSON Schema, price, title and annotations', async () => {
    const client = await connect((await h.account('pro', 0)).apiKey);
    const { tools } = await client.listTools();
    const compute = tools.find((t) => t.name === 'compute')!;
    expect(compute.inputSchema).toMatchObject({ type: 'object', required: ['expression'] });
    expect(compute.description).toMatch(/\$0\.02 per successful call/);
    expect(compute.annotations).toMatchObject({ title: 'Compute', readOnlyHint: true, destructiveHint: false, openWorldHint: false });
    const createDns = tools.find((t) => t.name === 'cf_create_dns')!;
    expect(createDns.annotations).toMatchObject({ title: 'Cloudflare create DNS', readOnlyHint: false, destructiveHint: true });
    // Hosts that cannot send headers pass the Cloudflare token as an argument, so the schema says so.
    expect(createDns.inputSchema.properties).toHaveProperty('edge_token');
    await client.close();
  });

  it('tools/call runs through the queue, charges once, and returns text plus structuredContent', async () => {
    const acct = await h.account('pro', 100);
    const client = await connect(acct.apiKey);
    const res = await client.callTool({ name: 'compute', arguments: { expression: '2 * (3 + 4)' } });
    expect(res.isError).toBeFalsy();
    expect(res.structuredContent).toEqual({
      result: { expression: '2 * (3 + 4)', result: '14', value: 14, type: 'number' },
      cost_cents: 2,
      remaining_credits: 98,
    });
    const content = res.content as Array<{ type: string; text: string }>;
    expect(JSON.parse(content[0]!.text)).toEqual(res.structuredContent);
    expect(await h.credits(acct.accountId)).toBe(98);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    await client.close();
  });

  it.each([
    ['no credit', 'pro', 0, 'compute', { expression: '1+1' }, 'insufficient_credits'],
    ['a plan below the tier', 'free', 100, 'compute', { expression: '1+1' }, 'plan_required'],
    ['invalid input', 'pro', 100, 'compute', { expression: 42 }, 'invalid_input'],
    ['a failure inside the tool', 'pro', 100, 'compute', { expression: '2 * (3 +' }, 'invalid_input'],
  ] as const)('%s is an isError result naming the code, and charges nothing', async (_l, plan, credits, tool, args, code) => {
    const acct = await h.account(plan, credits);
    const client = await connect(acct.apiKey);
    const res = await client.callTool({ name: tool, arguments: args });
    expect(res.isError).toBe(true);
    const text = (res.content as Array<{ text: string }>)[0]!.text;
    expect(text.startsWith(`${code}: `)).toBe(true);
    expect(res.structuredContent).toMatchObject({ error: { code } });
    expect(await h.credits(acct.accountId)).toBe(credits);
    await client.close();
  });

  it('an unknown tool is a JSON-RPC InvalidParams error, not a result', async () => {
    const client = await connect((await h.account('pro', 10)).apiKey);
    const err = await client.callTool({ name: 'no_such_tool', arguments: {} }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(McpError);
    expect((err as McpError).code).toBe(ErrorCode.InvalidParams);
    expect((err as McpError).message).toMatch(/no_such_tool/);
    await client.close();
  });

  it('a sub-key sees only its allowed tools and is refused the others', async () => {
    const ent = await h.account('enterprise', 500);
    const sub = await h.container.accounts.createKey({
      accountId: ent.accountId,
      type: 'sub',
      name: 'ci-bot',
      monthlyLimitCents: 50,
      allowedTools: ['compute', 'check_balance'],
    });
    const client = await connect(sub.api_key);
    const { tools } = await client.listTools();
    expect(tools.map((t) => t.name).sort()).toEqual(['check_balance', 'compute']);
    const ok = await client.callTool({ name: 'compute', arguments: { expression: '6*7' } });
    expect(ok.structuredContent).toMatchObject({ result: { value: 42 }, cost_cents: 2 });
    const refused = await client.callTool({ name: 'domain_check', arguments: { domain: 'example.com' } });
    expect(refused.isError).toBe(true);
    expect((refused.content as Array<{ text: string }>)[0]!.text).toMatch(/^tool_not_allowed: /);
    await client.close();
  });

  it('edge_token in the arguments reaches Cloudflare but is never stored or logged', async () => {
    const acct = await h.account('pro', 10);
    const client = await connect(acct.apiKey);
    const res = await client.callTool({ name: 'cf_list_zones', arguments: { edge_token: EDGE_TOKEN } });
    expect(res.isError).toBeFalsy();
    expect(res.structuredContent).toMatchObject({ cost_cents: 0 });
    expect(cf.requests.some((r) => r.headers.authorization === `Bearer ${EDGE_TOKEN}`)).toBe(true);
    await client.close();
    expect(h.logs.join('')).not.toContain(EDGE_TOKEN);
    expect(await redisDump(h)).not.toContain(EDGE_TOKEN);
  });

  it('an LLM tool streams its tokens as MCP progress notifications when asked', async () => {
    llm.enqueue({ type: 'tokens', tokens: ['Think ', 'about ', 'two ', 'pointers.'] });
    const acct = await h.account('starter', 20);
    const client = await connect(acct.apiKey);
    const seen: Progress[] = [];
    const res = await client.callTool({ name: 'hints', arguments: { problem: 'Detect a cycle in a linked list.' } }, undefined, {
      onprogress: (p) => seen.push(p),
    });
    expect(res.structuredContent).toMatchObject({ result: { text: 'Think about two pointers.' }, cost_cents: 5, remaining_credits: 15 });
    expect(seen.map((p) => p.progress)).toEqual([1, 2, 3, 4]);
    expect(seen[0]!.message).toMatch(/generating/);
    await client.close();
  });

  it('a missing key fails the SDK client at connect with 401', async () => {
    const client = new Client({ name: 'tollgate-test', version: '1.0.0' });
    const err = await client.connect(new StreamableHTTPClientTransport(url)).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 401 });
    expect(String(err)).toMatch(/unauthorized/);
  });
});

const INIT = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
};
const MCP_HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };

describe('POST /mcp at the HTTP level', () => {
  const post = (headers: Record<string, string>, payload: string = JSON.stringify(INIT)) =>
    h.request({ method: 'POST', url: '/mcp', headers: { ...MCP_HEADERS, ...headers }, payload });

  it.each([
    ['no Authorization header', 'unauthorized', {}],
    ['a malformed key', 'invalid_api_key', { authorization: 'Bearer nope' }],
    ['an unknown key', 'key_not_found', { authorization: `Bearer cv_${'A'.repeat(40)}` }],
  ])('%s is 401 %s in the envelope, before any JSON-RPC', async (_l, code, headers) => {
    const res = await post(headers);
    expect(res.statusCode).toBe(401);
    expect(res.headers['www-authenticate']).toMatch(/^Bearer/);
    expect(json(res).error).toMatchObject({ code });
  });

  it('a body that is not JSON is a JSON-RPC parse error, but only after authentication', async () => {
    expect((await post({}, '{"jsonrpc":')).statusCode).toBe(401);
    const acct = await h.account('pro', 0);
    const res = await post({ authorization: `Bearer ${acct.apiKey}` }, '{"jsonrpc":');
    expect(res.statusCode).toBe(400);
    expect(json(res)).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: -32700 } });
  });

  it.each([
    ['a foreign Origin', 'http://evil.example.com', 'evil.example.com', 403],
    ['a rebinding attempt (Origin and Host both the attacker)', 'http://evil.example.com:8080', 'evil.example.com:8080', 403],
    ['the opaque origin null', 'null', '127.0.0.1:8080', 403],
    ['the same loopback host', 'http://127.0.0.1:8080', '127.0.0.1:8080', 200],
    ['an origin in MCP_ALLOWED_ORIGINS', ALLOWED_ORIGIN, 'api.example.com', 200],
  ])('%s (Origin %s, Host %s) -> %i', async (_l, origin, host, status) => {
    const acct = await h.account('pro', 0);
    const res = await post({ authorization: `Bearer ${acct.apiKey}`, origin, host });
    expect(res.statusCode).toBe(status);
    if (status === 403) expect(json(res).error.code).toBe('forbidden');
    else {
      expect(json(res).result.serverInfo.name).toBe('tollgate');
      expect(res.headers['access-control-allow-origin']).toBe(origin);
    }
  });

  it('a batch with more than one tools/call is refused: each call is rate-limited on its own', async () => {
    const acct = await h.account('pro', 100);
    const call = (id: number) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'compute', arguments: { expression: '1+1' } } });
    const res = await post({ authorization: `Bearer ${acct.apiKey}`, 'mcp-protocol-version': '2025-03-26' }, JSON.stringify([call(1), call(2)]));
    expect(res.statusCode).toBe(400);
    expect(json(res).error.code).toBe(-32600);
    expect(await h.credits(acct.accountId)).toBe(100);
  });

  it('a foreign Origin is refused before the key is even looked at', async () => {
    const res = await post({ origin: 'http://evil.example.com', host: 'evil.example.com' });
    expect(res.statusCode).toBe(403);
  });

  it('answers plain JSON with the request id and rate-limit headers', async () => {
    const acct = await h.account('pro', 0);
    const res = await post({ authorization: `Bearer ${acct.apiKey}`, 'x-request-id': 'req-mcp-00000001' });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toMatch(/application\/json/);
    expect(res.headers['x-request-id']).toBe('req-mcp-00000001');
    expect(res.headers['x-ratelimit-limit']).toBe('60');
    expect(res.headers['mcp-session-id']).toBeUndefined();
  });

  it.each(['GET', 'DELETE'] as const)('%s is 405 with Allow: POST (stateless)', async (method) => {
    const res = await h.request({ method, url: '/mcp', headers: { accept: 'text/event-stream' } });
    expect(res.statusCode).toBe(405);
    expect(res.headers.allow).toBe('POST');
    expect(json(res).error.code).toBe('method_not_allowed');
  });
});

describe('origin policy', () => {
  const check = (env: Record<string, string>) => originChecker(loadConfig({}, env));

  it.each([
    [{}, undefined, 'anything.example.com', true],
    [{}, 'http://localhost:8080', 'localhost:8080', true],
    [{}, 'http://[::1]:8080', '[::1]:8080', true],
    [{}, 'http://10.0.0.5:8080', '10.0.0.5:8080', true],
    [{}, 'http://localhost:3000', 'localhost:8080', false],
    [{}, 'https://api.example.com', 'api.example.com', false],
    [{ PUBLIC_BASE_URL: 'https://api.example.com' }, 'https://api.example.com', 'api.example.com', true],
    [{ PUBLIC_BASE_URL: 'https://api.example.com' }, 'http://api.example.com', 'api.example.com', false],
    [{ MCP_ALLOWED_ORIGINS: 'https://a.example.com, https://b.example.com/' }, 'https://b.example.com', 'x', true],
  ] as const)('%j: Origin %s, Host %s -> %s', (env, origin, host, allowed) => {
    expect(check(env as Record<string, string>)(origin, host)).toBe(allowed);
  });

  it('a malformed MCP_ALLOWED_ORIGINS entry fails at start-up', () => {
    expect(() => check({ MCP_ALLOWED_ORIGINS: 'console.example.com' })).toThrow(/MCP_ALLOWED_ORIGINS/);
  });
});

describe('the MCP conformance suite (@modelcontextprotocol/conformance 0.1.13)', () => {
  let proxy: KeyProxy;
  beforeAll(async () => {
    // The CLI sends no API key; the script's proxy adds one and passes Host and Origin through as sent.
    proxy = await startKeyProxy(url.origin, (await h.account('enterprise', 0)).apiKey);
  });
  afterAll(() => proxy.close());

  it.each(SCENARIOS)('%s passes', async (scenario) => {
    const r = await runScenario(`${proxy.url}/mcp`, scenario);
    expect(
      r.checks.filter((c) => c.status === 'FAILURE'),
      r.output,
    ).toEqual([]);
    expect(passed(r)).toBe(true);
  });
});

/** Every value under the harness's Redis prefix, for secret-leak checks. */
async function redisDump(harness: Harness): Promise<string> {
  const redis = harness.container.redis;
  const out: string[] = [];
  for await (const { keys } of deploymentKeys(redis, harness.config.REDIS_PREFIX)) {
    for (const key of keys) {
      const type = await redis.type(key);
      if (type === 'string') out.push((await redis.get(key)) ?? '');
      else if (type === 'hash') out.push(JSON.stringify(await redis.hgetall(key)));
      else if (type === 'list') out.push(JSON.stringify(await redis.lrange(key, 0, -1)));
      else if (type === 'zset') out.push(JSON.stringify(await redis.zrange(key, 0, -1)));
      else if (type === 'set') out.push(JSON.stringify(await redis.smembers(key)));
      else if (type === 'stream') out.push(JSON.stringify(await redis.xrange(key, '-', '+')));
    }
  }
  return out.join('\n');
}

describe('Idempotency-Key on MCP tools/call', () => {
  it('a retried tools/call with the same key gets the first result and is charged once', async () => {
    const acct = await h.account('pro', 100);
    const client = new Client({ name: 'tollgate-test', version: '1.0.0' });
    await client.connect(
      new StreamableHTTPClientTransport(url, { requestInit: { headers: { authorization: `Bearer ${acct.apiKey}`, 'idempotency-key': 'mcp-retry-1' } } }),
    );
    const first = await client.callTool({ name: 'compute', arguments: { expression: '6*7' } });
    const again = await client.callTool({ name: 'compute', arguments: { expression: '6*7' } });
    expect(first.isError).toBeFalsy();
    expect(again).toEqual(first);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    const other = await client.callTool({ name: 'compute', arguments: { expression: '1+1' } });
    expect(other.isError).toBe(true);
    expect((other.content as Array<{ text: string }>)[0]!.text).toMatch(/^idempotency_key_reused:/);
    await client.close();
  });
});

describe('Idempotency-Key on an MCP tools/call with a large answer', () => {
  it('keeps a reference to the job, not the answer, and the retry gets the same result', async () => {
    const acct = await h.account('pro', 100);
    const idemKey = `mcp-large-${Date.now()}`;
    const client = new Client({ name: 'tollgate-test', version: '1.0.0' });
    await client.connect(
      new StreamableHTTPClientTransport(url, { requestInit: { headers: { authorization: `Bearer ${acct.apiKey}`, 'idempotency-key': idemKey } } }),
    );
    // About 17 KB of JSON: above JOB_RESULT_INLINE_BYTES, so neither the job nor this entry holds it.
    const first = await client.callTool({ name: 'compute', arguments: { expression: 'range(0, 3000)' } });
    expect(first.isError, JSON.stringify(first).slice(0, 300)).toBeFalsy();
    expect(JSON.stringify(first)).toContain('2998, 2999');
    const redis = h.container.redis;
    const keys = await redis.keys(`${h.config.REDIS_PREFIX}:idem:${acct.keyId}:*`);
    expect(keys).toHaveLength(1);
    const entry = (await redis.get(keys[0]!))!;
    expect(entry.length).toBeLessThan(2_000);
    expect(entry).not.toContain('2998, 2999');
    const again = await client.callTool({ name: 'compute', arguments: { expression: 'range(0, 3000)' } });
    expect(again).toEqual(first);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    await client.close();
  });
});

describe('Idempotency-Key on an MCP tools/call whose client hangs up', () => {
  it('keeps the key: the retry gets the result of the job the first call started, charged once', async () => {
    const acct = await h.account('pro', 100);
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    llm.enqueue({ type: 'tokens', tokens: ['Try ', 'halving.'], beforeToken: (i) => (i === 0 ? gate : undefined) });
    const before = llm.requests.length;
    const send = (signal?: AbortSignal) =>
      fetch(url, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${acct.apiKey}`,
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          'idempotency-key': 'mcp-gone-1',
        },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'hints', arguments: { problem: 'binary search' } } }),
        signal,
      });
    const abort = new AbortController();
    const first = send(abort.signal)
      .then((r) => r.text())
      .catch((e: Error) => e);
    while (llm.requests.length === before) await new Promise((r) => setTimeout(r, 10));
    abort.abort();
    expect(await first).toBeInstanceOf(Error);
    await new Promise((r) => setTimeout(r, 100));
    release();
    const retry = await send();
    expect(retry.status).toBe(200);
    const body = (await retry.json()) as { result: { isError?: boolean; structuredContent: { result: { text?: string }; cost_cents: number } } };
    expect(body.result.isError).toBeFalsy();
    expect(body.result.structuredContent.cost_cents).toBeGreaterThan(0);
    expect(JSON.stringify(body.result.structuredContent.result)).toContain('Try halving.');
    expect(llm.requests.length - before).toBe(1);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
  });
});
