import { randomUUID } from 'node:crypto';
import { bearerToken, sameSecret } from './operator-token.js';
import { createServer, type Server } from 'node:http';
import { once } from 'node:events';
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import { FAMILIES, type Family } from '../config.js';
import { AppError, envelope } from '../errors.js';

/** Error codes counted as refusals (tollgate_refusals_total{reason}). */
const REFUSALS: ReadonlySet<string> = new Set([
  'rate_limited',
  'concurrency_limited',
  'payment_required',
  'payment_invalid',
  'payment_already_used',
  'insufficient_credits',
  'monthly_limit_exceeded',
]);

const QUEUE_STATES = ['waiting', 'active', 'delayed', 'failed', 'completed'] as const;

/** Job counts per state of one family's queue (BullMQ's Queue.getJobCounts). */
export type QueueCounts = (family: Family) => Promise<Record<string, number>>;
/** Live worker processes per family (the heartbeats, src/queue/heartbeat.ts). */
export type WorkerCounts = () => Promise<Record<Family, number>>;

/**
 * A read that gives up after `ms` (null then, or when it fails), so a Redis or Postgres outage cannot
 * hang /metrics, /health or /readyz.
 */
export async function within<T>(ms: number, f: () => Promise<T>): Promise<T | null> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([f(), new Promise<never>((_, rej) => (timer = setTimeout(() => rej(new Error('timeout')), ms)))]);
  } catch {
    return null;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The Prometheus metrics of one process, in a registry of their own (never prom-client's global one),
 * so several containers in one process (tests) keep separate counts. Built by the container and
 * handed to what records into it.
 */
export class Metrics {
  readonly registry = new Registry();
  readonly httpRequests: Counter<'route' | 'method' | 'status'>;
  readonly httpDuration: Histogram<'route' | 'method'>;
  readonly toolCalls: Counter<'tool' | 'family' | 'outcome'>;
  readonly toolRunSeconds: Histogram<'tool' | 'family'>;
  readonly queueWaitSeconds: Histogram<'family'>;
  readonly settlementBatches: Counter;
  readonly settlementBatchSize: Histogram;
  readonly settlementSeconds: Histogram;
  readonly centsCharged: Counter<'tool'>;
  readonly refusals: Counter<'reason'>;

  constructor(opts: { defaultMetrics?: boolean } = {}) {
    const registers = [this.registry];
    this.httpRequests = new Counter({
      name: 'tollgate_http_requests_total',
      help: 'HTTP requests answered, by route pattern, method and status code',
      labelNames: ['route', 'method', 'status'],
      registers,
    });
    this.httpDuration = new Histogram({
      name: 'tollgate_http_request_duration_seconds',
      help: 'Time to answer an HTTP request, by route pattern and method',
      labelNames: ['route', 'method'],
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers,
    });
    this.toolCalls = new Counter({
      name: 'tollgate_tool_calls_total',
      help: 'Tool calls finished by the workers of this process, by outcome (ok or the error code)',
      labelNames: ['tool', 'family', 'outcome'],
      registers,
    });
    this.toolRunSeconds = new Histogram({
      name: 'tollgate_tool_run_seconds',
      help: 'Time a worker spent on a tool call (run and settlement)',
      labelNames: ['tool', 'family'],
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers,
    });
    this.queueWaitSeconds = new Histogram({
      name: 'tollgate_tool_queue_wait_seconds',
      help: 'Time a job waited in its queue before a worker took it (first attempt)',
      labelNames: ['family'],
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers,
    });
    this.settlementBatches = new Counter({
      name: 'tollgate_settlement_batches_total',
      help: 'Settlement statements run (one per batch of finished calls)',
      registers,
    });
    this.settlementBatchSize = new Histogram({
      name: 'tollgate_settlement_batch_size',
      help: 'Finished calls written by one settlement statement',
      buckets: [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000],
      registers,
    });
    this.settlementSeconds = new Histogram({
      name: 'tollgate_settlement_seconds',
      help: 'Time of one settlement statement',
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers,
    });
    this.centsCharged = new Counter({
      name: 'tollgate_cents_charged_total',
      help: 'Cents charged to accounts by settled calls, by tool',
      labelNames: ['tool'],
      registers,
    });
    this.refusals = new Counter({
      name: 'tollgate_refusals_total',
      help: 'Requests refused by a limit or for payment, by reason (the error code)',
      labelNames: ['reason'],
      registers,
    });
    if (opts.defaultMetrics !== false) {
      collectDefaultMetrics({ register: this.registry });
      // prom-client's sums of the per-type gauges above are gauges named like counters, which
      // `promtool check metrics` rejects; sum(nodejs_active_handles) gives the same number.
      for (const name of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total'])
        this.registry.removeSingleMetric(name);
    }
  }

  /** Counts a refused request when `code` is a refusal (rate, concurrency or payment); other codes are ignored. */
  refused(code: string): void {
    if (REFUSALS.has(code)) this.refusals.inc({ reason: code });
  }

  /**
   * Deployment-wide gauges read at scrape time: job counts per family and state, and live workers
   * per family. Registered once per process that serves the API (a worker process would repeat them).
   */
  watchDeployment(queueCounts: QueueCounts, workerCounts: WorkerCounts): void {
    new Gauge({
      name: 'tollgate_queue_jobs',
      help: 'Jobs in each family queue by state, read from BullMQ at scrape time',
      labelNames: ['family', 'state'],
      registers: [this.registry],
      async collect() {
        const all = await Promise.all(FAMILIES.map((f) => within(1000, () => queueCounts(f))));
        this.reset();
        FAMILIES.forEach((family, i) => {
          const counts = all[i];
          if (!counts) return;
          for (const state of QUEUE_STATES) this.set({ family, state }, Number(counts[state] ?? 0));
        });
      },
    });
    new Gauge({
      name: 'tollgate_workers_live',
      help: 'Live worker processes per family, from their heartbeats',
      labelNames: ['family'],
      registers: [this.registry],
      async collect() {
        const counts = await within(1000, workerCounts);
        this.reset();
        if (counts) for (const family of FAMILIES) this.set({ family }, counts[family] ?? 0);
      },
    });
  }

  /** The text exposition and its content type. */
  async scrape(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }

  close(): void {
    this.registry.clear();
  }
}

/** True when METRICS_TOKEN is unset, or the Authorization header carries it as a bearer (constant time). */
export function metricsAuthorized(token: string, authorization: string | undefined): boolean {
  return !token || sameSecret(bearerToken(authorization), token);
}

export function metricsUnauthorized(): AppError {
  return new AppError('unauthorized', 'GET /metrics needs Authorization: Bearer <METRICS_TOKEN>');
}

/** What /readyz answers: 200 when `ready`, else 503, with `body` as JSON (src/ops/readiness.ts). */
export type ReadinessProbe = () => Promise<{ ready: boolean; body: object }>;

/**
 * A process's own listener on METRICS_PORT (workers, and the API once it listens): GET /metrics (with
 * METRICS_TOKEN as a bearer when set), and the probes an orchestrator polls without a token: GET /livez
 * (200 while the process runs, nothing checked) and, given `ready`, GET /readyz (200 or 503). Anything
 * else is 404, all in the service's error envelope. The port is meant to stay off the public network.
 */
export async function serveMetrics(metrics: Metrics, opts: { port: number; host: string; token: string; ready?: ReadinessProbe }): Promise<Server> {
  const server = createServer((req, res) => {
    const requestId = randomUUID();
    const send = (status: number, body: object) => {
      res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store', 'x-request-id': requestId });
      res.end(req.method === 'HEAD' ? undefined : JSON.stringify(body));
    };
    const fail = (err: AppError) => {
      res.writeHead(err.status, { 'content-type': 'application/json; charset=utf-8', 'x-request-id': requestId, ...err.headers });
      res.end(JSON.stringify(envelope(err, requestId)));
    };
    const path = (req.url ?? '/').split('?')[0];
    const served = ['/metrics', '/livez', ...(opts.ready ? ['/readyz'] : [])];
    if (!served.includes(path!) || (req.method !== 'GET' && req.method !== 'HEAD')) {
      return fail(new AppError('not_found', `No route ${req.method} ${path}. This listener serves GET ${served.join(', ')}.`));
    }
    if (path === '/livez') return send(200, { status: 'ok' });
    if (path === '/readyz') {
      return void opts.ready!().then(
        ({ ready, body }) => send(ready ? 200 : 503, body),
        () => fail(new AppError('internal_error', 'Could not check readiness')),
      );
    }
    if (!metricsAuthorized(opts.token, req.headers.authorization)) return fail(metricsUnauthorized());
    metrics.scrape().then(
      ({ contentType, body }) => {
        res.writeHead(200, { 'content-type': contentType, 'x-request-id': requestId });
        res.end(req.method === 'HEAD' ? undefined : body);
      },
      () => fail(new AppError('internal_error', 'Could not collect the metrics')),
    );
  });
  server.listen(opts.port, opts.host);
  await once(server, 'listening');
  return server;
}
