import { randomUUID } from 'node:crypto';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { createRequire } from 'node:module';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../../src/config.js';
import { CreditReservations } from '../../../src/money/holds.js';
import { InFlightSlots } from '../../../src/access/in-flight.js';
import { PassportService } from '../../../src/access/passports.js';
import { PendingDeliveries } from '../../../src/calls/webhooks.js';
import { RateLimiter } from '../../../src/access/rate-limit.js';
import { familyKey, seenKey } from '../../../src/queue/heartbeat.js';
import { queuePrefix, shardOf, ACCOUNT_SHARDS } from '../../../src/queue/keyspace.js';
import { FAMILIES } from '../../../src/config.js';
import type { AccountsRepo } from '../../../src/access/accounts.js';

/**
 * Every Lua script, MULTI and pipeline in src/ touches keys of one Redis Cluster slot, computed with
 * the cluster's own CRC16 key-slot function (the `cluster-key-slot` package ioredis routes with).
 * The inventory below lists each one with the keys its call site passes; a source scan fails the
 * test when src/ gains a script, MULTI or pipeline that is not listed, so none slips in unchecked.
 */
const keySlot = createRequire(import.meta.url)('cluster-key-slot') as (key: string) => number;

const prefix = 'tollgate';
const config = loadConfig({}, { REDIS_PREFIX: prefix });
// Never connects: the classes only define their scripts on it and build key names.
const redis = new Redis({ lazyConnect: true });
afterAll(() => redis.disconnect());
const credits = new CreditReservations(redis, prefix, {} as AccountsRepo);
const slots = new InFlightSlots(redis, config, async () => new Set());
const passports = new PassportService({ redis, config });
const limiter = new RateLimiter(redis, config);
const pendingDeliveries = new PendingDeliveries({ redis, config, live: async () => [] });

interface Sample {
  account: string;
  keyId: string;
  payer: string;
}

type Kind = 'script' | 'multi' | 'pipeline' | 'eval';

interface Entry {
  file: string;
  kind: Kind;
  /** The script's defined name, or what the MULTI / pipeline is for. */
  name: string;
  keys: (s: Sample) => string[];
}

/** Keys of one account's passport namespace, as the service forms them (`${ns}:<suffix>`). */
const ns = (s: Sample, sandbox = false) => passports.namespace({ accountId: s.account, sandbox });
const pp = (s: Sample, ...suffixes: string[]) => [false, true].flatMap((sandbox) => suffixes.map((x) => `${ns(s, sandbox)}:${x}`));

const INVENTORY: Entry[] = [
  // Admission: the rate-limit hit, the holds and the owner's slots in flight, in one script.
  {
    file: 'src/money/holds.ts',
    kind: 'script',
    name: 'tgReserve',
    keys: (s) => [...credits.scriptKeys(s.account, s.keyId).tgReserve, ...slots.claim(s.account, 5, ['j']).keys, limiter.key(s.account)],
  },
  {
    file: 'src/money/holds.ts',
    kind: 'script',
    name: 'tgReserve (no sub-key, no hit)',
    keys: (s) => [...credits.scriptKeys(s.account, null).tgReserve, ...slots.claim(s.account, 5, ['j']).keys, credits.noRateKey(s.account)],
  },
  ...(['tgRelease', 'tgSettled', 'tgTopup', 'tgLoad', 'tgLoadSubuse', 'tgHoldSnapshot', 'tgHoldRebuild'] as const).flatMap((name) => [
    { file: 'src/money/holds.ts', kind: 'script' as const, name, keys: (s: Sample) => credits.scriptKeys(s.account, s.keyId)[name] },
    { file: 'src/money/holds.ts', kind: 'script' as const, name: `${name} (no sub-key)`, keys: (s: Sample) => credits.scriptKeys(s.account, null)[name] },
  ]),
  // The background passes' locks (money, intent and x402 payment reconcilers): one key each.
  ...(['tgLeaderUnlock', 'tgLeaderExtend'] as const).map((name) => ({
    file: 'src/queue/leader.ts',
    kind: 'script' as const,
    name,
    keys: () => [`${prefix}:reconcile:lock`],
  })),
  { file: 'src/access/in-flight.ts', kind: 'script', name: 'tgTakeSlots', keys: (s) => slots.scriptKeys(s.account).tgTakeSlots },
  { file: 'src/access/in-flight.ts', kind: 'script', name: 'tgTakeSlots (payer)', keys: (s) => slots.scriptKeys(`payer:${s.payer}`).tgTakeSlots },
  { file: 'src/access/in-flight.ts', kind: 'script', name: 'tgUnlistOwner', keys: (s) => slots.scriptKeys(s.account).tgUnlistOwner },
  { file: 'src/access/rate-limit.ts', kind: 'script', name: 'tgSlide', keys: (s) => [limiter.key(s.account)] },
  // One counter per client address.
  { file: 'src/access/auth.ts', kind: 'script', name: 'tgAuthFail', keys: () => [`${prefix}:authfail:127.0.0.1`] },
  { file: 'src/access/auth.ts', kind: 'script', name: 'tgAuthBlocked', keys: () => [`${prefix}:authfail:127.0.0.1`] },
  // One entry per idempotency key.
  { file: 'src/calls/idempotency.ts', kind: 'script', name: 'tgIdemClaim', keys: (s) => [`${prefix}:idem:${s.keyId}:${s.payer}`] },
  { file: 'src/calls/idempotency.ts', kind: 'script', name: 'tgIdemTouch', keys: (s) => [`${prefix}:idem:${s.keyId}:${s.payer}`] },
  { file: 'src/calls/idempotency.ts', kind: 'script', name: 'tgIdemDrop', keys: (s) => [`${prefix}:idem:${s.keyId}:${s.payer}`] },
  // A stored 202 of a lost job swapped for a retry's claim: the same one key.
  { file: 'src/calls/idempotency.ts', kind: 'script', name: 'tgIdemSwap', keys: (s) => [`${prefix}:idem:${s.keyId}:${s.payer}`] },
  // A tool's per-key lock (cvi_loop's rounds), freed by its holder only: one key.
  { file: 'src/queue/tool-store.ts', kind: 'eval', name: 'free a tool lock', keys: (s) => [`${prefix}:store:${s.account}:cvi_loop:loop-1:lock`] },
  {
    file: 'src/access/passports.ts',
    kind: 'script',
    name: 'tgPassportAdd',
    keys: (s) => pp(s, 'idx', `p:pp_${s.payer}`, `inbox:${s.keyId}`, `d:dl_${s.payer}`),
  },
  {
    file: 'src/access/passports.ts',
    kind: 'script',
    name: 'tgPassportMerge',
    keys: (s) => pp(s, `inbox:${s.keyId}`, `inbox:${randomUUID()}`, `inbox:${randomUUID()}`),
  },
  { file: 'src/access/passports.ts', kind: 'multi', name: 'page of a namespace set', keys: (s) => pp(s, 'idx', `inbox:${s.keyId}`) },
  { file: 'src/access/passports.ts', kind: 'multi', name: 'delete a passport', keys: (s) => pp(s, `p:pp_${s.payer}`, 'idx') },
  { file: 'src/access/passports.ts', kind: 'pipeline', name: 'list metadata', keys: (s) => pp(s, `p:pp_${s.payer}`, `p:pp_${s.keyId}`) },
  {
    file: 'src/access/passports.ts',
    kind: 'pipeline',
    name: "a sub-key's own list: every passport's metadata",
    keys: (s) => pp(s, `p:pp_${s.payer}`, `p:pp_${s.keyId}`),
  },
  { file: 'src/access/passports.ts', kind: 'pipeline', name: 'drop gone members', keys: (s) => pp(s, `p:pp_${s.payer}`, `d:dl_${s.keyId}`) },
  { file: 'src/access/passports.ts', kind: 'pipeline', name: 'inbox metadata', keys: (s) => pp(s, `p:pp_${s.payer}`, `p:none`) },
  { file: 'src/queue/job-events.ts', kind: 'script', name: 'tgEventAppend', keys: (s) => [`${prefix}:events:${s.payer}`] },
  { file: 'src/queue/heartbeat.ts', kind: 'script', name: 'tgWorkerBeat', keys: () => [seenKey(prefix), ...FAMILIES.map((f) => familyKey(prefix, f))] },
  { file: 'src/queue/heartbeat.ts', kind: 'script', name: 'tgWorkerCount', keys: () => [seenKey(prefix), ...FAMILIES.map((f) => familyKey(prefix, f))] },
  { file: 'src/queue/heartbeat.ts', kind: 'pipeline', name: 'leave the families', keys: () => FAMILIES.map((f) => familyKey(prefix, f)) },
  // Job hashes of the queues, all under the queues' one tag.
  { file: 'src/queue/queues.ts', kind: 'pipeline', name: 'job timestamps', keys: (s) => FAMILIES.map((f) => `${queuePrefix(prefix)}:${f}:${f}-${s.payer}`) },
  { file: 'src/faces/http/browser-pages.ts', kind: 'eval', name: 'requests per address', keys: () => [`${prefix}:signup:127.0.0.1`] },
  // An account's outstanding webhook deliveries: one sorted set (take a place, bind it to its job).
  { file: 'src/calls/webhooks.ts', kind: 'eval', name: 'take a pending-delivery place', keys: (s) => [pendingDeliveries.key(s.account)] },
  { file: 'src/calls/webhooks.ts', kind: 'eval', name: 'bind a place to its job', keys: (s) => [pendingDeliveries.key(s.account)] },
  // Repair: the tool job hash of each place (its delivery is an outbox row in Postgres), all under the queues' one tag.
  {
    file: 'src/calls/webhooks.ts',
    kind: 'pipeline',
    name: 'liveness of pending deliveries',
    keys: (s) => [`${queuePrefix(prefix)}:tools-core:core-${s.payer}`, `${queuePrefix(prefix)}:none`],
  },
];

const samples: Sample[] = Array.from({ length: 300 }, () => ({ account: randomUUID(), keyId: randomUUID(), payer: `0x${randomUUID().replace(/-/g, '')}` }));

describe('cluster slots: every script, MULTI and pipeline stays in one slot', () => {
  for (const e of INVENTORY) {
    it(`${e.file} ${e.kind} ${e.name}`, () => {
      for (const s of samples) {
        const keys = e.keys(s);
        expect(keys.length).toBeGreaterThan(0);
        const slotsOf = new Set(keys.map(keySlot));
        if (slotsOf.size !== 1) throw new Error(`${e.name}: keys span slots ${[...slotsOf].join(', ')}: ${keys.join(' ')}`);
      }
    });
  }

  it('per-account state spreads: 300 accounts land on many tags and slots', () => {
    const tags = new Set(samples.map((s) => shardOf(s.account)));
    const slotSet = new Set(samples.map((s) => keySlot(credits.availKey(s.account))));
    // 300 random accounts over 1,024 tags fill about 260 of them (standard deviation about 5): 250 failed
    // about one run in 30. Clustering (a bad hash, every account on a few tags) would give far fewer.
    expect(tags.size).toBeGreaterThan(220);
    expect(slotSet.size).toBeGreaterThan(220);
    expect(Math.max(...tags)).toBeLessThan(ACCOUNT_SHARDS);
  });

  it('an account, its sub-keys, its jobs in flight and its rate-limit window share one slot', () => {
    for (const s of samples) {
      const slot = keySlot(credits.availKey(s.account));
      expect(keySlot(credits.subuseKey(s.account, s.keyId))).toBe(slot);
      expect(keySlot(slots.scriptKeys(s.account).tgTakeSlots[0]!)).toBe(slot);
      expect(keySlot(limiter.key(s.account))).toBe(slot);
      expect(keySlot(`${ns(s)}:idx`)).toBe(slot);
    }
  });

  it('every queue of a deployment shares one slot (flows write to several in one script)', () => {
    const queueSlots = new Set(
      FAMILIES.flatMap((f) => [`${queuePrefix(prefix)}:${f}:wait`, `${queuePrefix(prefix)}:${f}:meta`, `${queuePrefix(prefix)}:${f}:123`]).map(keySlot),
    );
    expect(queueSlots.size).toBe(1);
  });

  it('the inventory lists every script, MULTI, pipeline and EVAL in src/', () => {
    const root = join(import.meta.dirname, '../../..');
    const files: string[] = [];
    const walk = (dir: string) => {
      for (const name of readdirSync(dir)) {
        const p = join(dir, name);
        if (statSync(p).isDirectory()) walk(p);
        else if (p.endsWith('.ts')) files.push(p);
      }
    };
    walk(join(root, 'src'));
    const found: string[] = [];
    for (const p of files) {
      const file = relative(root, p);
      const code = readFileSync(p, 'utf8');
      for (const m of code.matchAll(/defineCommand\('(\w+)'/g)) found.push(`${file} script ${m[1]}`);
      for (const kind of ['multi', 'pipeline', 'eval'] as const) {
        const n = [...code.matchAll(new RegExp(`\\.${kind}\\(`, 'g'))].length;
        for (let i = 0; i < n; i++) found.push(`${file} ${kind} #${i + 1}`);
      }
    }
    const listed: string[] = [];
    const count = new Map<string, number>();
    for (const e of INVENTORY) {
      if (e.kind === 'script') {
        if (!e.name.includes(' ')) listed.push(`${e.file} script ${e.name}`);
      } else {
        const k = `${e.file} ${e.kind}`;
        count.set(k, (count.get(k) ?? 0) + 1);
        listed.push(`${k} #${count.get(k)}`);
      }
    }
    expect(listed.sort()).toEqual(found.sort());
  });
});
