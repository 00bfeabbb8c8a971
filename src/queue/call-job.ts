/**
 * What the queue carries for a call: the job's data, its answer, an outcome already stored for it, and
 * the cancel signal every worker and completion dispatcher listens to. calls/ fills these and acts on
 * them; the queue only moves them, so they live here, below both.
 */
import { AppError } from '../errors.js';
import type { Sealed } from './job-seal.js';

/** What a tool-call job carries in Redis. Never the edge token in clear text. */
export interface CallJobData {
  tool: string;
  /** The tool's input; empty for a sensitive tool, whose input is `sealedInput`. */
  input: Record<string, unknown>;
  /** A sensitive tool's input, sealed (src/queue/job-seal.ts); only the worker running the job opens it. */
  sealedInput?: Sealed;
  accountId: string | null;
  keyId: string | null;
  /** Sub-key id when the caller used one (for balance views). */
  subKeyId: string | null;
  agentName: string | null;
  /** x402 payer address for calls paid per call. */
  payer: string | null;
  /** Cents this job charges when it succeeds (0 for free tools, sandbox keys and x402 payments). */
  priceCents: number;
  /** Price of the tool, recorded in the ledger for x402 payments. */
  listPriceCents: number;
  sandbox: boolean;
  requestId: string;
  /** The caller's edge-network token, sealed (EdgeTokenSealer). */
  edgeToken?: string;
  /** Chain step after the first: the previous step's output fills the tool's q field. */
  qFromPrevious?: boolean;
  /** Set on a job that failed for good: its input was dropped from Redis (src/calls/worker-pool.ts). */
  inputDropped?: true;
  /** Flow steps (root protocol): the job whose event log (src/queue/job-events.ts) gets this job's events. */
  eventLog?: string;
  /** Chain steps: the steps after this one. They never run if this one fails for good, so their credit holds go back with its own. */
  laterSteps?: string[];
  /** Vetted Callback-Url: settlement queues a signed delivery of the outcome (src/calls/webhooks.ts). */
  callbackUrl?: string;
}

/** The body a successful call answers with (and the job's return value). */
export interface CallResult {
  result: unknown;
  cost_cents: number;
  remaining_credits: number | null;
  sandbox?: true;
}

/** An outcome already stored for a job (it was settled before: a redelivery). */
export interface StoredOutcome {
  /** cancelled: DELETE /jobs/{id} won before the job settled (migrations/009_cancel.sql); never charged. */
  status: 'completed' | 'failed' | 'cancelled';
  /** completed: the CallResult as answered then; failed, cancelled: the error. */
  body: Record<string, unknown>;
  truncated: boolean;
}

/** The pub/sub channel that carries cancelled job ids. */
export function cancelChannel(prefix: string): string {
  return `${prefix}:cancels`;
}

/** Marker of a cancelled job, for a worker that starts it after the message went by. */
export function cancelKey(prefix: string, jobId: string): string {
  return `${prefix}:cancel:${jobId}`;
}

/** A cancelled job's error, as its waiting caller, GET /jobs/{id} and its stream see it. */
export function cancelledError(): AppError {
  return new AppError('cancelled', 'The job was cancelled (DELETE /jobs/{id}) before it finished; it was not charged');
}

/** The pub/sub channel that carries the ids of jobs the intent reconciler marked lost (src/calls/intents.ts). */
export function lostChannel(prefix: string): string {
  return `${prefix}:lost`;
}

/** A lost job's error (410 job_lost), as its waiting caller and GET /jobs/{id} see it. */
export function jobLostError(jobId: string): AppError {
  return new AppError(
    'job_lost',
    `Job ${jobId} was accepted but the queue lost it before it ran; it will not run and was not charged. ` +
      'Send the request again, with the same Idempotency-Key if it had one.',
    { job_id: jobId, status: 'lost' },
    { headers: { 'x-job-id': jobId } },
  );
}

/** Reason a cancelled job's signal is aborted with (the runner tells a cancel from a shutdown by it). */
export const JOB_CANCELLED = new Error('job cancelled');
