import { AppError } from '../errors.js';
import type { KeyCaller } from '../services/auth.js';
import type { KeyType } from '../services/keys.js';

/**
 * Keys that may be rotated through POST /keys/{key_id}/rotate: the account's own keys. A sub-key is
 * replaced through /subkeys (create a new one, delete the old), where its limit and tools are set.
 */
export const ROTATABLE_TYPES: readonly KeyType[] = ['production', 'agent', 'vip', 'test'];

/**
 * Only the account's own full keys list and rotate keys. A sub-key is a delegated, limited key and a
 * sandbox key is for trying things out: neither may see or replace the account's other keys.
 */
export function requireKeyManager(caller: KeyCaller): void {
  if (caller.keyType === 'sub') throw new AppError('forbidden', 'A sub-key cannot list or rotate keys; use a production key');
  if (caller.keyType === 'test') throw new AppError('forbidden', 'Sandbox keys cannot list or rotate keys; use a production key');
}
