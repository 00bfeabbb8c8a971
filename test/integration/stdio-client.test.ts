import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import type { JSONRPCMessage, Progress } from '@modelcontextprotocol/sdk/types.js';
import { startHarness, type Harness } from '../helpers/harness.js';
import { startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import { TOOLS } from '../../src/tools/index.js';
import { planRank } from '../../src/tools/types.js';

const BIN = fileURLToPath(new URL('../../bin/tollgate-mcp.js', import.meta.url));

let h: Harness;
let llm: FakeOpenAI;
let baseUrl: string;
const open: Client[] = [];

beforeAll(async () => {
  llm = await startFakeOpenAI();
  h = await startHarness({ LLM_BASE_URL: llm.baseURL });
  baseUrl = await h.app.listen({ port: 0, host: '127.0.0.1' });
});
afterEach(async () => {
  for (const c of open.splice(0)) await c.close();
});
afterAll(async () => {
  await h.close();
  await llm.close();
});

/** Launches the relay the way an MCP host does: `node bin/tollgate-mcp.js` on stdio. */
async function relay(env: Record<string, string>, wire?: JSONRPCMessage[]): Promise<Client> {
  const client = new Client({ name: 'host', version: '1.0.0' });
  const transport = new StdioClientTransport({ command: process.execPath, args: [BIN], env: { PATH: process.env.PATH ?? '', ...env }, stderr: 'pipe' });
  await client.connect(transport);
  if (wire) {
    // What the relay wrote, in the order it wrote it, before the SDK dispatches anything.
    const dispatch = transport.onmessage!;
    transport.onmessage = (message: JSONRPCMessage) => {
      wire.push(message);
      dispatch(message);
    };
  }
  open.push(client);
  return client;
}

describe('the stdio relay (bin/tollgate-mcp.js)', () => {
  it('relays tools/list for the key it was given', async () => {
    const acct = await h.account('starter', 0);
    const client = await relay({ TOLLGATE_API_KEY: acct.apiKey, TOLLGATE_URL: baseUrl });
    expect(client.getInstructions()).toMatch(/charged/);
    const { tools } = await client.listTools();
    const expected = TOOLS.filter((t) => planRank(t.tier) <= planRank('starter'))
      .map((t) => t.name)
      .sort();
    expect(tools.map((t) => t.name).sort()).toEqual(expected);
    expect(tools.find((t) => t.name === 'hints')?.inputSchema).toMatchObject({ type: 'object', required: ['problem'] });
  });

  it('narrows the list as /mcp does with TOLLGATE_FAMILIES and TOLLGATE_TOOLS', async () => {
    const acct = await h.account('pro', 0);
    const client = await relay({ TOLLGATE_API_KEY: acct.apiKey, TOLLGATE_URL: baseUrl, TOLLGATE_FAMILIES: 'core', TOLLGATE_TOOLS: 'compute,page_fetch' });
    // Both narrow: the intersection.
    expect((await client.listTools()).tools.map((t) => t.name)).toEqual(['compute']);
  });

  it('relays tools/call end to end: the service runs and charges the call', async () => {
    const acct = await h.account('pro', 50);
    const client = await relay({ TOLLGATE_API_KEY: acct.apiKey, TOLLGATE_URL: `${baseUrl}/` });
    const res = await client.callTool({ name: 'compute', arguments: { expression: 'sqrt(16) + 1' } });
    expect(res.isError).toBeFalsy();
    expect(res.structuredContent).toMatchObject({ result: { value: 5 }, cost_cents: 2, remaining_credits: 48 });
    expect(await h.credits(acct.accountId)).toBe(48);
  });

  it('relays business failures as isError results', async () => {
    const acct = await h.account('pro', 0);
    const client = await relay({ TOLLGATE_API_KEY: acct.apiKey, TOLLGATE_URL: baseUrl });
    const res = await client.callTool({ name: 'compute', arguments: { expression: '1+1' } });
    expect(res.isError).toBe(true);
    expect((res.content as Array<{ text: string }>)[0]!.text).toMatch(/^insufficient_credits: /);
  });

  it('passes the service\u2019s progress notifications on to the host', async () => {
    llm.enqueue({ type: 'tokens', tokens: ['Roast', ' incoming', '.'] });
    const acct = await h.account('starter', 10);
    const wire: JSONRPCMessage[] = [];
    const client = await relay({ TOLLGATE_API_KEY: acct.apiKey, TOLLGATE_URL: baseUrl }, wire);
    const seen: Progress[] = [];
    const res = await client.callTool({ name: 'roast', arguments: { text: 'My todo app, in 14 microservices.' } }, undefined, {
      onprogress: (p) => seen.push(p),
    });
    expect(res.structuredContent).toMatchObject({ result: { text: 'Roast incoming.' }, cost_cents: 5 });
    // On the wire: every token's progress, in order, before the result.
    const answered = wire.findIndex((m) => 'result' in m && 'id' in m);
    const progressBefore = wire.slice(0, answered).filter((m) => 'method' in m && m.method === 'notifications/progress');
    expect(progressBefore.map((m) => (m as unknown as { params: { progress: number } }).params.progress)).toEqual([1, 2, 3]);
    // The host saw them through onprogress. The SDK client drops a notification it reads in the same
    // chunk as the response (typescript-sdk#2580), so under load the last ones may not reach the callback.
    expect(seen.map((p) => p.progress)).toEqual([1, 2, 3].slice(0, seen.length));
  });

  it('reports an unreachable service as a JSON-RPC error the host can show', async () => {
    const port = await closedPort();
    const client = await relay({ TOLLGATE_API_KEY: 'cv_' + 'A'.repeat(40), TOLLGATE_URL: `http://127.0.0.1:${port}` });
    await expect(client.listTools()).rejects.toThrow(/Cannot use Tollgate at http:\/\/127\.0\.0\.1:\d+\/mcp/);
  });

  it('exits with a clear message when TOLLGATE_API_KEY is missing', async () => {
    const child = spawn(process.execPath, [BIN], { env: { PATH: process.env.PATH ?? '' }, stdio: ['pipe', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const [code] = await once(child, 'exit');
    expect(code).toBe(1);
    expect(stderr).toMatch(/TOLLGATE_API_KEY/);
  });
});

/** A port that nothing listens on: bind one, note it, let it go. */
async function closedPort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address() as { port: number };
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}
