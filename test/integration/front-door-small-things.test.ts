import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import { llmApiRoot } from '../../src/tools/llm/llm-client.js';
import { similarToolNames, unavailableTools } from '../../src/tools/index.js';
import { loadConfig } from '../../src/config.js';

/** What a new user trips over first: a mistyped tool name, one version everywhere, a model server's address. */

const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };

let h: Harness;
let llm: FakeOpenAI;

beforeAll(async () => {
  llm = await startFakeOpenAI();
  // The server's address alone, as Ollama and the others print it: no /v1.
  h = await startHarness({ LLM_BASE_URL: llm.url }, { workers: ['core', 'llm'] });
});
afterAll(async () => {
  await h.close();
  await llm.close();
});

describe('a mistyped tool name', () => {
  it('is 404 tool_not_found with the names it was probably meant to be', async () => {
    const acct = await h.account('enterprise', 100);
    const res = await h.call('compte', { expression: '1 + 1' }, acct.apiKey);
    expect(res.statusCode).toBe(404);
    const e = json(res).error;
    expect(e.code).toBe('tool_not_found');
    expect(e.message).toContain("Did you mean 'compute'?");
    expect(e.did_you_mean).toEqual(['compute']);
    expect(await h.credits(acct.accountId)).toBe(100);
  });

  it('suggests nothing for a name unlike any tool, and finds slips of case, separators and order', () => {
    expect(similarToolNames('nope')).toEqual([]);
    expect(similarToolNames('x'.repeat(200))).toEqual([]);
    expect(similarToolNames('Web-Search')).toEqual(['web_search']);
    expect(similarToolNames('page fetch')).toEqual(['page_fetch']);
    expect(similarToolNames('cmopute')).toEqual(['compute']);
  });
});

describe('one version', () => {
  it("package.json's version is the root document's v, the OpenAPI info's and MCP's serverInfo's", async () => {
    const root = json(await h.request({ method: 'GET', url: '/' }));
    expect(root.v).toBe(pkg.version);
    const doc = json(await h.request({ method: 'GET', url: '/openapi.json' }));
    expect(doc.info.version).toBe(pkg.version);
    const acct = await h.account('enterprise', 10);
    const res = await h.request({
      method: 'POST',
      url: '/mcp',
      headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      payload: {
        jsonrpc: '2.0',
        id: 1,
        method: 'initialize',
        params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '0' } },
      },
    });
    expect(res.statusCode).toBe(200);
    const body = res.body.startsWith('{')
      ? JSON.parse(res.body)
      : JSON.parse(
          res.body
            .split('\n')
            .find((l) => l.startsWith('data:'))!
            .slice(5),
        );
    expect(body.result.serverInfo).toMatchObject({ name: 'tollgate', version: pkg.version });
  });
});

describe('a language-model server named by its address', () => {
  it('is reached at its /v1 when LLM_BASE_URL has no path, and kept as given when it has one', async () => {
    expect(llmApiRoot('http://localhost:11434')).toBe('http://localhost:11434/v1');
    expect(llmApiRoot('http://localhost:8000/v1/')).toBe('http://localhost:8000/v1');
    expect(llmApiRoot('https://generativelanguage.googleapis.com/v1beta/openai/')).toBe('https://generativelanguage.googleapis.com/v1beta/openai');

    llm.enqueue({ type: 'tokens', tokens: ['Use ', 'a ', 'set.'] });
    const acct = await h.account('starter', 20);
    const base = await h.app.listen({ port: 0, host: '127.0.0.1' });
    const client = new OpenAI({ apiKey: acct.apiKey, baseURL: `${base}/v1`, maxRetries: 0 });
    const res = await client.chat.completions.create({ model: 'svc-hints', messages: [{ role: 'user', content: 'Dedupe a list?' }] });
    expect(res.choices[0]!.message.content).toBe('Use a set.');
    expect(llm.requests.at(-1)!.path).toBe('/v1/chat/completions');
  });

  it('without LLM_BASE_URL, /v1/models lists none and start-up names the tools that are off', async () => {
    const off = await startHarness({}, { workers: [] });
    try {
      const acct = await off.account('enterprise', 10);
      const res = await off.request({ method: 'GET', url: '/v1/models', headers: { authorization: `Bearer ${acct.apiKey}` } });
      expect(res.statusCode).toBe(200);
      expect(json(res).data).toEqual([]);
      const llmOff = unavailableTools(loadConfig({}, {})).find((u) => u.need === 'llm');
      expect(llmOff?.setting).toBe('LLM_BASE_URL');
      expect(llmOff?.tools).toEqual(expect.arrayContaining(['hints', 'genius', 'roast']));
    } finally {
      await off.close();
    }
  });
});
