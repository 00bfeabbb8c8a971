/**
 * db/: Postgres. The pool (this file), migrations and the text guard for what Postgres refuses. The
 * statements live with the rooms that own their tables.
 */
import { createPool, createTypeParserPreset, SchemaValidationError, sql, type DatabasePool, type Interceptor, type QueryResultRow } from 'slonik';

export { sql };
export type { DatabasePool };

/** Validates every `sql.type(schema)` row against its zod schema (slonik leaves this to an interceptor). */
const resultParser: Interceptor = {
  transformRow: async (ctx, query, row) => {
    const parser = ctx.resultParser;
    if (!parser) return row;
    const parsed = await parser.safeParseAsync(row);
    if (!parsed.success) throw new SchemaValidationError(query, row, parsed.error.issues);
    return parsed.data as QueryResultRow;
  },
};

function parseSafeInt(v: string): number {
  const n = Number(v);
  if (!Number.isSafeInteger(n)) throw new Error(`integer ${v} is beyond exact range`);
  return n;
}

const isoTimestamp = (v: string) => new Date(v).toISOString();

export async function openPool(url: string, opts: { maximumPoolSize?: number } = {}): Promise<DatabasePool> {
  return createPool(url, {
    interceptors: [resultParser],
    maximumPoolSize: opts.maximumPoolSize ?? 10,
    connectionTimeout: 5_000,
    // Stack capture on every query costs more than the queries on the hot path.
    captureStackTrace: false,
    // Slonik runs DISCARD ALL after every implicit checkout by default; this service sets no session
    // state, so that round trip buys nothing.
    resetConnection: async () => {},
    // Money is bigint in Postgres but always within Number's exact range here (cents).
    typeParsers: [
      ...createTypeParserPreset().filter((p) => !['timestamptz', 'timestamp', 'int8'].includes(p.name)),
      { name: 'int8', parse: parseSafeInt },
      { name: 'timestamptz', parse: isoTimestamp },
      { name: 'timestamp', parse: isoTimestamp },
    ],
  });
}

/** Database name and a maintenance URL on the same server. */
function maintenanceUrl(url: string): { name: string; adminUrl: string } {
  const u = new URL(url);
  const name = decodeURIComponent(u.pathname.replace(/^\//, ''));
  u.pathname = '/postgres';
  return { name, adminUrl: u.toString() };
}

/** Creates the configured database when it does not exist yet (the default `tollgate` on a fresh machine). */
export async function ensureDatabase(url: string): Promise<void> {
  const { name, adminUrl } = maintenanceUrl(url);
  if (!name || name === 'postgres') return;
  const admin = await createPool(adminUrl, { maximumPoolSize: 1, connectionTimeout: 5_000 });
  try {
    const exists = await admin.exists(sql.unsafe`SELECT 1 FROM pg_database WHERE datname = ${name}`);
    if (!exists) {
      try {
        await admin.query(sql.unsafe`CREATE DATABASE ${sql.identifier([name])}`);
      } catch (e) {
        // Another process created it at the same moment.
        if (!/already exists/.test(String((e as Error).message))) throw e;
      }
    }
  } finally {
    await admin.end();
  }
}

/** The URL with any password masked, for messages. */
export function redactUrl(url: string): string {
  // A cluster address (redis+cluster://user:password@host:port,host:port) is not a WHATWG URL.
  const cluster = /^(rediss?\+cluster:\/\/)(?:([^:@/]*)(?::[^@/]*)?@)?(.*)$/.exec(url);
  if (cluster) return `${cluster[1]}${cluster[2] !== undefined ? `${cluster[2]}:***@` : ''}${cluster[3]}`;
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '(unparseable URL)';
  }
}
