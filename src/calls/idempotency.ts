import { AsyncLocalStorage } from 'node:async_hooks';
import { createHash, randomUUID } from 'node:crypto';
import { asDependencyError, type Redis } from '../queue/redis.js';
import { AppError } from '../errors.js';
import { idempotencyDigest, type DurableClaim } from './intents.js';

export interface StoredResponse {
  status: number;
  headers: Record<string, string>;
  body: unknown;
  /**
   * Keep a success by reference to its job whatever its size, never its body: the answer of a
   * sensitive tool, sealed where it is stored (src/queue/job-seal.ts), is not copied into Redis in clear.
   */
  byReference?: boolean;
}

/**
 * How a large answer is kept: its status and headers, and instead of its body the job whose stored
 * answer (job_results) it is, read back with `recover` on a replay.
 */
interface StoredReference {
  status: number;
  headers: Record<string, string>;
  body: null;
  ref: string;
}

/** What the stored entry holds. `job_ids` is comma-joined (Lua's cjson cannot tell [] from {}). */
interface Entry {
  state: 'running' | 'done';
  fingerprint: string;
  /** The claim's owner: whoever holds this token may record jobs, renew and finish. */
  token?: string;
  /** The claim counts as abandoned (its owner died or its client left) once this time has passed. */
  lease_until?: number;
  job_ids?: string;
  response?: StoredResponse | StoredReference;
}

/** Records a job id in the claim before the job is queued (pass it as CallOptions.onJobId). */
export type TrackJob = (jobId: string) => Promise<void>;

/**
 * Thrown by a request whose client went away while its job runs (chat completions, MCP tools/call):
 * the claim is kept, with its job ids, and marked abandoned, so the retry answers from the job
 * instead of running (and charging) again.
 */
export class ClientGone extends Error {
  constructor() {
    super('the client went away before the job finished');
  }
}

/** A recovered retry whose job has not finished yet: the claim stays abandoned for the next retry. */
export function stillRunning(jobId: string): AppError {
  return new AppError(
    'idempotency_in_progress',
    `The first request with this Idempotency-Key started job ${jobId}, which is still running; retry shortly`,
    { job_id: jobId, retry_after: 1 },
    { headers: { 'retry-after': '1' } },
  );
}

/** The Idempotency-Key a request runs under, as its job intents record it (src/calls/intents.ts). */
export interface IdempotencyContext {
  /** SHA-256 of the key and its scope. */
  idem: Buffer;
  /** The request's fingerprint (hex). */
  fingerprint: string;
}

const current = new AsyncLocalStorage<IdempotencyContext>();

/** The Idempotency-Key of the request whose work is running now (admission writes it into the intents). */
export function currentIdempotency(): IdempotencyContext | undefined {
  return current.getStore();
}

/** Where a key's use outlives its Redis claim: the job intents, asked only while claims may have been lost. */
export interface DurableClaims {
  mayHaveLost(): boolean;
  byIdempotencyKey(idem: Buffer): Promise<DurableClaim | null>;
}

function inProgress(): AppError {
  return new AppError(
    'idempotency_in_progress',
    'A request with this Idempotency-Key is still running; retry shortly',
    { retry_after: 1 },
    { headers: { 'retry-after': '1' } },
  );
}

function reusedKey(): AppError {
  return new AppError('idempotency_key_reused', 'This Idempotency-Key was used with a different request body; use a new key for a new request');
}

/**
 * Whether a key keeps this failure as its answer: a caller's error (4xx but 429) is final, and so is an
 * error after which something was charged (a chain failing at a later step) even when it is a 5xx:
 * retrying would run and charge the completed steps again. A lost job (job_lost) ran nothing and never
 * will, and a 5xx or 429 with nothing charged is worth retrying: those free the key.
 */
function keptFailure(e: AppError): boolean {
  if (e.code === 'job_lost') return false;
  return (e.status !== 429 && e.status < 500) || Number(e.details.cost_cents ?? 0) > 0;
}

const TTL_SECONDS = 24 * 3600;
/** A live request renews its claim every third of this; a dead one's claim is taken over after it. */
export const LEASE_MS = 10_000;
const KEY_RE = /^[\x21-\x7e]{1,255}$/;

// KEYS: entry   ARGV: new entry (json), ttl, now
// Claims the key, or takes over a running claim whose lease ran out (same body only), keeping the job
// ids its owner recorded. Returns {1, ''} claimed, {2, old} taken over, {0, old} someone else's.
const CLAIM = `
local raw = redis.call('GET', KEYS[1])
if not raw then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
  return {1, ''}
end
local e = cjson.decode(raw)
local mine = cjson.decode(ARGV[1])
if e.state == 'running' and e.fingerprint == mine.fingerprint and tonumber(e.lease_until or 0) < tonumber(ARGV[3]) then
  mine.job_ids = e.job_ids or ''
  redis.call('SET', KEYS[1], cjson.encode(mine), 'KEEPTTL')
  return {2, raw}
end
return {0, raw}
`;

// KEYS: entry   ARGV: token, lease_until, job id ('' = renew only)
const TOUCH = `
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local e = cjson.decode(raw)
if e.state ~= 'running' or e.token ~= ARGV[1] then return 0 end
e.lease_until = tonumber(ARGV[2])
if ARGV[3] ~= '' then
  if e.job_ids == nil or e.job_ids == '' then e.job_ids = ARGV[3] else e.job_ids = e.job_ids .. ',' .. ARGV[3] end
end
redis.call('SET', KEYS[1], cjson.encode(e), 'KEEPTTL')
return 1
`;

// KEYS: entry   ARGV: token
const DROP = `
local raw = redis.call('GET', KEYS[1])
if raw and cjson.decode(raw).token == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
`;

// KEYS: entry   ARGV: the entry as read, the claim to put in its place, ttl (s)
const SWAP = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[3]))
return 1
`;

type Scripted = Redis & {
  tgIdemSwap(keys: 1, ...args: Array<string | number>): Promise<number>;
  tgIdemClaim(keys: 1, ...args: Array<string | number>): Promise<[number, string]>;
  tgIdemTouch(keys: 1, ...args: Array<string | number>): Promise<number>;
  tgIdemDrop(keys: 1, ...args: string[]): Promise<number>;
};

/**
 * Idempotency-Key for POSTs that run tools. The first request with a key claims it; a retry with the
 * same key and body gets the first response again and runs nothing, a different body is 422, and a
 * retry while the first still runs is 409. Responses that say nothing happened (429 and 5xx without a
 * charge) free the key so the client can retry for real.
 *
 * A claim survives its owner. It records its job ids before they are queued and carries a lease the
 * live request renews; when the owner dies (an API crash) or its client leaves (chat, MCP), the next
 * retry takes the claim over and answers from the job: its result if it finished, a wait for it (or a
 * 202 with its status URL) if it still runs. Only a claim that never queued a job runs again.
 */
export class Idempotency {
  private readonly redis: Scripted;
  /**
   * Set by the container: a fresh claim of a key Redis may have forgotten (it lost its data in the
   * last day) asks the job intents whether the key was used, so a retry of a job that ran is answered
   * from it and a retry of a lost one runs, once.
   */
  durable: DurableClaims | null = null;

  constructor(
    redis: Redis,
    private readonly prefix: string,
    private readonly leaseMs = LEASE_MS,
    /**
     * Bounds what one entry keeps in Redis. An entry larger than `inlineBytes` keeps a reference to its
     * job (the response's `x-job-id`, else the one job it queued) when `recover` can read that job back
     * (REST, POST /, chat, MCP), else the whole body for `largeTtlSeconds` only (calls paid per call,
     * whose answers no key can read later), so answers cannot pile up in Redis for a day.
     */
    private readonly bounds: { inlineBytes: number; largeTtlSeconds: number } = { inlineBytes: Infinity, largeTtlSeconds: TTL_SECONDS },
  ) {
    const r: Redis = redis;
    if (!('tgIdemClaim' in r)) {
      r.defineCommand('tgIdemClaim', { lua: CLAIM });
      r.defineCommand('tgIdemTouch', { lua: TOUCH });
      r.defineCommand('tgIdemDrop', { lua: DROP });
      r.defineCommand('tgIdemSwap', { lua: SWAP });
    }
    this.redis = redis as Scripted;
  }

  static fingerprint(method: string, path: string, body: unknown): string {
    return createHash('sha256')
      .update(`${method} ${path}\n${JSON.stringify(body ?? null)}`)
      .digest('hex');
  }

  private key(scope: string, idemKey: string) {
    return `${this.prefix}:idem:${scope}:${createHash('sha256').update(idemKey).digest('hex')}`;
  }

  /**
   * Runs `exec` once per key. `recover`, when given, answers a retry from the jobs a dead owner
   * recorded (null: none of them exists); without it (calls paid per call, whose results no key can read) such a retry runs anew.
   */
  async run(
    scope: string,
    idemKey: string,
    fingerprint: string,
    exec: (track: TrackJob) => Promise<StoredResponse>,
    recover?: (jobIds: string[]) => Promise<StoredResponse | null>,
    /**
     * Errors after which the key is freed instead of keeping the error as its answer (an x402 payment
     * refused before anything ran: the client may sign a new one under the same payment identifier).
     */
    release?: (e: AppError) => boolean,
  ): Promise<StoredResponse & { replayed: boolean }> {
    if (!KEY_RE.test(idemKey)) throw new AppError('invalid_input', 'Idempotency-Key must be 1 to 255 printable ASCII characters');
    const key = this.key(scope, idemKey);
    const token = randomUUID();
    const claim: Entry = { state: 'running', fingerprint, token, lease_until: Date.now() + this.leaseMs, job_ids: '' };
    const [status, raw] = await this.redis.tgIdemClaim(1, key, JSON.stringify(claim), TTL_SECONDS, Date.now());
    // The jobs this request queued, also kept here: a large answer of exactly one job is stored by reference.
    const tracked: string[] = [];
    const track: TrackJob = (jobId) => {
      tracked.push(jobId);
      return this.touch(key, token, jobId);
    };
    let produce = () => exec(track);
    let replayed = false;
    const idem = idempotencyDigest(scope, idemKey);
    const held = status === 0 ? (JSON.parse(raw) as Entry) : null;
    if (held && (await this.stale202(key, raw, held, claim, idem))) {
      // The first request answered 202 for a job the queue has since lost: this retry took the key
      // over (compare-and-set, so of two racing retries one runs) and runs for real.
    } else if (held) {
      if (held.fingerprint !== fingerprint) throw reusedKey();
      if (held.state === 'running' || !held.response) {
        throw inProgress();
      }
      if ('ref' in held.response) {
        const { ref, ...kept } = held.response;
        const answer = recover ? await recover([ref]) : null;
        if (!answer || answer.status !== kept.status)
          throw new AppError('not_found', `The answer of this request (job ${ref}) is no longer stored`, { job_id: ref });
        return { ...kept, body: answer.body, replayed: true };
      }
      return { ...held.response, replayed: true };
    }
    // The jobs an earlier request with this key queued are the answer, never a second run. `recover`
    // answers null when none of them exists (nothing ran), throws job_lost for lost ones (they will
    // never run) and throws the job's own failure when it failed: a failure the key would not have kept
    // (a 5xx or 429 with nothing charged, such as 503 after its settlement could not reach Postgres)
    // frees the key as it would have on the first request. Then this request runs for real.
    const fromJobs = (jobIds: string[]) => async () => {
      let answer: StoredResponse | null;
      try {
        answer = await recover!(jobIds);
      } catch (e) {
        if (e instanceof AppError && (e.code === 'job_lost' || (typeof e.details.job_id === 'string' && !keptFailure(e)))) return exec(track);
        throw e;
      }
      if (!answer) return exec(track);
      replayed = true;
      return answer;
    };
    if (status === 2) {
      // The first owner queued work before it died.
      const jobIds = ((JSON.parse(raw) as Entry).job_ids ?? '').split(',').filter(Boolean);
      if (jobIds.length && recover) produce = fromJobs(jobIds);
    } else if (recover && this.durable?.mayHaveLost()) {
      // A fresh claim, but Redis lost its data lately: the key may have been used before that.
      let prior: DurableClaim | null;
      try {
        prior = await this.durable.byIdempotencyKey(idem);
        if (prior && !prior.lost && prior.fingerprint !== fingerprint) throw reusedKey();
      } catch (e) {
        await this.redis.tgIdemDrop(1, key, token).catch(() => {});
        throw asDependencyError(e);
      }
      if (prior && !prior.lost) produce = fromJobs(prior.jobIds);
    }

    const renew = setInterval(() => void this.touch(key, token).catch(() => {}), Math.max(50, Math.floor(this.leaseMs / 3)));
    renew.unref();
    let response: StoredResponse;
    try {
      // Admission records the key with the request's job intents (src/calls/admission.ts).
      response = await current.run({ idem, fingerprint }, produce);
    } catch (e) {
      clearInterval(renew);
      if (e instanceof ClientGone || (e instanceof AppError && e.code === 'idempotency_in_progress')) {
        // Keep the claim and its jobs, abandoned at once: the retry answers from the job.
        await this.redis.tgIdemTouch(1, key, token, 0, '');
        throw e;
      }
      if (e instanceof AppError && keptFailure(e) && !release?.(e)) {
        const stored: StoredResponse = { status: e.status, headers: e.headers, body: { error: { code: e.code, message: e.message, ...e.details } } };
        await this.store(key, fingerprint, stored);
      } else {
        await this.redis.tgIdemDrop(1, key, token);
      }
      throw e;
    }
    clearInterval(renew);
    if (response.status >= 500 || response.status === 429) await this.redis.tgIdemDrop(1, key, token);
    else {
      // Serialised once: its length decides how the entry is kept, and a small one is written as it is.
      const whole = JSON.stringify({ state: 'done', fingerprint, response } satisfies Entry);
      const large = Buffer.byteLength(whole) > this.bounds.inlineBytes;
      // A large success is its job's stored answer: the entry names the job (the response's own, else its
      // only one) and a replay reads the body back through `recover`, as a retry after a crash would.
      const ref =
        (large || response.byReference) && recover && response.status < 300
          ? (response.headers['x-job-id'] ?? (tracked.length === 1 ? tracked[0] : undefined))
          : undefined;
      if (ref) await this.store(key, fingerprint, { status: response.status, headers: response.headers, body: null, ref });
      // A sensitive answer that cannot be kept by reference is not kept: a retry runs again.
      else if (response.byReference && response.status < 300) await this.redis.tgIdemDrop(1, key, token);
      else await this.redis.set(key, whole, 'EX', large ? Math.min(this.bounds.largeTtlSeconds, TTL_SECONDS) : TTL_SECONDS);
    }
    return { ...response, replayed };
  }

  /**
   * Whether `raw` (parsed: `entry`) is a 202 answer (its job still to come) whose job the intents say was lost, and this
   * request swapped its own claim in for it. A 202 stored for a job lost afterwards would otherwise be
   * replayed for a day, each replay pointing at a job that answers 410 job_lost and asks for exactly
   * this retry. Asked on every replay of a 202, not only after Redis lost data: a job is also lost when
   * the API dies between its intent and the queue, and a retry that found its intent still young
   * stored the 202 (one indexed Postgres read per replayed 202).
   */
  private async stale202(key: string, raw: string, entry: Entry, claim: Entry, idem: Buffer): Promise<boolean> {
    if (!this.durable) return false;
    const response = entry.response;
    if (!response || 'ref' in response || response.status !== 202 || entry.fingerprint !== claim.fingerprint) return false;
    const jobId = response.headers['x-job-id'] ?? (response.body as { job_id?: unknown } | null)?.job_id;
    if (typeof jobId !== 'string') return false;
    const prior = await this.durable.byIdempotencyKey(idem).catch((e: Error) => {
      throw asDependencyError(e);
    });
    if (!prior?.lost || !prior.jobIds.includes(jobId)) return false;
    if ((await this.redis.tgIdemSwap(1, key, raw, JSON.stringify(claim), TTL_SECONDS)) === 1) return true;
    throw inProgress();
  }

  private async touch(key: string, token: string, jobId = ''): Promise<void> {
    await this.redis.tgIdemTouch(1, key, token, Date.now() + this.leaseMs, jobId);
  }

  private async store(key: string, fingerprint: string, response: StoredResponse | StoredReference): Promise<void> {
    await this.redis.set(key, JSON.stringify({ state: 'done', fingerprint, response } satisfies Entry), 'EX', TTL_SECONDS);
  }
}
