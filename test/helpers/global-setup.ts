import { existsSync } from 'node:fs';
import type { TestProject } from 'vitest/node';
import { ensureDatabase } from '../../src/db/pool.js';
import { migrate } from '../../src/db/migrate.js';
import { loadConfig } from '../../src/config.js';
import { startEmbedded, stopEmbedded } from '../../src/ops/embedded.js';

const LOCAL_REDIS = 'redis://127.0.0.1:6379';
const LOCAL_POSTGRES = 'postgres://postgres@127.0.0.1:5432/tollgate_test';

/**
 * Finds Redis and Postgres for the tests: REDIS_URL / DATABASE_URL when set (`embedded` starts one,
 * as `npm start` does); otherwise containers from testcontainers when a Docker engine is reachable;
 * otherwise the local services on their standard ports, and when nothing answers there, the same
 * embedded Redis and Postgres `npm start` uses (data under .tollgate/test). Then creates and
 * migrates the test database. A URL that was given and does not answer stops the run with one line.
 */
export default async function setup(project: TestProject) {
  const stops: Array<() => Promise<unknown>> = [];
  let redisUrl = process.env.REDIS_URL;
  let databaseUrl = process.env.DATABASE_URL;
  const docker = existsSync('/var/run/docker.sock') || !!process.env.DOCKER_HOST;
  if ((!redisUrl || !databaseUrl) && docker && process.env.TESTCONTAINERS !== 'off') {
    try {
      const { GenericContainer, Wait } = await import('testcontainers');
      if (!redisUrl) {
        const redis = await new GenericContainer('redis:7-alpine').withExposedPorts(6379).start();
        stops.push(() => redis.stop());
        redisUrl = `redis://${redis.getHost()}:${redis.getMappedPort(6379)}`;
      }
      if (!databaseUrl) {
        const pg = await new GenericContainer('postgres:16-alpine')
          .withEnvironment({ POSTGRES_PASSWORD: 'postgres', POSTGRES_DB: 'tollgate_test' })
          .withExposedPorts(5432)
          .withWaitStrategy(Wait.forLogMessage(/ready to accept connections/, 2))
          .start();
        stops.push(() => pg.stop());
        databaseUrl = `postgres://postgres:postgres@${pg.getHost()}:${pg.getMappedPort(5432)}/tollgate_test`;
      }
    } catch (e) {
      process.stderr.write(`testcontainers unavailable (${(e as Error).message.split('\n')[0]}); using local services\n`);
    }
  }
  const given = { redis: redisUrl, postgres: databaseUrl };
  if (!redisUrl || !databaseUrl || redisUrl === 'embedded' || databaseUrl === 'embedded') {
    // The embedded servers of `npm start`, when a URL says so or is unset and nothing answers at its default.
    const config = loadConfig({}, { TOLLGATE_DATA_DIR: '.tollgate/test', REDIS_URL: LOCAL_REDIS, DATABASE_URL: LOCAL_POSTGRES });
    // TOLLGATE_DEFAULT_*_URL move the defaults probed, as they do for `npm start`.
    const env: NodeJS.ProcessEnv = {
      TOLLGATE_DEFAULT_REDIS_URL: process.env.TOLLGATE_DEFAULT_REDIS_URL,
      TOLLGATE_DEFAULT_DATABASE_URL: process.env.TOLLGATE_DEFAULT_DATABASE_URL,
    };
    if (redisUrl === 'embedded') config.REDIS_URL = 'embedded';
    else if (redisUrl) env.REDIS_URL = redisUrl;
    if (databaseUrl === 'embedded') config.DATABASE_URL = 'embedded';
    else if (databaseUrl) env.DATABASE_URL = databaseUrl;
    await startEmbedded(config, (m) => process.stderr.write(`tests: ${m}\n`), env);
    stops.push(() => stopEmbedded());
    redisUrl = redisUrl && redisUrl !== 'embedded' ? redisUrl : config.REDIS_URL;
    // The embedded Postgres's own database is `tollgate`; the tests use `tollgate_test` beside it.
    databaseUrl = databaseUrl && databaseUrl !== 'embedded' ? databaseUrl : config.DATABASE_URL.replace(/\/tollgate$/, '/tollgate_test');
  }
  try {
    await ensureDatabase(databaseUrl);
    await migrate(databaseUrl);
  } catch (e) {
    const named = given.postgres
      ? `DATABASE_URL (${given.postgres.replace(/:[^:@/]*@/, ':***@')})`
      : `the test database (${databaseUrl.replace(/:[^:@/]*@/, ':***@')})`;
    throw new Error(
      `tests need Postgres: ${named} does not answer (${(e as Error).message.split('\n')[0]}). Unset it to use the embedded one, or start Postgres.`,
    );
  }
  await assertRedisAnswers(redisUrl, given.redis);
  project.provide('redisUrl', redisUrl);
  project.provide('databaseUrl', databaseUrl);
  return async () => {
    for (const stop of stops) await stop();
  };
}

/** One clear line when the Redis the tests were pointed at does not answer. */
async function assertRedisAnswers(url: string, given: string | undefined): Promise<void> {
  if (/^rediss?\+cluster:/.test(url)) return;
  const { Redis } = await import('ioredis');
  const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, enableOfflineQueue: false, retryStrategy: () => null, connectTimeout: 2000 });
  client.on('error', () => {});
  try {
    await client.connect();
    await client.ping();
  } catch (e) {
    const named = given ? `REDIS_URL (${url.replace(/:[^:@/]*@/, ':***@')})` : `Redis at ${url}`;
    throw new Error(`tests need Redis: ${named} does not answer (${(e as Error).message}). Unset it to use the embedded one, or start Redis.`);
  } finally {
    client.disconnect();
  }
}

declare module 'vitest' {
  export interface ProvidedContext {
    redisUrl: string;
    databaseUrl: string;
  }
}
