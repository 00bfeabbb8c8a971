import { isAppError } from '../errors.js';
import type { CompletionDispatcher } from '../queue/dispatcher.js';

/** Reads a job's answer as GET /jobs/{id} gives it (`{job_id, status, ...}`). */
export type JobStatusReader = (jobId: string) => Promise<{ status: number; body: unknown }>;

/**
 * A job's answer as GET /jobs/{id} gives it, waiting up to `timeoutMs` while it is still queued or
 * running; null when no such job exists (for this key). Throws the job's error when it failed. Used to
 * answer a retry whose first request died after queueing the job.
 */
export async function awaitJobBody(
  dispatcher: CompletionDispatcher,
  readStatus: JobStatusReader,
  jobId: string,
  timeoutMs: number,
): Promise<Record<string, unknown> | null> {
  // Subscribed before reading, so a job finishing in between is not missed.
  const wait = dispatcher.waitFor(jobId, timeoutMs);
  const read = async () => {
    try {
      return (await readStatus(jobId)).body as Record<string, unknown>;
    } catch (e) {
      if (isAppError(e) && e.code === 'not_found') return null;
      throw e;
    }
  };
  try {
    let body = await read();
    if (body && (body.status === 'queued' || body.status === 'running')) {
      await wait.outcome;
      body = await read();
    }
    return body;
  } finally {
    wait.cancel();
  }
}
