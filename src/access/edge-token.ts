import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { ConfigError, type Config } from '../config.js';
import { AppError } from '../errors.js';
import { isProduction } from '../config.js';

/**
 * The caller's edge-network token travels to the worker inside BullMQ job data, which lives in Redis.
 * It is sealed there with AES-256-GCM under EDGE_TOKEN_KEY, so Redis only ever holds ciphertext; so is
 * each account's webhook secret in Postgres (src/calls/webhooks.ts).
 *
 * The key must outlive the process: the entry points (src/bootstrap.ts `sealingKeysOrDie`) refuse to
 * start production without it and elsewhere fill it from the data dir, generated once. Only a
 * container built without them (tests, NODE_ENV=test) gets a random key of its own process; in
 * production that is refused here too.
 */
export class EdgeTokenSealer {
  private readonly key: Buffer;

  constructor(config: Config) {
    if (config.EDGE_TOKEN_KEY) {
      const raw = /^[0-9a-fA-F]{64}$/.test(config.EDGE_TOKEN_KEY) ? Buffer.from(config.EDGE_TOKEN_KEY, 'hex') : Buffer.from(config.EDGE_TOKEN_KEY, 'base64');
      if (raw.length !== 32) throw new ConfigError('EDGE_TOKEN_KEY must be 32 bytes, as 64 hex characters or base64');
      this.key = raw;
    } else if (isProduction()) {
      throw new ConfigError(
        'EDGE_TOKEN_KEY is required in production: webhook secrets and edge tokens sealed under a random key of one process open in no other (`openssl rand -hex 32`)',
      );
    } else {
      this.key = randomBytes(32);
    }
  }

  seal(token: string): string {
    const iv = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', this.key, iv);
    const body = Buffer.concat([cipher.update(token, 'utf8'), cipher.final()]);
    return ['v1', iv.toString('base64'), cipher.getAuthTag().toString('base64'), body.toString('base64')].join('.');
  }

  open(sealed: string): string {
    const [v, iv, tag, body] = sealed.split('.');
    if (v !== 'v1' || !iv || !tag || !body) throw new Error('sealed edge token has an unknown format');
    const decipher = createDecipheriv('aes-256-gcm', this.key, Buffer.from(iv, 'base64'));
    decipher.setAuthTag(Buffer.from(tag, 'base64'));
    return Buffer.concat([decipher.update(Buffer.from(body, 'base64')), decipher.final()]).toString('utf8');
  }
}

/** Replaces every occurrence of the token in a text (error messages from upstream libraries). */
export function redactToken(text: string, token: string | undefined): string {
  if (!token || token.length < 4) return text;
  return text.split(token).join('[redacted]');
}

/**
 * An edge token goes into an Authorization header towards the edge network, where only visible ASCII
 * is safe: CR/LF would be a header injection and anything outside Latin-1 cannot be sent at all (a 502
 * instead of the caller's mistake). Checked where a token enters, before anything is queued; the
 * message never repeats the token, since it is a secret.
 */
export function assertEdgeToken(token: string | undefined): void {
  if (token === undefined || /^[\x21-\x7e]+$/.test(token)) return;
  throw new AppError(
    'invalid_input',
    'The Cloudflare API token (X-Edge-Token header or edge_token field) may contain only visible ASCII characters ' +
      '(no spaces, line breaks or accented letters); check that it was copied whole and nothing else',
    { issues: [{ path: ['X-Edge-Token'], message: 'only visible ASCII characters (0x21-0x7E) are allowed' }] },
  );
}
