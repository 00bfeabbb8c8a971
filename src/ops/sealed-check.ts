import type { Logger } from 'pino';
import { openSealed, passportKey } from '../access/passports.js';
import type { Container } from '../container.js';
import { isCluster } from '../queue/redis.js';

/** How many sealed values of each kind are tried at start-up. */
const SAMPLE = 20;
/** SCAN rounds (COUNT 500 each) spent looking for passports, per Redis primary. */
const SCAN_ROUNDS = 10;
/** Each half of the check gives up after this long (a Redis or Postgres that went away since the start-up check). */
const CHECK_MS = 5_000;

function within<T>(p: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${CHECK_MS} ms`)), CHECK_MS);
    timer.unref();
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/**
 * Start-up check that this process's keys open what earlier ones sealed: the latest webhook secrets in
 * Postgres (EDGE_TOKEN_KEY) and a few passports found by a bounded SCAN of Redis (PASSPORT_KEY). A
 * key that does not open part of its sample (it changed, or an earlier start used a per-process random
 * one) is said in one warning line naming the variable and what stops working. Nothing is changed, and
 * a failure of the check itself (or no answer within CHECK_MS) is only logged at debug: it never stops a start.
 */
export async function warnUnopenableSealed(c: Pick<Container, 'config' | 'redis' | 'webhooks'>, log: Pick<Logger, 'warn' | 'debug'>): Promise<void> {
  try {
    const secrets = c.webhooks ? await within(c.webhooks.secrets.sample(SAMPLE)) : null;
    if (secrets && secrets.unopenable > 0) {
      log.warn(
        { variable: 'EDGE_TOKEN_KEY', sampled: secrets.sampled, unopenable: secrets.unopenable },
        `EDGE_TOKEN_KEY does not open ${secrets.unopenable} of the ${secrets.sampled} latest webhook secrets in Postgres (sealed under another key): ` +
          "those accounts' deliveries fail and GET /webhooks/secret answers 503 until EDGE_TOKEN_KEY is set back to the key they were sealed with, or each account rolls its secret (POST /webhooks/secret)",
      );
    }
  } catch (err) {
    log.debug({ err: (err as Error).message }, 'sealed webhook secrets check failed');
  }
  try {
    const passports = await within(samplePassports(c));
    if (passports.unopenable > 0) {
      log.warn(
        { variable: 'PASSPORT_KEY', sampled: passports.sampled, unopenable: passports.unopenable },
        `PASSPORT_KEY does not open ${passports.unopenable} of ${passports.sampled} passports sampled in Redis (sealed under another key): ` +
          'they read as not found until PASSPORT_KEY is set back to the key they were sealed with, or they expire',
      );
    }
  } catch (err) {
    log.debug({ err: (err as Error).message }, 'sealed passports check failed');
  }
}

/** Passport records are hashes at `<namespace>:p:<handle>` whose `meta` is sealed with `<namespace>|<handle>|meta` as additional data. */
async function samplePassports(c: Pick<Container, 'config' | 'redis'>): Promise<{ sampled: number; unopenable: number }> {
  const key = passportKey(c.config);
  const servers = isCluster(c.redis) ? c.redis.nodes('master') : [c.redis];
  const found: string[] = [];
  for (const server of servers) {
    let cursor = '0';
    for (let round = 0; round < SCAN_ROUNDS && found.length < SAMPLE; round++) {
      const [next, keys] = await server.scan(cursor, 'MATCH', `${c.config.REDIS_PREFIX}:pp:*:p:*`, 'COUNT', 500);
      found.push(...keys.slice(0, SAMPLE - found.length));
      cursor = next;
      if (cursor === '0') break;
    }
  }
  let sampled = 0;
  let unopenable = 0;
  for (const k of found) {
    const blob = await c.redis.hgetBuffer(k, 'meta');
    if (!blob) continue; // expired meanwhile
    sampled++;
    const at = k.lastIndexOf(':p:');
    if (!openSealed(key, blob, `${k.slice(0, at)}|${k.slice(at + 3)}|meta`)) unopenable++;
  }
  return { sampled, unopenable };
}
