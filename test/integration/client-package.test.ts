import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gunzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { API_VERSION } from '../../src/calls/catalogue.js';

let h: Harness;
let baseUrl: string;
const temps: string[] = [];

beforeAll(async () => {
  // PUBLIC_HOSTS: the service's own host names; a Host naming another is not reflected into its links.
  h = await startHarness({ PUBLIC_HOSTS: 'tollgate.example' });
  baseUrl = await h.app.listen({ port: 0, host: '127.0.0.1' });
});
afterAll(async () => {
  await h.close();
  for (const d of temps) await rm(d, { recursive: true, force: true });
});

async function tempDir(prefix: string): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), prefix));
  temps.push(d);
  return d;
}

function outsideNpm(): Record<string, string> {
  return Object.fromEntries(Object.entries(process.env).filter((e): e is [string, string] => e[1] !== undefined && !/^(npm_|INIT_CWD$|TOLLGATE_)/i.test(e[0])));
}

/** The entries of a ustar archive: name, mode and body. */
function untar(buf: Buffer): Map<string, { mode: number; body: Buffer }> {
  const out = new Map<string, { mode: number; body: Buffer }>();
  for (let at = 0; at + 512 <= buf.length; ) {
    const header = buf.subarray(at, at + 512);
    if (header.every((b) => b === 0)) break;
    const field = (from: number, len: number) =>
      header
        .toString('utf8', from, from + len)
        .replace(/\0.*$/s, '')
        .trim();
    const size = parseInt(field(124, 12), 8);
    out.set(field(0, 100), { mode: parseInt(field(100, 8), 8), body: buf.subarray(at + 512, at + 512 + size) });
    at += 512 + Math.ceil(size / 512) * 512;
  }
  return out;
}

describe('the stdio MCP client as an npm tarball (GET /client/tollgate-mcp.tgz)', () => {
  it('serves a gzipped npm package tollgate-mcp without a key', async () => {
    const res = await h.request({ method: 'GET', url: '/client/tollgate-mcp.tgz' });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toBe('application/gzip');
    const files = untar(gunzipSync(res.rawPayload));
    expect([...files.keys()].sort()).toEqual(['package/bin/tollgate-mcp.js', 'package/package.json']);
    const pkg = JSON.parse(files.get('package/package.json')!.body.toString());
    expect(pkg).toMatchObject({ name: 'tollgate-mcp', version: API_VERSION, bin: { 'tollgate-mcp': 'bin/tollgate-mcp.js' }, type: 'module' });
    expect(Object.keys(pkg.dependencies).sort()).toEqual(['@modelcontextprotocol/sdk', 'zod']);
    expect(files.get('package/bin/tollgate-mcp.js')!.mode & 0o111).toBe(0o111);

    // The same bytes on every request; a matching ETag gets a 304.
    const again = await h.request({ method: 'GET', url: '/client/tollgate-mcp.tgz', headers: { 'if-none-match': String(res.headers.etag) } });
    expect(again.statusCode).toBe(304);
  });

  it('the root document\u2019s npm command names the tarball and the env the client needs', async () => {
    const doc = json(await h.request({ method: 'GET', url: '/', headers: { host: 'tollgate.example' } }));
    expect(doc.npm).toBe('TOLLGATE_URL=http://tollgate.example TOLLGATE_API_KEY=<your key> npx -y http://tollgate.example/client/tollgate-mcp.tgz');
    expect(doc.endpoints['GET /client/tollgate-mcp.tgz']).toBeDefined();
  });

  it('runs with `npx -y <base>/client/tollgate-mcp.tgz` from an empty folder and lists tools', { timeout: 150_000 }, async () => {
    const acct = await h.account('pro', 0);
    const cwd = await tempDir('tollgate-npx-');
    const cache = await tempDir('tollgate-npm-cache-');
    // The root document's command, as a user would copy it, filled in with a key.
    const doc = json(await h.request({ method: 'GET', url: '/', headers: { host: new URL(baseUrl).host } }));
    const command: string = doc.npm.replace('<your key>', acct.apiKey);
    const words = command.split(' ');
    const env = Object.fromEntries(words.filter((w) => /^[A-Z_]+=/.test(w)).map((w) => [w.slice(0, w.indexOf('=')), w.slice(w.indexOf('=') + 1)]));
    const [npx, ...args] = words.filter((w) => !/^[A-Z_]+=/.test(w));
    expect(npx).toBe('npx');
    expect(args).toEqual(['-y', `${baseUrl}/client/tollgate-mcp.tgz`]);
    expect(env).toEqual({ TOLLGATE_URL: baseUrl, TOLLGATE_API_KEY: acct.apiKey });

    const started = Date.now();
    const client = new Client({ name: 'host', version: '1.0.0' });
    const transport = new StdioClientTransport({
      command: 'npx',
      args,
      cwd,
      // The test runner's own environment minus npm's per-run variables (which point into the checkout),
      // a fresh npm cache so nothing installed before is reused, and the command's env.
      env: { ...outsideNpm(), npm_config_cache: cache, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false', ...env },
      stderr: 'pipe',
    });
    let stderr = '';
    transport.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    try {
      await client.connect(transport, { timeout: 120_000 });
      const { tools } = await client.listTools();
      const seconds = ((Date.now() - started) / 1000).toFixed(1);
      console.log(`npx -y ${args[1]}: connected and listed ${tools.length} tools in ${seconds} s`);
      expect(tools.map((t) => t.name)).toContain('compute');
      expect(client.getServerVersion()).toMatchObject({ name: 'tollgate', version: API_VERSION });
    } catch (e) {
      throw new Error(`${e instanceof Error ? e.message : String(e)}\nnpx stderr:\n${stderr}`);
    } finally {
      await client.close();
    }
  });
});
