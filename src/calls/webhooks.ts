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
import { queuePrefix } from '../queue/keyspace.js';
import type { EdgeTokenSealer } from '../services/edge-token.js';
import { PinnedAgent, vetDestination, withoutAddresses } from '../tools/web/net-guard.js';
import { pgSafeValue } from '../db/pg-text.js';
import { createResolver, type DnsResolver } from '../tools/web/resolver.js';

/**
 * Webhooks for async jobs. A call may name a Callback-Url (checked at admission by
 * `vetCallbackUrl`); when its job ends, settlement (src/money/settlement.ts, worker side, so it holds
 * even when the API process that admitted the job is gone) hands it to `Webhooks.ended`, which queues
 * one delivery per job on the `webhooks` queue. The delivery worker POSTs the body GET /jobs/{id}
 * answers, signed with the account's secret, and records every attempt in Postgres
 * (migrations/010_webhooks.sql) for GET /jobs/{id} to show.
 */

export const WEBHOOK_QUEUE = 'webhooks';
/**
 * Chain and parallel requests end in several jobs, with no single settlement to hang a delivery on:
 * a `watch` job per request waits (re-delayed, not retried) until the whole request has ended, then
 * stores its body and queues the delivery. Its worker runs in API processes, which can assemble a
 * request's body (src/services/protocol.ts); it lives in Redis, so any API replica picks it up.
 */
export const WEBHOOK_WATCH_QUEUE = 'webhook-watch';
/** A request whose outcome is still unknown after this long is given up (its steps have long timed out). */
const WATCH_GIVE_UP_MS = 48 * 3600_000;
/** The response body is read no further than this (then the connection is dropped). */
const RESPONSE_PEEK_BYTES = 4096;
const URL_MAX = 2048;

/** Where a refused Callback-Url is named: the header on POST /tools/{name}, the field on POST /. */
export type CallbackSource = 'Callback-Url' | 'callback_url';

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

/** Signature header value: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">`. */
export function signatureHeader(secret: string, body: string, t = Math.floor(Date.now() / 1000)): string {
  return `t=${t},v1=${createHmac('sha256', secret).update(`${t}.${body}`).digest('hex')}`;
}

/**
 * One signing secret per account, stored sealed with the edge-token sealer (AES-256-GCM under
 * EDGE_TOKEN_KEY): the database never holds it in clear, and it is never logged. Separate API and
 * worker processes need the same EDGE_TOKEN_KEY, as for edge tokens.
 */
export class WebhookSecrets {
  constructor(
    private readonly pool: DatabasePool,
    private readonly sealer: EdgeTokenSealer,
  ) {}

  private static fresh(): string {
    return `whsec_${randomBytes(24).toString('base64url')}`;
  }

  /** The account's secret, created on first use. */
  async get(accountId: string): Promise<string> {
    await this.pool.query(sql.unsafe`
      INSERT INTO webhook_secrets (account_id, sealed) VALUES (${accountId}, ${this.sealer.seal(WebhookSecrets.fresh())})
      ON CONFLICT (account_id) DO NOTHING`);
    const sealed = await this.pool.oneFirst(sql.type(z.object({ sealed: z.string() }))`SELECT sealed FROM webhook_secrets WHERE account_id = ${accountId}`);
    return this.open(sealed);
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
  /** Tollgate-Delivery-Id: the same on every retry, so receivers can drop duplicates. */
  deliveryId: string;
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
  readonly resolver: DnsResolver;

  constructor(
    private readonly deps: { config: Config; log: Logger; pool: DatabasePool; redis: Redis; sealer: EdgeTokenSealer; results: ResultsStore },
  ) {
    this.queue = new Queue<DeliveryData>(WEBHOOK_QUEUE, { connection: deps.redis, prefix: queuePrefix(deps.config.REDIS_PREFIX) });
    this.watchQueue = new Queue<WatchData>(WEBHOOK_WATCH_QUEUE, { connection: deps.redis, prefix: queuePrefix(deps.config.REDIS_PREFIX) });
    this.secrets = new WebhookSecrets(deps.pool, deps.sealer);
    this.resolver = createResolver(deps.config);
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
    }
  }

  private async enqueue(jobId: string, accountId: string, url: string): Promise<void> {
    const { config } = this.deps;
    await this.queue.add(
      'deliver',
      { jobId, accountId, url, deliveryId: `dlv_${randomUUID()}` },
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
      return;
    }
    if (body === null) {
      if (Date.now() - since > WATCH_GIVE_UP_MS) {
        this.deps.log.warn({ job: rootId }, 'webhook watch gave up: the request has not ended');
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

  /** One attempt: vet the URL again (DNS may have changed) and POST to the pinned addresses only. */
  private async deliver(job: Job<DeliveryData>): Promise<void> {
    const { jobId, accountId, url: raw, deliveryId } = job.data;
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
          'tollgate-signature': signatureHeader(secret, raw_),
          'tollgate-job-id': jobId,
          'tollgate-delivery-id': deliveryId,
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
      error = e instanceof DeliveryFailed || isAppError(e) ? e.message : `request failed: ${(e as Error).name === 'TimeoutError' ? 'timed out' : withoutAddresses((e as Error).message)}`;
    } finally {
      await agent.close().catch(() => {});
    }
    const ok = error === undefined;
    await pool.query(sql.unsafe`
      INSERT INTO webhook_deliveries (job_id, delivery_id, attempt, status, ok, error)
      VALUES (${jobId}, ${deliveryId}, ${attempt}, ${status}, ${ok}, ${error ?? null})`);
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
