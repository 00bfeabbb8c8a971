import { createHash } from 'node:crypto';
import type { Redis } from 'ioredis';
import { AppError } from '../errors.js';

export interface StoredResponse {
  status: number;
  headers: Record<string, string>;
  body: unknown;
}

interface Entry {
  state: 'running' | 'done';
  fingerprint: string;
  response?: StoredResponse;
}

const TTL_SECONDS = 24 * 3600;
const KEY_RE = /^[\x21-\x7e]{1,255}$/;

/**
 * Idempotency-Key for POSTs that run tools. The first request with a key claims it atomically
 * (SET NX); a retry with the same key and body gets the first response again and runs nothing, a
 * different body is 422, and a retry while the first still runs is 409. Responses that say nothing
 * happened (429 and 5xx without a charge) release the key so the client can retry for real.
 */
export class Idempotency {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
  ) {}

  static fingerprint(method: string, path: string, body: unknown): string {
    return createHash('sha256').update(`${method} ${path}\n${JSON.stringify(body ?? null)}`).digest('hex');
  }

  private key(scope: string, idemKey: string) {
    return `${this.prefix}:idem:${scope}:${createHash('sha256').update(idemKey).digest('hex')}`;
  }

  async run(scope: string, idemKey: string, fingerprint: string, exec: () => Promise<StoredResponse>): Promise<StoredResponse & { replayed: boolean }> {
    if (!KEY_RE.test(idemKey)) throw new AppError('invalid_input', 'Idempotency-Key must be 1 to 255 printable ASCII characters');
    const key = this.key(scope, idemKey);
    const claim: Entry = { state: 'running', fingerprint };
    const won = await this.redis.set(key, JSON.stringify(claim), 'EX', TTL_SECONDS, 'NX');
    if (!won) {
      const raw = await this.redis.get(key);
      if (raw) {
        const entry = JSON.parse(raw) as Entry;
        if (entry.fingerprint !== fingerprint) {
          throw new AppError('idempotency_key_reused', 'This Idempotency-Key was used with a different request body; use a new key for a new request');
        }
        if (entry.state === 'running' || !entry.response) {
          throw new AppError('idempotency_in_progress', 'A request with this Idempotency-Key is still running; retry shortly', { retry_after: 1 }, { headers: { 'retry-after': '1' } });
        }
        return { ...entry.response, replayed: true };
      }
      // The key expired between the two commands: treat this as a first request.
      return this.run(scope, idemKey, fingerprint, exec);
    }
    let response: StoredResponse;
    try {
      response = await exec();
    } catch (e) {
      // An error after which something was charged (a chain failing at a later step) is kept even
      // when it is a 5xx: retrying would run and charge the completed steps again.
      const charged = e instanceof AppError && Number(e.details.cost_cents ?? 0) > 0;
      if (e instanceof AppError && ((e.status !== 429 && e.status < 500) || charged)) {
        const stored: StoredResponse = { status: e.status, headers: e.headers, body: { error: { code: e.code, message: e.message, ...e.details } } };
        await this.redis.set(key, JSON.stringify({ state: 'done', fingerprint, response: stored } satisfies Entry), 'EX', TTL_SECONDS);
      } else {
        await this.redis.del(key);
      }
      throw e;
    }
    if (response.status >= 500 || response.status === 429) await this.redis.del(key);
    else await this.redis.set(key, JSON.stringify({ state: 'done', fingerprint, response } satisfies Entry), 'EX', TTL_SECONDS);
    return { ...response, replayed: false };
  }
}
