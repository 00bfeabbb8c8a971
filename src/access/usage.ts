import type { KeyCaller } from './auth.js';
import type { UsageScope } from './accounts.js';

/**
 * What GET /usage and GET /usage/entries may show a caller. Production, agent and VIP keys see the
 * whole account. A sub-key sees only its own lines, as it sees only its own use in GET /balance. A
 * sandbox key too sees only its own lines: its calls are free and write no ledger line, so that is
 * an empty month, and it never shows the account's real spending to a key meant for trying things.
 */
export function usageScope(caller: KeyCaller): UsageScope {
  const ownOnly = caller.keyType === 'sub' || caller.keyType === 'test';
  return { accountId: caller.accountId, keyId: ownOnly ? caller.keyId : null };
}
