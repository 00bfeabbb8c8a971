/**
 * @tollgate/client: a typed client for Tollgate's HTTP API.
 *
 * Tool calls (sync, async jobs, resumable Server-Sent Events), balance, cancellation, retries with
 * automatic idempotency keys, typed errors and Standard Webhooks verification. No runtime
 * dependencies beyond the global `fetch` and `node:crypto`.
 */
import { createHmac, randomUUID, timingSafeEqual } from 'node:crypto';
import type { components, paths } from './api.js';

export type { components, operations, paths } from './api.js';

type Schemas = components['schemas'];

export type Balance = Schemas['Balance'];
export type CancelledJob = Schemas['CancelledJob'];
export type JobStatus = Schemas['JobStatus'];
export type JobAccepted = Schemas['JobAccepted'];
export type WebhookSecret = Schemas['WebhookSecret'];
/** Every error code the service answers with (its `ERROR_STATUS` table). */
export type ErrorCode = Schemas['ErrorCode'];

// ---------------------------------------------------------------------------------------------
// Per-tool types, read off the generated `paths['/tools/<name>']['post']`.

/** The names of the tools the generated document describes (each has a `POST /tools/<name>`). */
export type ToolName = {
  [P in keyof paths]: P extends `/tools/${infer N}` ? (paths[P] extends { post: object } ? N : never) : never;
}[keyof paths];

type ToolOperation<N extends string> = `/tools/${N}` extends keyof paths ? (paths[`/tools/${N}`] extends { post: infer O } ? O : never) : never;

/** A tool's input: its request body in the generated document; any JSON object for a tool it does not name. */
export type ToolInput<N extends string> = [ToolOperation<N>] extends [never]
  ? Record<string, unknown>
  : ToolOperation<N> extends { requestBody?: { content: { 'application/json': infer I } } }
    ? I
    : Record<string, unknown>;

/** A tool's `result`: what its 200 answer documents; `unknown` for a tool the document does not name. */
export type ToolResult<N extends string> = [ToolOperation<N>] extends [never]
  ? unknown
  : ToolOperation<N> extends { responses: { 200: { content: { 'application/json': infer R } } } }
    ? R extends { result?: infer X }
      ? Exclude<X, undefined>
      : unknown
    : unknown;

/** A successful call's body: `{ result, cost_cents, remaining_credits }` (`sandbox: true` for sandbox keys). */
export interface CallResult<R = unknown> {
  result: R;
  cost_cents: number;
  /** null for calls paid per call (x402). */
  remaining_credits: number | null;
  sandbox?: true;
  [key: string]: unknown;
}

/** The error envelope every failure carries. */
export interface ErrorEnvelope {
  error: { code: ErrorCode | (string & {}); message: string; request_id?: string; [key: string]: unknown };
}

/** One Server-Sent Event, its `data` parsed as JSON. `id` is null for an event sent without one. */
export type StreamEvent<R = unknown> =
  | { event: 'queued'; id: string | null; data: { job_id: string; [key: string]: unknown } }
  | { event: 'progress'; id: string | null; data: Record<string, unknown> }
  | { event: 'step'; id: string | null; data: Record<string, unknown> }
  | { event: 'result'; id: string | null; data: CallResult<R> }
  | { event: 'error'; id: string | null; data: ErrorEnvelope };

// ---------------------------------------------------------------------------------------------
// Errors

export interface TollgateErrorInit {
  status: number;
  code: string;
  message: string;
  requestId?: string | undefined;
  retryAfter?: number | undefined;
  details?: Record<string, unknown>;
}

/** Any error the service answered with (or, with status 0, no answer at all). */
export class TollgateError extends Error {
  /** HTTP status; 0 when no response arrived. */
  readonly status: number;
  /** The envelope's `error.code` (`insufficient_credits`, `rate_limited`, …). */
  readonly code: ErrorCode | (string & {});
  /** The envelope's `request_id` (or the X-Request-Id header). */
  readonly requestId: string | undefined;
  /** Seconds to wait before trying again: Retry-After, else the envelope's `retry_after`. */
  readonly retryAfter: number | undefined;
  /** Every other member of the envelope's `error` (`issues`, `required_cents`, `job_id`, …). */
  readonly details: Record<string, unknown>;

  constructor(init: TollgateErrorInit) {
    super(init.message);
    this.name = new.target.name;
    this.status = init.status;
    this.code = init.code;
    this.requestId = init.requestId;
    this.retryAfter = init.retryAfter;
    this.details = init.details ?? {};
  }
}
/** 400: the body or a parameter failed validation (`details.issues` says where). */
export class InvalidInputError extends TollgateError {}
/** 401: no key, a malformed key, or a key that does not exist or was revoked. */
export class AuthenticationError extends TollgateError {}
/** 402: not enough credits, a sub-key's monthly limit, or payment required. */
export class PaymentRequiredError extends TollgateError {}
/** 403: plan below the tool's tier, tool not allowed for a sub-key, forbidden. */
export class PermissionDeniedError extends TollgateError {}
/** 404: unknown tool, job or route. */
export class NotFoundError extends TollgateError {}
/** 409: idempotency key in use, a cancelled job, a job already finished. */
export class ConflictError extends TollgateError {}
/** 429: rate or concurrency limit; `retryAfter` says when to try again. */
export class RateLimitedError extends TollgateError {}
/** 503: Redis or Postgres unreachable, or the tool's upstream down; nothing was charged. */
export class ServiceUnavailableError extends TollgateError {}
/** No response: the connection failed or dropped (status 0). */
export class ConnectionError extends TollgateError {}
/** `wait()` gave up before the job finished (the job runs on). */
export class WaitTimeoutError extends TollgateError {}

const ERROR_CLASSES: Record<number, typeof TollgateError> = {
  400: InvalidInputError,
  401: AuthenticationError,
  402: PaymentRequiredError,
  403: PermissionDeniedError,
  404: NotFoundError,
  409: ConflictError,
  429: RateLimitedError,
  503: ServiceUnavailableError,
};

function errorFromBody(status: number, body: unknown, headers: Headers | undefined): TollgateError {
  const env = (body && typeof body === 'object' ? (body as Record<string, unknown>).error : undefined) as Record<string, unknown> | string | undefined;
  const fields = env && typeof env === 'object' ? env : {};
  const { code, message, request_id, ...details } = fields;
  const fromHeader = headers ? parseRetryAfter(headers.get('retry-after')) : undefined;
  const fromBody = typeof details.retry_after === 'number' ? details.retry_after : undefined;
  const Cls = ERROR_CLASSES[status] ?? TollgateError;
  return new Cls({
    status,
    code: typeof code === 'string' ? code : status === 402 ? 'payment_required' : 'http_error',
    message: typeof message === 'string' ? message : typeof env === 'string' ? env : `HTTP ${status}`,
    requestId: typeof request_id === 'string' ? request_id : (headers?.get('x-request-id') ?? undefined),
    retryAfter: fromHeader ?? fromBody,
    details: env && typeof env === 'object' ? details : body && typeof body === 'object' ? { body } : {},
  });
}

async function errorFromResponse(res: Response): Promise<TollgateError> {
  const text = await res.text().catch(() => '');
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = text ? { error: text } : undefined;
  }
  return errorFromBody(res.status, body, res.headers);
}

/** Retry-After as seconds: delta-seconds or an HTTP date. */
function parseRetryAfter(value: string | null): number | undefined {
  if (!value) return undefined;
  if (/^\d+(\.\d+)?$/.test(value.trim())) return Number(value);
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, Math.ceil((at - Date.now()) / 1000));
}

// ---------------------------------------------------------------------------------------------
// Client

export interface TollgateOptions {
  /** `Authorization: Bearer <apiKey>`: a `cv_…` key. */
  apiKey: string;
  /** Where the service answers; default `http://localhost:8080`. */
  baseUrl?: string;
  /** Retries after a network error, 429 or 503 (Retry-After honoured); default 2. */
  maxRetries?: number;
  /** A fetch to use instead of the global one. */
  fetch?: typeof fetch;
}

export interface RequestOptions {
  signal?: AbortSignal;
  /** Overrides the client's maxRetries for this request. */
  maxRetries?: number;
  /** Extra request headers. */
  headers?: Record<string, string>;
}

export interface ToolCallOptions extends RequestOptions {
  /** Sent as Idempotency-Key; one is made (crypto.randomUUID) per call when left out, and reused on its retries. */
  idempotencyKey?: string;
  /** Sent as Callback-Url: the job's outcome is POSTed there, signed (see verifyWebhook). */
  callbackUrl?: string;
}

export interface WaitOptions {
  /** Give up (WaitTimeoutError) after this long; default 10 minutes. */
  timeoutMs?: number;
  /** Time between polls of GET /jobs/{id}; default 500 ms. */
  pollMs?: number;
  signal?: AbortSignal;
}

export interface CallOptions extends ToolCallOptions, Omit<WaitOptions, 'signal'> {}

export interface StreamOptions extends ToolCallOptions {
  /** Reconnections in a row that deliver no event before the stream gives up (ConnectionError); default 5. */
  maxReconnects?: number;
}

interface SendOptions extends RequestOptions {
  body?: unknown;
}

const BACKOFF_BASE_MS = 500;
const BACKOFF_MAX_MS = 8000;

function backoff(attempt: number): number {
  const ms = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** attempt);
  return ms / 2 + Math.random() * (ms / 2);
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  if (signal?.aborted) return Promise.reject(abortError(signal));
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortError(signal));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

function abortError(signal: AbortSignal | undefined): unknown {
  return signal?.reason ?? new DOMException('The operation was aborted', 'AbortError');
}

function toolPath(tool: string): string {
  return `/tools/${encodeURIComponent(tool)}`;
}

function jobPath(jobId: string): string {
  return `/jobs/${encodeURIComponent(jobId)}`;
}

function isEventStream(res: Response): boolean {
  return (res.headers.get('content-type') ?? '').toLowerCase().startsWith('text/event-stream');
}

export class Tollgate {
  readonly baseUrl: string;
  readonly maxRetries: number;
  private readonly apiKey: string;
  private readonly fetchImpl: typeof fetch;

  constructor(opts: TollgateOptions) {
    if (!opts?.apiKey) throw new TypeError('Tollgate: apiKey is required');
    this.apiKey = opts.apiKey;
    this.baseUrl = (opts.baseUrl ?? 'http://localhost:8080').replace(/\/+$/, '');
    this.maxRetries = Math.max(0, opts.maxRetries ?? 2);
    const f = opts.fetch ?? globalThis.fetch;
    if (typeof f !== 'function') throw new TypeError('Tollgate: no fetch available (Node 20+ has a global one; or pass opts.fetch)');
    this.fetchImpl = f;
  }

  /**
   * Runs a tool and answers its body `{ result, cost_cents, remaining_credits }`. When the service
   * answers 202 (the job outlived SYNC_TIMEOUT_MS), waits for the job. Retried (same
   * Idempotency-Key) after a network error, 429 or 503.
   */
  async call<N extends ToolName | (string & {})>(tool: N, input: ToolInput<N>, opts: CallOptions = {}): Promise<CallResult<ToolResult<N>>> {
    const res = await this.send('POST', toolPath(tool), { ...opts, body: input ?? {}, headers: this.toolHeaders(opts) });
    const body = (await res.json()) as Record<string, unknown>;
    if (res.status === 202) {
      const jobId = String(body.job_id ?? res.headers.get('x-job-id'));
      return this.wait<ToolResult<N>>(jobId, { timeoutMs: opts.timeoutMs, pollMs: opts.pollMs, signal: opts.signal });
    }
    return body as CallResult<ToolResult<N>>;
  }

  /** Queues a tool call (`Prefer: respond-async`) and answers `{ job_id, status, status_url }` at once. */
  async submit<N extends ToolName | (string & {})>(tool: N, input: ToolInput<N>, opts: ToolCallOptions = {}): Promise<JobAccepted> {
    const headers = { ...this.toolHeaders(opts), prefer: 'respond-async' };
    const res = await this.send('POST', toolPath(tool), { ...opts, body: input ?? {}, headers });
    const body = (await res.json()) as Record<string, unknown>;
    if (res.status === 202) return body as JobAccepted;
    // An idempotent replay of a call that had answered 200: it already ran.
    const jobId = res.headers.get('x-job-id') ?? String(body.job_id ?? '');
    return { job_id: jobId, status: 'completed', status_url: jobPath(jobId) };
  }

  /**
   * Polls `GET /jobs/{id}` until the job is neither queued nor running and answers its body. A job
   * that failed or was cancelled throws its error (a cancelled one: ConflictError, code `cancelled`).
   */
  async wait<R = unknown>(jobId: string, opts: WaitOptions = {}): Promise<CallResult<R>> {
    const timeoutMs = opts.timeoutMs ?? 600_000;
    const pollMs = Math.max(10, opts.pollMs ?? 500);
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const job = await this.getJob(jobId, { signal: opts.signal });
      if (job.status !== 'queued' && job.status !== 'running') return job as unknown as CallResult<R>;
      if (Date.now() + pollMs > deadline) {
        throw new WaitTimeoutError({
          status: 0,
          code: 'wait_timeout',
          message: `Job ${jobId} had not finished after ${timeoutMs} ms`,
          details: { job_id: jobId },
        });
      }
      await sleep(pollMs, opts.signal);
    }
  }

  /** `GET /jobs/{id}`: the status while it runs, the finished body after; a failed or cancelled job throws its error. */
  async getJob(jobId: string, opts: RequestOptions = {}): Promise<JobStatus> {
    const res = await this.send('GET', jobPath(jobId), opts);
    return (await res.json()) as JobStatus;
  }

  /** `DELETE /jobs/{id}`: cancels a queued or running job (not charged). One that already finished throws ConflictError `job_finished`. */
  async cancel(jobId: string, opts: RequestOptions = {}): Promise<CancelledJob> {
    const res = await this.send('DELETE', jobPath(jobId), opts);
    return (await res.json()) as CancelledJob;
  }

  /** `GET /balance`: credits (cents), plan, this month's use and the key's type. */
  async balance(opts: RequestOptions = {}): Promise<Balance> {
    const res = await this.send('GET', '/balance', opts);
    return (await res.json()) as Balance;
  }

  /** `GET /webhooks/secret`: the account's signing secret (`whsec_…`), made the first time. Production key only. */
  async webhookSecret(opts: RequestOptions = {}): Promise<WebhookSecret> {
    const res = await this.send('GET', '/webhooks/secret', opts);
    return (await res.json()) as WebhookSecret;
  }

  /**
   * Streams a tool call's Server-Sent Events (`queued`, `progress`, `step`, then `result` or
   * `error`) as `{ event, id, data }`. If the connection drops, it reconnects to
   * `GET /jobs/{id}/events` with the last `Last-Event-ID` seen, so no event is lost or repeated.
   * It ends after `result` or `error`; `opts.signal` aborts it (the job itself runs on).
   */
  async *stream<N extends ToolName | (string & {})>(
    tool: N,
    input: ToolInput<N>,
    opts: StreamOptions = {},
  ): AsyncGenerator<StreamEvent<ToolResult<N>>, void, undefined> {
    const { signal } = opts;
    const maxReconnects = opts.maxReconnects ?? 5;
    const headers = { ...this.toolHeaders(opts), accept: 'text/event-stream' };
    let res = await this.send('POST', toolPath(tool), { ...opts, body: input ?? {}, headers });
    let jobId = res.headers.get('x-job-id');
    if (!isEventStream(res)) {
      // Not a stream (an idempotent replay answers with the first response's JSON): one result.
      const body = (await res.json()) as Record<string, unknown>;
      const data = res.status === 202 ? await this.wait<ToolResult<N>>(String(body.job_id ?? jobId), { signal }) : (body as CallResult<ToolResult<N>>);
      yield { event: 'result', id: null, data };
      return;
    }
    let lastId: string | null = null;
    let reconnectMs = 250;
    let barren = 0;
    for (;;) {
      let delivered = false;
      try {
        if (!res.body) throw new Error('no body');
        for await (const raw of parseSse(res.body)) {
          if (raw.retry !== undefined) reconnectMs = Math.min(raw.retry, 5000);
          if (raw.event === undefined) continue;
          delivered = true;
          if (raw.id !== null) lastId = raw.id;
          const ev = toStreamEvent<ToolResult<N>>(raw.event, raw.id, raw.data);
          if (ev.event === 'queued' && !jobId && typeof ev.data.job_id === 'string') jobId = ev.data.job_id;
          yield ev;
          if (ev.event === 'result' || ev.event === 'error') return;
        }
      } catch (err) {
        if (signal?.aborted) throw abortError(signal);
        if (err instanceof TollgateError) throw err;
        // The connection dropped: resume below.
      }
      if (!jobId) throw new ConnectionError({ status: 0, code: 'connection_error', message: 'The event stream ended before it named its job' });
      barren = delivered ? 0 : barren + 1;
      if (barren > maxReconnects) {
        throw new ConnectionError({
          status: 0,
          code: 'connection_error',
          message: `The event stream of job ${jobId} kept dropping`,
          details: { job_id: jobId },
        });
      }
      if (barren > 0) await sleep(reconnectMs * barren, signal);
      res = await this.send('GET', `${jobPath(jobId)}/events`, {
        signal,
        maxRetries: opts.maxRetries,
        headers: { accept: 'text/event-stream', ...(lastId !== null ? { 'last-event-id': lastId } : {}) },
      });
      if (res.status === 204) {
        // Everything up to lastId was seen but the stream says it is over: take the outcome from the job.
        yield await this.finalEvent<ToolResult<N>>(jobId, signal);
        return;
      }
    }
  }

  private async finalEvent<R>(jobId: string, signal: AbortSignal | undefined): Promise<StreamEvent<R>> {
    try {
      return { event: 'result', id: null, data: await this.wait<R>(jobId, { signal }) };
    } catch (err) {
      if (!(err instanceof TollgateError) || err.status === 0) throw err;
      return { event: 'error', id: null, data: { error: { code: err.code, message: err.message, request_id: err.requestId, ...err.details } } };
    }
  }

  private toolHeaders(opts: ToolCallOptions): Record<string, string> {
    return {
      ...opts.headers,
      'idempotency-key': opts.idempotencyKey ?? randomUUID(),
      ...(opts.callbackUrl ? { 'callback-url': opts.callbackUrl } : {}),
    };
  }

  /**
   * One request, retried after a network error, 429 or 503 (Retry-After honoured) up to maxRetries
   * times with the same headers (so the same Idempotency-Key). Answers any 2xx; throws a
   * TollgateError for the rest.
   */
  private async send(method: string, path: string, opts: SendOptions): Promise<Response> {
    const retries = Math.max(0, opts.maxRetries ?? this.maxRetries);
    const headers: Record<string, string> = {
      accept: 'application/json',
      ...opts.headers,
      authorization: `Bearer ${this.apiKey}`,
    };
    let body: string | undefined;
    if (opts.body !== undefined) {
      headers['content-type'] = 'application/json';
      body = JSON.stringify(opts.body);
    }
    for (let attempt = 0; ; attempt++) {
      let res: Response;
      try {
        res = await this.fetchImpl(this.baseUrl + path, { method, headers, body, signal: opts.signal });
      } catch (err) {
        if (opts.signal?.aborted) throw abortError(opts.signal);
        if (attempt >= retries) {
          throw new ConnectionError({
            status: 0,
            code: 'connection_error',
            message: `${method} ${path}: ${err instanceof Error ? err.message : String(err)}`,
            details: { cause: err },
          });
        }
        await sleep(backoff(attempt), opts.signal);
        continue;
      }
      if (res.status >= 200 && res.status < 300) return res;
      if ((res.status === 429 || res.status === 503) && attempt < retries) {
        const after = parseRetryAfter(res.headers.get('retry-after'));
        await res.body?.cancel().catch(() => {});
        await sleep(after !== undefined ? after * 1000 : backoff(attempt), opts.signal);
        continue;
      }
      throw await errorFromResponse(res);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Server-Sent Events

interface RawEvent {
  /** undefined for a block that dispatches nothing (only `retry:` or `id:`). */
  event: string | undefined;
  id: string | null;
  data: string;
  retry: number | undefined;
}

/** Parses an SSE byte stream into blocks, as the EventSource spec reads them. */
async function* parseSse(body: ReadableStream<Uint8Array>): AsyncGenerator<RawEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  let event = '';
  let data: string[] = [];
  let id: string | null = null;
  let retry: number | undefined;
  let sawField = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return; // an unterminated last block is dropped, as EventSource does
      buf += decoder.decode(value, { stream: true });
      for (;;) {
        const m = /\r\n|\r|\n/.exec(buf);
        if (!m) break;
        // A lone \r at the end may be the first half of \r\n: wait for the next chunk.
        if (m[0] === '\r' && m.index === buf.length - 1) break;
        const line = buf.slice(0, m.index);
        buf = buf.slice(m.index + m[0].length);
        if (line === '') {
          if (sawField) yield { event: data.length > 0 ? event || 'message' : undefined, id, data: data.join('\n'), retry };
          event = '';
          data = [];
          id = null;
          retry = undefined;
          sawField = false;
          continue;
        }
        if (line.startsWith(':')) continue; // a comment: heartbeats
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        const val = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
        sawField = true;
        if (field === 'event') event = val;
        else if (field === 'data') data.push(val);
        else if (field === 'id' && !val.includes('\0')) id = val;
        else if (field === 'retry' && /^\d+$/.test(val)) retry = Number(val);
      }
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
}

function toStreamEvent<R>(event: string, id: string | null, data: string): StreamEvent<R> {
  let parsed: unknown = data;
  try {
    parsed = JSON.parse(data);
  } catch {
    // not JSON: leave the text
  }
  return { event, id, data: parsed } as StreamEvent<R>;
}

// ---------------------------------------------------------------------------------------------
// Webhooks

/** A delivery that does not verify: missing headers, a bad signature, or a timestamp outside the tolerance. */
export class WebhookVerificationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'WebhookVerificationError';
  }
}

export type HeadersLike = Headers | Record<string, string | string[] | undefined>;

function headerValue(headers: HeadersLike, name: string): string | undefined {
  if (typeof (headers as Headers).get === 'function') return (headers as Headers).get(name) ?? undefined;
  const rec = headers as Record<string, string | string[] | undefined>;
  const key = Object.keys(rec).find((k) => k.toLowerCase() === name);
  const v = key === undefined ? undefined : rec[key];
  return Array.isArray(v) ? v[0] : v;
}

export interface VerifyWebhookOptions {
  /** How far the `webhook-timestamp` may be from now, either way; default 300 s. */
  toleranceSeconds?: number;
}

/**
 * Verifies a Tollgate webhook delivery (Standard Webhooks) and answers its parsed body.
 *
 * `secret` is `GET /webhooks/secret`'s `whsec_…`; `rawBody` is the body exactly as received. The
 * signature is HMAC-SHA256 of `${webhook-id}.${webhook-timestamp}.${body}` keyed with the
 * base64-decoded bytes after `whsec_`, compared in constant time against every `v1,` entry of
 * `webhook-signature`. Throws WebhookVerificationError when anything does not match.
 */
export function verifyWebhook<T = unknown>(secret: string, headers: HeadersLike, rawBody: string | Uint8Array, opts: VerifyWebhookOptions = {}): T {
  const toleranceSeconds = opts.toleranceSeconds ?? 300;
  const id = headerValue(headers, 'webhook-id');
  const timestamp = headerValue(headers, 'webhook-timestamp');
  const signature = headerValue(headers, 'webhook-signature');
  if (!id || !timestamp || !signature) throw new WebhookVerificationError('Missing webhook-id, webhook-timestamp or webhook-signature header');
  if (!/^\d+$/.test(timestamp)) throw new WebhookVerificationError('Invalid webhook-timestamp');
  const skew = Math.floor(Date.now() / 1000) - Number(timestamp);
  if (skew > toleranceSeconds) throw new WebhookVerificationError('Message timestamp too old');
  if (skew < -toleranceSeconds) throw new WebhookVerificationError('Message timestamp too new');

  const key = Buffer.from(secret.startsWith('whsec_') ? secret.slice('whsec_'.length) : secret, 'base64');
  if (key.length === 0) throw new WebhookVerificationError('Empty webhook secret');
  const bytes = typeof rawBody === 'string' ? Buffer.from(rawBody, 'utf8') : Buffer.from(rawBody.buffer, rawBody.byteOffset, rawBody.byteLength);
  const expected = createHmac('sha256', key).update(`${id}.${timestamp}.`).update(bytes).digest();

  let ok = false;
  for (const entry of signature.split(' ')) {
    const comma = entry.indexOf(',');
    if (comma < 0 || entry.slice(0, comma) !== 'v1') continue;
    const given = Buffer.from(entry.slice(comma + 1), 'base64');
    if (given.length === expected.length && timingSafeEqual(given, expected)) ok = true;
  }
  if (!ok) throw new WebhookVerificationError('No matching signature found');
  try {
    return JSON.parse(bytes.toString('utf8')) as T;
  } catch {
    throw new WebhookVerificationError('The body is not JSON');
  }
}
