import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort } from '../chaos/rig.js';

/**
 * A local Redis Cluster for `npm run test:scale`: `primaries` primaries with one replica each, every
 * node a `redis-server --cluster-enabled yes` process on a free port, joined by
 * `redis-cli --cluster create`. Nothing is persisted (as on the machine's own Redis); a node's
 * `nodes.conf` lives in a temporary directory removed by stop().
 */
export class RedisCluster {
  readonly ports: number[] = [];
  private readonly procs = new Map<number, ChildProcess>();
  private dir = '';

  constructor(
    private readonly primaries = 3,
    /** How long a node may be unreachable before its replica takes over. */
    private readonly nodeTimeoutMs = 2_000,
  ) {}

  /** `redis+cluster://` address of every node, as REDIS_URL takes it. */
  get url(): string {
    return `redis+cluster://${this.nodes.join(',')}`;
  }

  /** `host:port` of every node, as REDIS_CLUSTER_NODES takes it. */
  get nodes(): string[] {
    return this.ports.map((p) => `127.0.0.1:${p}`);
  }

  async start(): Promise<void> {
    this.dir = mkdtempSync(join(tmpdir(), 'tollgate-cluster-'));
    for (let i = 0; i < this.primaries * 2; i++) this.ports.push(await freePort());
    for (const port of this.ports) this.spawn(port);
    for (const port of this.ports) await this.waitPing(port);
    execFileSync('redis-cli', ['--cluster', 'create', ...this.nodes, '--cluster-replicas', '1', '--cluster-yes'], { stdio: 'ignore' });
    await this.waitHealthy();
  }

  private spawn(port: number): void {
    const proc = spawn(
      'redis-server',
      [
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        '--cluster-enabled',
        'yes',
        '--cluster-config-file',
        join(this.dir, `nodes-${port}.conf`),
        '--cluster-node-timeout',
        String(this.nodeTimeoutMs),
        '--dir',
        this.dir,
        '--save',
        '',
        '--appendonly',
        'no',
      ],
      { stdio: 'ignore' },
    );
    this.procs.set(port, proc);
  }

  private cli(port: number, ...args: string[]): string {
    return execFileSync('redis-cli', ['-p', String(port), ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  }

  private async waitPing(port: number): Promise<void> {
    for (let i = 0; i < 200; i++) {
      try {
        if (this.cli(port, 'ping').trim() === 'PONG') return;
      } catch {
        /* not up yet */
      }
      await sleep(50);
    }
    throw new Error(`redis-server on ${port} did not start`);
  }

  /** Ports of live nodes. */
  private live(): number[] {
    return this.ports.filter((p) => {
      const proc = this.procs.get(p);
      return proc && proc.exitCode === null && proc.signalCode === null;
    });
  }

  /**
   * Waits until every live node says the cluster is ok and sees `primaries` primaries that each
   * serve slots, and every live replica has finished its first sync.
   */
  async waitHealthy(timeoutMs = 60_000): Promise<void> {
    const end = Date.now() + timeoutMs;
    for (;;) {
      if (this.isHealthy()) return;
      if (Date.now() > end) throw new Error('the Redis Cluster did not become healthy');
      await sleep(200);
    }
  }

  private isHealthy(): boolean {
    try {
      for (const port of this.live()) {
        if (!/cluster_state:ok/.test(this.cli(port, 'cluster', 'info'))) return false;
        const info = this.cli(port, 'info', 'replication');
        if (/role:slave/.test(info) && !/master_link_status:up/.test(info)) return false;
      }
      return this.primaryPorts().length === this.primaries;
    } catch {
      return false;
    }
  }

  /** Ports of the primaries that serve slots, from a live node's CLUSTER NODES. */
  primaryPorts(): number[] {
    const out = this.cli(this.live()[0]!, 'cluster', 'nodes');
    return out
      .split('\n')
      .filter((l) => /\bmaster\b/.test(l) && !/\bfail\b/.test(l) && l.trim().split(' ').length > 8)
      .map((l) => Number(/:(\d+)@/.exec(l)![1]));
  }

  /** The port of the primary that serves `key`'s slot. */
  primaryOf(key: string): number {
    const slot = Number(this.cli(this.live()[0]!, 'cluster', 'keyslot', key).trim());
    for (const line of this.cli(this.live()[0]!, 'cluster', 'nodes').split('\n')) {
      const parts = line.trim().split(' ');
      if (!/\bmaster\b/.test(parts[2] ?? '') || /\bfail\b/.test(parts[2] ?? '')) continue;
      for (const range of parts.slice(8)) {
        const [a, b] = range.split('-').map(Number);
        if (slot >= a! && slot <= (b ?? a)!) return Number(/:(\d+)@/.exec(parts[1]!)![1]);
      }
    }
    throw new Error(`no primary serves slot ${slot}`);
  }

  /** SIGKILLs a node: no goodbye, its replica takes over after the node timeout. */
  async kill(port: number): Promise<void> {
    const proc = this.procs.get(port);
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    proc.kill('SIGKILL');
    await once(proc, 'exit');
  }

  /** Starts a killed node again; it rejoins from its nodes.conf as a replica of whoever took over. */
  async restart(port: number): Promise<void> {
    this.spawn(port);
    await this.waitPing(port);
  }

  async stop(): Promise<void> {
    for (const proc of this.procs.values()) if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
    await Promise.all([...this.procs.values()].map((p) => (p.exitCode === null && p.signalCode === null ? once(p, 'exit') : undefined)));
    if (this.dir) rmSync(this.dir, { recursive: true, force: true });
  }
}
