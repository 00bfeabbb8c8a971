import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promisify } from 'node:util';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { testEnv } from '../helpers/harness.js';

/**
 * The compose `seed` service's command, `admin account create ... --name <n> --if-absent`, run as
 * the CLI against the real database: the first run creates the account and prints its key, later
 * runs find the same account and print no key (only its hash is stored), and concurrent runs create
 * one account between them.
 */

const run = promisify(execFile);
const env = testEnv({ LOG_LEVEL: 'warn' });
let db: pg.Client;

beforeAll(async () => {
  db = new pg.Client({ connectionString: env.DATABASE_URL });
  await db.connect();
});

afterAll(async () => {
  await db?.end();
});

async function seed(name: string): Promise<Record<string, unknown>> {
  const { stdout } = await run(
    'node',
    ['--import', 'tsx', 'src/cli/admin.ts', 'account', 'create', '--plan', 'pro', '--credits', '1000', '--name', name, '--if-absent'],
    { env: { ...process.env, ...env } },
  );
  return JSON.parse(stdout) as Record<string, unknown>;
}

async function rows(name: string) {
  const accounts = await db.query<{ id: string }>('SELECT id FROM accounts WHERE name = $1', [name]);
  const keys = await db.query('SELECT k.id FROM api_keys k JOIN accounts a ON a.id = k.account_id WHERE a.name = $1', [name]);
  return { accounts: accounts.rows.map((r) => r.id), keys: keys.rowCount };
}

describe('admin account create --if-absent (the demo seed)', () => {
  it('creates the account with a key once, then finds it again without issuing another key', async () => {
    const name = `demo-${randomBytes(4).toString('hex')}`;
    const first = await seed(name);
    expect(first).toMatchObject({ created: true, plan: 'pro', credits: 1000 });
    expect(first.api_key).toMatch(/^cv_/);

    const again = await seed(name);
    expect(again).toMatchObject({ created: false, account_id: first.account_id, api_key: null, plan: 'pro', credits: 1000 });
    expect(String(again.note)).toContain(`key create --account ${first.account_id}`);
    expect(await rows(name)).toEqual({ accounts: [first.account_id], keys: 1 });
  }, 120_000);

  it('creates one account when several seeds run at once', async () => {
    const name = `demo-${randomBytes(4).toString('hex')}`;
    const out = await Promise.all([seed(name), seed(name), seed(name)]);
    expect(out.filter((o) => o.created === true)).toHaveLength(1);
    expect(new Set(out.map((o) => o.account_id)).size).toBe(1);
    const r = await rows(name);
    expect(r.accounts).toHaveLength(1);
    expect(r.keys).toBe(1);
    // Three CLI processes starting at once under tsx: 10-20 s each on a loaded two-core machine.
  }, 180_000);
});
