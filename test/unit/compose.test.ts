import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { FAMILIES, loadConfig, type Config } from '../../src/config.js';
import { missingInProduction } from '../../src/ops/embedded.js';

/**
 * docker-compose.yml read as Compose reads it (no Docker engine runs here): YAML with merge keys, then
 * `${VAR}` interpolation from the operator's environment. Every service that runs our image is checked
 * against the configuration schema (src/config.ts) and the production refusals (src/ops/embedded.ts)
 * with what the operator must set and nothing more; the secrets have no defaults and compose stops
 * naming each; values the code needs equal in every process come from one variable; one image is
 * built once; each worker family has a service with METRICS_PORT and a health check on its /readyz.
 */
const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const COMPOSE = readFileSync(`${ROOT}docker-compose.yml`, 'utf8');
const DOCKERFILE = readFileSync(`${ROOT}Dockerfile`, 'utf8');
const IMAGE = 'tollgate:local';

/** What the operator has to put in .env: the variables the file requires (`${VAR:?...}`). */
const REQUIRED = ['ADMIN_TOKEN', 'EDGE_TOKEN_KEY', 'PASSPORT_KEY', 'POSTGRES_PASSWORD'];
const OPERATOR_ENV: Record<string, string> = {
  ADMIN_TOKEN: 'c'.repeat(64),
  EDGE_TOKEN_KEY: 'a'.repeat(64),
  PASSPORT_KEY: 'b'.repeat(64),
  POSTGRES_PASSWORD: '0123456789abcdef0123456789abcdef0123456789abcdef',
};

/** Variables that hold secrets: never a literal, never a non-empty default in the file. */
const SECRETS = ['EDGE_TOKEN_KEY', 'PASSPORT_KEY', 'ADMIN_TOKEN', 'METRICS_TOKEN', 'POSTGRES_PASSWORD', 'LLM_API_KEY', 'X402_SETTLER_PRIVATE_KEY'];

/** Values every process of one deployment must share: sealing keys, and the Redis and Postgres they meet in. */
const SHARED: Array<keyof Config> = ['EDGE_TOKEN_KEY', 'PASSPORT_KEY', 'REDIS_URL', 'REDIS_PREFIX', 'DATABASE_URL'];

class Missing extends Error {
  constructor(
    readonly variable: string,
    message: string,
  ) {
    super(message);
  }
}

/**
 * Compose's interpolation (the compose-spec's "Interpolation"): `$$`, `$VAR`, `${VAR}`, `${VAR:-d}`,
 * `${VAR-d}`, `${VAR:?err}`, `${VAR?err}`, `${VAR:+r}`, `${VAR+r}`. Every missing required variable is
 * collected, as compose reports them.
 */
function interpolate(text: string, env: Record<string, string>, missing: Missing[]): string {
  return text.replace(/\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)/g, (all, name, op, arg, bare) => {
    if (all === '$$') return '$';
    if (bare) return env[bare] ?? '';
    const value = env[name];
    const unset = value === undefined || (op?.startsWith(':') && value === '');
    switch (op) {
      case undefined:
        return value ?? '';
      case ':-':
      case '-':
        return unset ? arg : value!;
      case ':?':
      case '?':
        if (unset) missing.push(new Missing(name, arg));
        return value ?? '';
      default:
        return unset ? '' : arg;
    }
  });
}

interface Service {
  image?: string;
  build?: unknown;
  command?: string[];
  environment?: Record<string, string | number | boolean>;
  healthcheck?: { test: string[] };
  depends_on?: Record<string, { condition: string }>;
}

/** The file with every `${...}` resolved from `env`, as plain data (merge keys applied). */
function resolve(env: Record<string, string>): { services: Record<string, Service>; missing: Missing[] } {
  const missing: Missing[] = [];
  const doc = parse(COMPOSE, { merge: true }) as { services: Record<string, Service> };
  const walk = (v: unknown): unknown =>
    typeof v === 'string'
      ? interpolate(v, env, missing)
      : Array.isArray(v)
        ? v.map(walk)
        : v && typeof v === 'object'
          ? Object.fromEntries(Object.entries(v).map(([k, x]) => [k, walk(x)]))
          : v;
  return { services: walk(doc.services) as Record<string, Service>, missing };
}

/** The raw (uninterpolated) services, merge keys applied. */
const RAW = (parse(COMPOSE, { merge: true }) as { services: Record<string, Service> }).services;
const { services: SERVICES, missing: MISSING_WITH_ENV } = resolve(OPERATOR_ENV);

/** The services that run our code (a command under dist/): migrate, api, one per family, seed. */
const OURS = Object.entries(SERVICES).filter(([, s]) => s.command?.some((c) => c.startsWith('dist/')));
const isApi = (s: Service) => s.command?.join(' ') === 'node dist/src/server.js';
const familyOf = (s: Service) => (s.command?.[1] === 'dist/workers/index.js' ? s.command.slice(2) : null);

/** A service's environment as its process sees it: the image's ENV lines, then compose's `environment`. */
function processEnv(s: Service): Record<string, string> {
  const image = Object.fromEntries([...DOCKERFILE.matchAll(/^ENV (\w+)=(\S+)$/gm)].map((m) => [m[1]!, m[2]!]));
  return { ...image, ...Object.fromEntries(Object.entries(s.environment ?? {}).map(([k, v]) => [k, String(v)])) };
}

describe('docker-compose.yml', () => {
  it('stops without each required secret, naming it, and needs nothing else', () => {
    const { missing } = resolve({});
    expect([...new Set(missing.map((m) => m.variable))].sort()).toEqual(REQUIRED);
    for (const m of missing) expect(m.message, m.variable).toMatch(/must be set.*openssl rand -hex/);
    expect(MISSING_WITH_ENV).toEqual([]);
  });

  it('has no literal or default value for any secret', () => {
    for (const [name, s] of Object.entries(RAW)) {
      for (const [key, raw] of Object.entries(s.environment ?? {})) {
        if (!SECRETS.includes(key)) continue;
        // Required (`:?`), or empty unless the operator sets it (`:-` with nothing after).
        expect(String(raw), `${name}.${key}`).toMatch(new RegExp(`^\\$\\{${key}(:\\?.+|:-)\\}$`));
      }
    }
    // Nor hidden inside another value (a password in a URL): each use of a secret variable is required or empty.
    for (const m of COMPOSE.matchAll(/\$\{([A-Z0-9_]+)(:?[-?+]?)([^}]*)\}/g)) {
      if (SECRETS.includes(m[1]!)) expect(m[2] === ':?' || (m[2] === ':-' && m[3] === ''), m[0]).toBe(true);
    }
  });

  it('builds one image once and runs it in every service of ours', () => {
    const built = Object.entries(SERVICES).filter(([, s]) => s.build !== undefined);
    expect(built.map(([n]) => n)).toEqual(['migrate']);
    expect(built[0]![1].image).toBe(IMAGE);
    expect(OURS.length).toBe(1 + 1 + FAMILIES.length + 1); // migrate, api, the workers, seed
    for (const [name, s] of OURS) expect(s.image, name).toBe(IMAGE);
    // Every other service of ours starts after the one that builds the image.
    for (const [name] of OURS.filter(([n]) => n !== 'migrate')) {
      const chain = (n: string): string[] => Object.keys(SERVICES[n]!.depends_on ?? {}).flatMap((d) => [d, ...chain(d)]);
      expect(chain(name), name).toContain('migrate');
    }
  });

  it('gives every service of ours a configuration the service accepts, production refusals included', () => {
    expect(DOCKERFILE).toMatch(/^ENV NODE_ENV=production$/m);
    expect(OURS.length).toBe(1 + 1 + FAMILIES.length + 1);
    for (const [name, s] of OURS) {
      const config = loadConfig(processEnv(s));
      if (name === 'migrate') continue; // migrations need only DATABASE_URL and REDIS_URL
      expect(missingInProduction(config, { api: isApi(s) }), name).toEqual([]);
    }
  });

  it('runs one worker service per family, each with METRICS_PORT and a health check on its /readyz', () => {
    const workers = Object.entries(SERVICES).filter(([, s]) => familyOf(s));
    expect(workers.map(([, s]) => familyOf(s)).sort()).toEqual(FAMILIES.map((f) => ['--family', f]).sort());
    for (const [name, s] of workers) {
      expect(name).toBe(`worker-${familyOf(s)![1]}`);
      expect(loadConfig(processEnv(s)).METRICS_PORT, name).toBeGreaterThan(0);
      const test = s.healthcheck?.test.join(' ') ?? '';
      expect(test, name).toMatch(/process\.env\.METRICS_PORT\+'\/readyz'/);
    }
  });

  it("runs the API without inline workers, with the dashboard behind the operator's ADMIN_TOKEN and a health check on /readyz", () => {
    const api = Object.entries(SERVICES).filter(([, s]) => isApi(s));
    expect(api.map(([n]) => n)).toEqual(['api']);
    const s = api[0]![1];
    const config = loadConfig(processEnv(s));
    expect(config.WORKERS).toBe('off');
    expect(config.ADMIN_TOKEN).toBe(OPERATOR_ENV.ADMIN_TOKEN);
    expect(RAW.api!.environment!.ADMIN_TOKEN).toMatch(/^\$\{ADMIN_TOKEN:\?/);
    expect(s.healthcheck?.test.join(' ')).toMatch(/\/readyz'/);
    expect(s.healthcheck?.test.join(' ')).not.toMatch(/\/health/);
  });

  it('shares the sealing keys, Redis and Postgres across every process, from one variable each', () => {
    const apps = OURS.filter(([n]) => n !== 'migrate');
    const configs = apps.map(([n, s]) => [n, loadConfig(processEnv(s))] as const);
    for (const key of SHARED) {
      const values = new Set(configs.map(([, c]) => c[key]));
      expect(values.size, key).toBe(1);
      // Written once (the shared anchor), not repeated by hand per service.
      const raws = new Set(apps.map(([n]) => JSON.stringify(RAW[n]!.environment?.[key] ?? null)));
      expect(raws.size, key).toBe(1);
    }
    expect(configs[0]![1].EDGE_TOKEN_KEY).toBe(OPERATOR_ENV.EDGE_TOKEN_KEY);
    expect(configs[0]![1].PASSPORT_KEY).toBe(OPERATOR_ENV.PASSPORT_KEY);
    // Migrations run against the same database, and Postgres is started with the password in that URL.
    const migrate = loadConfig(processEnv(SERVICES.migrate!));
    expect(migrate.DATABASE_URL).toBe(configs[0]![1].DATABASE_URL);
    expect(new URL(migrate.DATABASE_URL).password).toBe(SERVICES.postgres!.environment!.POSTGRES_PASSWORD);
    expect(SERVICES.postgres!.environment!.POSTGRES_PASSWORD).toBe(OPERATOR_ENV.POSTGRES_PASSWORD);
  });

  it("health checks' scripts exit 0 on a 200 from /readyz and 1 on a 503 or no answer", async () => {
    let status = 200;
    const asked: string[] = [];
    const server = http.createServer((req, res) => {
      asked.push(req.url ?? '');
      res.writeHead(status).end('{}');
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const port = (server.address() as AddressInfo).port;
    const run = async (test: string[], env: Record<string, string>) => {
      expect(test.slice(0, 3)).toEqual(['CMD', 'node', '-e']);
      const child = spawn('node', ['-e', test[3]!], { env: { PATH: process.env.PATH!, ...env }, stdio: 'ignore' });
      const [code] = await once(child, 'exit');
      return code as number;
    };
    try {
      const checks = [
        { test: SERVICES['worker-core']!.healthcheck!.test, env: { METRICS_PORT: String(port) } as Record<string, string> },
        { test: SERVICES.api!.healthcheck!.test, env: { PORT: String(port) } as Record<string, string> },
      ];
      for (const { test, env } of checks) {
        status = 200;
        expect(await run(test, env)).toBe(0);
        status = 503;
        expect(await run(test, env)).toBe(1);
      }
      expect(asked).toEqual(Array(4).fill('/readyz'));
    } finally {
      server.close();
    }
    // Nothing listening: unhealthy, not a hang.
    expect(await run(SERVICES['worker-core']!.healthcheck!.test, { METRICS_PORT: String(port) })).toBe(1);
  });
});
