import { createHash, randomUUID } from 'node:crypto';
import type { Redis } from '../queue/redis.js';
import { AppError } from '../errors.js';

export interface StoredResponse {
  status: number;
  headers: Record<string, string>;
  body: unknown;
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

type Scripted = Redis & {
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
    if (status === 0) {
      const entry = JSON.parse(raw) as Entry;
      if (entry.fingerprint !== fingerprint) {
        throw new AppError('idempotency_key_reused', 'This Idempotency-Key was used with a different request body; use a new key for a new request');
      }
      if (entry.state === 'running' || !entry.response) {
        throw new AppError(
          'idempotency_in_progress',
          'A request with this Idempotency-Key is still running; retry shortly',
          { retry_after: 1 },
          { headers: { 'retry-after': '1' } },
        );
      }
      if ('ref' in entry.response) {
        const { ref, ...kept } = entry.response;
        const answer = recover ? await recover([ref]) : null;
        if (!answer || answer.status !== kept.status)
          throw new AppError('not_found', `The answer of this request (job ${ref}) is no longer stored`, { job_id: ref });
        return { ...kept, body: answer.body, replayed: true };
      }
      return { ...entry.response, replayed: true };
    }
    if (status === 2) {
      const jobIds = ((JSON.parse(raw) as Entry).job_ids ?? '').split(',').filter(Boolean);
      // The first owner queued work before it died: that work is the answer, never a second run.
      // (`recover` answers null when no job of them exists: nothing ran, so this retry runs for real.)
      if (jobIds.length && recover) {
        produce = async () => {
          const answer = await recover(jobIds);
          if (!answer) return exec(track);
          replayed = true;
          return answer;
        };
      }
    }

    const renew = setInterval(() => void this.touch(key, token).catch(() => {}), Math.max(50, Math.floor(this.leaseMs / 3)));
    renew.unref();
    let response: StoredResponse;
    try {
      response = await produce();
    } catch (e) {
      clearInterval(renew);
      if (e instanceof ClientGone || (e instanceof AppError && e.code === 'idempotency_in_progress')) {
        // Keep the claim and its jobs, abandoned at once: the retry answers from the job.
        await this.redis.tgIdemTouch(1, key, token, 0, '');
        throw e;
      }
      // An error after which something was charged (a chain failing at a later step) is kept even
      // when it is a 5xx: retrying would run and charge the completed steps again.
      const charged = e instanceof AppError && Number(e.details.cost_cents ?? 0) > 0;
      if (e instanceof AppError && ((e.status !== 429 && e.status < 500) || charged) && !release?.(e)) {
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
      const ref = large && recover && response.status < 300 ? (response.headers['x-job-id'] ?? (tracked.length === 1 ? tracked[0] : undefined)) : undefined;
      if (ref) await this.store(key, fingerprint, { status: response.status, headers: response.headers, body: null, ref });
      else await this.redis.set(key, whole, 'EX', large ? Math.min(this.bounds.largeTtlSeconds, TTL_SECONDS) : TTL_SECONDS);
    }
    return { ...response, replayed };
  }

  private async touch(key: string, token: string, jobId = ''): Promise<void> {
    await this.redis.tgIdemTouch(1, key, token, Date.now() + this.leaseMs, jobId);
  }

  private async store(key: string, fingerprint: string, response: StoredResponse | StoredReference): Promise<void> {
    await this.redis.set(key, JSON.stringify({ state: 'done', fingerprint, response } satisfies Entry), 'EX', TTL_SECONDS);
  }
}
