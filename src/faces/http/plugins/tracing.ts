import type { FastifyInstance, FastifyRequest } from 'fastify';
import { endRequestTrace, startRequestTrace, tracingOn, withContext, type RequestTrace } from '../../../tracing.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** This request's server span (src/tracing.ts), while tracing is on. */
    trace?: RequestTrace;
  }
}

/**
 * One server span per request, continuing the caller's W3C `traceparent` when it sends one, and the
 * answer's `traceresponse` header naming the trace (while tracing is on: src/tracing.ts). The span is
 * named by the route's pattern, never the raw URL. The handler runs in the span's context, so
 * authentication, admission and the enqueue are its children. Off, no hook is installed.
 */
export function installTracing(app: FastifyInstance): void {
  if (!tracingOn()) return;
  const end = (req: FastifyRequest, status: number, aborted = false) => {
    const t = req.trace;
    if (!t) return;
    req.trace = undefined;
    endRequestTrace(t, status, aborted);
  };
  app.addHook('onRequest', (req, reply, done) => {
    req.trace = startRequestTrace(req.method, req.routeOptions.url ?? '(unmatched)', req.headers) ?? undefined;
    if (req.trace) reply.header('traceresponse', req.trace.traceresponse);
    done();
  });
  // After the body is read (its stream's events carry no context of ours): the handler, and every
  // hook after this one, run inside the request's span.
  app.addHook('preHandler', (req, _reply, done) => (req.trace ? withContext(req.trace.context, done) : done()));
  app.addHook('onResponse', (req, reply, done) => {
    end(req, reply.statusCode);
    done();
  });
  app.addHook('onRequestAbort', (req, done) => {
    end(req, 499, true);
    done();
  });
}
