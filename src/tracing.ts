/**
 * OpenTelemetry tracing: one small API every room calls (`traced`, `annotate`, `recordSpan`, the job's
 * carried context) and the SDK's start and stop for the roof (`startTracing`).
 *
 * It lives on the ground floor, beside config.ts, because its hooks sit in nearly every room: faces
 * (the HTTP span), access (authentication), calls (admission), queue (enqueue, the job's context),
 * sandbox, tools (upstream HTTP) and money (settlement). Only the ground floor can be imported by
 * all of them, and this file imports nothing of the project's.
 *
 * Off unless an OTLP endpoint is configured (OTEL_EXPORTER_OTLP_ENDPOINT or
 * OTEL_EXPORTER_OTLP_TRACES_ENDPOINT): then no SDK module is even loaded, and every hook is one check
 * of `tracer` before it calls straight through. docs/guides/tracing.md is the operator's side.
 *
 * Attributes name the tool, family, job, outcome and cost, and the account only hashed; never a key,
 * a token, an input or a URL (a URL is a caller's input).
 */
import { createHash } from 'node:crypto';
import { context, propagation, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type Attributes, type Context, type Span, type Tracer } from '@opentelemetry/api';

/** Null while tracing is off: the one check every hook makes. */
let tracer: Tracer | null = null;
/** BullMQ's own producer telemetry (bullmq-otel), for the queues and flows; undefined while off. */
let queueTelemetry: unknown;

export const tracingOn = (): boolean => tracer !== null;

/** Whether the environment asks for traces: an OTLP endpoint, and neither OTEL_SDK_DISABLED nor OTEL_TRACES_EXPORTER=none. */
export function tracingWanted(env: NodeJS.ProcessEnv = process.env): boolean {
  const endpoint = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim() || env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim();
  if (!endpoint) return false;
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === 'true') return false;
  return (env.OTEL_TRACES_EXPORTER?.trim().toLowerCase() ?? 'otlp') !== 'none';
}

/**
 * Starts the SDK when the environment asks for it: spans batched and sent as OTLP/HTTP JSON to the
 * configured endpoint (the exporter reads the OTEL_EXPORTER_OTLP_* variables itself, the sampler
 * OTEL_TRACES_SAMPLER), W3C trace context as the propagator. Returns the stop that flushes what is
 * left, or null when tracing stays off. Call it before the container is built: the queues take
 * BullMQ's telemetry when they are made.
 */
export async function startTracing(
  service: 'tollgate-api' | 'tollgate-worker',
  warn: (message: string) => void = () => {},
): Promise<(() => Promise<void>) | null> {
  if (tracer || !tracingWanted()) return null;
  const protocol = (process.env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL ?? process.env.OTEL_EXPORTER_OTLP_PROTOCOL)?.trim();
  if (protocol && protocol !== 'http/json') warn(`OTEL_EXPORTER_OTLP_PROTOCOL=${protocol} is not supported: traces are sent as http/json`);
  // Loaded only now, so a process without tracing never loads the SDK.
  const [{ NodeTracerProvider, BatchSpanProcessor }, { W3CTraceContextPropagator }, { OTLPTraceExporter }, resources, { BullMQOtel }] = await Promise.all([
    import('@opentelemetry/sdk-trace-node'),
    import('@opentelemetry/core'),
    import('@opentelemetry/exporter-trace-otlp-http'),
    import('@opentelemetry/resources'),
    import('bullmq-otel'),
  ]);
  // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the name given here.
  const resource = resources
    .defaultResource()
    .merge(resources.resourceFromAttributes({ 'service.name': service }))
    .merge(resources.detectResources({ detectors: [resources.envDetector] }));
  const provider = new NodeTracerProvider({ resource, spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter())] });
  // The global provider and AsyncLocalStorage context. The propagator is W3C trace context alone: a
  // caller's `baggage` header is not carried into jobs or anywhere else.
  provider.register({ propagator: new W3CTraceContextPropagator() });
  tracer = trace.getTracer('tollgate');
  queueTelemetry = new BullMQOtel('tollgate');
  return async () => {
    tracer = null;
    queueTelemetry = undefined;
    await provider.shutdown();
  };
}

/** The `telemetry` option for BullMQ's Queue and FlowProducer (their `add` spans carry the context into the job), or undefined. */
export function bullmqTelemetry<T>(): T | undefined {
  return queueTelemetry as T | undefined;
}

/** Names the account in a span without naming it: a short SHA-256 of its id. */
export function accountHash(accountId: string | null | undefined): string | undefined {
  return accountId ? createHash('sha256').update(accountId).digest('hex').slice(0, 16) : undefined;
}

/** A call's attributes, the same on the API's spans and the worker's: the account only hashed. */
export function callAttributes(c: { tool: string; family: string; jobId: string; accountId: string | null }): Attributes {
  return {
    'tollgate.tool': c.tool,
    'tollgate.family': c.family,
    'tollgate.job_id': c.jobId,
    ...(c.accountId ? { 'tollgate.account': accountHash(c.accountId) } : {}),
  };
}

/** Marks a span failed with the error's code (an AppError's) or its class name; never its message. */
function failed(span: Span, e: unknown): void {
  const code = (e as { code?: unknown })?.code;
  span.setStatus({ code: SpanStatusCode.ERROR, message: typeof code === 'string' ? code : (e as Error)?.name });
  if (typeof code === 'string') span.setAttribute('tollgate.outcome', code);
}

/**
 * Runs `fn` inside a span named `name` (a child of the active one, or of `parent`), ending it when `fn`
 * settles. While tracing is off it is `fn()`.
 */
export function traced<T>(name: string, fn: () => Promise<T>, attributes?: Attributes, opts: { kind?: SpanKind; parent?: Context } = {}): Promise<T> {
  if (!tracer) return fn();
  return tracer.startActiveSpan(name, { kind: opts.kind ?? SpanKind.INTERNAL, attributes }, opts.parent ?? context.active(), async (span) => {
    try {
      return await fn();
    } catch (e) {
      failed(span, e);
      throw e;
    } finally {
      span.end();
    }
  });
}

/** Adds attributes to the active span (say the cost, once settled). */
export function annotate(attributes: Attributes): void {
  if (tracer) trace.getActiveSpan()?.setAttributes(attributes);
}

/** Records a span that already happened (the queue wait: from enqueue until a worker took the job). */
export function recordSpan(name: string, start: number, end: number, attributes: Attributes, parent: Context): void {
  if (!tracer || !(end >= start)) return;
  tracer.startSpan(name, { startTime: start, attributes }, parent).end(end);
}

/**
 * The context a job was queued in, from the W3C carrier BullMQ's telemetry stored with it (the job's
 * `opts.telemetry.metadata`, a JSON object such as {"traceparent": "00-..."}): a worker on any machine
 * continues the caller's trace from there. Null while off or when the job carries none.
 */
export function jobContext(metadata: string | undefined): Context | null {
  if (!tracer || !metadata) return null;
  try {
    const carrier = JSON.parse(metadata) as unknown;
    if (!carrier || typeof carrier !== 'object') return null;
    return propagation.extract(ROOT_CONTEXT, carrier);
  } catch {
    return null;
  }
}

// ---------------------------------------------------------------------------------------------
// HTTP server spans (faces/http/plugins/tracing.ts installs them on Fastify).

/** A request's server span and the context to run its handler in. */
export interface RequestTrace {
  span: Span;
  context: Context;
  /** The W3C `traceresponse` value the answer carries: the caller's trace id and this span's id. */
  traceresponse: string;
}

/**
 * Starts the server span of an incoming request, continuing the caller's `traceparent` when it is a
 * valid one (an invalid one is ignored: a new trace starts). `route` is the route's pattern, never
 * the raw URL (a path may hold a secret: the one-time sign-in link). Null while off.
 */
export function startRequestTrace(method: string, route: string, headers: Record<string, unknown>): RequestTrace | null {
  if (!tracer) return null;
  const parent = propagation.extract(ROOT_CONTEXT, headers);
  const span = tracer.startSpan(`${method} ${route}`, { kind: SpanKind.SERVER, attributes: { 'http.request.method': method, 'http.route': route } }, parent);
  const sc = span.spanContext();
  const flags = (sc.traceFlags & 1).toString(16).padStart(2, '0');
  return { span, context: trace.setSpan(parent, span), traceresponse: `00-${sc.traceId}-${sc.spanId}-${flags}` };
}

/** Ends a request's server span with its status (5xx marks it failed). */
export function endRequestTrace(t: RequestTrace, status: number, aborted = false): void {
  t.span.setAttribute('http.response.status_code', status);
  if (status >= 500 || aborted) t.span.setStatus({ code: SpanStatusCode.ERROR, message: aborted ? 'aborted' : String(status) });
  t.span.end();
}

/** Runs `fn` (a Fastify hook's `done`) with the request's context active, so its handler's spans are children. */
export function withContext<T>(ctx: Context, fn: () => T): T {
  return context.with(ctx, fn);
}

export { SpanKind };
