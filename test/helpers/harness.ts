import { randomBytes } from 'node:crypto';
import { Writable } from 'node:stream';
import pino from 'pino';
import { inject } from 'vitest';
import type { FastifyInstance, InjectOptions, LightMyRequestResponse } from 'fastify';
import { buildApp } from '../../src/app.js';
import { loadConfig, FAMILIES, type Config, type Family } from '../../src/config.js';
import { createContainer, type Container } from '../../src/container.js';
import { AdminService } from '../../src/ops/admin.js';
import type { Plan } from '../../src/tools/types.js';
import type { KeyType } from '../../src/access/key-format.js';
import { sql } from '../../src/db/pool.js';
import { connectRedis, deleteByPrefix } from '../../src/queue/redis.js';
import { z } from 'zod';

export interface TestAccount {
  accountId: string;
  apiKey: string;
  keyId: string;
}

export interface Harness {
  app: FastifyInstance;
  container: Container;
  config: Config;
  admin: AdminService;
  /** Every log line the app wrote, for secret-leak checks. */
  logs: string[];
  /** A new account with a production key; `rpm` sets an enterprise account's custom rate, `maxInFlight` its cap on jobs in flight. */
  account(plan: Plan, credits: number, opts?: { name?: string; rpm?: number; maxInFlight?: number }): Promise<TestAccount>;
  key(accountId: string, type: KeyType, name?: string): Promise<{ keyId: string; apiKey: string }>;
  /** POST /tools/{name} with a key. */
  call(tool: string, body: unknown, apiKey?: string, headers?: Record<string, string>): Promise<LightMyRequestResponse>;
  request(opts: InjectOptions): Promise<LightMyRequestResponse>;
  credits(accountId: string): Promise<number>;
  ledgerSum(accountId: string): Promise<number>;
  ledgerCharges(accountId: string): Promise<number>;
  close(): Promise<void>;
}

export function testEnv(extra: Record<string, string> = {}): Record<string, string> {
  return {
    REDIS_URL: inject('redisUrl'),
    DATABASE_URL: inject('databaseUrl'),
    REDIS_PREFIX: `t${randomBytes(5).toString('hex')}`,
    LOG_LEVEL: 'info',
    ...extra,
  };
}

/**
 * A whole service for one test file: fresh Redis prefix, real Postgres, in-process workers for the
 * chosen families (all by default), and helpers to seed accounts and make calls.
 */
export async function startHarness(env: Record<string, string> = {}, opts: { workers?: readonly Family[] } = {}): Promise<Harness> {
  const config = loadConfig({}, testEnv(env));
  const logs: string[] = [];
  const sink = new Writable({
    write(chunk, _enc, cb) {
      logs.push(String(chunk));
      cb();
    },
  });
  const log = pino({ level: config.LOG_LEVEL }, sink);
  const container = await createContainer(config, log, { api: true, workerFamilies: opts.workers ?? FAMILIES });
  const app = await buildApp(container, { logger: log });
  await app.ready();
  const admin = new AdminService({ accounts: container.accounts, credits: container.credits, redis: container.redis, prefix: config.REDIS_PREFIX });
  const h: Harness = {
    app,
    container,
    config,
    admin,
    logs,
    account: async (plan, credits, o = {}) => {
      const r = await admin.createAccount(plan, credits, o.name);
      if (o.rpm || o.maxInFlight) await container.accounts.setAccount(r.account_id, { rpm: o.rpm, maxInFlight: o.maxInFlight });
      return { accountId: r.account_id, apiKey: r.api_key, keyId: r.key_id };
    },
    key: async (accountId, type, name) => {
      const r = await admin.createKey(accountId, type, name);
      return { keyId: r.key_id, apiKey: r.api_key };
    },
    call: (tool, body, apiKey, headers = {}) =>
      app.inject({
        method: 'POST',
        url: `/tools/${tool}`,
        headers: { ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}), 'content-type': 'application/json', ...headers },
        payload: JSON.stringify(body ?? {}),
      }),
    request: (o) => app.inject(o),
    credits: (accountId) => container.accounts.credits(accountId),
    ledgerSum: (accountId) =>
      container.pool.oneFirst(
        sql.type(z.object({ s: z.number() }))`SELECT COALESCE(SUM(delta_cents), 0)::bigint AS s FROM ledger WHERE account_id = ${accountId}`,
      ),
    ledgerCharges: (accountId) =>
      container.pool.oneFirst(
        sql.type(z.object({ n: z.number() }))`SELECT count(*)::bigint AS n FROM ledger WHERE account_id = ${accountId} AND kind = 'charge'`,
      ),
    close: async () => {
      await app.close();
      await container.close();
      const redis = connectRedis(config.REDIS_URL);
      await deleteByPrefix(redis, config.REDIS_PREFIX);
      await redis.quit();
    },
  };
  return h;
}

export function json<T = Record<string, any>>(res: LightMyRequestResponse): T {
  return JSON.parse(res.body) as T;
}
