import { randomUUID } from 'node:crypto';
import type { Redis } from './redis.js';

// Compare-and-delete / compare-and-extend: only the lock's holder may release or extend it.
const UNLOCK = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`;
const EXTEND = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0`;

type Scripted = Redis & {
  tgLeaderUnlock(key: string, token: string): Promise<number>;
  tgLeaderExtend(key: string, token: string, ms: number): Promise<number>;
};

/**
 * One holder at a time across replicas, for background passes (the money reconciler, the intent
 * reconciler, the x402 payment reconciler): `SET NX PX` with a random token, extended by its holder
 * while the pass runs and released by it alone, so a pass that outlives its lock learns so instead of
 * running beside another holder. A holder that dies frees the lock when it expires.
 */
export class RedisLeader {
  private readonly redis: Scripted;

  constructor(
    redis: Redis,
    private readonly key: string,
    private readonly lockMs: number,
  ) {
    const r = redis as Redis & Partial<Scripted>;
    if (!r.tgLeaderUnlock) {
      r.defineCommand('tgLeaderUnlock', { numberOfKeys: 1, lua: UNLOCK });
      r.defineCommand('tgLeaderExtend', { numberOfKeys: 1, lua: EXTEND });
    }
    this.redis = r as Scripted;
  }

  /**
   * Runs `pass` holding the lock, or answers null at once when another process holds it. `keep`
   * extends the lock (at most every quarter of its time, so calling it per item is cheap) and throws
   * `lost` when it is no longer this pass's: the pass stops there.
   */
  async run<T>(pass: (keep: () => Promise<void>) => Promise<T>, lost = 'lock lost'): Promise<T | null> {
    const token = randomUUID();
    if ((await this.redis.set(this.key, token, 'PX', this.lockMs, 'NX')) !== 'OK') return null;
    let lastExtend = Date.now();
    const keep = async () => {
      if (Date.now() - lastExtend < this.lockMs / 4) return;
      lastExtend = Date.now();
      if (!(await this.redis.tgLeaderExtend(this.key, token, this.lockMs))) throw new Error(lost);
    };
    try {
      return await pass(keep);
    } finally {
      await this.redis.tgLeaderUnlock(this.key, token).catch(() => {});
    }
  }
}

/**
 * Runs a pass every `intervalSeconds` (jittered by ±20 % so replicas do not all try at once), one at
 * a time in this process: `runOnce` while a pass runs joins it. A failed pass is reported to `failed`
 * and the schedule goes on.
 */
export class PeriodicPass<T> {
  private timer: NodeJS.Timeout | null = null;
  private running: Promise<T> | null = null;

  constructor(
    private readonly intervalSeconds: number,
    private readonly pass: () => Promise<T>,
    private readonly failed: (err: Error) => void,
  ) {}

  start(): void {
    const s = this.intervalSeconds;
    if (s <= 0 || this.timer) return;
    const schedule = () => {
      this.timer = setTimeout(
        () => {
          this.runOnce()
            .catch(this.failed)
            .finally(() => this.timer && schedule());
        },
        s * 1000 * (0.8 + Math.random() * 0.4),
      );
      this.timer.unref();
    };
    schedule();
  }

  async stop(): Promise<void> {
    const t = this.timer;
    this.timer = null;
    if (t) clearTimeout(t);
    await this.running?.catch(() => {});
  }

  /** One pass now, or the one already running. */
  runOnce(): Promise<T> {
    this.running ??= this.pass().finally(() => (this.running = null));
    return this.running;
  }
}
