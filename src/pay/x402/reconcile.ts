import type { Logger } from 'pino';
import type { Config } from '../../config.js';
import type { CommonQueryMethods } from 'slonik';
import { sql, type DatabasePool } from '../../db/pool.js';
import type { Redis } from '../../queue/redis.js';
import { PeriodicPass, RedisLeader } from '../../queue/leader.js';
import { ATOMIC_UNITS_PER_CENT } from './requirements.js';
import {
  FACILITATOR_BAD_RESPONSE,
  FACILITATOR_UNREACHABLE,
  RPC_UNREACHABLE,
  SETTLEMENT_UNCONFIRMED,
  type PaymentSettler,
  type SettlementLookup,
} from './settle-types.js';
import {
  listStaleReserved,
  markAwaitingSettlement,
  markFailed,
  markSettled,
  recordPaidCall,
  recordSubmitted,
  releaseUnsettled,
  type StoredPayment,
} from './store.js';

/**
 * The payment reconciler (issue 31): completes or releases x402 payments a crash left `reserved`.
 *
 * A payment is `reserved` from its arrival until its call's outcome is recorded. A row still reserved
 * X402_RECONCILE_GRACE_SECONDS later (longer than any live request holds one) lost its API process
 * somewhere, and what happened is read from the row and the chain:
 *
 * - No settlement was started (`settling_at` empty: the call never finished, failed, or the process
 *   died before settling): released (failed, nothing charged). Settlement only ever starts after the
 *   answer was kept, so nothing can have moved. A job still running in a worker finishes there, and
 *   its result is dropped with it: the payer never received it and pays nothing.
 * - Settlement was started (the answer is kept with the row): the chain decides (the receipt of the
 *   recorded transaction, else the token's `authorizationState(payer, nonce)` and its
 *   `AuthorizationUsed` event):
 *   - transferred: marked settled (compare-and-set from reserved) with its ledger entry, in one
 *     transaction; a retry of the same request with the same payment is answered with the kept
 *     answer and the settlement's payment response headers;
 *   - not transferred and expired (the chain's time is past validBefore): released;
 *   - not transferred and still valid: **settled now**. The payer signed exactly this transfer for
 *     exactly this answer, the answer exists and is handed to a retry of the same payment, and a
 *     transfer sent before the crash may still be mined, so releasing it could charge a payment
 *     recorded as free. Settling closes that: the authorization moves money once at most (EIP-3009
 *     nonces are single-use), whichever submission lands;
 *   - the nonce is used but no transfer of it is found (the payer cancelled it, or it is older than
 *     the logs searched): left reserved with a note for an operator (`payments mark-settled` /
 *     `mark-failed`), and logged.
 * - Deferred settlement (nothing to look up): the call was answered or about to be; recorded as
 *   awaiting settlement, with its ledger entry, for the operator to collect.
 * - A facilitator without X402_RECONCILE_RPC_URL: x402 facilitators answer /verify, /settle and
 *   /supported only, nothing that looks a settlement up. The payment is submitted to /settle again:
 *   success settles it; a refusal cannot tell "already settled" from "cannot settle", so the row is
 *   left for an operator as above.
 *
 * One pass at a time across replicas (a Redis lock), and every change is a compare-and-set from
 * `reserved` against the API's own (markSettling, markSettled, markFailed), so no payment is settled
 * or recorded twice even when a pass and a live request meet.
 */

export type PaymentOutcome =
  /** Released: no settlement was ever started, or it can no longer happen. */
  | 'released'
  /** The transfer had happened; recorded now. */
  | 'settled'
  /** Submitted by the reconciler (the authorization was still valid). */
  | 'settled_now'
  | 'awaiting_settlement'
  /** Nothing decided yet (the chain or facilitator did not answer, or a transfer is pending): next pass. */
  | 'pending'
  /** Left for an operator (noted on the row, logged). */
  | 'operator'
  /** Someone else changed the row first (the API, another pass): nothing done here. */
  | 'raced';

export interface PaymentReconcileReport {
  /** False when another process held the lock. */
  ran: boolean;
  checked: number;
  outcomes: Partial<Record<PaymentOutcome, number>>;
}

export interface PaymentReconcilerDeps {
  config: Config;
  db: DatabasePool;
  settler: PaymentSettler;
  /** Where settlements are looked up: the settler's chain, or X402_RECONCILE_RPC_URL's; none for a bare facilitator. */
  lookup?: SettlementLookup;
  log: Pick<Logger, 'warn' | 'error'>;
}

/**
 * Where the reconciler looks settlements up: self-settlement's own chain client; for a facilitator,
 * the chain at X402_RECONCILE_RPC_URL when set (loaded only then: it brings viem's clients); none otherwise.
 */
export async function settlementLookup(config: Config, settler: PaymentSettler): Promise<SettlementLookup | undefined> {
  if (settler.lookup) return settler.lookup;
  if (settler.mode !== 'facilitator' || !config.X402_RECONCILE_RPC_URL) return undefined;
  const { ChainLookup } = await import('./chain-settler.js');
  return new ChainLookup(config, config.X402_RECONCILE_RPC_URL);
}

function isOurFault(reason: string | undefined): boolean {
  return reason === FACILITATOR_UNREACHABLE || reason === FACILITATOR_BAD_RESPONSE || reason === RPC_UNREACHABLE || reason === SETTLEMENT_UNCONFIRMED;
}

/** Decides one stale reserved payment (see the module comment). Throws when the chain cannot be read. */
export async function reconcilePayment(deps: PaymentReconcilerDeps, p: StoredPayment): Promise<PaymentOutcome> {
  if (!p.settling) {
    const done = await releaseUnsettled(deps.db, p.id, 'reconcile: released, the call never reached settlement (its API process stopped)');
    return done ? 'released' : 'raced';
  }
  if (deps.settler.mode === 'deferred') {
    return (await complete(deps, p, (tx) => markAwaitingSettlement(tx, p.id))) ? 'awaiting_settlement' : 'raced';
  }
  if (!deps.lookup) return settleNow(deps, p, false);
  const found = await deps.lookup.settlementOf(p.payment_payload, p.tx_hash);
  if (found.state === 'settled') return (await complete(deps, p, (tx) => markSettled(tx, p.id, found.transaction))) ? 'settled' : 'raced';
  if (found.state === 'used') {
    return leaveForOperator(deps, p, 'reconcile: the nonce is used on chain but no transfer of it was found (cancelled by the payer?); an operator decides');
  }
  if (found.expired) {
    const done = await markFailed(deps.db, p.id, 'reconcile: released, the authorization expired before it was settled');
    return done ? 'released' : 'raced';
  }
  return settleNow(deps, p, true);
}

/** Marks the row (compare-and-set) and writes a paid call's ledger entry, in one transaction. */
async function complete(deps: PaymentReconcilerDeps, p: StoredPayment, mark: (tx: CommonQueryMethods) => Promise<boolean>): Promise<boolean> {
  return deps.db.transaction(async (tx) => {
    if (!(await mark(tx))) return false;
    // A top-up names its account before it settles, and is credited from its settled row by the
    // top-up recovery pass (src/pay/topup.ts); a call paid per call gets its ledger entry here.
    if (p.account_id === null) {
      await recordPaidCall(tx, {
        paymentId: p.id,
        jobId: p.job_id,
        tool: p.tool,
        priceCents: Number(BigInt(p.value_atomic) / ATOMIC_UNITS_PER_CENT),
        payer: p.payer,
      });
    }
    return true;
  });
}

/** The settlement the crash interrupted, submitted now (see the module comment for why, not released). */
async function settleNow(deps: PaymentReconcilerDeps, p: StoredPayment, canLookUp: boolean): Promise<PaymentOutcome> {
  const result = await deps.settler.settle(p.payment_payload, p.payment_requirements, undefined, {
    submitted: (tx) => recordSubmitted(deps.db, p.id, tx).catch(() => {}),
  });
  if (result.success) return (await complete(deps, p, (tx) => markSettled(tx, p.id, result.transaction))) ? 'settled_now' : 'raced';
  // Unanswered, or sent and not yet confirmed: the next pass looks again.
  if (isOurFault(result.errorReason)) return 'pending';
  // Refused (funds moved away, a transfer already pending or mined): with the chain to read, the next
  // pass sees which, and the authorization's expiry ends it; without, only an operator can tell.
  if (canLookUp) return 'pending';
  return leaveForOperator(
    deps,
    p,
    `reconcile: the facilitator refused to settle it again (${result.errorReason ?? 'no reason given'}); it may have settled before the API stopped. An operator decides`,
  );
}

async function leaveForOperator(deps: PaymentReconcilerDeps, p: StoredPayment, note: string): Promise<PaymentOutcome> {
  // The note takes the row out of later passes (they take reserved rows without one).
  await deps.db.query(sql.unsafe`UPDATE x402_payments SET error = ${note.slice(0, 500)} WHERE id = ${p.id} AND status = 'reserved'`);
  deps.log.error({ paymentId: p.id, payer: p.payer, tool: p.tool }, `x402 payment left reserved for an operator: ${note}`);
  return 'operator';
}

/** One pass over every stale reserved payment (no lock: PaymentReconciler takes one). */
export async function reconcilePayments(deps: PaymentReconcilerDeps, keepLock: () => Promise<void> = async () => {}): Promise<PaymentReconcileReport> {
  const report: PaymentReconcileReport = { ran: true, checked: 0, outcomes: {} };
  let after: StoredPayment | undefined;
  for (;;) {
    const rows = await listStaleReserved(deps.db, deps.config.X402_RECONCILE_GRACE_SECONDS, { after });
    if (!rows.length) return report;
    for (const p of rows) {
      after = p;
      report.checked++;
      let outcome: PaymentOutcome;
      try {
        outcome = await reconcilePayment(deps, p);
      } catch (err) {
        deps.log.warn({ err: (err as Error).message, paymentId: p.id }, 'reconciling an x402 payment failed; next pass');
        outcome = 'pending';
      }
      report.outcomes[outcome] = (report.outcomes[outcome] ?? 0) + 1;
      await keepLock();
    }
  }
}

/**
 * Runs reconcilePayments every RECONCILE_SECONDS (jittered) in each API process with x402 on, one
 * pass at a time across replicas (`SET NX PX`, extended while the pass works).
 */
export class PaymentReconciler {
  private readonly leader: RedisLeader;
  private readonly passes: PeriodicPass<PaymentReconcileReport>;

  constructor(private readonly deps: PaymentReconcilerDeps & { redis: Redis; prefix: string; intervalSeconds: number; lockMs?: number }) {
    // Longer than one settlement can take, so a pass submitting one keeps its lock.
    this.leader = new RedisLeader(deps.redis, `${deps.prefix}:x402-reconcile:lock`, deps.lockMs ?? deps.config.X402_SETTLE_TIMEOUT_MS + 60_000);
    this.passes = new PeriodicPass(
      deps.intervalSeconds,
      () => this.pass(),
      (err) => deps.log.warn({ err: err.message }, 'x402 payment reconciler pass failed'),
    );
  }

  start(): void {
    this.passes.start();
  }

  async stop(): Promise<void> {
    await this.passes.stop();
  }

  /** One pass if no other process is running one. */
  runOnce(): Promise<PaymentReconcileReport> {
    return this.passes.runOnce();
  }

  private async pass(): Promise<PaymentReconcileReport> {
    const report = await this.leader.run((keepLock) => reconcilePayments(this.deps, keepLock), 'x402 payment reconciler lock lost');
    if (!report) return { ran: false, checked: 0, outcomes: {} };
    if (report.checked) this.deps.log.warn(report, 'x402 payment reconciler completed or released reserved payments');
    return report;
  }
}
