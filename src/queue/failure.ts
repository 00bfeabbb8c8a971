import { AppError, type SerializedError } from '../errors.js';

/**
 * BullMQ keeps a failed job's reason as a string. Tool failures are carried in it as JSON behind a
 * marker, so the API can answer with the tool's own error code and message.
 */
const MARK = 'tollgate:';

export function encodeFailure(err: AppError): string {
  return MARK + JSON.stringify(err.toJSON());
}

export function decodeFailure(reason: string | undefined): AppError {
  if (reason?.startsWith(MARK)) {
    try {
      return AppError.fromJSON(JSON.parse(reason.slice(MARK.length)) as SerializedError);
    } catch {
      // fall through
    }
  }
  if (reason && /stalled/i.test(reason)) {
    // BullMQ redelivers a job whose worker died once (maxStalledCount: 1); a second death fails it for
    // good. Twice in a row is the call's doing (most often memory), so it is the caller's answer.
    return new AppError(
      'limit_exceeded',
      'The worker process running this call stopped twice while running it (most likely out of memory); it was not charged and will not be retried',
      { limit: 'memory' },
    );
  }
  return new AppError('internal_error', 'The call failed unexpectedly');
}

export function isOwnFailure(reason: string | undefined): boolean {
  return !!reason?.startsWith(MARK);
}

/**
 * A call that failed by its caller's doing (bad input found by the worker, a target that refused, a
 * cancel: any 4xx) is not a fault: its job completes in BullMQ, returning this, so Bull Board and
 * tollgate_queue_jobs{state="failed"} count only faults (5xx: ours or an upstream's). Every reader of
 * a job's return value turns it back into the failure it is (`returnedFailure`).
 */
export interface FailedReturn {
  failed: SerializedError;
}

export function isCallersFailure(err: AppError): boolean {
  return err.status < 500;
}

export function failedReturn(err: AppError): FailedReturn {
  return { failed: err.toJSON() };
}

/** The failure a completed job returned, or null for an answer (or a reference to one). */
export function returnedFailure(value: unknown): AppError | null {
  if (!value || typeof value !== 'object' || 'result' in value) return null;
  const failed = (value as Partial<FailedReturn>).failed;
  return failed && typeof failed === 'object' && typeof failed.code === 'string' ? AppError.fromJSON(failed) : null;
}
