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
