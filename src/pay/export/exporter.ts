import pg from 'pg';
import type { Logger } from 'pino';
import { Counter, Gauge, type Registry } from 'prom-client';
import type { DatabasePool } from '../../db/pool.js';
import { within } from '../../ops/metrics.js';
import { type Cursor, LedgerFeed, type TargetName, TARGETS } from './ledger-feed.js';
import { ExportFailure, type ExportTarget } from './targets.js';

/**
 * The advisory lock one exporter holds across every replica: a fixed key of this service's own
 * (advisory locks are per database, so deployments on other databases do not meet).
 */
export const EXPORT_LOCK_KEY = '7418231000000000023';

/** The longest wait between two tries of a failing target. */
const MAX_BACKOFF_MS = 30_000;

export interface ExporterOptions {
  db: DatabasePool;
  /** For the lock's own connection: held while the exporter runs, so the lock goes when the process dies. */
  databaseUrl: string;
  targets: readonly ExportTarget[];
  log: Logger;
  registry: Registry;
  batchSize: number;
  intervalMs: number;
}

/**
 * Sends every ledger entry to each target once, in export order (src/pay/export/ledger-feed.ts). One
 * process at a time: the loop runs only while this process holds a session advisory lock on a
 * connection of its own, which Postgres frees the moment the process or the connection dies, and a
 * replica without the lock tries again every interval. Each target runs its own loop, so a target
 * that fails (and backs off) holds up no other. A target's cursor moves only after it accepted the
 * batch; a crash between the two sends the batch again, and the receivers dedupe by the entry's id.
 */
export class UsageExporter {
  private readonly feed: LedgerFeed;
  private lock: pg.Client | null = null;
  private conn: pg.Client | null = null;
  private running = false;
  private loop: Promise<void> | null = null;
  private readonly sleepers = new Set<() => void>();
  readonly exported: Counter<'target'>;
  readonly failures: Counter<'target'>;

  constructor(private readonly opts: ExporterOptions) {
    this.feed = new LedgerFeed(opts.db);
    const registers = [opts.registry];
    const feed = this.feed;
    const names = opts.targets.map((t) => t.name);
    this.exported = new Counter({
      name: 'tollgate_export_entries_total',
      help: 'Ledger entries a billing target accepted from this process, by target',
      labelNames: ['target'],
      registers,
    });
    this.failures = new Counter({
      name: 'tollgate_export_failures_total',
      help: 'Export batches a billing target did not accept (retried with backoff), by target',
      labelNames: ['target'],
      registers,
    });
    new Gauge({
      name: 'tollgate_export_lag_entries',
      help: `Ledger entries not yet accepted by each billing target (counted up to 100,000), read at scrape time`,
      labelNames: ['target'],
      registers,
      async collect() {
        const lags = await Promise.all(names.map((t) => within(1000, () => feed.lag(t))));
        this.reset();
        names.forEach((target, i) => {
          const lag = lags[i];
          if (lag !== null && lag !== undefined) this.set({ target }, lag);
        });
      },
    });
    for (const t of names) {
      this.exported.inc({ target: t }, 0);
      this.failures.inc({ target: t }, 0);
    }
  }

  /** True while this process holds the lock and exports. */
  get leading(): boolean {
    return this.lock !== null;
  }

  start(): void {
    if (this.running) return;
    this.running = true;
    this.loop = this.lead();
  }

  async stop(): Promise<void> {
    this.running = false;
    for (const wake of this.sleepers) wake();
    await this.loop;
    this.loop = null;
    for (const t of this.opts.targets) t.close?.();
  }

  /** Waits `ms`, or less when stop() is called. */
  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(t);
        this.sleepers.delete(done);
        resolve();
      };
      const t = setTimeout(done, ms);
      this.sleepers.add(done);
    });
  }

  /** Takes the lock (or waits for it), runs every target's loop while holding it, and starts over when it is lost. */
  private async lead(): Promise<void> {
    while (this.running) {
      const client = await this.acquire();
      if (!client) {
        await this.pause(this.opts.intervalMs);
        continue;
      }
      this.lock = client;
      this.opts.log.info({ targets: this.opts.targets.map((t) => t.name) }, 'usage export: this process exports');
      await Promise.all(this.opts.targets.map((t) => this.run(t)));
      // Ending the session frees the lock; a replica waiting for it takes over within its interval.
      this.lock = null;
      this.conn = null;
      await client.end().catch(() => {});
    }
    const idle = this.conn;
    this.conn = null;
    await idle?.end().catch(() => {});
  }

  /**
   * One try at the lock, on a connection kept between tries (a replica that waits holds one idle
   * connection, not a new one every interval). The connection is the lock's: Postgres frees the lock
   * when it closes, whichever way the process ends.
   */
  private async acquire(): Promise<pg.Client | null> {
    try {
      if (!this.conn) {
        const client = new pg.Client({ connectionString: this.opts.databaseUrl });
        // A dropped connection ends this process's turn: the loops see `lock` change and stop.
        client.on('error', (err) => {
          if (this.conn === client) this.conn = null;
          if (this.lock === client) {
            this.opts.log.warn({ err: err.message }, 'usage export: lock connection lost');
            this.lock = null;
          }
        });
        this.conn = client;
        await client.connect();
      }
      const r = await this.conn.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1::bigint) AS ok', [EXPORT_LOCK_KEY]);
      return r.rows[0]?.ok ? this.conn : null;
    } catch (err) {
      this.opts.log.warn({ err: (err as Error).message }, 'usage export: could not reach Postgres for the lock');
      const broken = this.conn;
      this.conn = null;
      await broken?.end().catch(() => {});
      return null;
    }
  }

  private holds(client: pg.Client | null): boolean {
    return this.running && client !== null && this.lock === client;
  }

  /** One target's loop: read after its cursor, send, move the cursor over what it accepted. */
  private async run(target: ExportTarget): Promise<void> {
    const client = this.lock;
    let failures = 0;
    let cursor: Cursor | null = null;
    while (this.holds(client)) {
      try {
        cursor ??= await this.feed.cursor(target.name);
        const batch = await this.feed.after(cursor, this.opts.batchSize);
        if (!batch.length) {
          await this.pause(this.opts.intervalMs);
          continue;
        }
        let accepted = batch.length;
        let failure: Error | null = null;
        try {
          const { sent } = await target.send(batch);
          this.exported.inc({ target: target.name }, sent);
        } catch (err) {
          failure = err as Error;
          accepted = err instanceof ExportFailure ? err.accepted : 0;
        }
        if (accepted > 0) {
          const last = batch[accepted - 1]!;
          cursor = { xact: last.xact, id: last.id };
          await this.feed.advance(target.name, cursor);
        }
        if (failure) throw failure;
        failures = 0;
        // A short batch means the line has been reached: wait for more rather than asking again at once.
        if (batch.length < this.opts.batchSize) await this.pause(this.opts.intervalMs);
      } catch (err) {
        failures++;
        this.failures.inc({ target: target.name });
        // Only the message: the token and the Stripe key are in headers, never in these messages.
        this.opts.log.warn({ target: target.name, err: (err as Error).message, attempt: failures }, 'usage export: batch not accepted, retrying');
        // Another exporter may have moved the cursor meanwhile (a lock lost and taken): read it again.
        cursor = null;
        const backoff = Math.min(MAX_BACKOFF_MS, this.opts.intervalMs * 2 ** Math.min(failures - 1, 10));
        await this.pause(backoff / 2 + Math.random() * (backoff / 2));
      }
    }
  }

  /** Each target's cursor and lag, for tests and the guide's checks. */
  async status(): Promise<Record<TargetName, { cursor: Cursor; lag: number }>> {
    const out = {} as Record<TargetName, { cursor: Cursor; lag: number }>;
    for (const t of TARGETS) out[t] = { cursor: await this.feed.cursor(t), lag: await this.feed.lag(t) };
    return out;
  }
}
