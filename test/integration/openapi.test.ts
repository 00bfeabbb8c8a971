import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Validator } from '@seriousme/openapi-schema-validator';
import openapiTS, { astToString } from 'openapi-typescript';
import createClient from 'openapi-fetch';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { TOOLS } from '../../src/tools/index.js';
import { ERROR_STATUS } from '../../src/errors.js';
import { inputJsonSchema } from '../../src/calls/catalogue.js';
import { loadConfig } from '../../src/config.js';

let h: Harness;
let pro: TestAccount;
let baseUrl: string;

beforeAll(async () => {
  // Real sockets, reused by fetch between tests. With the default 5 s keep-alive, fetch drops an idle
  // socket after 4 s (the server's hint less a second); on a loaded CI machine the event loop stalled past
  // that margin once, fetch reused a socket the server was closing, and the request failed (ECONNRESET).
  // No idle gap in this file comes near a minute.
  h = await startHarness({ KEEP_ALIVE_TIMEOUT_MS: '60000' });
  pro = await h.account('enterprise', 1000, { rpm: 100_000 });
  baseUrl = await h.app.listen({ port: 0, host: '127.0.0.1' });
});
afterAll(() => h.close());

async function liveDocument(): Promise<Record<string, any>> {
  const res = await fetch(`${baseUrl}/openapi.json`);
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/application\/json/);
  return (await res.json()) as Record<string, any>;
}

async function expectValid(doc: Record<string, unknown>) {
  const result = await new Validator().validate(doc);
  expect(result.errors ?? []).toEqual([]);
  expect(result.valid).toBe(true);
}

describe('GET /openapi.json', () => {
  it('is an OpenAPI 3.1 document that validates, served without a key', async () => {
    const doc = await liveDocument();
    expect(doc.openapi).toBe('3.1.0');
    expect(doc.servers).toEqual([{ url: baseUrl }]);
    await expectValid(doc);
  });

  it('also validates with x402 enabled, and then offers the x402 schemes (v2 PAYMENT-SIGNATURE, v1 X-Payment) except on side-effect tools', async () => {
    const h2 = await startHarness({ X402_ENABLED: 'true', X402_PAY_TO: `0x${'1'.repeat(40)}`, X402_SETTLEMENT: 'deferred' }, { workers: [] });
    let doc: Record<string, any>;
    try {
      doc = json(await h2.request({ method: 'GET', url: '/openapi.json' }));
    } finally {
      await h2.close();
    }
    await expectValid(doc);
    expect(doc.components.securitySchemes.x402Payment).toMatchObject({ type: 'apiKey', in: 'header', name: 'PAYMENT-SIGNATURE' });
    expect(doc.components.securitySchemes.x402PaymentV1).toMatchObject({ type: 'apiKey', in: 'header', name: 'X-Payment' });
    expect(doc.paths['/tools/compute'].post.security).toEqual([{ bearerAuth: [] }, { x402Payment: [] }, { x402PaymentV1: [] }]);
    expect(doc.paths['/tools/cf_purge_all'].post.security).toEqual([{ bearerAuth: [] }]);
  });

  it('names how many tools exist and has one path per tool with its input schema and examples', async () => {
    const doc = await liveDocument();
    expect(doc.info['x-total-tools']).toBe(TOOLS.length);
    expect(doc.info.description).toContain(`${TOOLS.length} tools`);
    for (const tool of TOOLS) {
      const op = doc.paths[`/tools/${tool.name}`]?.post;
      expect(op, tool.name).toBeDefined();
      const media = op.requestBody.content['application/json'];
      expect(media.schema).toEqual(JSON.parse(JSON.stringify(inputJsonSchema(tool))));
      expect(Object.values(media.examples).map((e: any) => e.value)).toEqual(JSON.parse(JSON.stringify(tool.examples)));
    }
    // No tool is claimed that does not exist.
    const toolPaths = Object.keys(doc.paths).filter((p) => /^\/tools\/[^{]+$/.test(p));
    expect(toolPaths.sort()).toEqual(TOOLS.map((t) => `/tools/${t.name}`).sort());
  });

  it('describes every endpoint, the error envelope, the headers, bearer auth and the x402 402', async () => {
    const doc = await liveDocument();
    const ops = Object.entries(doc.paths).flatMap(([path, item]: [string, any]) =>
      ['get', 'post', 'delete'].filter((m) => item[m]).map((m) => `${m.toUpperCase()} ${path}`),
    );
    for (const op of [
      'GET /',
      'POST /',
      'GET /health',
      'GET /tools',
      'GET /tools/{name}',
      'POST /tools/{name}',
      'GET /jobs',
      'GET /jobs/{id}',
      'GET /jobs/{id}/events',
      'GET /balance',
      'GET /v1/manifest',
      'GET /subkeys',
      'POST /subkeys/create',
      'DELETE /subkeys/{key_id}',
      'POST /mcp',
      'POST /v1/chat/completions',
      'GET /v1/models',
      'GET /v1/models/{model}',
      'GET /openapi.json',
      'GET /docs',
      'GET /docs/readme',
    ]) {
      expect(ops).toContain(op);
    }
    const c = doc.components;
    expect(c.schemas.ErrorCode.enum.sort()).toEqual(Object.keys(ERROR_STATUS).sort());
    expect(c.schemas.Error.properties.error.required).toEqual(['code', 'message', 'request_id']);
    expect(c.securitySchemes.bearerAuth).toMatchObject({ type: 'http', scheme: 'bearer' });
    for (const name of [
      'X-RateLimit-Limit',
      'X-RateLimit-Remaining',
      'X-RateLimit-Reset',
      'Retry-After',
      'X-Job-Id',
      'X-Payment-Required',
      'X-Payment-Amount',
    ]) {
      expect(c.headers[name], name).toBeDefined();
    }
    expect(c.parameters['Idempotency-Key']).toMatchObject({ in: 'header', name: 'Idempotency-Key' });
    expect(c.schemas.PaymentRequired.required).toEqual(expect.arrayContaining(['x402Version', 'accepts']));
    expect(c.responses.PaymentRequired.headers['X-Payment-Amount']).toBeDefined();
    const compute = doc.paths['/tools/compute'].post;
    expect(compute.responses['402']).toEqual({ $ref: '#/components/responses/PaymentRequired' });
    expect(compute.responses['429']).toEqual({ $ref: '#/components/responses/TooManyRequests' });
    expect(compute.responses['200'].headers['X-Job-Id']).toBeDefined();
    expect(c.responses.TooManyRequests.headers['Retry-After']).toBeDefined();
    expect(doc.paths['/'].post.requestBody.content['application/json'].schema).toEqual({ $ref: '#/components/schemas/ProtocolRequest' });
    expect(c.schemas.ChatCompletionRequest.required).toEqual(expect.arrayContaining(['model', 'messages']));
  });

  it("shows compute's true answer as the sample of POST /tools/{name}, and no Prefer in any sample", async () => {
    const doc = await liveDocument();
    const op = doc.paths['/tools/{name}'].post;
    const body = Object.values(op.requestBody.content['application/json'].examples as Record<string, { value: unknown }>)[0]!.value;
    const sample = Object.values(op.responses['200'].content['application/json'].examples as Record<string, { value: any }>)[0]!.value;
    const res = await h.call('compute', body as Record<string, unknown>, pro.apiKey);
    expect(res.statusCode).toBe(200);
    expect(json(res).result).toEqual(sample.result);
    expect(json(res).cost_cents).toBe(sample.cost_cents);
    expect(doc.components.parameters.Prefer.schema).toEqual({ type: 'string' });
  });

  it("is what the TypeScript client's types were generated from (regenerate with clients/typescript/scripts/generate.ts)", async () => {
    const doc = await liveDocument();
    const file = readFileSync(new URL('../../clients/typescript/src/api.d.ts', import.meta.url), 'utf8');
    const generated = astToString(await openapiTS(doc as never, { alphabetize: false }));
    expect(file.slice(file.indexOf('*/\n\n') + 4)).toBe(generated);
  });

  it('generates TypeScript types, and a typed client calls compute with them', async () => {
    const doc = await liveDocument();
    const types = astToString(await openapiTS(doc as never));
    expect(types).toContain('"/tools/compute"');
    expect(types).toContain('expression');

    const client = createClient<any>({ baseUrl });
    const { data, error, response } = await client.POST('/tools/compute', {
      body: { expression: '6 * 7' },
      headers: { authorization: `Bearer ${pro.apiKey}` },
    });
    expect(error).toBeUndefined();
    expect(response.status).toBe(200);
    expect(data).toMatchObject({ result: { value: 42 }, cost_cents: 2 });
  });
});

describe('/docs', () => {
  it('answers the interactive reference as HTML, pointing at /openapi.json', async () => {
    for (const url of ['/docs', '/docs/']) {
      const res = await h.request({ method: 'GET', url });
      expect(res.statusCode, url).toBe(200);
      expect(res.headers['content-type']).toMatch(/text\/html/);
      expect(res.body).toContain('/openapi.json');
      expect(res.body).toContain('/docs/js/scalar.js');
    }
    const script = await h.request({ method: 'GET', url: '/docs/js/scalar.js' });
    expect(script.statusCode).toBe(200);
    expect(script.headers['content-type']).toMatch(/javascript/);
  });

  it('serves the README as Markdown at /docs/readme', async () => {
    const res = await h.request({ method: 'GET', url: '/docs/readme' });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toMatch(/text\/markdown/);
    expect(res.body).toMatch(/^# Tollgate/);
  });
});

describe('CORS', () => {
  const origin = 'http://example.test';

  it('allows a preflight for POST /tools/compute with authorization and content-type', async () => {
    const res = await h.request({
      method: 'OPTIONS',
      url: '/tools/compute',
      headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type' },
    });
    expect(res.statusCode).toBe(204);
    expect(res.headers['access-control-allow-origin']).toBe('*');
    expect(String(res.headers['access-control-allow-methods'])).toContain('POST');
    const allowed = String(res.headers['access-control-allow-headers']).toLowerCase().split(/,\s*/);
    for (const name of ['authorization', 'content-type', 'idempotency-key', 'x-payment', 'last-event-id']) expect(allowed).toContain(name);
    expect(res.headers['access-control-allow-credentials']).toBeUndefined();
  });

  it('answers preflights on every route, /docs and /openapi.json included', async () => {
    for (const url of ['/', '/jobs/abc', '/balance', '/v1/chat/completions', '/openapi.json', '/subkeys/x']) {
      const res = await h.request({ method: 'OPTIONS', url, headers: { origin, 'access-control-request-method': 'GET' } });
      expect(res.statusCode, url).toBe(204);
      expect(res.headers['access-control-allow-origin'], url).toBe('*');
    }
  });

  it('exposes X-Job-Id and the other headers callers read on a real call', async () => {
    const res = await h.call('compute', { expression: '1 + 1' }, pro.apiKey, { origin });
    expect(res.statusCode).toBe(200);
    expect(res.headers['access-control-allow-origin']).toBe('*');
    const exposed = String(res.headers['access-control-expose-headers']).split(/,\s*/);
    for (const name of [
      'X-Job-Id',
      'X-Request-Id',
      'X-RateLimit-Limit',
      'X-RateLimit-Remaining',
      'X-RateLimit-Reset',
      'Retry-After',
      'Idempotent-Replayed',
      'Location',
      'X-Payment-Response',
    ]) {
      expect(exposed).toContain(name);
    }
    expect(res.headers['x-job-id']).toBeTruthy();
  });

  it('leaves /mcp to its own origin check', async () => {
    const pre = await h.request({
      method: 'OPTIONS',
      url: '/mcp',
      headers: { origin: 'http://evil.example.com', host: 'evil.example.com', 'access-control-request-method': 'POST' },
    });
    expect(pre.statusCode).toBe(403);
    expect(pre.headers['access-control-allow-origin']).toBeUndefined();
    const res = await h.request({
      method: 'POST',
      url: '/mcp',
      headers: { origin: 'http://evil.example.com', host: 'evil.example.com', 'content-type': 'application/json' },
      payload: '{}',
    });
    expect(res.statusCode).toBe(403);
    expect(json(res).error.code).toBe('forbidden');
    expect(res.headers['access-control-allow-origin']).toBeUndefined();
    // An allowed origin gets /mcp's own preflight answer, not the global one.
    const own = 'http://127.0.0.1:8080';
    const ok = await h.request({ method: 'OPTIONS', url: '/mcp', headers: { origin: own, host: '127.0.0.1:8080', 'access-control-request-method': 'POST' } });
    expect(ok.statusCode).toBe(204);
    expect(ok.headers['access-control-allow-origin']).toBe(own);
    expect(ok.headers['access-control-allow-methods']).toBe('POST');
    expect(ok.headers['access-control-expose-headers']).toBe('mcp-session-id, mcp-protocol-version, x-request-id, www-authenticate');
  });

  it('with CORS_ORIGINS set, reflects only the listed origins', async () => {
    const h2 = await startHarness({ CORS_ORIGINS: 'https://app.example.com, https://other.example.com' }, { workers: [] });
    try {
      const pre = (o: string) => h2.request({ method: 'OPTIONS', url: '/tools/compute', headers: { origin: o, 'access-control-request-method': 'POST' } });
      const yes = await pre('https://app.example.com');
      expect(yes.headers['access-control-allow-origin']).toBe('https://app.example.com');
      expect(String(yes.headers.vary)).toMatch(/origin/i);
      const no = await pre('http://example.test');
      expect(no.headers['access-control-allow-origin']).toBeUndefined();
    } finally {
      await h2.close();
    }
  });

  it('refuses a CORS_ORIGINS entry that is not an origin', () => {
    expect(() => loadConfig({}, { CORS_ORIGINS: 'example.com/path' })).toThrow(/CORS_ORIGINS/);
  });
});
