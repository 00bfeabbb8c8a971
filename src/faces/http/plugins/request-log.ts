import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { AppError } from '../../../errors.js';

/**
 * What a request's log line says beyond its route and status, gathered while it runs: the tool and
 * job it ran, what it cost, and how it failed (set by the error handler, src/faces/http/plugins/errors.ts).
 */
export interface RequestNote {
  tool?: string;
  job?: string;
  cost_cents?: number;
  /** The answer's error. */
  error?: AppError;
  /** A fault on our side (the error it came from, stack and all); never set for an expected failure. */
  fault?: unknown;
}

declare module 'fastify' {
  interface FastifyRequest {
    note: RequestNote | null;
  }
}

/** Notes something for the request's log line. */
export function noteRequest(req: FastifyRequest, fields: RequestNote): void {
  req.note = req.note ? Object.assign(req.note, fields) : { ...fields };
}

/**
 * Gathers the tool and cost of each request for its one log line: the tool from the route's `name`
 * parameter or the body's `tool`, the cost from the answer's `cost_cents` before it is serialised
 * (no JSON is parsed again).
 */
export function logRequests(app: FastifyInstance): void {
  app.decorateRequest('note', null);
  app.addHook('preSerialization', async (req, _reply, payload) => {
    const cost = (payload as { cost_cents?: unknown } | null)?.cost_cents;
    if (typeof cost === 'number') noteRequest(req, { cost_cents: cost });
    return payload;
  });
}

function toolOf(req: FastifyRequest): string | undefined {
  const fromPath = (req.params as { name?: unknown } | undefined)?.name;
  if (typeof fromPath === 'string' && req.routeOptions.url?.startsWith('/tools/')) return fromPath;
  const fromBody = (req.body as { tool?: unknown } | null | undefined)?.tool;
  return typeof fromBody === 'string' && fromBody.length <= 100 ? fromBody : undefined;
}

/**
 * One line per request, written once it is answered: `info` when it succeeded, `warn` (code and
 * message, no stack) when the caller's request or an upstream failed as expected, `error` with the
 * stack for a fault of ours. Route patterns only, never the raw URL: a path or query may carry a secret.
 */
export function logRequest(req: FastifyRequest, reply: FastifyReply, route: string): void {
  const note = req.note;
  const job = note?.job ?? reply.getHeader('x-job-id');
  const tool = note?.tool ?? toolOf(req);
  const line = {
    method: req.method,
    route,
    status: reply.statusCode,
    ms: Math.round(reply.elapsedTime * 10) / 10,
    ...(tool ? { tool } : {}),
    ...(typeof job === 'string' ? { job } : {}),
    ...(note?.cost_cents !== undefined ? { cost_cents: note.cost_cents } : {}),
    ...(note?.error ? { error: { code: note.error.code, message: note.error.message } } : {}),
  };
  if (note?.fault !== undefined) req.log.error({ ...line, err: note.fault }, 'request failed');
  else if (reply.statusCode >= 400) req.log.warn(line, 'request refused or failed');
  else req.log.info(line, 'request');
}
