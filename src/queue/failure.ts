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
    return new AppError('internal_error', 'The worker running this call stopped; the call was not charged');
  }
  return new AppError('internal_error', 'The call failed unexpectedly');
}

export function isOwnFailure(reason: string | undefined): boolean {
  return !!reason?.startsWith(MARK);
}
