import { existsSync } from 'node:fs';
import type { TestProject } from 'vitest/node';
import { ensureDatabase } from '../../src/db/pool.js';
import { migrate } from '../../src/db/migrate.js';

/**
 * Finds Redis and Postgres for the tests: REDIS_URL / DATABASE_URL when set; otherwise containers
 * from testcontainers when a Docker engine is reachable; otherwise the local services on their
 * standard ports. Then creates and migrates the test database.
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
  redisUrl ??= 'redis://127.0.0.1:6379';
  databaseUrl ??= 'postgres://postgres@127.0.0.1:5432/tollgate_test';
  await ensureDatabase(databaseUrl);
  await migrate(databaseUrl);
  project.provide('redisUrl', redisUrl);
  project.provide('databaseUrl', databaseUrl);
  return async () => {
    for (const stop of stops) await stop();
  };
}

declare module 'vitest' {
  export interface ProvidedContext {
    redisUrl: string;
    databaseUrl: string;
  }
}
