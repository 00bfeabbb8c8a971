/**
 * Runs the MCP conformance suite (@modelcontextprotocol/conformance) server scenarios against /mcp.
 *
 *   npm run conformance
 *       Starts the API in this process (Redis and Postgres from REDIS_URL / DATABASE_URL, as
 *       `npm start` uses them, under a throwaway Redis prefix) with a fresh enterprise account.
 *   TOLLGATE_API_KEY=cv_... npm run conformance -- --url http://127.0.0.1:8080
 *       Runs against a service that is already running, with that key.
 *
 * The conformance CLI cannot send an API key, and /mcp answers 401 without one. So the scenarios
 * go through a loopback proxy that adds `Authorization: Bearer <key>` and passes everything else
 * through unchanged (Host and Origin included), which keeps the DNS-rebinding scenario a test of
 * the service's own check.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { deleteByPrefix } from '../src/queue/redis.js';

export const SCENARIOS = ['server-initialize', 'tools-list', 'ping', 'dns-rebinding-protection'] as const;

const CLI = fileURLToPath(new URL('../node_modules/@modelcontextprotocol/conformance/dist/index.js', import.meta.url));

export interface KeyProxy {
  url: string;
  close(): Promise<void>;
}

/**
 * A loopback HTTP proxy to `target` that adds the API key (or an OAuth access token) to every
 * request. `asTarget` sends the target's own Host instead of the client's: an access token is for
 * one resource URL (RFC 8707), which the service reads from Host.
 */
export async function startKeyProxy(target: string, apiKey: string, opts: { asTarget?: boolean } = {}): Promise<KeyProxy> {
  const to = new URL(target);
  const server = http.createServer((req, res) => {
    const upstream = http.request(
      {
        host: to.hostname,
        port: to.port,
        method: req.method,
        path: req.url,
        headers: { ...req.headers, ...(opts.asTarget ? { host: to.host } : {}), authorization: `Bearer ${apiKey}` },
      },
      (up) => {
        res.writeHead(up.statusCode ?? 502, up.headers);
        up.pipe(res);
      },
    );
    upstream.on('error', (err) => {
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' });
      res.end(`proxy: ${err.message}`);
    });
    req.pipe(upstream);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

export interface Check {
  id: string;
  name: string;
  status: string;
  errorMessage?: string;
}

export interface ScenarioResult {
  scenario: string;
  exitCode: number;
  checks: Check[];
  output: string;
}

/** Runs one scenario with the CLI and reads back its checks. */
export async function runScenario(mcpUrl: string, scenario: string): Promise<ScenarioResult> {
  const dir = await mkdtemp(join(tmpdir(), 'mcp-conformance-'));
  try {
    const { exitCode, output } = await new Promise<{ exitCode: number; output: string }>((resolve) => {
      execFile(process.execPath, [CLI, 'server', '--url', mcpUrl, '--scenario', scenario, '-o', dir], { timeout: 60_000 }, (err, stdout, stderr) => {
        const code = err ? (typeof err.code === 'number' ? err.code : 1) : 0;
        resolve({ exitCode: code, output: `${stdout}${stderr}` });
      });
    });
    return { scenario, exitCode, checks: await readChecks(dir), output };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

async function readChecks(dir: string): Promise<Check[]> {
  const checks: Check[] = [];
  for (const entry of await readdir(dir, { recursive: true })) {
    if (String(entry).endsWith('checks.json')) checks.push(...(JSON.parse(await readFile(join(dir, String(entry)), 'utf8')) as Check[]));
  }
  return checks;
}

/** A scenario passes when the CLI says so and none of its checks failed. */
export function passed(r: ScenarioResult): boolean {
  return r.exitCode === 0 && r.checks.length > 0 && r.checks.every((c) => c.status !== 'FAILURE');
}

export async function runConformance(serviceUrl: string, apiKey: string): Promise<ScenarioResult[]> {
  const proxy = await startKeyProxy(serviceUrl, apiKey);
  try {
    const results: ScenarioResult[] = [];
    for (const scenario of SCENARIOS) results.push(await runScenario(`${proxy.url}/mcp`, scenario));
    return results;
  } finally {
    await proxy.close();
  }
}

function report(results: ScenarioResult[]): boolean {
  for (const r of results) {
    const ok = passed(r);
    process.stdout.write(`${ok ? 'PASS' : 'FAIL'}  ${r.scenario} (${r.checks.length} checks)\n`);
    for (const c of r.checks.filter((x) => x.status === 'FAILURE')) process.stdout.write(`      ${c.id}: ${c.errorMessage ?? 'failed'}\n`);
    if (!ok && !r.checks.length) process.stdout.write(r.output.replace(/^/gm, '      ') + '\n');
  }
  return results.every(passed);
}

/** Starts the API in this process on a loopback port with a fresh account, for the scenarios. */
async function startLocalService(): Promise<{ url: string; apiKey: string; stop(): Promise<void> }> {
  const [{ buildApp }, { checkServices, configOrDie, makeLogger, runMigrations }, { createContainer }, { AdminService }, { loadConfig }] = await Promise.all([
    import('../src/app.js'),
    import('../src/bootstrap.js'),
    import('../src/container.js'),
    import('../src/ops/admin.js'),
    import('../src/config.js'),
  ]);
  configOrDie(); // reports a bad environment the way the server does
  const prefix = `conformance${randomBytes(4).toString('hex')}`;
  // PUBLIC_BASE_URL would make the service's own origin something other than the loopback port
  // the suite connects to; the scenarios test the loopback case.
  const config = loadConfig(process.env, { REDIS_PREFIX: prefix, LOG_LEVEL: 'warn', PUBLIC_BASE_URL: '', MCP_ALLOWED_ORIGINS: '' });
  await checkServices(config);
  const log = makeLogger(config);
  await runMigrations(config, log);
  const container = await createContainer(config, log, { api: true, workerFamilies: [] });
  const app = await buildApp(container, { logger: log });
  const url = await app.listen({ port: 0, host: '127.0.0.1' });
  const admin = new AdminService({ accounts: container.accounts, credits: container.credits, redis: container.redis, prefix });
  // Enterprise for its rate limit: the scenarios make more requests than a free plan's 10 a minute.
  const account = await admin.createAccount('enterprise', 0, 'mcp-conformance');
  return {
    url,
    apiKey: account.api_key,
    stop: async () => {
      await container.accounts.revokeKey(account.key_id);
      await app.close();
      await deleteByPrefix(container.redis, prefix);
      await container.close();
    },
  };
}

async function main(): Promise<number> {
  const args = process.argv.slice(2);
  const at = args.indexOf('--url');
  const given = at >= 0 ? args[at + 1] : undefined;
  if (given) {
    const key = process.env.TOLLGATE_API_KEY;
    if (!key) {
      process.stderr.write('conformance: set TOLLGATE_API_KEY to a key for the service at --url\n');
      return 2;
    }
    return report(await runConformance(given.replace(/\/mcp\/?$/, ''), key)) ? 0 : 1;
  }
  const service = await startLocalService();
  try {
    return report(await runConformance(service.url, service.apiKey)) ? 0 : 1;
  } finally {
    await service.stop();
  }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  main().then(
    (code) => process.exit(code),
    (err: unknown) => {
      process.stderr.write(`conformance: ${err instanceof Error ? err.stack : String(err)}\n`);
      process.exit(1);
    },
  );
}
