/**
 * The stdio MCP client (bin/tollgate-mcp.js) as an installable npm tarball, served at
 * GET /client/tollgate-mcp.tgz so that `npx -y <base>/client/tollgate-mcp.tgz` works anywhere: the
 * repository's own package is private and its name is not on the registry.
 *
 * The tarball is built in memory (no npm, no temp files): a package.json generated here (name
 * `tollgate-mcp`, the service's API version, the client's runtime dependencies at the versions the
 * repository's package.json pins) and the client script, in a ustar archive under `package/`, gzipped.
 * The client keeps its place in bin/, since it reads its version from `../package.json`.
 */
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { gzipSync } from 'node:zlib';
import { API_VERSION } from '../calls/catalogue.js';

export const CLIENT_PACKAGE_NAME = 'tollgate-mcp';

/**
 * What the client imports at run time: the MCP SDK, and zod, the SDK's required peer dependency
 * (listed so that the install does not rest on npm's automatic peer installs).
 */
const RUNTIME_DEPENDENCIES = ['@modelcontextprotocol/sdk', 'zod'] as const;

export interface ClientPackage {
  tarball: Buffer;
  /** npm's `integrity` form of the tarball (sha512), also a strong ETag. */
  integrity: string;
  packageJson: Record<string, unknown>;
}

/** The first of the candidates (relative to this module) that can be read: src/ops/ in a checkout, dist/src/ops/ in a build. */
async function readFirst(candidates: string[]): Promise<string> {
  let last: unknown;
  for (const rel of candidates) {
    try {
      return await readFile(new URL(rel, import.meta.url), 'utf8');
    } catch (e) {
      last = e;
    }
  }
  throw last;
}

export async function buildClientPackage(): Promise<ClientPackage> {
  const [script, rootJson] = await Promise.all([
    readFirst(['../../bin/tollgate-mcp.js', '../../../bin/tollgate-mcp.js']),
    readFirst(['../../package.json', '../../../package.json']),
  ]);
  const root = JSON.parse(rootJson) as { dependencies?: Record<string, string>; engines?: Record<string, string> };
  const dependencies: Record<string, string> = {};
  for (const name of RUNTIME_DEPENDENCIES) {
    const range = root.dependencies?.[name];
    if (!range) throw new Error(`package.json has no dependency ${name}, which bin/tollgate-mcp.js needs`);
    dependencies[name] = range;
  }
  const packageJson = {
    name: CLIENT_PACKAGE_NAME,
    version: API_VERSION,
    description: 'Stdio MCP relay to a Tollgate service (TOLLGATE_API_KEY, TOLLGATE_URL)',
    type: 'module',
    bin: { [CLIENT_PACKAGE_NAME]: 'bin/tollgate-mcp.js' },
    files: ['bin/'],
    engines: root.engines ?? { node: '>=20.11' },
    dependencies,
  };
  const tarball = gzipSync(
    tar([
      { path: 'package/package.json', body: Buffer.from(JSON.stringify(packageJson, null, 2) + '\n'), mode: 0o644 },
      { path: 'package/bin/tollgate-mcp.js', body: Buffer.from(script), mode: 0o755 },
    ]),
    { level: 9 },
  );
  const integrity = `sha512-${createHash('sha512').update(tarball).digest('base64')}`;
  return { tarball, integrity, packageJson };
}

/** npm's fixed mtime for packed files (1985-10-26T08:15:00Z), so the same inputs give the same bytes. */
const MTIME = Math.floor(Date.UTC(1985, 9, 26, 8, 15, 0) / 1000);

/** A minimal ustar writer: regular files only, paths under 100 bytes. */
function tar(files: { path: string; body: Buffer; mode: number }[]): Buffer {
  const blocks: Buffer[] = [];
  for (const f of files) {
    if (Buffer.byteLength(f.path) > 99) throw new Error(`tar path too long: ${f.path}`);
    const h = Buffer.alloc(512);
    const str = (s: string, at: number, len: number) => h.write(s, at, len, 'utf8');
    const oct = (n: number, at: number, len: number) => str(n.toString(8).padStart(len - 1, '0') + '\0', at, len);
    str(f.path, 0, 100);
    oct(f.mode, 100, 8);
    oct(0, 108, 8); // uid
    oct(0, 116, 8); // gid
    oct(f.body.length, 124, 12);
    oct(MTIME, 136, 12);
    h.fill(' ', 148, 156); // checksum counts as spaces while it is computed
    str('0', 156, 1); // regular file
    str('ustar\0', 257, 6);
    str('00', 263, 2);
    let sum = 0;
    for (const b of h) sum += b;
    str(sum.toString(8).padStart(6, '0') + '\0 ', 148, 8);
    blocks.push(h, f.body);
    const pad = (512 - (f.body.length % 512)) % 512;
    if (pad) blocks.push(Buffer.alloc(pad));
  }
  blocks.push(Buffer.alloc(1024)); // two zero blocks end the archive
  return Buffer.concat(blocks);
}
