/**
 * Where keys live in a Redis Cluster. A script or MULTI may only touch keys of one hash slot, and
 * Redis hashes only the part of a key inside its first `{...}` (the hash tag) when there is one. So
 * every key that a script or transaction touches together carries the same tag, chosen for spread:
 *
 * - **Per-account state** (`avail`, holds, the settle and top-up counters, sub-keys' month use, jobs in
 *   flight, rate-limit windows, passports) is tagged by the account's shard: `{a<0..1023>}`, a hash of
 *   the account id (or, for a call paid per call, of its payer). One account's keys share a slot, so
 *   one script can reserve credit and count its sub-key's month at once; accounts spread over 1,024
 *   tags, which a cluster spreads over its primaries. The registries the reconciler walks (accounts
 *   with money state, owners with jobs in flight) are one set per shard, in the shard's own slot, so
 *   the script that creates an account's state lists it in the same step.
 * - **Queues** (BullMQ) use the prefix `{<REDIS_PREFIX>}`: BullMQ's own scripts touch several keys of a
 *   queue, and a flow (a chain or parallel request) writes to the queues of several families in one
 *   script, so every queue shares one tag, hence one slot and one primary. The workers' heartbeats sit
 *   under the same tag. What that costs is in the README's scale section.
 * - **Single-key state** (idempotency entries, job records, event logs, cancel markers, auth-failure
 *   counters, sign-up counters, the reconciler's lock) needs no tag: it spreads by its own name.
 *
 * On a single Redis the tags change nothing but the names.
 */

/** How many tags per-account state is spread over. Fixed: changing it moves every account's keys. */
export const ACCOUNT_SHARDS = 1024;

/** FNV-1a (32-bit) of the id, modulo ACCOUNT_SHARDS: stable across processes and releases. */
export function shardOf(id: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < id.length; i++) {
    h ^= id.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return (h >>> 0) % ACCOUNT_SHARDS;
}

/** The hash tag of an account's (or payer's) state: `{a<shard>}`. */
export function accountTag(owner: string): string {
  return `{a${shardOf(owner)}}`;
}

/** The hash tag of shard `n` (for walking the per-shard registries). */
export function shardTag(n: number): string {
  return `{a${n}}`;
}

/** BullMQ's prefix for every queue of a deployment: one hash tag, as flows across queues need. */
export function queuePrefix(prefix: string): string {
  return `{${prefix}}`;
}
