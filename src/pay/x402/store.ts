import { z } from 'zod';
import type { CommonQueryMethods, DatabasePool, SerializableValue } from 'slonik';
import { sql } from '../../db/pool.js';
import { AppError } from '../../errors.js';
import { PaymentPayloadSchema, paymentInvalid, type PaymentPayload } from './payload.js';
import { ATOMIC_UNITS_PER_CENT, PaymentRequirementsSchema, X402_VERSION, type PaymentRequirements } from './requirements.js';
import type { VerifiedPayment } from './verify.js';

/**
 * Postgres record of accepted x402 payments (migrations/002_x402_payments.sql).
 *
 * Lifecycle: reserved -> settled (facilitator settled it) | awaiting_settlement (verified locally,
 * an operator submits it) | failed. A failed call never frees its nonce. Once a client has handed
 * us a signed authorization, anyone holding it can still submit it on chain until validBefore, and
 * the token contract accepts each nonce once, so "reusing" it could never produce a second valid
 * payment anyway; the client signs a new authorization with a fresh nonce instead. Marking the row
 * failed keeps the record of why that call was not charged.
 */

export const PAYMENT_STATUSES = ['reserved', 'settled', 'awaiting_settlement', 'failed'] as const;
export type PaymentStatus = (typeof PAYMENT_STATUSES)[number];

const IdRow = z.object({ id: z.string().uuid() });

export interface ReserveInput {
  /** v1 form, on our network name. */
  payment: PaymentPayload;
  requirements: PaymentRequirements;
  verified: VerifiedPayment;
  /** The tool being paid for (for a chain or parallel call, the root request's label). */
  tool: string;
  /** The x402 version the payer used (default 1). */
  version?: 1 | 2;
  /**
   * Deferred settlement: the most this payer may have open (reserved or awaiting settlement) once
   * this payment is counted, in atomic units. Needs a pool (the check and the insert are one transaction).
   */
  deferredCapAtomic?: bigint;
}

const SumRow = z.object({ open: z.string() });

/**
 * Claims the payment's nonce. Exactly one of any number of concurrent reservations of the same
 * authorization succeeds; the others, and every later one, get `payment_already_used`.
 * With a deferred cap, the payer's open payments are summed under a per-payer lock, so concurrent
 * payments cannot together pass the cap. Returns the payment row id.
 */
export async function reserveNonce(db: CommonQueryMethods, input: ReserveInput): Promise<string> {
  const { verified, deferredCapAtomic: cap } = input;
  if (cap === undefined) return insertPayment(db, input);
  if (!('transaction' in db)) throw new Error('reserveNonce with a deferred cap needs a pool');
  return (db as DatabasePool).transaction(async (tx) => {
    await tx.query(sql.unsafe`SELECT pg_advisory_xact_lock(hashtextextended(${`x402-deferred:${verified.payer}`}, 0))`);
    const { open } = await tx.one(sql.type(SumRow)`
      SELECT coalesce(sum(value_atomic), 0)::text AS open FROM x402_payments
      WHERE payer = ${verified.payer} AND status IN ('reserved', 'awaiting_settlement')`);
    if (BigInt(open) + verified.valueAtomic > cap) {
      const cents = (v: bigint) => (v / ATOMIC_UNITS_PER_CENT).toString();
      throw paymentInvalid(
        'deferred_limit',
        `${verified.payer} already has ${cents(BigInt(open))} cents of payments waiting for settlement; this service accepts at most ` +
          `${cents(cap)} cents unsettled per payer. Retry once earlier payments have been settled.`,
        { open_cents: Number(cents(BigInt(open))), limit_cents: Number(cents(cap)) },
      );
    }
    return insertPayment(tx, input);
  });
}

async function insertPayment(db: CommonQueryMethods, input: ReserveInput): Promise<string> {
  const { payment, requirements, verified, tool } = input;
  const row = await db.maybeOne(sql.type(IdRow)`
    INSERT INTO x402_payments (
      chain_id, asset, payer, nonce, network, value_atomic, pay_to, tool, resource, valid_before,
      payment_payload, payment_requirements, x402_version
    ) VALUES (
      ${verified.profile.chainId}, ${verified.profile.asset.toLowerCase()}, ${verified.payer}, ${verified.nonce},
      ${payment.network}, ${verified.valueAtomic.toString()}::numeric, ${payment.payload.authorization.to.toLowerCase()},
      ${tool}, ${requirements.resource}, ${verified.validBefore.toString()}::numeric,
      ${sql.jsonb(payment)}, ${sql.jsonb(requirements as SerializableValue)}, ${input.version ?? 1}
    )
    ON CONFLICT (chain_id, asset, payer, nonce) DO NOTHING
    RETURNING id`);
  if (!row) {
    throw new AppError(
      'payment_already_used',
      `This payment authorization (nonce ${verified.nonce}) has already been used. Sign a new payment with a fresh nonce.`,
      { reason: 'nonce_already_used' },
    );
  }
  return row.id;
}

/** The answer a payment buys, as a retry of the same request is answered with it. */
export interface PaidAnswer {
  status: number;
  headers: Record<string, string>;
  body: unknown;
}

export interface SettlingInput {
  /** What the payment pays for (absent for top-ups: their credit is written from the settled row). */
  answer?: PaidAnswer;
  /** The request's idempotency fingerprint: a retry must repeat it to be answered. */
  fingerprint?: string;
  /** The first job the payment paid for (the ledger entry's key). */
  jobId?: string;
}

/**
 * Settlement is about to be attempted: from here the money may move, so the answer it pays for is
 * kept first. Compare-and-set from 'reserved' with no settlement started: false when the row was
 * released meanwhile (the reconciler decided), and then nothing must be settled.
 */
export async function markSettling(db: CommonQueryMethods, id: string, input: SettlingInput = {}): Promise<boolean> {
  const row = await db.maybeOne(sql.type(IdRow)`
    UPDATE x402_payments
    SET settling_at = now(), answer = ${input.answer ? sql.jsonb(input.answer as unknown as SerializableValue) : null},
        request_fingerprint = ${input.fingerprint ?? null}, job_id = ${input.jobId ?? null}
    WHERE id = ${id} AND status = 'reserved' AND settling_at IS NULL
    RETURNING id`);
  return row !== null;
}

/** The settlement's transaction was sent (not yet mined): its receipt will say what happened. */
export async function recordSubmitted(db: CommonQueryMethods, id: string, txHash: string): Promise<void> {
  await db.query(sql.unsafe`UPDATE x402_payments SET tx_hash = ${txHash.toLowerCase()} WHERE id = ${id} AND status = 'reserved'`);
}

/**
 * Released without a settlement ever being attempted (the reconciler, after a crash before
 * settlement). Compare-and-set against markSettling: of the two, exactly one wins.
 */
export async function releaseUnsettled(db: CommonQueryMethods, id: string, error: string): Promise<boolean> {
  const row = await db.maybeOne(sql.type(IdRow)`
    UPDATE x402_payments SET status = 'failed', error = ${error.slice(0, 500)}
    WHERE id = ${id} AND status = 'reserved' AND settling_at IS NULL
    RETURNING id`);
  return row !== null;
}

/** Settled on chain. Also accepts rows an operator settled after they waited for settlement. */
export async function markSettled(db: CommonQueryMethods, id: string, txHash: string): Promise<boolean> {
  const row = await db.maybeOne(sql.type(IdRow)`
    UPDATE x402_payments SET status = 'settled', tx_hash = ${txHash}, error = NULL, settled_at = now()
    WHERE id = ${id} AND status IN ('reserved', 'awaiting_settlement')
    RETURNING id`);
  return row !== null;
}

/** Verified locally, result delivered; the authorization still has to be submitted on chain. */
export async function markAwaitingSettlement(db: CommonQueryMethods, id: string): Promise<boolean> {
  const row = await db.maybeOne(sql.type(IdRow)`
    UPDATE x402_payments SET status = 'awaiting_settlement'
    WHERE id = ${id} AND status = 'reserved'
    RETURNING id`);
  return row !== null;
}

/** Not charged: the call failed, or settlement did. The nonce stays used (see the module comment). */
export async function markFailed(db: CommonQueryMethods, id: string, error: string, txHash?: string): Promise<boolean> {
  // A transaction that was sent but not confirmed keeps its hash, so an operator can look it up.
  const row = await db.maybeOne(sql.type(IdRow)`
    UPDATE x402_payments SET status = 'failed', error = ${error.slice(0, 500)}, tx_hash = coalesce(${txHash ?? null}, tx_hash)
    WHERE id = ${id} AND status IN ('reserved', 'awaiting_settlement')
    RETURNING id`);
  return row !== null;
}

export const AwaitingPaymentSchema = z.object({
  id: z.string().uuid(),
  network: z.string(),
  payer: z.string(),
  value_atomic: z.string(),
  tool: z.string(),
  resource: z.string(),
  valid_before: z.string(),
  created_at: z.string(),
  payment_payload: PaymentPayloadSchema,
  payment_requirements: PaymentRequirementsSchema,
});
export type AwaitingPayment = z.infer<typeof AwaitingPaymentSchema>;

/** Oldest first: authorizations expire (valid_before), so the oldest are the most urgent. */
export async function listAwaitingSettlement(db: CommonQueryMethods, opts: { limit?: number } = {}): Promise<AwaitingPayment[]> {
  const limit = Math.min(Math.max(opts.limit ?? 1000, 1), 100_000);
  // The casts keep the row shape the same whatever type parsers the pool was built with.
  const rows = await db.any(sql.type(AwaitingPaymentSchema)`
    SELECT id, network, payer, value_atomic::text AS value_atomic, tool, resource,
           valid_before::text AS valid_before,
           to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS created_at,
           payment_payload, payment_requirements
    FROM x402_payments
    WHERE status = 'awaiting_settlement'
    ORDER BY created_at, id
    LIMIT ${limit}`);
  return rows.map((r) => AwaitingPaymentSchema.parse(r));
}

/**
 * One JSON line per payment awaiting settlement. `settle_request` is exactly the body a
 * facilitator's POST /settle takes, so an operator can pipe it to any x402 facilitator; afterwards
 * record the outcome with markSettled / markFailed (the admin CLI's job).
 */
export function exportLine(p: AwaitingPayment, now: Date = new Date()): string {
  const expired = BigInt(p.valid_before) <= BigInt(Math.floor(now.getTime() / 1000));
  return JSON.stringify({
    id: p.id,
    tool: p.tool,
    network: p.network,
    payer: p.payer,
    value_atomic: p.value_atomic,
    created_at: p.created_at,
    valid_before: p.valid_before,
    expired,
    settle_request: { x402Version: X402_VERSION, paymentPayload: p.payment_payload, paymentRequirements: p.payment_requirements },
  });
}

export async function exportAwaitingSettlement(db: CommonQueryMethods, now: Date = new Date()): Promise<string> {
  const rows = await listAwaitingSettlement(db, { limit: 100_000 });
  return rows.map((r) => exportLine(r, now) + '\n').join('');
}

export const StoredPaymentSchema = z.object({
  id: z.string().uuid(),
  status: z.enum(PAYMENT_STATUSES),
  payer: z.string(),
  nonce: z.string(),
  network: z.string(),
  value_atomic: z.string(),
  tool: z.string(),
  valid_before: z.string(),
  account_id: z.string().nullable(),
  tx_hash: z.string().nullable(),
  settling: z.boolean(),
  answer: z.object({ status: z.number().int(), headers: z.record(z.string()), body: z.unknown() }).nullable(),
  request_fingerprint: z.string().nullable(),
  job_id: z.string().nullable(),
  /** Microsecond precision (a page's cursor). */
  created_at: z.string(),
  payment_payload: PaymentPayloadSchema,
  payment_requirements: PaymentRequirementsSchema,
});
export type StoredPayment = z.infer<typeof StoredPaymentSchema>;

const STORED_COLUMNS = sql.fragment`
  id, status, payer, nonce, network, value_atomic::text AS value_atomic, tool, valid_before::text AS valid_before,
  account_id, tx_hash, settling_at IS NOT NULL AS settling, answer, request_fingerprint, job_id,
  to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created_at, payment_payload, payment_requirements`;

/** The row of one authorization (the unique key a reservation conflicts on), or null. */
export async function findPayment(
  db: CommonQueryMethods,
  key: { chainId: number; asset: string; payer: string; nonce: string },
): Promise<StoredPayment | null> {
  const row = await db.maybeOne(sql.type(StoredPaymentSchema)`
    SELECT ${STORED_COLUMNS} FROM x402_payments
    WHERE chain_id = ${key.chainId} AND asset = ${key.asset.toLowerCase()} AND payer = ${key.payer.toLowerCase()} AND nonce = ${key.nonce.toLowerCase()}`);
  return row ? StoredPaymentSchema.parse(row) : null;
}

export async function getPayment(db: CommonQueryMethods, id: string): Promise<StoredPayment | null> {
  const row = await db.maybeOne(sql.type(StoredPaymentSchema)`SELECT ${STORED_COLUMNS} FROM x402_payments WHERE id = ${id}`);
  return row ? StoredPaymentSchema.parse(row) : null;
}

/**
 * Payments still 'reserved' that were reserved more than `graceSeconds` ago and carry no operator
 * note, oldest first, a page after `after`: more than any live request holds one, so whoever reserved
 * them is gone. Served by the partial index on reserved rows (migrations/020), whatever the statistics.
 */
export async function listStaleReserved(
  db: CommonQueryMethods,
  graceSeconds: number,
  opts: { after?: Pick<StoredPayment, 'created_at' | 'id'>; limit?: number } = {},
): Promise<StoredPayment[]> {
  const { after, limit = 100 } = opts;
  const rows = await db.any(sql.type(StoredPaymentSchema)`
    SELECT ${STORED_COLUMNS} FROM x402_payments
    WHERE status = 'reserved' AND created_at < now() - make_interval(secs => ${graceSeconds}) AND error IS NULL
      ${after ? sql.fragment`AND (created_at, id) > (${after.created_at}::timestamptz, ${after.id}::uuid)` : sql.fragment``}
    ORDER BY created_at, id
    LIMIT ${limit}`);
  return rows.map((r) => StoredPaymentSchema.parse(r));
}

/** The ledger key of a call paid per call: one entry per payment, whoever writes it. */
export function paidCallEntryKey(paymentId: string, jobId: string | null | undefined): string {
  return `x402:${paymentId}:${jobId ?? ''}`;
}

/**
 * A call paid per call in the ledger under the payer's address, once its payment is settled (or
 * recorded for the operator to settle). Keyed by payment, so the API and the reconciler can both
 * write it and it is written once.
 */
export async function recordPaidCall(
  db: CommonQueryMethods,
  entry: { paymentId: string; jobId: string | null | undefined; tool: string; priceCents: number; payer: string },
): Promise<void> {
  await db.query(sql.unsafe`
    INSERT INTO ledger (entry_key, account_id, kind, tool, delta_cents, payer)
    VALUES (${paidCallEntryKey(entry.paymentId, entry.jobId)}, NULL, 'payment', ${entry.tool}, ${-entry.priceCents}, ${entry.payer})
    ON CONFLICT (entry_key) DO NOTHING`);
}
