import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Validator } from '@seriousme/openapi-schema-validator';
import openapiTS, { astToString } from 'openapi-typescript';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { TOOLS } from '../../src/tools/index.js';
import { recordedRoutes } from '../../src/faces/http/openapi.js';
import type { RouteSchema } from '../../src/faces/http/route-schema.js';

/**
 * The document is generated from the routes: every route Fastify registers states its schema and
 * appears, every tool's result is typed, the document is valid OpenAPI 3.1, and a client generated from
 * it with openapi-typescript type-checks a call to every operation.
 */

let h: Harness;
let doc: Record<string, any>;

const root = path.resolve(import.meta.dirname, '../..');

beforeAll(async () => {
  h = await startHarness(
    { X402_ENABLED: 'true', X402_PAY_TO: `0x${'1'.repeat(40)}`, X402_SETTLEMENT: 'deferred', ADMIN_TOKEN: 'a'.repeat(32) },
    { workers: [] },
  );
  doc = json(await h.request({ method: 'GET', url: '/openapi.json' }));
});
afterAll(() => h.close());

const METHODS = ['get', 'post', 'put', 'patch', 'delete', 'options'] as const;
const openApiPath = (url: string) => url.replace(/:([A-Za-z0-9_]+)/g, '{$1}');

function routes() {
  return recordedRoutes(h.app).flatMap((r) =>
    ([] as string[])
      .concat(r.method)
      .filter((m) => m !== 'HEAD')
      .map((m) => ({ method: m, url: r.url, schema: r.schema as RouteSchema | undefined })),
  );
}

describe('routes carry their schemas', () => {
  it('every route Fastify registers declares a schema with an operationId, or is left out with a reason', () => {
    const all = routes();
    expect(all.length).toBeGreaterThan(30);
    const missing = all.filter((r) => !r.schema?.operationId).map((r) => `${r.method} ${r.url}`);
    expect(missing).toEqual([]);
    for (const r of all.filter((x) => x.schema?.hide)) expect(r.schema!.hide!.length, `${r.method} ${r.url}`).toBeGreaterThan(10);
    // Only third-party plugins' routes (the reference page's assets, the dashboard's internals) and CORS preflights are left out.
    const hidden = all.filter((r) => r.schema?.hide);
    for (const r of hidden) expect(r.method === 'OPTIONS' || /^(\/docs\/|\/admin\/queues\/)/.test(r.url), `${r.method} ${r.url}`).toBe(true);
  });

  it('every route that is not left out appears in the document, by path and method', () => {
    const shown = routes().filter((r) => !r.schema?.hide);
    for (const r of shown) {
      const op = doc.paths[openApiPath(r.url)]?.[r.method.toLowerCase()];
      expect(op, `${r.method} ${r.url}`).toBeDefined();
      expect(op.operationId).toBe(r.schema!.operationId);
    }
    // And nothing is documented that is not served (the per-tool paths are POST /tools/:name).
    const served = new Set(shown.map((r) => `${r.method.toLowerCase()} ${openApiPath(r.url)}`));
    for (const [p, item] of Object.entries(doc.paths) as [string, any][]) {
      for (const m of METHODS.filter((x) => item[x])) {
        const key = `${m} ${p}`;
        if (/^\/tools\/[^{]+$/.test(p)) expect(served.has('post /tools/{name}')).toBe(true);
        else expect(served.has(key), key).toBe(true);
      }
    }
  });

  it('every $ref points at something in the document', () => {
    const refs: string[] = [];
    const walk = (v: unknown): void => {
      if (Array.isArray(v)) v.forEach(walk);
      else if (v && typeof v === 'object') for (const [k, x] of Object.entries(v)) k === '$ref' && typeof x === 'string' ? refs.push(x) : walk(x);
    };
    walk(doc);
    expect(refs.length).toBeGreaterThan(100);
    const dangling = [...new Set(refs)].filter((ref) => {
      let at: any = doc;
      for (const part of ref.replace(/^#\//, '').split('/')) at = at?.[part.replace(/~1/g, '/').replace(/~0/g, '~')];
      return at === undefined || !ref.startsWith('#/components/');
    });
    expect(dangling).toEqual([]);
  });

  it('operation ids are unique', () => {
    const ids = Object.values(doc.paths).flatMap((item: any) => METHODS.filter((m) => item[m]).map((m) => item[m].operationId));
    expect(new Set(ids).size).toBe(ids.length);
  });

  it('validates as OpenAPI 3.1', async () => {
    expect(doc.openapi).toBe('3.1.0');
    const result = await new Validator().validate(doc as never);
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
  });

  it("types every tool's result", () => {
    const untyped: string[] = [];
    for (const tool of TOOLS) {
      const schema = doc.paths[`/tools/${tool.name}`].post.responses['200'].content['application/json'].schema;
      const result = schema.allOf?.[1]?.properties?.result;
      if (!result || Object.keys(result).length === 0) untyped.push(tool.name);
    }
    expect(untyped).toEqual([]);
  });

  it('shows a synchronous call by default and the real key prefixes', () => {
    const compute = doc.paths['/tools/compute'].post;
    const prefer = doc.components.parameters.Prefer;
    expect(prefer.required).toBe(false);
    expect(prefer.description).toMatch(/Leave it out to wait/);
    expect(JSON.stringify(compute.requestBody.content['application/json'].examples)).not.toMatch(/respond-async/);
    const bearer = doc.components.securitySchemes.bearerAuth.description;
    for (const prefix of ['cv_', 'cv_test_', 'cv_sub_', 'cv_agent_', 'titan_vip_']) expect(bearer).toContain(prefix);
    expect(bearer).not.toContain('cv_live_');
  });
});

describe('a generated client', () => {
  it('type-checks a call to every operation (openapi-typescript + openapi-fetch)', async () => {
    const types = astToString(await openapiTS(doc as never));
    const dir = await mkdtemp(path.join(root, '.openapi-client-'));
    try {
      await writeFile(path.join(dir, 'api.d.ts'), types);
      const calls: string[] = [];
      for (const [p, item] of Object.entries(doc.paths) as [string, any][]) {
        for (const m of METHODS.filter((x) => item[x] && x !== 'options')) {
          const op = item[m];
          const params = [...(item.parameters ?? []), ...(op.parameters ?? [])].filter((x: any) => !x.$ref);
          const pathParams = params.filter((x: any) => x.in === 'path').map((x: any) => `${JSON.stringify(x.name)}: "x"`);
          // JSON, or a form (the OAuth endpoints): either is typed from its schema.
          const media = op.requestBody?.content?.['application/json'] ?? op.requestBody?.content?.['application/x-www-form-urlencoded'];
          // A JSON body is sent as the operation's first example: the example must fit the generated type.
          const example = media?.examples ? (Object.values(media.examples)[0] as { value: unknown }).value : undefined;
          if (media) expect(example, `${m.toUpperCase()} ${p} needs a body example`).toBeDefined();
          const init = [pathParams.length ? `params: { path: { ${pathParams.join(', ')} } }` : '', media ? `body: ${JSON.stringify(example)}` : ''].filter(
            Boolean,
          );
          calls.push(`  await client.${m.toUpperCase()}(${JSON.stringify(p)}${init.length ? `, { ${init.join(', ')} }` : ''});`);
        }
      }
      const program = [
        "import createClient from 'openapi-fetch';",
        "import type { paths } from './api.js';",
        "const client = createClient<paths>({ baseUrl: 'http://localhost' });",
        'export async function callEverything(): Promise<void> {',
        ...calls,
        '}',
        '',
      ].join('\n');
      await writeFile(path.join(dir, 'calls.ts'), program);
      await writeFile(
        path.join(dir, 'tsconfig.json'),
        JSON.stringify({
          compilerOptions: { strict: true, module: 'NodeNext', moduleResolution: 'NodeNext', target: 'ES2022', noEmit: true, skipLibCheck: true, types: [] },
          files: ['calls.ts'],
        }),
      );
      const tsc = path.join(root, 'node_modules/typescript/bin/tsc');
      const out = await promisify(execFile)(process.execPath, [tsc, '-p', path.join(dir, 'tsconfig.json')], { cwd: dir }).catch(
        (e: { stdout?: string; stderr?: string }) => e,
      );
      expect(`${out.stdout ?? ''}${out.stderr ?? ''}`).toBe('');
      expect(calls.length).toBeGreaterThan(TOOLS.length + 30);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }, 120_000);
});
