import { AppError } from '../../errors.js';
import type { ToolContext } from '../types.js';

/**
 * A thin client for Cloudflare's API v4, created per call with the caller's token. It never retries:
 * a read that fails transiently throws a retryable `upstream_error` so the job runs again, and a
 * write that may or may not have landed throws a final one, because repeating it blindly could
 * apply a change twice.
 */

export type WriteMethod = 'POST' | 'PUT' | 'PATCH' | 'DELETE';
export type Query = Record<string, string | number | boolean | undefined>;

export interface CfMessage {
  code: number;
  message: string;
}

export interface ResultInfo {
  page?: number;
  per_page?: number;
  count?: number;
  total_count?: number;
  total_pages?: number;
}

interface Envelope<T> {
  success: boolean;
  errors?: Array<CfMessage & { error_chain?: CfMessage[] }>;
  messages?: unknown[];
  result: T;
  result_info?: ResultInfo;
}

/** A part of a multipart upload (worker modules and their metadata). */
export interface MultipartPart {
  name: string;
  filename?: string;
  contentType: string;
  content: string;
}

/**
 * One change a tool will send. Tools plan their writes first (reads allowed), then either send them
 * or, for sandbox keys, return them as they are: the dry run shows exactly these.
 */
export interface PlannedWrite {
  method: WriteMethod;
  /** Path under the API base, with any query string, e.g. `/zones/{id}/dns_records`. */
  path: string;
  body?: unknown;
  multipart?: MultipartPart[];
}

/** Builds a path with every interpolated value URL-encoded: cfPath`/zones/${id}/dns_records`. */
export function cfPath(strings: TemplateStringsArray, ...values: Array<string | number>): string {
  return strings.reduce((acc, s, i) => acc + s + (i < values.length ? encodeURIComponent(String(values[i])) : ''), '');
}

export function withQuery(path: string, query: Query = {}): string {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== undefined) qs.set(k, String(v));
  const s = qs.toString();
  return s ? `${path}?${s}` : path;
}

/** Error codes Cloudflare uses for a missing, malformed, invalid or under-privileged token. */
const AUTH_CODES = new Set([6003, 6100, 6101, 6102, 6103, 6111, 9103, 9106, 9107, 9109, 10000]);
const DEFAULT_RETRY_AFTER = 60;

export class CfClient {
  private readonly base: string;
  private readonly token: string;

  constructor(private readonly ctx: ToolContext) {
    if (!ctx.edgeToken) {
      throw new AppError('invalid_input', 'Send your Cloudflare API token in the X-Edge-Token header (or edge_token in the body)');
    }
    this.token = ctx.edgeToken;
    this.base = ctx.config.CF_API_BASE_URL.replace(/\/+$/, '');
  }

  get sandbox(): boolean {
    return this.ctx.sandbox;
  }

  /** GET a single result. */
  async get<T>(path: string, query?: Query): Promise<T> {
    const env = await this.envelope<T>('GET', withQuery(path, query));
    return env.result;
  }

  /**
   * GET a list, following `page`/`per_page` until `result_info.total_pages` (or a short page) or
   * `max` items. Reports each page as progress.
   */
  async listAll<T>(path: string, query: Query = {}, opts: { perPage?: number; max?: number; what?: string } = {}) {
    const perPage = opts.perPage ?? 100;
    const max = opts.max ?? 5000;
    const items: T[] = [];
    let total: number | null = null;
    for (let page = 1; ; page++) {
      const env = await this.envelope<T[]>('GET', withQuery(path, { ...query, page, per_page: perPage }));
      const rows = Array.isArray(env.result) ? env.result : [];
      items.push(...rows);
      const info = env.result_info;
      total = info?.total_count ?? total;
      const pages = info?.total_pages;
      await this.ctx.progress({ stage: `listing ${opts.what ?? 'items'}`, done: page, total: pages, unit: 'pages' });
      const more = pages !== undefined ? page < pages : rows.length === perPage;
      if (!more || rows.length === 0) return { items, total: total ?? items.length, truncated: false };
      if (items.length >= max) return { items: items.slice(0, max), total: total ?? items.length, truncated: true };
    }
  }

  /** Sends one planned write and returns its `result`. */
  async write<T = unknown>(w: PlannedWrite): Promise<T> {
    const env = await this.envelope<T>(w.method, w.path, w.multipart ? { multipart: w.multipart } : { json: w.body });
    return env.result;
  }

  /** Runs a query against the GraphQL Analytics API (`POST /graphql`) and returns `data`. */
  async graphql<T>(query: string, variables: Record<string, unknown>): Promise<T> {
    const { status, json, headers } = await this.send('POST', '/graphql', { json: { query, variables } }, false);
    const body = json as { data?: T | null; errors?: Array<{ message?: string; path?: unknown[]; extensions?: { code?: string } }> | null } | undefined;
    const isGraphql = !!body && typeof body === 'object' && !('success' in body) && ('data' in body || 'errors' in body);
    if (!isGraphql || status === 429 || status === 401 || status === 403 || status >= 500) {
      // Auth failures, throttling and outages come back in the v4 envelope (or as plain HTTP errors).
      const asEnvelope = isGraphql ? { success: false, errors: (body.errors ?? []).map((e) => ({ code: 0, message: String(e.message ?? '') })) } : json;
      this.throwForEnvelope(status, headers, asEnvelope, false);
      throw new AppError('upstream_error', `Cloudflare's analytics API answered with an unexpected body (HTTP ${status})`);
    }
    const errors = body.errors ?? [];
    if (errors.length) {
      const list = errors.map((e) => ({ message: this.scrub(String(e.message ?? 'error')), code: e.extensions?.code ?? null, path: e.path ?? null }));
      const codes = list.map((e) => String(e.code ?? '').toLowerCase());
      const details = { cloudflare: { status, errors: list } };
      if (codes.some((c) => c === 'authz' || c === 'authn' || c === 'unauthorized')) {
        throw new AppError('edge_token_rejected', `Cloudflare refused the analytics query for this token: ${list[0]!.message}`, details, { retryable: false });
      }
      if (codes.some((c) => c.includes('rate') || c.includes('budget'))) {
        throw this.rateLimited(headers, details);
      }
      throw new AppError('tool_failed', `Cloudflare rejected the analytics query: ${list.map((e) => e.message).join('; ')}`, details);
    }
    if (status >= 400) throw new AppError('tool_failed', `Cloudflare rejected the analytics query (HTTP ${status})`, { cloudflare: { status, errors: [] } });
    if (body.data === null || body.data === undefined) {
      throw new AppError('upstream_error', "Cloudflare's analytics API returned no data");
    }
    return body.data;
  }

  private async envelope<T>(method: 'GET' | WriteMethod, path: string, payload: Payload = {}): Promise<Envelope<T>> {
    const write = method !== 'GET';
    const { status, headers, json } = await this.send(method, path, payload, write);
    this.throwForEnvelope(status, headers, json, write);
    return json as Envelope<T>;
  }

  /** Throws the mapped AppError when a v4 answer is a failure; returns when it is a success. */
  private throwForEnvelope(status: number, headers: Headers, json: unknown, write: boolean): void {
    const env = json && typeof json === 'object' ? (json as Partial<Envelope<unknown>>) : undefined;
    const errors = (env?.errors ?? []).map((e) => ({ code: Number(e.code), message: this.scrub(String(e.message ?? '')) }));
    const chain = (env?.errors ?? []).flatMap((e) => e.error_chain ?? []).map((e) => ({ code: Number(e.code), message: this.scrub(String(e.message ?? '')) }));
    const details = { cloudflare: { status, errors: [...errors, ...chain] } };
    const text = [...errors, ...chain].map((e) => `${e.message} (code ${e.code})`).join('; ');

    if (status === 429) throw this.rateLimited(headers, details);
    // An outage is not a token problem, whatever codes come with it; a 4xx with an auth code is.
    if (status === 401 || status === 403 || (status < 500 && [...errors, ...chain].some((e) => AUTH_CODES.has(e.code)))) {
      throw new AppError(
        'edge_token_rejected',
        `Cloudflare rejected the edge token, or it lacks the permission this call needs${text ? `: ${text}` : ''}`,
        details,
        { retryable: false },
      );
    }
    if (status >= 500) {
      throw new AppError(
        'upstream_error',
        write
          ? `Cloudflare failed with HTTP ${status} while applying a change; it may or may not have been applied, so check before trying again${text ? ` (${text})` : ''}`
          : `Cloudflare failed with HTTP ${status}${text ? `: ${text}` : ''}`,
        details,
        { retryable: !write },
      );
    }
    if (!env || typeof env.success !== 'boolean') {
      throw new AppError(
        'upstream_error',
        `Cloudflare answered HTTP ${status} with a body that is not its API envelope`,
        { cloudflare: { status } },
        { retryable: !write },
      );
    }
    if (status >= 400 || !env.success) {
      throw new AppError('tool_failed', `Cloudflare rejected the request: ${text || `HTTP ${status}`}`, details);
    }
  }

  private rateLimited(headers: Headers, details: Record<string, unknown>): AppError {
    const retryAfter = parseRetryAfter(headers.get('retry-after')) ?? DEFAULT_RETRY_AFTER;
    return new AppError(
      'rate_limited',
      `Cloudflare is rate limiting this token; try again in ${retryAfter} s`,
      { retry_after: retryAfter, ...details },
      { headers: { 'Retry-After': String(retryAfter) }, retryable: false },
    );
  }

  private async send(method: 'GET' | WriteMethod, path: string, payload: Payload, write: boolean) {
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.token}`,
      Accept: 'application/json',
      'User-Agent': 'tollgate-edge/1',
    };
    let body: string | FormData | undefined;
    if (payload.multipart) {
      const form = new FormData();
      for (const p of payload.multipart) {
        form.append(p.name, new Blob([p.content], { type: p.contentType }), p.filename ?? p.name);
      }
      body = form;
    } else if (payload.json !== undefined) {
      headers['Content-Type'] = 'application/json';
      body = JSON.stringify(payload.json);
    }

    const timeoutMs = this.ctx.config.CF_TIMEOUT_MS;
    const signal = AbortSignal.any([this.ctx.signal, AbortSignal.timeout(timeoutMs)]);
    const maybeApplied = write ? '; the change may or may not have been applied, so check before trying again' : '';
    let res: Response;
    try {
      res = await fetch(this.base + path, { method, headers, body, signal, redirect: 'error' });
    } catch (e) {
      if (this.ctx.signal.aborted) {
        throw new AppError('timeout', `The call was stopped before Cloudflare answered${maybeApplied}`, {}, { retryable: !write });
      }
      const timedOut = signal.aborted;
      const cause = (e as { cause?: { code?: string } }).cause?.code;
      throw new AppError(
        'upstream_error',
        timedOut ? `Cloudflare did not answer within ${timeoutMs} ms${maybeApplied}` : `Could not reach Cloudflare${cause ? ` (${cause})` : ''}${maybeApplied}`,
        {},
        { retryable: !write },
      );
    }
    let text: string;
    try {
      text = await res.text();
    } catch {
      throw new AppError('upstream_error', `Cloudflare's answer was cut off (HTTP ${res.status})${maybeApplied}`, {}, { retryable: !write });
    }
    let json: unknown;
    try {
      json = text ? JSON.parse(text) : undefined;
    } catch {
      json = undefined;
    }
    return { status: res.status, headers: res.headers, json };
  }

  /** Cloudflare's messages never should echo the token, but one in a result would leak it. */
  private scrub(s: string): string {
    return this.token.length >= 4 ? s.split(this.token).join('[redacted]') : s;
  }
}

interface Payload {
  json?: unknown;
  multipart?: MultipartPart[];
}

function parseRetryAfter(v: string | null): number | null {
  if (!v) return null;
  if (/^\d+$/.test(v.trim())) return Math.max(1, parseInt(v, 10));
  const at = Date.parse(v);
  if (Number.isNaN(at)) return null;
  return Math.max(1, Math.ceil((at - Date.now()) / 1000));
}

/** How a planned write looks in a dry run: method, path and the exact body. */
export function describeWrite(w: PlannedWrite): { method: WriteMethod; path: string; body?: unknown } {
  if (w.multipart) {
    return {
      method: w.method,
      path: w.path,
      body: {
        content_type: 'multipart/form-data',
        parts: w.multipart.map((p) => ({
          name: p.name,
          ...(p.filename ? { filename: p.filename } : {}),
          content_type: p.contentType,
          content: p.contentType === 'application/json' ? (JSON.parse(p.content) as unknown) : p.content,
        })),
      },
    };
  }
  return { method: w.method, path: w.path, ...(w.body !== undefined ? { body: w.body } : {}) };
}

export interface DryRun {
  dry_run: true;
  requests: Array<ReturnType<typeof describeWrite>>;
}

export function dryRun(writes: PlannedWrite[]): DryRun {
  return { dry_run: true, requests: writes.map(describeWrite) };
}
