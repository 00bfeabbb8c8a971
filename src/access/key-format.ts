import { createHash, randomBytes } from 'node:crypto';
import { AppError } from '../errors.js';

/** Key types and their prefixes. Longest prefixes first so `cv_sub_` is not read as `cv_`. */
export const KEY_PREFIXES = [
  ['titan_vip_', 'vip'],
  ['cv_agent_', 'agent'],
  ['cv_test_', 'test'],
  ['cv_sub_', 'sub'],
  // OAuth access tokens (src/access/oauth.ts): each authenticates as its grant, a delegated key.
  ['cv_oat_', 'grant'],
  ['cv_', 'production'],
] as const;

export type KeyType = (typeof KEY_PREFIXES)[number][1];
export const KEY_TYPES = ['production', 'sub', 'test', 'agent', 'vip', 'grant'] as const satisfies readonly KeyType[];

const BASE62 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
const SECRET_LENGTH = 40;
const SECRET_RE = /^[A-Za-z0-9]{32,128}$/;

export function prefixFor(type: KeyType): string {
  return KEY_PREFIXES.find(([, t]) => t === type)![0];
}

/** Parses a key's shape without touching any store. Anything malformed is `invalid_api_key`. */
export function parseKey(key: string): { type: KeyType; hash: string } {
  for (const [prefix, type] of KEY_PREFIXES) {
    if (key.startsWith(prefix)) {
      if (!SECRET_RE.test(key.slice(prefix.length))) break;
      return { type, hash: hashKey(key) };
    }
  }
  throw new AppError(
    'invalid_api_key',
    'API key is malformed: expected a prefix (cv_, cv_sub_, cv_test_, cv_agent_, titan_vip_, or cv_oat_ for an OAuth access token) followed by at least 32 letters and digits',
  );
}

export function hashKey(key: string): string {
  return createHash('sha256').update(key).digest('hex');
}

/** `length` characters drawn uniformly from [A-Za-z0-9]. */
export function randomBase62(length: number): string {
  let out = '';
  while (out.length < length) {
    for (const b of randomBytes(length * 2)) {
      // 248 = 4 * 62: rejecting bytes above it keeps every character equally likely.
      if (b < 248 && out.length < length) out += BASE62[b % 62];
    }
  }
  return out;
}

export interface NewKey {
  key: string;
  hash: string;
  displayPrefix: string;
}

export function generateKey(type: KeyType): NewKey {
  const prefix = prefixFor(type);
  const key = prefix + randomBase62(SECRET_LENGTH);
  return { key, hash: hashKey(key), displayPrefix: key.slice(0, prefix.length + 6) };
}
