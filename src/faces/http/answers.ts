/** How a call's request headers and answer read over HTTP: shared by the key-paid and the x402-paid call routes. */
import type { FastifyRequest } from 'fastify';
import type { CallAnswer } from '../../calls/admission.js';
import type { StoredResponse } from '../../calls/idempotency.js';
import type { AnyTool } from '../../tools/types.js';

/** `Prefer: respond-async` (RFC 7240) asks for the 202 at once. */
export function wantsAsync(req: FastifyRequest): boolean {
  const prefer = req.headers.prefer;
  return typeof prefer === 'string' && /(^|[,;\s])respond-async($|[,;\s])/i.test(prefer);
}

export function edgeTokenHeader(req: FastifyRequest): string | undefined {
  const v = req.headers['x-edge-token'];
  return typeof v === 'string' && v.trim() ? v.trim() : undefined;
}

/** A call's answer as a stored, replayable response. */
export function answerResponse(answer: CallAnswer, tool?: Pick<AnyTool, 'sensitive'>): StoredResponse {
  return {
    status: answer.status,
    headers: { 'x-job-id': answer.jobId, ...(answer.status === 202 ? { location: answer.body.status_url } : {}) },
    body: answer.body,
    // An Idempotency-Key keeps a sensitive tool's answer as a reference to its (sealed) job.
    ...(tool?.sensitive ? { byReference: true } : {}),
  };
}
