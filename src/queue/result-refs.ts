import { AppError, type SerializedError } from '../errors.js';
import type { CallResult, StoredOutcome } from './call-job.js';

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
 * Answers up to JOB_RESULT_INLINE_BYTES stay inline: the common small call costs no extra round trip.
 */
export interface ResultRef {
  stored: 'job_results' | 'job_record';
  cost_cents: number;
  remaining_credits: number | null;
  sandbox?: true;
  /** JSON bytes of the result it stands for. */
  bytes: number;
}

/** A job's return value as BullMQ holds it. */
export type JobReturn = CallResult | ResultRef;

export function isResultRef(v: unknown): v is ResultRef {
  return !!v && typeof v === 'object' && !('result' in v) && ((v as ResultRef).stored === 'job_results' || (v as ResultRef).stored === 'job_record');
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
  constructor(private readonly sources: RefSources) {}

  async resolve(jobId: string, value: JobReturn): Promise<CallResult> {
    if (!isResultRef(value)) return value;
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
): ResultRefs {
  return new ResultRefs({
    stored: (jobId) => results.get(jobId),
    recorded: async (jobId) => {
      const rec = await records.raw(jobId);
      return rec?.state === 'completed' && rec.value && !isResultRef(rec.value) ? rec.value : null;
    },
  });
}
