import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import pg from 'pg';
import { packageRoot } from '../config.js';

export const MIGRATIONS_DIR = path.join(packageRoot(), 'migrations');

/** Lock id that serialises migrations when several processes start at once. */
const MIGRATION_LOCK = 7_421_001;

/** The migration files in `dir`, in the order they apply (`NNN_name.sql`). */
export async function migrationFiles(dir = MIGRATIONS_DIR): Promise<string[]> {
  return (await readdir(dir)).filter((f) => /^\d{3,}_[\w-]+\.sql$/.test(f)).sort();
}

/** A migration file's version, as schema_migrations records it (the digits before the first `_`). */
export const migrationVersion = (file: string): string => file.split('_')[0]!;

/**
 * Applies pending `migrations/NNN_name.sql` files in order, each in its own transaction, and records
 * them in schema_migrations. Returns the files applied now.
 *
 * This uses pg directly rather than slonik: a migration file holds many statements, and slonik
 * refuses multi-statement queries by design.
 */
export async function migrate(databaseUrl: string, dir = MIGRATIONS_DIR): Promise<string[]> {
  const files = await migrationFiles(dir);
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    await client.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK]);
    await client.query(`CREATE TABLE IF NOT EXISTS schema_migrations (
      version text PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`);
    const done = new Set((await client.query<{ version: string }>('SELECT version FROM schema_migrations')).rows.map((r) => r.version));
    const applied: string[] = [];
    for (const file of files) {
      const version = migrationVersion(file);
      if (done.has(version)) continue;
      const text = await readFile(path.join(dir, file), 'utf8');
      try {
        await client.query('BEGIN');
        await client.query(text);
        await client.query('INSERT INTO schema_migrations (version, name) VALUES ($1, $2)', [version, file]);
        await client.query('COMMIT');
      } catch (e) {
        await client.query('ROLLBACK');
        throw new Error(`migration ${file} failed: ${(e as Error).message}`);
      }
      applied.push(file);
    }
    return applied;
  } finally {
    await client.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK]).catch(() => {});
    await client.end();
  }
}
