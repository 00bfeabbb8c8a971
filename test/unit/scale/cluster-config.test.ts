import { describe, expect, inject, it } from 'vitest';
import { ConfigError, loadConfig } from '../../../src/config.js';
import { connectRedis, isCluster, isDependencyError, parseClusterUrl } from '../../../src/queue/redis.js';
import { redactUrl } from '../../../src/db/pool.js';
import { runToExit } from '../../helpers/processes.js';

describe('naming a Redis Cluster', () => {
  it('REDIS_CLUSTER_NODES becomes a redis+cluster:// REDIS_URL, keeping its credentials and TLS', () => {
    expect(loadConfig({ REDIS_CLUSTER_NODES: '10.0.0.1:7000, 10.0.0.2:7001' }).REDIS_URL).toBe('redis+cluster://10.0.0.1:7000,10.0.0.2:7001');
    const c = loadConfig({ REDIS_URL: 'rediss://app:s3cret@redis.internal:6380', REDIS_CLUSTER_NODES: 'a.internal:7000,b.internal:7000' });
    expect(c.REDIS_URL).toBe('rediss+cluster://app:s3cret@a.internal:7000,b.internal:7000');
    expect(parseClusterUrl(c.REDIS_URL)).toEqual({
      nodes: [
        { host: 'a.internal', port: 7000 },
        { host: 'b.internal', port: 7000 },
      ],
      username: 'app',
      password: 's3cret',
      tls: true,
    });
  });

  it('takes a redis+cluster:// REDIS_URL as it is', () => {
    const url = 'redis+cluster://:pw@127.0.0.1:7000,127.0.0.1:7001';
    expect(loadConfig({ REDIS_URL: url }).REDIS_URL).toBe(url);
    expect(parseClusterUrl(url)).toMatchObject({
      nodes: [
        { host: '127.0.0.1', port: 7000 },
        { host: '127.0.0.1', port: 7001 },
      ],
      password: 'pw',
      tls: false,
    });
    expect(parseClusterUrl('redis://127.0.0.1:6379')).toBeNull();
  });

  it('refuses a bad node list or cluster address at start-up, naming the variable', () => {
    expect(() => loadConfig({ REDIS_CLUSTER_NODES: '10.0.0.1' })).toThrow(ConfigError);
    expect(() => loadConfig({ REDIS_CLUSTER_NODES: '10.0.0.1' })).toThrow(/REDIS_CLUSTER_NODES/);
    expect(() => loadConfig({ REDIS_CLUSTER_NODES: 'a:1,b:notaport' })).toThrow(/REDIS_CLUSTER_NODES/);
    expect(() => loadConfig({ REDIS_URL: 'redis+cluster://' })).toThrow(/REDIS_URL/);
    expect(() => loadConfig({ REDIS_URL: 'redis+cluster://host-without-port' })).toThrow(/REDIS_URL/);
  });

  it('keeps the password out of what it prints', () => {
    expect(redactUrl('redis+cluster://app:s3cret@a:7000,b:7000')).toBe('redis+cluster://app:***@a:7000,b:7000');
    expect(redactUrl('redis+cluster://a:7000')).toBe('redis+cluster://a:7000');
    expect(redactUrl('redis://:s3cret@a:6379')).not.toContain('s3cret');
  });

  it('opens an ioredis Cluster for a cluster address and a single connection otherwise', () => {
    const cluster = connectRedis('redis+cluster://127.0.0.1:7000', { lazyConnect: true });
    const single = connectRedis('redis://127.0.0.1:6379', { lazyConnect: true });
    try {
      expect(isCluster(cluster)).toBe(true);
      expect(isCluster(single)).toBe(false);
    } finally {
      cluster.disconnect();
      single.disconnect();
    }
  });

  it('a plain Redis named as a cluster stops start-up with one line that says so', async () => {
    const plain = new URL(inject('redisUrl'));
    const node = `${plain.hostname}:${plain.port || 6379}`;
    const env: NodeJS.ProcessEnv = { ...process.env, REDIS_CLUSTER_NODES: node, DATABASE_URL: inject('databaseUrl'), PORT: '0', LOG_LEVEL: 'error' };
    delete env.REDIS_URL;
    const { code, lines } = await runToExit(process.execPath, ['--import', 'tsx', 'src/server.ts'], { env });
    expect(code).toBe(1);
    expect(lines).toEqual([
      `tollgate: ${node} answers but is not a Redis Cluster (cluster_enabled:0); name a single server with REDIS_URL=redis://${node}, or start the servers with --cluster-enabled yes`,
    ]);
  }, 60_000);

  it('a cluster mid-failover is a dependency outage (503, uncharged), not an internal error', () => {
    for (const msg of [
      'Too many Cluster redirections. Last error: ReplyError: MOVED 12261 127.0.0.1:45221',
      'CLUSTERDOWN The cluster is down',
      'TRYAGAIN Multiple keys request during rehashing of slot',
      'Failed to refresh slots cache.',
      'None of startup nodes is available',
      "Cluster isn't ready and enableOfflineQueue options is false",
      'LOADING Redis is loading the dataset in memory',
    ]) {
      expect(isDependencyError(new Error(msg)), msg).toBe(true);
    }
    expect(isDependencyError(new Error('ERR wrong number of arguments for command'))).toBe(false);
    expect(isDependencyError(new Error("Cannot read properties of undefined (reading 'x')"))).toBe(false);
  });
});
