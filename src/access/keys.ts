import { AppError } from '../errors.js';
import type { KeyCaller } from './auth.js';
import type { KeyType } from './key-format.js';

/**
 * Who may manage what. A leaked key is the case to design for: the owner rotates it, then revokes
 * it; meanwhile the leaked key must not be able to mint keys, widen sub-keys or roll secrets.
 *
 * - The account's current production key (`cv_`) is the only key that lists, rotates and revokes
 *   keys, manages sub-keys and reads or rolls the webhook secret.
 * - Agent, VIP, sandbox and sub-keys call tools and read their own jobs; they manage nothing.
 * - A rotated key in its grace period (`inGrace`) calls tools, reads and cancels its own jobs and
 *   reads the balance: everything else answers `403 key_in_grace`.
 */

/**
 * Keys that may be rotated through POST /keys/{key_id}/rotate: the account's own keys. A sub-key is
 * replaced through /subkeys (create a new one, delete the old), where its limit and tools are set.
 */
export const ROTATABLE_TYPES: readonly KeyType[] = ['production', 'agent', 'vip', 'test'];

const TYPE_NAMES: Record<KeyType, string> = {
  production: 'A production key',
  sub: 'A sub-key',
  test: 'A sandbox key',
  agent: 'An agent key',
  vip: 'A VIP key',
  grant: 'An OAuth grant',
};

/** 403 key_in_grace for a rotated key still in its grace period: it may only call tools and read its jobs. */
export function requireNotInGrace(caller: KeyCaller, action: string): void {
  if (!caller.inGrace) return;
  throw new AppError(
    'key_in_grace',
    `This key was rotated and is in its grace period: it may call tools and read its own jobs, but not ${action}. Use the key that replaced it`,
    { key_id: caller.keyId },
  );
}

/**
 * Only the account's current production key manages keys, sub-keys and the webhook secret (`action`
 * says which, for the message). A rotated production key in its grace period is refused too.
 */
export function requireKeyOwner(caller: KeyCaller, action: string): void {
  requireNotInGrace(caller, action);
  if (caller.keyType !== 'production') {
    throw new AppError('forbidden', `${TYPE_NAMES[caller.keyType]} cannot ${action}; use the account's production key (cv_)`, {
      key_type: caller.keyType,
    });
  }
}

/** Whether a job made with `jobKeyId` is this caller's: made with its key, or with a key it replaced. */
export function ownsJob(caller: Pick<KeyCaller, 'ownKeyIds'>, jobKeyId: string | null | undefined): boolean {
  return jobKeyId != null && caller.ownKeyIds.includes(jobKeyId);
}
