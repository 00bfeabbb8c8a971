import { createHmac, randomBytes, randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { request } from 'undici';
import { z } from 'zod';
import type { Config } from '../config.js';
import { sql, type DatabasePool } from '../db/pool.js';
import { AppError, isAppError, type SerializedError } from '../errors.js';
import { ResultsStore } from '../money/results.js';
import type { Redis } from '../queue/redis.js';
import { accountTag, queuePrefix } from '../queue/keyspace.js';
import { familyOfJob, queueName } from '../queue/queues.js';
import { isSealed, jobSeal } from '../queue/job-seal.js';
import type { EdgeTokenSealer } from '../access/edge-token.js';
import { PinnedAgent, vetDestination, withoutAddresses } from '../tools/web/net-guard.js';
import { pgSafeValue } from '../db/pg-text.js';
import { createResolver, type DnsResolver } from '../tools/web/resolver.js';

/**
 * Webhooks for async jobs. A charged call may name a Callback-Url (checked at admission by
 * `vetCallbackUrl`, and counted among the account's outstanding deliveries by `PendingDeliveries`);
 * its delivery is a row of the Postgres outbox (`webhook_jobs`, migrations/019_webhook_outbox.sql)
 * written in the same transaction as the outcome it reports: the job's settlement
 * (src/money/settlement.ts), a spend alert's event (src/calls/alerts.ts), a cancel, or for a chain or
 * parallel request its acceptance (`watch`). A relay in every worker process claims due rows and POSTs
 * the body GET /jobs/{id} answers, signed as Standard Webhooks says (https://www.standardwebhooks.com:
 * `webhook-id`, `webhook-timestamp`, `webhook-signature`) with the account's secret, and records every
 * attempt in Postgres for GET /jobs/{id} to show. A row is done once it was delivered or given up after
 * WEBHOOK_ATTEMPTS; nothing accepted is lost while Redis is down or after it comes back empty.
 *
 * Why deliveries are sent from Postgres and not through a BullMQ queue: with a queue, a delivery would
 * live in two places (the outbox row and a Redis job) and every Redis loss would need the two compared
 * and the lost ones found and queued again. Here the row is the delivery: its backoff (`next_at`), its
 * attempts and its outcome are columns, claimed with FOR UPDATE SKIP LOCKED (so replicas never send a
 * row at the same time) under a lease that brings back the row of a relay that died mid-attempt. Redis
 * being down does not even delay a delivery. The cost is a poll of a partial index of outstanding rows
 * (POLL_MS, one indexed statement, nothing when the relay is woken by its own process's settlement).
 *
 * A receiver may see one delivery twice: a relay that dies after the receiver answered and before the
 * outcome is recorded sends it again once its lease ends. The `webhook-id` is fixed when the row is
 * written, so it is the same on every attempt and receivers drop the second.
 */

/** A request whose outcome is still unknown after this long is given up (its steps have long timed out). */
const WATCH_GIVE_UP_MS = 48 * 3600_000;
/** A chain or parallel request is looked at again after a quarter of its age, within these bounds. */
const WATCH_MIN_MS = 250;
const WATCH_MAX_MS = 30_000;
/** A relay with nothing due looks again after this long (at once when its own process writes a row). */
const POLL_MS = 500;
/** The response body is read no further than this (then the connection is dropped). */
const RESPONSE_PEEK_BYTES = 4096;
const URL_MAX = 2048;
/** Where a refused Callback-Url is named: the header on POST /tools/{name}, the field on POST /, PUT /alerts' `url`. */
export type CallbackSource = 'Callback-Url' | 'callback_url' | 'url';

function refuse(source: CallbackSource, message: string, extra: Record<string, unknown> = {}): AppError {
  return new AppError('invalid_input', `${source} refused: ${message}`, { ...extra, issues: [{ path: [source], message }] });
}

/** Whether `hostPort` is exempt from the address checks (and may use plain http): tests. */
function allowedHost(config: Pick<Config, 'WEBHOOK_ALLOWED_HOSTS'>, url: URL): boolean {
  const port = url.port ? Number(url.port) : url.protocol === 'https:' ? 443 : 80;
  return config.WEBHOOK_ALLOWED_HOSTS.includes(`${url.hostname}:${port}`);
}

/**
 * Admission check of a callback URL: absolute, https (http only for WEBHOOK_ALLOWED_HOSTS), no
 * credentials, and a host whose every address is public (page_fetch's SSRF rules). Returns the URL
 * as it will be stored. Throws 400 invalid_input naming the header (or field), 503 when DNS is down.
 */
export async function vetCallbackUrl(
  raw: unknown,
  deps: { config: Pick<Config, 'WEBHOOK_ALLOWED_HOSTS'>; resolver: DnsResolver },
  source: CallbackSource = 'Callback-Url',
): Promise<string> {
  if (typeof raw !== 'string' || !raw.trim()) throw refuse(source, 'expected an absolute https URL');
  if (raw.length > URL_MAX) throw refuse(source, `longer than ${URL_MAX} characters`);
  let url: URL;
  try {
    url = new URL(raw.trim());
  } catch {
    throw refuse(source, 'not a valid absolute URL');
  }
  const exempt = allowedHost(deps.config, url);
  if (url.protocol !== 'https:' && !(url.protocol === 'http:' && exempt)) throw refuse(source, `must use https, not ${url.protocol.replace(/:$/, '')}`);
  if (url.username || url.password) throw refuse(source, 'must not carry a user name or password');
  try {
    await vetDestination(url, { config: { FETCH_ALLOWED_HOSTS: deps.config.WEBHOOK_ALLOWED_HOSTS }, resolver: deps.resolver, tool: source });
  } catch (e) {
    if (isAppError(e) && e.code === 'tool_unavailable') throw e;
    // "Callback-Url refused localhost: the destination is not allowed (not a public address)", or no such domain.
    const why = isAppError(e) ? e.message.replace(new RegExp(`^${source} (refused )?`), '') : 'its host could not be checked';
    throw refuse(source, why, isAppError(e) && e.details.reason ? { reason: e.details.reason } : {});
  }
  return url.toString();
}

/**
 * The HMAC key of a secret: the bytes its `whsec_` part encodes. Secrets made before deliveries
 * followed Standard Webhooks are base64url (24 bytes); Node decodes both alphabets, so they keep their
 * bytes and are shown again in standard base64 (`secretString`), which is what Standard Webhooks
 * libraries read.
 */
export function secretKey(secret: string): Buffer {
  const key = Buffer.from(secret.replace(/^whsec_/, ''), 'base64');
  if (key.length < 24) throw new Error('webhook secret too short');
  return key;
}

/** `whsec_<standard base64 of the key>` (Standard Webhooks' serialization of a symmetric secret). */
export function secretString(secret: string): string {
  return `whsec_${secretKey(secret).toString('base64')}`;
}

/**
 * The Standard Webhooks signature: `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">` keyed with the
 * secret's decoded bytes. The id is the delivery's (the same on every retry, so receivers dedupe on
 * it) and the timestamp the attempt's, in seconds: a captured delivery replayed under another id or
 * later than the receiver's tolerance does not verify.
 */
export function webhookSignature(secret: string, id: string, timestamp: number, body: string): string {
  return `v1,${createHmac('sha256', secretKey(secret)).update(`${id}.${timestamp}.${body}`).digest('base64')}`;
}

/**
 * One signing secret per account, stored sealed with the edge-token sealer (AES-256-GCM under
 * EDGE_TOKEN_KEY): the database never holds it in clear, and it is never logged. Every process that
 * reads it (the API for GET /webhooks/secret, the delivery workers) needs the same EDGE_TOKEN_KEY,
 * kept across restarts (src/bootstrap.ts `sealingKeysOrDie`).
 */
export class WebhookSecrets {
  constructor(
    private readonly pool: DatabasePool,
    private readonly sealer: EdgeTokenSealer,
  ) {}

  /** 32 random bytes (Standard Webhooks asks for 24 to 64), as `whsec_<base64>`. */
  private static fresh(): string {
    return `whsec_${randomBytes(32).toString('base64')}`;
  }

  /** The account's secret (`whsec_<base64>`), created on first use. */
  async get(accountId: string): Promise<string> {
    await this.pool.query(sql.unsafe`
      INSERT INTO webhook_secrets (account_id, sealed) VALUES (${accountId}, ${this.sealer.seal(WebhookSecrets.fresh())})
      ON CONFLICT (account_id) DO NOTHING`);
    const sealed = await this.pool.oneFirst(sql.type(z.object({ sealed: z.string() }))`SELECT sealed FROM webhook_secrets WHERE account_id = ${accountId}`);
    return secretString(this.open(sealed));
  }

  /**
   * Start-up check: how many of the latest `n` secrets this process's EDGE_TOKEN_KEY cannot open (sealed
   * under another key: it changed, or was a per-process random one before). One indexed read.
   */
  async sample(n = 20): Promise<{ sampled: number; unopenable: number }> {
    const rows = await this.pool.anyFirst(sql.type(z.object({ sealed: z.string() }))`
      SELECT sealed FROM webhook_secrets ORDER BY created_at DESC LIMIT ${n}`);
    let unopenable = 0;
    for (const sealed of rows) {
      try {
        this.sealer.open(sealed);
      } catch {
        unopenable++;
      }
    }
    return { sampled: rows.length, unopenable };
  }

  /** Replaces the account's secret; deliveries from now on are signed with the new one. */
  async roll(accountId: string): Promise<string> {
    const secret = WebhookSecrets.fresh();
    await this.pool.query(sql.unsafe`
      INSERT INTO webhook_secrets (account_id, sealed) VALUES (${accountId}, ${this.sealer.seal(secret)})
      ON CONFLICT (account_id) DO UPDATE SET sealed = EXCLUDED.sealed, created_at = now()`);
    return secret;
  }

  private open(sealed: string): string {
    try {
      return this.sealer.open(sealed);
    } catch {
      throw new AppError(
        'service_unavailable',
        'The webhook secret cannot be unsealed with this EDGE_TOKEN_KEY (it changed, or is unset and this is another process): roll it with POST /webhooks/secret',
      );
    }
  }
}

/** Members of the pending set not yet bound to a job: `claim:<random>`. */
const CLAIM_PREFIX = 'claim:';
/** An unbound claim, or a job just bound that has no outbox row yet, counts this long at most. */
const FRESH_MS = 60_000;
/** The pending set of an account that takes no new callback expires this long after its last one. */
const PENDING_TTL_MS = 8 * 86400_000;
/** At most one repair per account this often (each reads every member's jobs). */
const REPAIR_EVERY_MS = 5_000;

/**
 * Takes a place in an account's pending set unless it is full.
 * KEYS: set  ARGV: max, member, now (ms), ttl (ms). Returns {1, count} taken, or {0, count} full.
 */
const CLAIM = `
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[1]) then return {0, n} end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {1, n + 1}
`;

/**
 * Moves a claim onto the job it was taken for (the job, or a chain or parallel request's root).
 * KEYS: set  ARGV: claim, job id, now (ms)
 */
const BIND = `
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
return 1
`;

/** Whether something still stands for each job id (an outstanding delivery, a running job), for `PendingDeliveries.repair`. */
type Liveness = (ids: string[]) => Promise<boolean[]>;

/**
 * WEBHOOK_MAX_PENDING: the deliveries an account has outstanding, one member per accepted callback in
 * a Redis sorted set per account (score: when last touched). A call with a Callback-Url takes a place
 * atomically before anything is reserved or queued (`claim`, 429 when full, so concurrent calls can
 * never take more places than there are), binds it to its job id once it has one (`bind`), and the
 * place is given back when the delivery finally succeeds or gives up (`release`, by the relay), or
 * when the request was never queued.
 *
 * Crash tolerance: a place whose release was lost (a process died between a last attempt and its
 * release, a request that failed between binding and queueing) would hold a place forever. So when
 * the set is full, before refusing, every member is checked (`repair`, at most once per REPAIR_EVERY_MS
 * per account): one with an outbox row not done, or no row yet and a tool job unfinished (or finished
 * within FRESH_MS), or touched within FRESH_MS, still counts; the others are dropped. A Redis that came
 * back empty forgets the places: the limit then counts from the calls after it.
 */
export class PendingDeliveries {
  constructor(private readonly deps: { redis: Redis; config: Pick<Config, 'REDIS_PREFIX' | 'WEBHOOK_MAX_PENDING'>; live: Liveness; now?: () => number }) {}

  private now(): number {
    return this.deps.now?.() ?? Date.now();
  }

  key(accountId: string): string {
    return `${this.deps.config.REDIS_PREFIX}:wh:pending:${accountTag(accountId)}:${accountId}`;
  }

  /** How many places the account's deliveries hold now. */
  count(accountId: string): Promise<number> {
    return this.deps.redis.zcard(this.key(accountId));
  }

  /** Takes a place for a new callback; 429 rate_limited when WEBHOOK_MAX_PENDING are outstanding. Returns the claim. */
  async claim(accountId: string): Promise<string> {
    const max = this.deps.config.WEBHOOK_MAX_PENDING;
    const member = `${CLAIM_PREFIX}${randomUUID()}`;
    const take = async () => (await this.deps.redis.eval(CLAIM, 1, this.key(accountId), max, member, this.now(), PENDING_TTL_MS)) as [number, number];
    let [taken, n] = await take();
    if (!taken && (await this.repair(accountId))) [taken, n] = await take();
    if (!taken) {
      throw new AppError(
        'rate_limited',
        `This account already has ${n} webhook deliveries outstanding (queued or retrying), the most WEBHOOK_MAX_PENDING allows (${max}); ` +
          'a call with a Callback-Url is accepted again once one is delivered or given up (GET /jobs/{id} shows its attempts). Nothing was queued or charged',
        { limit: 'webhook_pending', limit_value: max, pending: n },
      );
    }
    return member;
  }

  /** The claim now stands for this job (a call's job, or a chain or parallel request's root). */
  async bind(accountId: string, claim: string, jobId: string): Promise<void> {
    await this.deps.redis.eval(BIND, 1, this.key(accountId), claim, jobId, this.now());
  }

  /** Gives a place back: the delivery succeeded or gave up, or the request was never queued. */
  async release(accountId: string, member: string): Promise<void> {
    await this.deps.redis.zrem(this.key(accountId), member);
  }

  /** Drops members nothing stands for any more; true when it ran (false: another repair ran recently). */
  private async repair(accountId: string): Promise<boolean> {
    const key = this.key(accountId);
    const lock = await this.deps.redis.set(`${key}:repair`, '1', 'PX', REPAIR_EVERY_MS, 'NX');
    if (lock !== 'OK') return false;
    const flat = await this.deps.redis.zrange(key, 0, -1, 'WITHSCORES');
    const now = this.now();
    const members: string[] = [];
    const dead: string[] = [];
    for (let i = 0; i < flat.length; i += 2) {
      const m = flat[i]!;
      const fresh = now - Number(flat[i + 1]) < FRESH_MS;
      if (fresh) continue;
      if (m.startsWith(CLAIM_PREFIX)) dead.push(m);
      else members.push(m);
    }
    const live = members.length ? await this.deps.live(members) : [];
    members.forEach((m, i) => {
      if (!live[i]) dead.push(m);
    });
    if (dead.length) await this.deps.redis.zrem(key, ...dead);
    return true;
  }
}

/** A job that ended and has a callback (from its settlement). */
export interface EndedJob {
  jobId: string;
  accountId: string;
  callbackUrl?: string;
}

/**
 * The body GET /jobs/{root} answers once a chain or parallel request has ended; null while it runs;
 * undefined when there is no such request (it was never queued, or is no longer stored).
 */
export type FlowOutcome = (rootId: string) => Promise<Record<string, unknown> | null | undefined>;

export interface WebhookView {
  url: string;
  deliveries: Array<{ at: string; status: number | null; ok: boolean; error?: string }>;
  delivered_at: string | null;
}

const ViewRow = z.object({
  url: z.string(),
  delivered_at: z.string().nullable(),
  deliveries: z.array(z.object({ at: z.string(), status: z.number().nullable(), ok: z.boolean(), error: z.string().nullable() })),
});

class DeliveryFailed extends Error {}

/** A due outbox row as the relay claims it; `attempts` counts this attempt. */
const DueRow = z.object({
  job_id: z.string(),
  account_id: z.string(),
  url: z.string(),
  delivery_id: z.string(),
  event: z.string().nullable(),
  attempts: z.number().int(),
});
type Due = z.infer<typeof DueRow>;

/**
 * The relay's claim of up to `n` due rows of `scope`, leased for `leaseMs` (see `Webhooks.claimDue`).
 * Its inner select is shaped for webhook_jobs_due (scope equal, next_at ordered, a LIMIT), so it needs
 * no planner statistics.
 */
export function dueClaim(scope: string, n: number, leaseMs: number) {
  return sql.type(DueRow)`
    UPDATE webhook_jobs w SET attempts = w.attempts + 1, next_at = now() + ${leaseMs}::int * interval '1 millisecond'
    FROM (
      SELECT job_id FROM webhook_jobs
      WHERE scope = ${scope} AND done_at IS NULL AND next_at <= now() AND (NOT flow OR body IS NOT NULL)
      ORDER BY next_at LIMIT ${n} FOR UPDATE SKIP LOCKED
    ) due
    WHERE w.job_id = due.job_id
    RETURNING w.job_id, w.account_id, w.url, w.delivery_id, w.event, w.attempts`;
}

/** A chain or parallel request's row as the watcher claims it, with its age. */
const WatchRow = z.object({ job_id: z.string(), account_id: z.string(), age_ms: z.number() });
type Watched = z.infer<typeof WatchRow>;

/**
 * Claims due work and runs it, at most `limit` at a time: `claim(n)` takes up to n items (leasing their
 * rows in Postgres), `run` handles one. It claims again at once while it finds a full batch or was
 * woken meanwhile; otherwise after POLL_MS. When Postgres does not answer it says so once and keeps
 * trying at that pace.
 */
class Relay<T> {
  private readonly running = new Set<Promise<void>>();
  private stopped = false;
  private woken = false;
  private wakeUp: (() => void) | null = null;
  private failing = false;
  private readonly loop: Promise<void>;

  constructor(
    private readonly name: string,
    private readonly limit: number,
    private readonly claim: (n: number) => Promise<readonly T[]>,
    private readonly run: (item: T) => Promise<void>,
    private readonly log: Logger,
  ) {
    this.loop = this.cycle();
  }

  /** Something may be due now (a row was just written, or a run finished and freed a place). */
  wake(): void {
    this.woken = true;
    this.wakeUp?.();
  }

  private async cycle(): Promise<void> {
    while (!this.stopped) {
      this.woken = false;
      const free = this.limit - this.running.size;
      let full = false;
      if (free > 0) {
        try {
          const items = await this.claim(free);
          if (this.failing) this.log.info(`${this.name}: claiming works again`);
          this.failing = false;
          full = items.length === free;
          for (const item of items) {
            const p: Promise<void> = this.run(item)
              .catch((err: Error) => this.log.warn({ err: err.message }, `${this.name}: a run failed; its row is due again when its lease ends`))
              .finally(() => {
                this.running.delete(p);
                this.wake();
              });
            this.running.add(p);
          }
        } catch (err) {
          if (!this.failing) this.log.warn({ err: (err as Error).message }, `${this.name}: claiming due rows failed; trying again`);
          this.failing = true;
        }
      }
      if (this.stopped || ((full || this.woken) && this.running.size < this.limit && !this.failing)) continue;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, POLL_MS);
        this.wakeUp = () => {
          clearTimeout(timer);
          resolve();
        };
        if (this.woken || this.stopped) this.wakeUp();
      });
      this.wakeUp = null;
    }
    await Promise.all(this.running);
  }

  /** Claims nothing more and waits for the runs in hand (each bounded by its timeouts). */
  async stop(): Promise<void> {
    this.stopped = true;
    this.wakeUp?.();
    await this.loop;
  }
}

export class Webhooks {
  private relay: Relay<Due> | null = null;
  private watcher: Relay<Watched> | null = null;
  readonly secrets: WebhookSecrets;
  readonly pending: PendingDeliveries;
  readonly resolver: DnsResolver;
  /** What settlement needs to write outbox rows in its own statement (src/money/settlement.ts). */
  readonly outbox: { scope: string; wake: () => void };
  /**
   * How long a claimed row stays another relay's: longer than one attempt can take (the DNS check and
   * the request, each bounded by WEBHOOK_TIMEOUT_MS, and the reads and writes around them). A relay that
   * dies mid-attempt leaves its rows due again after it.
   */
  private readonly leaseMs: number;

  constructor(private readonly deps: { config: Config; log: Logger; pool: DatabasePool; redis: Redis; sealer: EdgeTokenSealer; results: ResultsStore }) {
    this.secrets = new WebhookSecrets(deps.pool, deps.sealer);
    this.pending = new PendingDeliveries({ redis: deps.redis, config: deps.config, live: (ids) => this.live(ids) });
    this.resolver = createResolver(deps.config);
    this.outbox = { scope: deps.config.REDIS_PREFIX, wake: () => this.relay?.wake() };
    this.leaseMs = 3 * deps.config.WEBHOOK_TIMEOUT_MS + 5_000;
  }

  private get scope(): string {
    return this.outbox.scope;
  }

  /**
   * For each id in the pending set, whether something still stands for it: its outbox row not done
   * yet, or (before settlement writes the row) its tool job not finished or finished within FRESH_MS.
   * One indexed read of the rows and one pipeline of job hashes, as JobQueues.liveJobs reads them.
   */
  private async live(ids: string[]): Promise<boolean[]> {
    const rows = await this.deps.pool.any(sql.type(z.object({ job_id: z.string(), open: z.boolean() }))`
      SELECT job_id, done_at IS NULL AS open FROM webhook_jobs WHERE job_id = ANY(${sql.array(ids, 'text')})`);
    const open = new Map(rows.map((r) => [r.job_id, r.open]));
    const qp = queuePrefix(this.deps.config.REDIS_PREFIX);
    const pipe = this.deps.redis.pipeline();
    for (const id of ids) {
      const family = familyOfJob(id);
      pipe.hmget(family ? `${qp}:${queueName(family)}:${id}` : `${qp}:none`, 'timestamp', 'finishedOn');
    }
    const tools = ((await pipe.exec()) ?? []).map(([err, v]) => {
      if (err) throw err;
      const [created, finished] = (v ?? []) as Array<string | null>;
      return { exists: created !== null, finishedOn: finished ? Number(finished) : null };
    });
    const now = Date.now();
    return ids.map((id, i) => {
      const row = open.get(id);
      if (row !== undefined) return row;
      const tool = tools[i]!;
      return tool.exists && (tool.finishedOn === null || now - tool.finishedOn < FRESH_MS);
    });
  }

  /** Admission check (see vetCallbackUrl) with this process's resolver. */
  vet(raw: unknown, source: CallbackSource = 'Callback-Url'): Promise<string> {
    return vetCallbackUrl(raw, { config: this.deps.config, resolver: this.resolver }, source);
  }

  /**
   * Jobs that ended outside a settlement statement (a cancel; a stored outcome answered again): writes
   * their outbox rows. Keyed by the job id, so a job whose row settlement already wrote keeps that one.
   */
  async ended(jobs: EndedJob[]): Promise<void> {
    const hooked = jobs.filter((j) => j.callbackUrl);
    if (!hooked.length) return;
    await this.deps.pool.query(sql.unsafe`
      INSERT INTO webhook_jobs (job_id, account_id, url, scope)
      SELECT x.job_id, x.account_id, x.url, ${this.scope}
      FROM jsonb_to_recordset(${sql.jsonb(hooked.map((j) => ({ job_id: j.jobId, account_id: j.accountId, url: j.callbackUrl })))}) AS x(job_id text, account_id uuid, url text)
      ON CONFLICT (job_id) DO NOTHING`);
    this.outbox.wake();
  }

  /**
   * A chain or parallel request with a callback is about to be queued: its outbox row is written now,
   * before the flow exists in Redis (a request whose row cannot be written is not run at all). The
   * watcher looks at it until it ends, stores its body, and the relay delivers it.
   */
  async watch(rootId: string, accountId: string, url: string): Promise<void> {
    await this.deps.pool.query(sql.unsafe`
      INSERT INTO webhook_jobs (job_id, account_id, url, scope, flow, next_at)
      VALUES (${rootId}, ${accountId}, ${url}, ${this.scope}, true, now() + ${WATCH_MIN_MS}::int * interval '1 millisecond')
      ON CONFLICT (job_id) DO NOTHING`);
  }

  /**
   * Starts the watcher of chain and parallel requests (API processes: `outcome` needs the protocol
   * service, src/calls/protocol.ts). Rows are claimed like deliveries, so one replica looks at each.
   */
  startWatcher(outcome: FlowOutcome, concurrency = 16): void {
    if (this.watcher) return;
    this.watcher = new Relay<Watched>(
      'webhook watcher',
      concurrency,
      (n) => this.claimWatches(n),
      (w) => this.check(w, outcome),
      this.deps.log,
    );
  }

  /** Up to `n` requests due for a look, leased to this process. Uses webhook_jobs_due. */
  private claimWatches(n: number): Promise<readonly Watched[]> {
    return this.deps.pool.any(sql.type(WatchRow)`
      UPDATE webhook_jobs w SET next_at = now() + ${this.leaseMs}::int * interval '1 millisecond'
      FROM (
        SELECT job_id FROM webhook_jobs
        WHERE scope = ${this.scope} AND done_at IS NULL AND next_at <= now() AND flow AND body IS NULL
        ORDER BY next_at LIMIT ${n} FOR UPDATE SKIP LOCKED
      ) due
      WHERE w.job_id = due.job_id
      RETURNING w.job_id, w.account_id, (extract(epoch FROM now() - w.created_at) * 1000)::float8 AS age_ms`);
  }

  /** One look at a watched request: not ended, look again later (a quarter of its age, 250 ms to 30 s); ended, store its body for the relay. */
  private async check(w: Watched, outcome: FlowOutcome): Promise<void> {
    const { pool, log } = this.deps;
    const body = await outcome(w.job_id);
    if (body === undefined || (body === null && w.age_ms > WATCH_GIVE_UP_MS)) {
      log.warn(
        { job: w.job_id },
        body === undefined ? 'webhook watch: the request is not stored; nothing to deliver' : 'webhook watch gave up: the request has not ended',
      );
      await pool.query(sql.unsafe`UPDATE webhook_jobs SET done_at = now() WHERE job_id = ${w.job_id} AND done_at IS NULL`);
      await this.pending.release(w.account_id, w.job_id).catch(() => {});
      return;
    }
    if (body === null) {
      const again = Math.round(Math.min(WATCH_MAX_MS, Math.max(WATCH_MIN_MS, w.age_ms / 4)));
      await pool.query(
        sql.unsafe`UPDATE webhook_jobs SET next_at = now() + ${again}::int * interval '1 millisecond' WHERE job_id = ${w.job_id} AND done_at IS NULL`,
      );
      return;
    }
    // Sealed like a sensitive tool's answer (src/queue/job-seal.ts): a request's steps may have been
    // sensitive, and its whole body is kept until delivered.
    const sealed = jobSeal(this.deps.config).seal(pgSafeValue(body), webhookBinding(w.job_id));
    await pool.query(sql.unsafe`
      UPDATE webhook_jobs SET body = ${sql.jsonb(sealed as never)}, next_at = now() WHERE job_id = ${w.job_id} AND done_at IS NULL`);
    this.outbox.wake();
  }

  /** The `webhook` member of GET /jobs/{id}: where it goes and every attempt so far; null without a callback. */
  async view(jobId: string): Promise<WebhookView | null> {
    const row = await this.deps.pool.maybeOne(sql.type(ViewRow)`
      SELECT w.url, w.delivered_at::text AS delivered_at,
        COALESCE((SELECT json_agg(json_build_object('at', d.at, 'status', d.status, 'ok', d.ok, 'error', d.error) ORDER BY d.id)
          FROM webhook_deliveries d WHERE d.job_id = w.job_id), '[]'::json) AS deliveries
      FROM webhook_jobs w WHERE w.job_id = ${jobId}`);
    if (!row) return null;
    return {
      url: row.url,
      deliveries: row.deliveries.map((d) => ({ at: new Date(d.at).toISOString(), status: d.status, ok: d.ok, ...(d.error ? { error: d.error } : {}) })),
      delivered_at: row.delivered_at ? new Date(row.delivered_at).toISOString() : null,
    };
  }

  /**
   * The body GET /jobs/{id} answers for a finished job, from its stored result: completed, the
   * result; failed, the error envelope (without a request_id: no request asked for it).
   */
  async body(jobId: string): Promise<Record<string, unknown> | null> {
    // A chain or parallel request, or an account event: the body stored with its row.
    const kept = await this.deps.pool.maybeOneFirst(sql.type(z.object({ body: z.record(z.unknown()).nullable() }))`
      SELECT body FROM webhook_jobs WHERE job_id = ${jobId}`);
    if (kept) return isSealed(kept) ? (jobSeal(this.deps.config).open(kept, webhookBinding(jobId)) as Record<string, unknown>) : kept;
    const stored = await this.deps.results.get(jobId);
    if (!stored) return null;
    if (stored.status === 'completed') return ResultsStore.answer(jobId, stored);
    const err = AppError.fromJSON(stored.body as unknown as SerializedError);
    return { error: { code: err.code, message: err.message, ...err.details, job_id: jobId } };
  }

  /**
   * Starts the relay (processes that run tool workers, whose settlements wake it). Rows written before
   * the outbox had scopes (migrations/019_webhook_outbox.sql) are taken over by this deployment first.
   */
  start(concurrency = 16): void {
    if (this.relay) return;
    const adopt = this.deps.pool
      .query(sql.unsafe`UPDATE webhook_jobs SET scope = ${this.scope} WHERE scope = '' AND done_at IS NULL`)
      .catch((err: Error) => this.deps.log.warn({ err: err.message }, 'taking over earlier webhook deliveries failed'));
    this.relay = new Relay<Due>(
      'webhook relay',
      concurrency,
      async (n) => {
        await adopt;
        return this.claimDue(n);
      },
      (d) => this.deliver(d),
      this.deps.log,
    );
  }

  /**
   * Up to `n` due deliveries, leased to this process: the claim counts the attempt and moves next_at
   * past the lease, so no other relay takes the row meanwhile, and one whose relay died comes back.
   * A request's row is due only once its body is stored. Uses webhook_jobs_due.
   */
  private claimDue(n: number): Promise<readonly Due[]> {
    return this.deps.pool.any(dueClaim(this.scope, n, this.leaseMs));
  }

  /**
   * One attempt: vet the URL again (DNS may have changed) and POST to the pinned addresses only, signed
   * per Standard Webhooks: `webhook-id` (the row's delivery id, the same on every attempt),
   * `webhook-timestamp` (this attempt, seconds) and `webhook-signature` over both and the body. Then
   * the attempt and what follows are recorded in one statement: delivered, given up (the last of
   * WEBHOOK_ATTEMPTS), or due again after WEBHOOK_BACKOFF_MS * 2^(attempt-1). The last attempt,
   * delivered or not, gives the account's pending place back.
   */
  private async deliver(d: Due): Promise<void> {
    const { job_id: jobId, account_id: accountId, url: raw, delivery_id: deliveryId, event, attempts: attempt } = d;
    const { config, pool, log } = this.deps;
    let status: number | null = null;
    let error: string | undefined;
    const agent = new PinnedAgent({ connectTimeoutMs: config.WEBHOOK_TIMEOUT_MS });
    try {
      const body = await this.body(jobId);
      if (!body) throw new DeliveryFailed('the job has no stored outcome');
      const raw_ = JSON.stringify(body);
      const secret = await this.secrets.get(accountId);
      const timestamp = Math.floor(Date.now() / 1000);
      const url = new URL(raw);
      const dest = await vetDestination(url, {
        config: { FETCH_ALLOWED_HOSTS: config.WEBHOOK_ALLOWED_HOSTS },
        resolver: this.resolver,
        tool: 'webhook delivery',
        signal: AbortSignal.timeout(config.WEBHOOK_TIMEOUT_MS),
      });
      if (url.protocol !== 'https:' && !dest.exempt) throw new DeliveryFailed('plain http is only allowed for WEBHOOK_ALLOWED_HOSTS');
      agent.pin(dest);
      // undici's request never follows redirects: a 3xx is an answer like any other non-2xx.
      const res = await request(url, {
        method: 'POST',
        dispatcher: agent.dispatcher,
        headers: {
          'content-type': 'application/json',
          'user-agent': 'Tollgate-Webhooks/1',
          'webhook-id': deliveryId,
          'webhook-timestamp': String(timestamp),
          'webhook-signature': webhookSignature(secret, deliveryId, timestamp, raw_),
          ...(event ? { 'tollgate-event': event } : { 'tollgate-job-id': jobId }),
        },
        body: raw_,
        headersTimeout: config.WEBHOOK_TIMEOUT_MS,
        bodyTimeout: config.WEBHOOK_TIMEOUT_MS,
        signal: AbortSignal.timeout(config.WEBHOOK_TIMEOUT_MS),
      });
      status = res.statusCode;
      await peek(res.body);
      if (status < 200 || status > 299) throw new DeliveryFailed(`the receiver answered ${status}`);
    } catch (e) {
      error =
        e instanceof DeliveryFailed || isAppError(e)
          ? e.message
          : `request failed: ${(e as Error).name === 'TimeoutError' ? 'timed out' : withoutAddresses((e as Error).message)}`;
    } finally {
      await agent.close().catch(() => {});
    }
    const ok = error === undefined;
    const last = attempt >= config.WEBHOOK_ATTEMPTS;
    const then = ok
      ? sql.fragment`delivered_at = now(), done_at = now()`
      : last
        ? sql.fragment`done_at = now()`
        : sql.fragment`next_at = now() + ${Math.min(config.WEBHOOK_BACKOFF_MS * 2 ** (attempt - 1), 2 ** 31 - 1)}::int * interval '1 millisecond'`;
    await pool.query(sql.unsafe`
      WITH attempt AS (
        INSERT INTO webhook_deliveries (job_id, delivery_id, attempt, status, ok, error)
        VALUES (${jobId}, ${deliveryId}, ${attempt}, ${status}, ${ok}, ${error ?? null})
      )
      UPDATE webhook_jobs SET ${then} WHERE job_id = ${jobId} AND done_at IS NULL`);
    if (!ok && last) log.warn({ job: jobId, delivery: deliveryId, err: error }, 'webhook delivery gave up');
    // Best effort: a place whose release is lost is found by the next repair (its row is done).
    if (ok || last) await this.pending.release(accountId, jobId).catch(() => {});
  }

  /** Stops claiming; deliveries and looks in hand finish first (each within its timeouts). */
  async close(): Promise<void> {
    await this.relay?.stop();
    await this.watcher?.stop();
  }
}

/** Reads at most RESPONSE_PEEK_BYTES of a response body, then drops the rest. */
async function peek(body: AsyncIterable<Buffer> & { destroy(): void }): Promise<void> {
  let n = 0;
  try {
    for await (const chunk of body) {
      n += chunk.length;
      if (n >= RESPONSE_PEEK_BYTES) break;
    }
  } catch {
    // The answer's status is what counts.
  } finally {
    body.destroy();
  }
}

/** What a request's sealed webhook body is bound to: its row. */
function webhookBinding(jobId: string): string {
  return `webhook:${jobId}`;
}
