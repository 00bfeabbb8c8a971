import { createHmac, randomBytes, randomUUID } from 'node:crypto';
import { DelayedError, Queue, Worker, type Job } from 'bullmq';
import type { Logger } from 'pino';
import { request } from 'undici';
import { z } from 'zod';
import type { Config } from '../config.js';
import { sql, type DatabasePool } from '../db/pool.js';
import { AppError, isAppError, type SerializedError } from '../errors.js';
import { ResultsStore } from '../money/results.js';
import { connectRedis, type Redis } from '../queue/redis.js';
import { accountTag, queuePrefix } from '../queue/keyspace.js';
import { familyOfJob, queueName } from '../queue/queues.js';
import type { EdgeTokenSealer } from '../access/edge-token.js';
import { PinnedAgent, vetDestination, withoutAddresses } from '../tools/web/net-guard.js';
import { pgSafeValue } from '../db/pg-text.js';
import { createResolver, type DnsResolver } from '../tools/web/resolver.js';

/**
 * Webhooks for async jobs. A charged call may name a Callback-Url (checked at admission by
 * `vetCallbackUrl`, and counted among the account's outstanding deliveries by `PendingDeliveries`);
 * when its job ends, settlement (src/money/settlement.ts, worker side, so it holds even when the API
 * process that admitted the job is gone) hands it to `Webhooks.ended`, which queues one delivery per
 * job on the `webhooks` queue. The delivery worker POSTs the body GET /jobs/{id} answers, signed as
 * Standard Webhooks says (https://www.standardwebhooks.com: `webhook-id`, `webhook-timestamp`,
 * `webhook-signature`) with the account's secret, and records every attempt in Postgres
 * (migrations/010_webhooks.sql) for GET /jobs/{id} to show.
 */

export const WEBHOOK_QUEUE = 'webhooks';
/**
 * Chain and parallel requests end in several jobs, with no single settlement to hang a delivery on:
 * a `watch` job per request waits (re-delayed, not retried) until the whole request has ended, then
 * stores its body and queues the delivery. Its worker runs in API processes, which can assemble a
 * request's body (src/calls/protocol.ts); it lives in Redis, so any API replica picks it up.
 */
export const WEBHOOK_WATCH_QUEUE = 'webhook-watch';
/** A request whose outcome is still unknown after this long is given up (its steps have long timed out). */
const WATCH_GIVE_UP_MS = 48 * 3600_000;
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

/** What a delivery job carries (no secret: the worker reads it when it signs). */
export interface DeliveryData {
  jobId: string;
  accountId: string;
  url: string;
  /** `webhook-id`: the same on every retry, and signed, so receivers can drop duplicates. */
  deliveryId: string;
  /** An account event (src/calls/alerts.ts), not a job's outcome: its type, sent as `tollgate-event`. */
  event?: string;
}

/** An account event to deliver: its body is already stored in webhook_jobs under `evt_<id>`. */
export interface AccountEvent {
  id: string;
  accountId: string;
  type: string;
  url: string;
}

/** Members of the pending set not yet bound to a job: `claim:<random>`. */
const CLAIM_PREFIX = 'claim:';
/** An unbound claim, or a job just bound that has no queued job yet, counts this long at most. */
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

/** What a job id stands for in the queues, for `PendingDeliveries.repair`. */
type Liveness = (ids: string[]) => Promise<boolean[]>;

/**
 * WEBHOOK_MAX_PENDING: the deliveries an account has outstanding, one member per accepted callback in
 * a Redis sorted set per account (score: when last touched). A call with a Callback-Url takes a place
 * atomically before anything is reserved or queued (`claim`, 429 when full, so concurrent calls can
 * never take more places than there are), binds it to its job id once it has one (`bind`), and the
 * place is given back when the delivery finally succeeds or gives up (`release`, by the delivery
 * worker), or when the request was never queued.
 *
 * Crash tolerance: a place whose release was lost (a process died between a last attempt and its
 * release, a request that failed between binding and queueing) would hold a place forever. So when
 * the set is full, before refusing, every member is checked against the queues (`repair`, at most once
 * per REPAIR_EVERY_MS per account): one with an unfinished delivery, watch or tool job, or touched
 * within FRESH_MS, still counts; the others are dropped.
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

  /** Marks a member as recently active (its delivery was just queued). */
  async touch(accountId: string, jobId: string): Promise<void> {
    await this.deps.redis.zadd(this.key(accountId), 'XX', this.now(), jobId);
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

/** What a watch job carries: the chain or parallel request and where its outcome goes. */
export interface WatchData {
  rootId: string;
  accountId: string;
  url: string;
  since: number;
  checks: number;
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

export class Webhooks {
  private readonly queue: Queue<DeliveryData>;
  private readonly watchQueue: Queue<WatchData>;
  private worker: Worker<DeliveryData> | null = null;
  private workerRedis: Redis | null = null;
  private watcher: Worker<WatchData> | null = null;
  private watcherRedis: Redis | null = null;
  readonly secrets: WebhookSecrets;
  readonly pending: PendingDeliveries;
  readonly resolver: DnsResolver;

  constructor(private readonly deps: { config: Config; log: Logger; pool: DatabasePool; redis: Redis; sealer: EdgeTokenSealer; results: ResultsStore }) {
    this.queue = new Queue<DeliveryData>(WEBHOOK_QUEUE, { connection: deps.redis, prefix: queuePrefix(deps.config.REDIS_PREFIX) });
    this.watchQueue = new Queue<WatchData>(WEBHOOK_WATCH_QUEUE, { connection: deps.redis, prefix: queuePrefix(deps.config.REDIS_PREFIX) });
    this.secrets = new WebhookSecrets(deps.pool, deps.sealer);
    this.pending = new PendingDeliveries({ redis: deps.redis, config: deps.config, live: (ids) => this.live(ids) });
    this.resolver = createResolver(deps.config);
  }

  /**
   * For each id in the pending set, whether something still stands for it: an unfinished delivery, an
   * unfinished watch, or (before its delivery is queued) a tool job not finished or finished within
   * FRESH_MS (settlement is about to queue its delivery). Reads job hashes as JobQueues.liveJobs does.
   */
  private async live(ids: string[]): Promise<boolean[]> {
    const qp = queuePrefix(this.deps.config.REDIS_PREFIX);
    const pipe = this.deps.redis.pipeline();
    for (const id of ids) {
      pipe.hmget(`${qp}:${WEBHOOK_QUEUE}:hook-${id}`, 'timestamp', 'finishedOn');
      pipe.hmget(`${qp}:${WEBHOOK_WATCH_QUEUE}:watch-${id}`, 'timestamp', 'finishedOn');
      const family = familyOfJob(id);
      pipe.hmget(family ? `${qp}:${queueName(family)}:${id}` : `${qp}:none`, 'timestamp', 'finishedOn');
    }
    const replies = ((await pipe.exec()) ?? []).map(([err, v]) => {
      if (err) throw err;
      const [created, finished] = (v ?? []) as Array<string | null>;
      return { exists: created !== null, finishedOn: finished ? Number(finished) : null };
    });
    const now = Date.now();
    return ids.map((_, i) => {
      const [hook, watch, tool] = [replies[3 * i]!, replies[3 * i + 1]!, replies[3 * i + 2]!];
      if (hook.exists) return hook.finishedOn === null;
      if (watch.exists && watch.finishedOn === null) return true;
      if (tool.exists) return tool.finishedOn === null || now - tool.finishedOn < FRESH_MS;
      return false;
    });
  }

  /** Admission check (see vetCallbackUrl) with this process's resolver. */
  vet(raw: unknown, source: CallbackSource = 'Callback-Url'): Promise<string> {
    return vetCallbackUrl(raw, { config: this.deps.config, resolver: this.resolver }, source);
  }

  /**
   * Called by settlement once a job's outcome is committed. Queues one delivery per job: the BullMQ
   * job id is derived from the job id, so a job settled twice (a redelivery) is delivered once.
   */
  async ended(jobs: EndedJob[]): Promise<void> {
    for (const j of jobs) {
      if (!j.callbackUrl) continue;
      await this.deps.pool.query(sql.unsafe`
        INSERT INTO webhook_jobs (job_id, account_id, url) VALUES (${j.jobId}, ${j.accountId}, ${j.callbackUrl})
        ON CONFLICT (job_id) DO NOTHING`);
      await this.enqueue(j.jobId, j.accountId, j.callbackUrl);
      await this.pending.touch(j.accountId, j.jobId).catch(() => {});
    }
  }

  /**
   * Queues the deliveries of account events (spend alerts) whose body and webhook_jobs row are
   * written. The webhook-id is the event's own id, and the BullMQ job id is derived from it, so an
   * event queued twice (two replicas picking up one whose queueing was lost) is delivered once.
   */
  async events(events: AccountEvent[]): Promise<void> {
    for (const e of events) await this.enqueue(`evt_${e.id}`, e.accountId, e.url, { deliveryId: `evt_${e.id}`, event: e.type });
  }

  private async enqueue(
    jobId: string,
    accountId: string,
    url: string,
    as: Pick<DeliveryData, 'deliveryId' | 'event'> = { deliveryId: `dlv_${randomUUID()}` },
  ): Promise<void> {
    const { config } = this.deps;
    await this.queue.add(
      'deliver',
      { jobId, accountId, url, ...as },
      {
        jobId: `hook-${jobId}`,
        attempts: config.WEBHOOK_ATTEMPTS,
        backoff: { type: 'exponential', delay: config.WEBHOOK_BACKOFF_MS },
        removeOnComplete: { age: 7 * 86400 },
        removeOnFail: { age: 7 * 86400 },
      },
    );
  }

  /**
   * A chain or parallel request with a callback was queued: watch it until it ends (see
   * WEBHOOK_WATCH_QUEUE). One watch per request (the job id is derived from the root's).
   */
  async watch(rootId: string, accountId: string, url: string): Promise<void> {
    await this.watchQueue.add(
      'watch',
      { rootId, accountId, url, since: Date.now(), checks: 0 },
      {
        jobId: `watch-${rootId}`,
        delay: 250,
        // Retries are for failures of the check itself (Redis or Postgres down); waiting is a re-delay.
        attempts: 20,
        backoff: { type: 'exponential', delay: 1000 },
        removeOnComplete: { age: 86400 },
        removeOnFail: { age: 7 * 86400 },
      },
    );
  }

  /** Starts the watch worker (API processes: `outcome` needs the protocol service). */
  startWatcher(outcome: FlowOutcome, concurrency = 16): void {
    if (this.watcher) return;
    this.watcherRedis = connectRedis(this.deps.config.REDIS_URL);
    this.watcherRedis.on('error', (err: Error) => this.deps.log.debug({ err: err.message }, 'webhook watcher redis connection error'));
    this.watcher = new Worker<WatchData>(WEBHOOK_WATCH_QUEUE, (job, token) => this.check(job, token, outcome), {
      connection: this.watcherRedis,
      prefix: queuePrefix(this.deps.config.REDIS_PREFIX),
      concurrency,
    });
    this.watcher.on('error', (err) => this.deps.log.warn({ err: err.message }, 'webhook watcher error'));
  }

  /** One look at a watched request: not ended, look again later (250 ms doubling to 30 s); ended, deliver. */
  private async check(job: Job<WatchData>, token: string | undefined, outcome: FlowOutcome): Promise<void> {
    const { rootId, accountId, url, since, checks } = job.data;
    const body = await outcome(rootId);
    if (body === undefined) {
      this.deps.log.warn({ job: rootId }, 'webhook watch: the request is not stored; nothing to deliver');
      await this.pending.release(accountId, rootId);
      return;
    }
    if (body === null) {
      if (Date.now() - since > WATCH_GIVE_UP_MS) {
        this.deps.log.warn({ job: rootId }, 'webhook watch gave up: the request has not ended');
        await this.pending.release(accountId, rootId);
        return;
      }
      await job.updateData({ ...job.data, checks: checks + 1 });
      await job.moveToDelayed(Date.now() + Math.min(250 * 2 ** checks, 30_000), token);
      throw new DelayedError();
    }
    await this.deps.pool.query(sql.unsafe`
      INSERT INTO webhook_jobs (job_id, account_id, url, body) VALUES (${rootId}, ${accountId}, ${url}, ${sql.jsonb(pgSafeValue(body) as never)})
      ON CONFLICT (job_id) DO NOTHING`);
    await this.enqueue(rootId, accountId, url);
    await this.pending.touch(accountId, rootId).catch(() => {});
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
    // A chain or parallel request: the body stored when it ended (see `check`).
    const kept = await this.deps.pool.maybeOneFirst(sql.type(z.object({ body: z.record(z.unknown()).nullable() }))`
      SELECT body FROM webhook_jobs WHERE job_id = ${jobId}`);
    if (kept) return kept;
    const stored = await this.deps.results.get(jobId);
    if (!stored) return null;
    if (stored.status === 'completed') return ResultsStore.answer(jobId, stored);
    const err = AppError.fromJSON(stored.body as unknown as SerializedError);
    return { error: { code: err.code, message: err.message, ...err.details, job_id: jobId } };
  }

  /** Starts the delivery worker (processes that run tool workers). */
  start(concurrency = 16): void {
    this.workerRedis = connectRedis(this.deps.config.REDIS_URL);
    this.workerRedis.on('error', (err: Error) => this.deps.log.debug({ err: err.message }, 'webhook worker redis connection error'));
    this.worker = new Worker<DeliveryData>(WEBHOOK_QUEUE, (job) => this.deliver(job), {
      connection: this.workerRedis,
      prefix: queuePrefix(this.deps.config.REDIS_PREFIX),
      concurrency,
    });
    this.worker.on('error', (err) => this.deps.log.warn({ err: err.message }, 'webhook worker error'));
    this.worker.on('failed', (job, err) => {
      if (job && job.attemptsMade >= (job.opts.attempts ?? 1)) {
        this.deps.log.warn({ job: job.data.jobId, delivery: job.data.deliveryId, err: err.message }, 'webhook delivery gave up');
      }
    });
  }

  /**
   * One attempt: vet the URL again (DNS may have changed) and POST to the pinned addresses only, signed
   * per Standard Webhooks: `webhook-id` (the delivery id, the same on every retry), `webhook-timestamp`
   * (this attempt, seconds) and `webhook-signature` over both and the body. The last attempt, delivered
   * or not, gives the account's pending place back.
   */
  private async deliver(job: Job<DeliveryData>): Promise<void> {
    const { jobId, accountId, url: raw, deliveryId, event } = job.data;
    const { config, pool } = this.deps;
    const attempt = job.attemptsMade + 1;
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
    await pool.query(sql.unsafe`
      INSERT INTO webhook_deliveries (job_id, delivery_id, attempt, status, ok, error)
      VALUES (${jobId}, ${deliveryId}, ${attempt}, ${status}, ${ok}, ${error ?? null})`);
    const last = attempt >= (job.opts.attempts ?? 1);
    // Best effort: a place whose release is lost is found by the next repair (its delivery job has finished).
    if (ok || last) await this.pending.release(accountId, jobId).catch(() => {});
    if (ok) {
      await pool.query(sql.unsafe`UPDATE webhook_jobs SET delivered_at = now() WHERE job_id = ${jobId} AND delivered_at IS NULL`);
      return;
    }
    // Thrown so BullMQ retries with its exponential backoff (WEBHOOK_ATTEMPTS, WEBHOOK_BACKOFF_MS).
    throw new Error(error);
  }

  async close(): Promise<void> {
    // A worker closed while it still connects leaves its connection's pending commands to reject
    // unhandled: let each finish starting first (a short-lived process, e.g. in tests, closes at once).
    await this.worker?.waitUntilReady().catch(() => {});
    await this.worker?.close();
    await this.watcher?.waitUntilReady().catch(() => {});
    await this.watcher?.close();
    await this.workerRedis?.quit().catch(() => {});
    await this.watcherRedis?.quit().catch(() => {});
    await this.queue.close();
    await this.watchQueue.close();
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
