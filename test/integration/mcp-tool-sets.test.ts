import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ErrorCode, McpError, type Tool } from '@modelcontextprotocol/sdk/types.js';
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/sdk/validation/ajv';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { TOOLS, findTool } from '../../src/tools/index.js';
import { planRank, type Plan } from '../../src/tools/types.js';
import { MCP_PAGE_SIZE, mcpOutputSchema } from '../../src/faces/mcp/server.js';
import { MAX_TOOL_SETS } from '../../src/access/tool-sets.js';
import { outputJsonSchema } from '../../src/calls/catalogue.js';

/**
 * Tool sets (src/access/tool-sets.ts) and what /mcp lists: the URL's narrowing (?tools=, ?families=,
 * ?set=), keys' default sets enforced on every surface, tools/list paging, and every listed tool's
 * outputSchema and annotations, checked with the real MCP SDK client (which validates structuredContent
 * against outputSchema on its own) and with Ajv over a broad sample of real results.
 */

let h: Harness;
let base: string;

beforeAll(async () => {
  h = await startHarness();
  base = await h.app.listen({ port: 0, host: '127.0.0.1' });
});
afterAll(async () => {
  await h.close();
});

const auth = (apiKey: string) => ({ authorization: `Bearer ${apiKey}` });
const MCP_HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };

async function connect(apiKey: string, query = ''): Promise<Client> {
  const client = new Client({ name: 'tool-sets-test', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(`/mcp${query}`, base), { requestInit: { headers: auth(apiKey) } }));
  return client;
}

/** Every page of tools/list, following nextCursor. */
async function listAll(client: Client): Promise<{ tools: Tool[]; pages: number }> {
  const tools: Tool[] = [];
  let cursor: string | undefined;
  let pages = 0;
  do {
    const page = await client.listTools(cursor === undefined ? undefined : { cursor });
    tools.push(...page.tools);
    cursor = page.nextCursor;
    pages++;
  } while (cursor !== undefined && pages < 10);
  return { tools, pages };
}

/** One raw JSON-RPC request to /mcp (no SDK), answered as JSON. */
function rpc(apiKey: string, body: object, query = '') {
  return h.request({ method: 'POST', url: `/mcp${query}`, headers: { ...MCP_HEADERS, ...auth(apiKey) }, payload: JSON.stringify(body) });
}

const createSet = (apiKey: string, body: object) => h.request({ method: 'POST', url: '/toolsets', headers: auth(apiKey), payload: body });

const namesOf = (family: string, plan: Plan) =>
  TOOLS.filter((t) => t.family === family && planRank(t.tier) <= planRank(plan))
    .map((t) => t.name)
    .sort();

describe('tool sets: POST/GET/PUT/DELETE /toolsets', () => {
  it('creates, reads, lists, replaces and deletes a set; the answer names the tools it stands for', async () => {
    const acct = await h.account('pro', 0);
    const res = await createSet(acct.apiKey, { name: 'research', families: ['core'], tools: ['page_fetch', 'page_fetch'] });
    expect(res.statusCode).toBe(201);
    const set = json(res);
    expect(set).toMatchObject({ name: 'research', tools: ['page_fetch'], families: ['core'], key_ids: [] });
    expect(set.resolved_tools).toEqual([...namesOf('core', 'enterprise'), 'page_fetch'].sort());
    expect(json(await h.request({ method: 'GET', url: '/toolsets/research', headers: auth(acct.apiKey) }))).toEqual(set);
    const put = await h.request({ method: 'PUT', url: '/toolsets/research', headers: auth(acct.apiKey), payload: { tools: ['compute'] } });
    expect(put.statusCode).toBe(200);
    expect(json(put)).toMatchObject({ tools: ['compute'], families: [], resolved_tools: ['compute'] });
    const list = json(await h.request({ method: 'GET', url: '/toolsets', headers: auth(acct.apiKey) }));
    expect(list.tool_sets.map((s: { name: string }) => s.name)).toEqual(['research']);
    const del = await h.request({ method: 'DELETE', url: '/toolsets/research', headers: auth(acct.apiKey) });
    expect(json(del)).toEqual({ name: 'research', deleted: true });
    expect((await h.request({ method: 'GET', url: '/toolsets/research', headers: auth(acct.apiKey) })).statusCode).toBe(404);
    expect((await h.request({ method: 'DELETE', url: '/toolsets/research', headers: auth(acct.apiKey) })).statusCode).toBe(404);
  });

  it.each([
    ['an unknown tool, named', { name: 'a', tools: ['compute', 'no_such_tool'] }, /no_such_tool/],
    ['an unknown family, named', { name: 'a', families: ['weather'] }, /weather/],
    ['neither tools nor families', { name: 'a' }, /at least one tool or family/],
    ['empty lists', { name: 'a', tools: [], families: [] }, /at least one tool or family/],
    ['an upper-case name', { name: 'Research', tools: ['compute'] }, /lower-case/],
    ['a name with a slash', { name: 'a/b', tools: ['compute'] }, /lower-case/],
    ['a name too long', { name: 'a'.repeat(65), tools: ['compute'] }, /lower-case/],
    ['too many tools', { name: 'a', tools: Array.from({ length: 201 }, () => 'compute') }, /200/],
    ['an unknown field', { name: 'a', tools: ['compute'], allowed: true }, /allowed/],
    ['tools that are not a list', { name: 'a', tools: 'compute' }, /tools/],
  ])('%s is 400 invalid_input and creates nothing', async (_l, body, message) => {
    const acct = await h.account('pro', 0);
    const res = await createSet(acct.apiKey, body);
    expect(res.statusCode).toBe(400);
    expect(json(res).error.code).toBe('invalid_input');
    expect(JSON.stringify(json(res).error)).toMatch(message);
    expect(json(await h.request({ method: 'GET', url: '/toolsets', headers: auth(acct.apiKey) })).tool_sets).toEqual([]);
  });

  it('a name taken is 409 tool_set_exists; two identical creations at once make one set', async () => {
    const acct = await h.account('pro', 0);
    const both = await Promise.all([0, 1].map(() => createSet(acct.apiKey, { name: 'dup', tools: ['compute'] })));
    expect(both.map((r) => r.statusCode).sort()).toEqual([201, 409]);
    expect(json(both.find((r) => r.statusCode === 409)!).error.code).toBe('tool_set_exists');
    // Another account may use the same name.
    const other = await h.account('pro', 0);
    expect((await createSet(other.apiKey, { name: 'dup', tools: ['compute'] })).statusCode).toBe(201);
  });

  it(`an account keeps at most ${MAX_TOOL_SETS} sets, even when the last ones are created at once`, async () => {
    const acct = await h.account('pro', 0);
    for (let i = 0; i < MAX_TOOL_SETS - 2; i++) expect((await createSet(acct.apiKey, { name: `s${i}`, tools: ['compute'] })).statusCode).toBe(201);
    const last = await Promise.all([0, 1, 2, 3].map((i) => createSet(acct.apiKey, { name: `last${i}`, tools: ['compute'] })));
    expect(last.filter((r) => r.statusCode === 201)).toHaveLength(2);
    for (const r of last.filter((x) => x.statusCode !== 201)) expect(json(r).error.message).toMatch(new RegExp(`${MAX_TOOL_SETS} tool sets`));
    expect(json(await h.request({ method: 'GET', url: '/toolsets', headers: auth(acct.apiKey) })).tool_sets).toHaveLength(MAX_TOOL_SETS);
  });

  it("only the account's production key manages sets; another account's sets are not found", async () => {
    const acct = await h.account('pro', 0);
    expect((await createSet(acct.apiKey, { name: 'mine', tools: ['compute'] })).statusCode).toBe(201);
    const agent = await h.key(acct.accountId, 'agent', 'bot');
    for (const req of [
      { method: 'GET' as const, url: '/toolsets' },
      { method: 'POST' as const, url: '/toolsets', payload: { name: 'x', tools: ['compute'] } },
      { method: 'DELETE' as const, url: '/toolsets/mine' },
    ]) {
      const res = await h.request({ ...req, headers: auth(agent.apiKey) });
      expect(res.statusCode).toBe(403);
      expect(json(res).error.code).toBe('forbidden');
    }
    const stranger = await h.account('pro', 0);
    expect((await h.request({ method: 'GET', url: '/toolsets/mine', headers: auth(stranger.apiKey) })).statusCode).toBe(404);
    expect((await h.request({ method: 'DELETE', url: '/toolsets/mine', headers: auth(stranger.apiKey) })).statusCode).toBe(404);
    expect((await h.request({ method: 'GET', url: '/toolsets/mine', headers: auth(acct.apiKey) })).statusCode).toBe(200);
  });
});

describe('/mcp narrowed by its URL', () => {
  it('?families=core lists only the core tools for an enterprise key, in under 10 KB, each with an outputSchema', async () => {
    const ent = await h.account('enterprise', 0);
    const res = await rpc(ent.apiKey, { jsonrpc: '2.0', id: 1, method: 'tools/list' }, '?families=core');
    expect(res.statusCode).toBe(200);
    expect(Buffer.byteLength(res.body)).toBeLessThan(10 * 1024);
    const { tools, nextCursor } = json(res).result;
    expect(nextCursor).toBeUndefined();
    expect(tools.map((t: Tool) => t.name)).toEqual(namesOf('core', 'enterprise'));
    for (const t of tools as Tool[]) expect(t.outputSchema?.type, t.name).toBe('object');
  });

  it('the SDK client lists and calls through a narrowed URL; a tool outside it is refused, never run or charged', async () => {
    const ent = await h.account('enterprise', 100);
    const client = await connect(ent.apiKey, '?tools=compute,check_balance,bcalc&families=core');
    const { tools } = await listAll(client);
    expect(tools.map((t) => t.name)).toEqual(['check_balance', 'compute']);
    const ok = await client.callTool({ name: 'compute', arguments: { expression: '6 * 7' } });
    expect(ok.structuredContent).toMatchObject({ result: { value: 42 }, cost_cents: 2, remaining_credits: 98 });
    // bcalc is a tool the key may call, but this URL does not offer it.
    const err = await client.callTool({ name: 'bcalc', arguments: { expression: '1 + 1' } }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(McpError);
    expect((err as McpError).code).toBe(ErrorCode.InvalidParams);
    expect((err as McpError).message).toMatch(/bcalc is not offered on this connection.*\?tools=compute,check_balance,bcalc&families=core/);
    expect(await h.credits(ent.accountId)).toBe(98);
    expect(await h.ledgerCharges(ent.accountId)).toBe(1);
    await client.close();
  });

  it('?set= narrows to a set of the account; combined with ?families= it is their intersection', async () => {
    const ent = await h.account('enterprise', 0);
    await createSet(ent.apiKey, { name: 'mixed', tools: ['compute', 'bcalc'], families: ['text'] });
    const list = async (q: string) => json(await rpc(ent.apiKey, { jsonrpc: '2.0', id: 1, method: 'tools/list' }, q)).result.tools.map((t: Tool) => t.name);
    expect(await list('?set=mixed')).toEqual(['bcalc', 'compute', ...namesOf('text', 'enterprise')].sort());
    expect(await list('?set=mixed&families=math')).toEqual(['bcalc']);
    expect(await list('?set=mixed&tools=compute')).toEqual(['compute']);
    // Another account's set of the same name is not this account's.
    const other = await h.account('enterprise', 0);
    const res = await rpc(other.apiKey, { jsonrpc: '2.0', id: 1, method: 'tools/list' }, '?set=mixed');
    expect(res.statusCode).toBe(400);
    expect(json(res).error.message).toMatch(/unknown tool set: mixed/);
  });

  it.each([
    ['unknown tools, each named', '?tools=compute,nope_one,nope_two', /unknown tools: nope_one, nope_two/],
    ['an unknown family', '?families=core,weather', /unknown families: weather/],
    ['an unknown set', '?set=never-made', /unknown tool set: never-made/],
    ['a set name that cannot be one', '?set=..%2F..', /unknown tool set/],
    ['an empty list', '?tools=', /name at least one tool/],
    ['only commas', '?families=,,,', /name at least one family/],
    ['a tools list over 2000 characters', `?tools=${'compute,'.repeat(300)}`, /at most 2000 characters/],
    ['a set name over 64 characters', `?set=${'a'.repeat(65)}`, /at most 64 characters/],
    ['a repeated set', '?set=a&set=b', /set/],
  ])('%s: 400 invalid_input in the envelope, before the MCP transport', async (_l, query, message) => {
    const ent = await h.account('enterprise', 10);
    const res = await rpc(ent.apiKey, { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'compute', arguments: { expression: '1' } } }, query);
    expect(res.statusCode).toBe(400);
    const body = json(res);
    expect(body.jsonrpc).toBeUndefined();
    expect(body.error).toMatchObject({ code: 'invalid_input' });
    expect(body.error.request_id).toEqual(expect.any(String));
    expect(JSON.stringify(body.error)).toMatch(message);
    expect(await h.credits(ent.accountId)).toBe(10);
  });

  it('repeated ?tools= are one list; the intersection can be empty, and then nothing is callable', async () => {
    const ent = await h.account('enterprise', 10);
    const list = await rpc(ent.apiKey, { jsonrpc: '2.0', id: 1, method: 'tools/list' }, '?tools=compute&tools=bcalc');
    expect(json(list).result.tools.map((t: Tool) => t.name)).toEqual(['bcalc', 'compute']);
    const none = await rpc(ent.apiKey, { jsonrpc: '2.0', id: 1, method: 'tools/list' }, '?tools=bcalc&families=core');
    expect(json(none).result.tools).toEqual([]);
    const call = await rpc(
      ent.apiKey,
      { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'bcalc', arguments: { expression: '1' } } },
      '?tools=bcalc&families=core',
    );
    expect(json(call).error.code).toBe(ErrorCode.InvalidParams);
    expect(await h.credits(ent.accountId)).toBe(10);
  });
});

describe('tools/list pages', () => {
  it('an enterprise key gets every tool it may call, by name, in pages of 50; the SDK client follows nextCursor', async () => {
    const ent = await h.account('enterprise', 0);
    const client = await connect(ent.apiKey);
    const first = await client.listTools();
    expect(first.tools).toHaveLength(MCP_PAGE_SIZE);
    expect(first.nextCursor).toEqual(expect.any(String));
    const { tools, pages } = await listAll(client);
    const all = TOOLS.map((t) => t.name).sort();
    expect(tools.map((t) => t.name)).toEqual(all);
    expect(pages).toBe(Math.ceil(all.length / MCP_PAGE_SIZE));
    // Deterministic: the same cursor gives the same page.
    const again = await client.listTools({ cursor: first.nextCursor! });
    expect(again.tools.map((t) => t.name)).toEqual(tools.slice(MCP_PAGE_SIZE, MCP_PAGE_SIZE * 2).map((t) => t.name));
    await client.close();
  });

  it.each([
    ['not base64url', '!!!'],
    ['not JSON', Buffer.from('hello').toString('base64url')],
    ['JSON without after', Buffer.from('{"x":1}').toString('base64url')],
    ['a name that is no tool name', Buffer.from('{"after":"../../etc"}').toString('base64url')],
    ['very long', 'A'.repeat(5000)],
  ])('a cursor %s is JSON-RPC InvalidParams', async (_l, cursor) => {
    const ent = await h.account('enterprise', 0);
    const res = await rpc(ent.apiKey, { jsonrpc: '2.0', id: 7, method: 'tools/list', params: { cursor } });
    const body = json(res);
    expect(body.error.code).toBe(ErrorCode.InvalidParams);
    expect(body.error.message).toMatch(/Invalid cursor/);
  });

  it('a cursor past the last tool gives an empty last page', async () => {
    const ent = await h.account('enterprise', 0);
    const res = await rpc(ent.apiKey, {
      jsonrpc: '2.0',
      id: 1,
      method: 'tools/list',
      params: { cursor: Buffer.from('{"after":"zzz"}').toString('base64url') },
    });
    expect(json(res).result).toEqual({ tools: [] });
  });
});

describe('outputSchema and annotations', () => {
  it('every tool listed has an object outputSchema wrapping its registry result schema, and hints from the registry', async () => {
    const ent = await h.account('enterprise', 0);
    const client = await connect(ent.apiKey);
    const { tools } = await listAll(client);
    for (const t of tools) {
      const success = (t.outputSchema?.anyOf as Array<Record<string, any>> | undefined)?.[0];
      expect(t.outputSchema?.type, t.name).toBe('object');
      expect(success, t.name).toMatchObject({ required: ['result', 'cost_cents', 'remaining_credits'] });
      expect(success!.properties.result, t.name).toEqual(outputJsonSchema(findTool(t.name)!));
      expect(t.annotations, t.name).toMatchObject({
        readOnlyHint: !findTool(t.name)!.sideEffects,
        destructiveHint: !!findTool(t.name)!.sideEffects,
        idempotentHint: expect.any(Boolean),
        openWorldHint: expect.any(Boolean),
      });
    }
    const hint = (name: string) => tools.find((t) => t.name === name)!.annotations!.idempotentHint;
    // Pure computations and reads: idempotent. Writes that set a state: idempotent. Writes that add: not.
    expect([hint('compute'), hint('page_fetch'), hint('cf_update_dns'), hint('cf_delete_dns'), hint('cf_ssl_mode')]).toEqual([true, true, true, true, true]);
    expect([hint('cf_create_dns'), hint('cf_block_ip'), hint('passport_store'), hint('handoff'), hint('cvi_loop')]).toEqual([
      false,
      false,
      false,
      false,
      false,
    ]);
    await client.close();
  });

  it('the SDK client validates structuredContent of several tools against their outputSchema, and a wrong shape would fail it', {
    timeout: 120_000,
  }, async () => {
    const ent = await h.account('enterprise', 1000);
    const client = await connect(ent.apiKey);
    await listAll(client); // the client keeps each listed tool's outputSchema and checks results against it
    const calls: Array<[string, Record<string, unknown>]> = [
      ['compute', { expression: 'sqrt(16) + 1' }],
      ['check_balance', {}],
      ['bcalc', { expression: '2^70' }],
      ['fico_score', findTool('fico_score')!.examples[0] as Record<string, unknown>],
      ['beacon_scan', findTool('beacon_scan')!.examples[0] as Record<string, unknown>],
      ['context_health', findTool('context_health')!.examples[0] as Record<string, unknown>],
    ];
    for (const [name, args] of calls) {
      const res = await client.callTool({ name, arguments: args });
      expect(res.isError, `${name}: ${JSON.stringify(res.content)}`).toBeFalsy();
      expect(res.structuredContent).toHaveProperty('result');
    }
    // A failure is an isError result whose structuredContent the client checks too: the schema's failure branch.
    const bad = await client.callTool({ name: 'compute', arguments: { expression: '2 * (3 +' } });
    expect(bad.isError).toBe(true);
    // The same validator the client uses refuses a result of the wrong shape.
    const check = new AjvJsonSchemaValidator().getValidator(mcpOutputSchema(findTool('compute')!)!);
    const validate = (v: unknown) => check(v).valid;
    expect(validate({ result: { expression: '1', result: '1', value: 1, type: 'number' }, cost_cents: 2, remaining_credits: 1 })).toBe(true);
    expect(validate({ result: { expression: '1', result: 1, value: 1, type: 'number' }, cost_cents: 2, remaining_credits: 1 })).toBe(false);
    expect(validate({ result: 'cut', cost_cents: 2, remaining_credits: 1 })).toBe(false);
    expect(validate({ result: 'cut', cost_cents: 2, remaining_credits: 1, truncated: true })).toBe(true);
    expect(validate({ error: { code: 'invalid_input', message: 'bad' } })).toBe(true);
    expect(validate({ cost_cents: 2, remaining_credits: 1 })).toBe(false);
    await client.close();
  });

  it("a broad sample of real results (every example of every tool that needs no upstream) validates against its tool's outputSchema", {
    timeout: 120_000,
  }, async () => {
    const ent = await h.account('enterprise', 100_000);
    const validator = new AjvJsonSchemaValidator();
    const sample = TOOLS.filter((t) => ['core', 'math', 'text'].includes(t.family) && !t.needs?.length && !t.needsEdgeToken && t.outputSchema);
    let validated = 0;
    const failed: string[] = [];
    for (const tool of sample) {
      // The success branch alone: a success must match it, not merely one of the other shapes.
      const success = (mcpOutputSchema(tool)!.anyOf as object[])[0]!;
      const validate = validator.getValidator({ type: 'object', ...success });
      for (const example of tool.examples) {
        const res = await h.call(tool.name, example, ent.apiKey);
        if (res.statusCode !== 200) continue; // e.g. a passport handle this account never made
        const out = validate(json(res));
        if (!out.valid) failed.push(`${tool.name}: ${out.errorMessage}`);
        validated++;
      }
    }
    expect(failed).toEqual([]);
    expect(validated).toBeGreaterThanOrEqual(30);
  });
});

describe("a key's default tool set, on every surface", () => {
  async function withSet(plan: Plan, credits: number, set: object) {
    const acct = await h.account(plan, credits);
    expect((await createSet(acct.apiKey, { name: 'only', ...set })).statusCode).toBe(201);
    const agent = await h.key(acct.accountId, 'agent', 'bot');
    const put = await h.request({ method: 'PUT', url: `/keys/${agent.keyId}/tool_set`, headers: auth(acct.apiKey), payload: { tool_set: 'only' } });
    expect(json(put)).toEqual({ key_id: agent.keyId, tool_set: 'only' });
    return { acct, agent };
  }

  it('REST, chains and parallels refuse a tool outside the set (403 tool_not_allowed), uncharged; those inside run', async () => {
    const { acct, agent } = await withSet('enterprise', 100, { tools: ['compute'] });
    const ok = await h.call('compute', { expression: '1 + 1' }, agent.apiKey);
    expect(ok.statusCode).toBe(200);
    const refused = await h.call('bcalc', { expression: '1 + 1' }, agent.apiKey);
    expect(refused.statusCode).toBe(403);
    expect(json(refused).error).toMatchObject({ code: 'tool_not_allowed', tool_set: 'only' });
    for (const body of [
      { chain: ['compute', 'bcalc'], q: '1 + 1' },
      { parallel: ['compute', 'bcalc'], q: '1 + 1' },
      { m: 'bcalc', q: '1 + 1' },
    ]) {
      const res = await h.request({ method: 'POST', url: '/', headers: auth(agent.apiKey), payload: body });
      expect(res.statusCode, JSON.stringify(body)).toBe(403);
      expect(json(res).error.code).toBe('tool_not_allowed');
    }
    expect(await h.credits(acct.accountId)).toBe(98);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    // The account's production key has no set: it calls anything its plan allows.
    expect((await h.call('bcalc', { expression: '1 + 1' }, acct.apiKey)).statusCode).toBe(200);
  });

  it('the chat API refuses a model whose tool is outside the set, and lists only those inside it', async () => {
    const { acct, agent } = await withSet('enterprise', 100, { tools: ['compute'] });
    const model = await h.request({ method: 'GET', url: '/v1/models/svc-hints', headers: auth(agent.apiKey) });
    expect(model.statusCode).toBe(403);
    expect(json(model).error.message).toMatch(/tool set "only" does not include hints/);
    const chat = await h.request({
      method: 'POST',
      url: '/v1/chat/completions',
      headers: auth(agent.apiKey),
      payload: { model: 'svc-hints', messages: [{ role: 'user', content: 'two-sum in O(n)?' }] },
    });
    expect(chat.statusCode).toBe(403);
    expect(json(chat).error.message).toMatch(/tool set "only" does not include hints/);
    expect(json(await h.request({ method: 'GET', url: '/v1/models', headers: auth(agent.apiKey) })).data).toEqual([]);
    expect(await h.credits(acct.accountId)).toBe(100);
  });

  it('over MCP the key lists only its set and a call outside it is an isError tool_not_allowed, uncharged', async () => {
    const { acct, agent } = await withSet('enterprise', 100, { families: ['core'] });
    const client = await connect(agent.apiKey);
    const { tools } = await listAll(client);
    expect(tools.map((t) => t.name)).toEqual(namesOf('core', 'enterprise'));
    const refused = await client.callTool({ name: 'bcalc', arguments: { expression: '1 + 1' } });
    expect(refused.isError).toBe(true);
    expect((refused.content as Array<{ text: string }>)[0]!.text).toMatch(/^tool_not_allowed: This key's tool set "only" does not include bcalc/);
    // A URL narrowing cannot widen the set: it narrows what the key may call.
    const wider = await connect(agent.apiKey, '?families=core,math');
    expect((await listAll(wider)).tools.map((t) => t.name)).toEqual(namesOf('core', 'enterprise'));
    expect(await h.credits(acct.accountId)).toBe(100);
    await client.close();
    await wider.close();
  });

  it('a sub-key with a default set sees and calls only tools in both its allowed_tools and the set', async () => {
    const ent = await h.account('enterprise', 100);
    await createSet(ent.apiKey, { name: 'calc', tools: ['compute', 'bcalc'] });
    const res = await h.request({
      method: 'POST',
      url: '/subkeys/create',
      headers: auth(ent.apiKey),
      payload: { name: 'bot', monthly_limit: 50, allowed_tools: ['compute', 'check_balance'], tool_set: 'calc' },
    });
    expect(res.statusCode).toBe(201);
    const sub = json(res);
    expect(sub.tool_set).toBe('calc');
    const client = await connect(sub.api_key);
    expect((await listAll(client)).tools.map((t) => t.name)).toEqual(['compute']);
    expect((await client.callTool({ name: 'compute', arguments: { expression: '2 + 2' } })).isError).toBeFalsy();
    for (const name of ['check_balance', 'bcalc']) {
      const refused = await client.callTool({ name, arguments: name === 'bcalc' ? { expression: '1' } : {} });
      expect((refused.content as Array<{ text: string }>)[0]!.text, name).toMatch(/^tool_not_allowed: /);
    }
    await client.close();
    const listed = json(await h.request({ method: 'GET', url: '/subkeys', headers: auth(ent.apiKey) })).subkeys;
    expect(listed.find((s: { key_id: string }) => s.key_id === sub.key_id).tool_set).toBe('calc');
    expect(await h.credits(ent.accountId)).toBe(98);
  });

  it('a sub-key naming an unknown set is 400 and no key is made', async () => {
    const ent = await h.account('enterprise', 0);
    const res = await h.request({
      method: 'POST',
      url: '/subkeys/create',
      headers: auth(ent.apiKey),
      payload: { name: 'bot', monthly_limit: 50, allowed_tools: ['compute'], tool_set: 'ghost' },
    });
    expect(res.statusCode).toBe(400);
    expect(json(res).error.message).toMatch(/ghost/);
    expect(json(await h.request({ method: 'GET', url: '/subkeys', headers: auth(ent.apiKey) })).subkeys).toEqual([]);
  });

  it('a replaced set applies at once; a set in use cannot be deleted until no live key names it; a rotation keeps it', async () => {
    const { acct, agent } = await withSet('enterprise', 100, { tools: ['compute'] });
    expect((await h.call('bcalc', { expression: '1' }, agent.apiKey)).statusCode).toBe(403);
    await h.request({ method: 'PUT', url: '/toolsets/only', headers: auth(acct.apiKey), payload: { tools: ['bcalc'] } });
    expect((await h.call('bcalc', { expression: '1' }, agent.apiKey)).statusCode).toBe(200);
    expect((await h.call('compute', { expression: '1' }, agent.apiKey)).statusCode).toBe(403);

    const del = await h.request({ method: 'DELETE', url: '/toolsets/only', headers: auth(acct.apiKey) });
    expect(del.statusCode).toBe(409);
    expect(json(del).error).toMatchObject({ code: 'tool_set_in_use', key_ids: [agent.keyId] });
    expect(json(await h.request({ method: 'GET', url: '/toolsets/only', headers: auth(acct.apiKey) })).key_ids).toEqual([agent.keyId]);

    // Rotating the key: the replacement keeps the set; the old key in its grace still names it.
    const rot = json(await h.request({ method: 'POST', url: `/keys/${agent.keyId}/rotate`, headers: auth(acct.apiKey) }));
    expect((await h.call('compute', { expression: '1' }, rot.api_key)).statusCode).toBe(403);
    expect(json(await h.request({ method: 'GET', url: '/toolsets/only', headers: auth(acct.apiKey) })).key_ids.sort()).toEqual(
      [agent.keyId, rot.key_id].sort(),
    );

    // Revoked keys let go of it; the live one is moved to no set, then the set goes.
    await h.request({ method: 'DELETE', url: `/keys/${agent.keyId}`, headers: auth(acct.apiKey) });
    const none = await h.request({ method: 'PUT', url: `/keys/${rot.key_id}/tool_set`, headers: auth(acct.apiKey), payload: { tool_set: null } });
    expect(json(none)).toEqual({ key_id: rot.key_id, tool_set: null });
    expect((await h.call('compute', { expression: '1' }, rot.api_key)).statusCode).toBe(200);
    expect((await h.request({ method: 'DELETE', url: '/toolsets/only', headers: auth(acct.apiKey) })).statusCode).toBe(200);
  });

  it('PUT /keys/{key_id}/tool_set: a key of another account is 404, a revoked key 409, an unknown set 400, a non-production key 403', async () => {
    const acct = await h.account('pro', 0);
    await createSet(acct.apiKey, { name: 'one', tools: ['compute'] });
    const agent = await h.key(acct.accountId, 'agent', 'bot');
    const put = (apiKey: string, keyId: string, tool_set: unknown) =>
      h.request({ method: 'PUT', url: `/keys/${keyId}/tool_set`, headers: auth(apiKey), payload: { tool_set } });
    const stranger = await h.account('pro', 0);
    expect((await put(acct.apiKey, stranger.keyId, 'one')).statusCode).toBe(404);
    // Another account cannot give its own key this account's set either: set names are per account.
    expect((await put(stranger.apiKey, stranger.keyId, 'one')).statusCode).toBe(400);
    expect((await put(acct.apiKey, agent.keyId, 'ghost')).statusCode).toBe(400);
    expect((await put(acct.apiKey, agent.keyId, 42)).statusCode).toBe(400);
    expect((await put(acct.apiKey, 'not-a-uuid', 'one')).statusCode).toBe(400);
    expect((await put(agent.apiKey, agent.keyId, null)).statusCode).toBe(403);
    await h.request({ method: 'DELETE', url: `/keys/${agent.keyId}`, headers: auth(acct.apiKey) });
    const revoked = await put(acct.apiKey, agent.keyId, 'one');
    expect(revoked.statusCode).toBe(409);
    expect(json(revoked).error.code).toBe('key_not_active');
  });
});
