import { AppError, type SerializedError } from '../errors.js';
import type { CallResult, StoredOutcome } from './call-job.js';
import { isSealed, resultBinding, type JobSeal, type Sealed } from './job-seal.js';

/**
 * What a finished job returns to BullMQ in place of a large answer. BullMQ keeps a job's return value
 * in the job's hash and copies it into the queue's event stream (the `completed` event), so an answer
 * put there is held twice, the stream's copy until the stream is trimmed. A result is stored once
 * instead:
 *
 * - `job_results`: a call made with a key is settled in Postgres with its answer (src/money/settlement.ts);
 *   when that answer is larger than JOB_RESULT_INLINE_BYTES (and was stored whole), the job returns this
 *   reference and every reader resolves it from `job_results` (one primary-key read).
 * - `job_record`: a call paid per call (x402) is not stored in Postgres; a large answer of one is kept
 *   under its job record (src/queue/job-records.ts) for JOB_REDIS_RETENTION_SECONDS, long enough for
 *   its caller's wait, and the job returns this reference.
 *
 * - `sealed`: a sensitive tool's answer (src/queue/job-seal.ts) travels with the reference, sealed, unless
 *   it is large and `job_results` (where it is sealed too) holds it whole; so do its job record and event
 *   log entries, which copy the job's return value.
 *
 * Answers up to JOB_RESULT_INLINE_BYTES stay inline: the common small call costs no extra round trip.
 */
export interface ResultRef {
  stored: 'job_results' | 'job_record' | 'sealed';
  cost_cents: number;
  remaining_credits: number | null;
  sandbox?: true;
  /** JSON bytes of the result it stands for. */
  bytes: number;
  /** `sealed`: the result, sealed to its job. */
  result_sealed?: Sealed;
}

/** A job's return value as BullMQ holds it. */
export type JobReturn = CallResult | ResultRef;

export function isResultRef(v: unknown): v is ResultRef {
  if (!v || typeof v !== 'object' || 'result' in v) return false;
  const stored = (v as ResultRef).stored;
  return stored === 'job_results' || stored === 'job_record' || stored === 'sealed';
}

export function refFor(stored: ResultRef['stored'], value: CallResult, bytes: number): ResultRef {
  return {
    stored,
    cost_cents: value.cost_cents,
    remaining_credits: value.remaining_credits,
    ...(value.sandbox ? { sandbox: true as const } : {}),
    bytes,
  };
}

/** A sensitive tool's answer as its job returns it: the figures in clear, the result sealed to the job. */
export function sealedRef(seal: JobSeal, jobId: string, value: CallResult, bytes: number): ResultRef {
  return { ...refFor('sealed', value, bytes), result_sealed: seal.seal(value.result, resultBinding(jobId)) };
}

/** The answer a stored completed outcome stands for (as GET /jobs/{id} and a redelivered job answer). */
export function storedAnswer(o: StoredOutcome): CallResult {
  return (o.truncated ? { ...o.body, truncated: true } : o.body) as unknown as CallResult;
}

/** Where references are resolved from. */
export interface RefSources {
  /** job_results (src/money/results.ts). */
  stored(jobId: string): Promise<StoredOutcome | null>;
  /** The job record's completed value, as written (never itself a reference). */
  recorded(jobId: string): Promise<CallResult | null>;
}

/** Resolves references back to the answers they stand for; anything else passes through unchanged. */
export class ResultRefs {
  constructor(
    private readonly sources: RefSources,
    /** Opens sealed answers (src/queue/job-seal.ts). */
    readonly seal: JobSeal | null = null,
  ) {}

  async resolve(jobId: string, value: JobReturn): Promise<CallResult> {
    if (!isResultRef(value)) return value;
    if (value.stored === 'sealed') {
      if (!this.seal || !isSealed(value.result_sealed)) throw new Error(`the sealed answer of job ${jobId} cannot be opened here`);
      const { stored: _s, bytes: _b, result_sealed, ...rest } = value;
      return { ...rest, result: this.seal.open(result_sealed, resultBinding(jobId)) };
    }
    if (value.stored === 'job_results') {
      const o = await this.sources.stored(jobId);
      if (o?.status === 'completed') return storedAnswer(o);
      if (o) throw AppError.fromJSON(o.body as unknown as SerializedError);
    } else {
      const v = await this.sources.recorded(jobId);
      if (v && !isResultRef(v)) return v;
    }
    throw new AppError('not_found', `The answer of job ${jobId} is no longer stored`);
  }
}

/** References resolved from job_results and the job records. */
export function resultRefs(
  results: { get(jobId: string): Promise<StoredOutcome | null> },
  records: { raw(jobId: string): Promise<{ state: string; value?: JobReturn } | null> },
  seal: JobSeal | null = null,
): ResultRefs {
  return new ResultRefs(
    {
      stored: (jobId) => results.get(jobId),
      recorded: async (jobId) => {
        const rec = await records.raw(jobId);
        return rec?.state === 'completed' && rec.value && !isResultRef(rec.value) ? rec.value : null;
      },
    },
    seal,
  );
}
