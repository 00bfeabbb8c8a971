import { pipeline, type Readable } from 'node:stream';
import { z } from 'zod';
import zlib from 'node:zlib';
import { request } from 'undici';
import type { Config } from '../../config.js';
import { AppError, type ErrorCode } from '../../errors.js';
import type { GuardedHttp, GuardedRequest, GuardedResponse, ToolProgress } from '../types.js';
import { PinnedAgent, vetDestination } from './net-guard.js';
import { errorCode, type DnsResolver } from './resolver.js';
import { annotate, SpanKind, traced } from '../../tracing.js';

/**
 * The guarded client every tool that reads the web for a caller shares (page_fetch, the web and media
 * families; `ctx.http`). Each hop is resolved and vetted, the connection is pinned to the vetted
 * addresses (no second DNS answer can move it), redirects are vetted again, decoded bodies are capped
 * (a gzip bomb stops at the cap), the whole request has one deadline, and a process sends at most
 * WEB_PER_HOST requests at once to one host.
 */

export const MAX_REDIRECTS = 5;
const PROGRESS_EVERY_BYTES = 64 * 1024;
const REDIRECT_STATUSES = new Set([301, 302, 303, 307, 308]);

export interface GuardedHttpOptions {
  config: Config;
  resolver: DnsResolver;
  /** Named in error messages. */
  tool: string;
  signal: AbortSignal;
  progress?: (p: ToolProgress) => Promise<void>;
  /** The code network failures carry: `fetch_failed` (502) for the catalogue tools, `tool_failed` for page_fetch. */
  failCode?: ErrorCode;
  /** Caps when the request names none (and the ceiling it may not pass). */
  maxBytes?: number;
  timeoutMs?: number;
  userAgent?: string;
}

// ---------------------------------------------------------------------------------------------
// At most WEB_PER_HOST requests at once to one host, per process (politeness, and amplification
// bounded: a caller cannot aim one worker's whole concurrency at a single site).

const hostQueues = new Map<string, { running: number; waiting: Array<() => void> }>();

/** Waits for one of the host's WEB_PER_HOST slots; call the returned function to give it back. */
export async function acquireHostSlot(host: string, limit: number, signal: AbortSignal): Promise<() => void> {
  host = host.toLowerCase();
  let q = hostQueues.get(host);
  if (!q) {
    q = { running: 0, waiting: [] };
    hostQueues.set(host, q);
  }
  const entry = q;
  if (entry.running >= limit) {
    await new Promise<void>((resolve, reject) => {
      const go = () => {
        signal.removeEventListener('abort', onAbort);
        resolve();
      };
      const onAbort = () => {
        const i = entry.waiting.indexOf(go);
        if (i >= 0) entry.waiting.splice(i, 1);
        reject(signal.reason);
      };
      entry.waiting.push(go);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  } else {
    entry.running += 1;
  }
  let released = false;
  return () => {
    if (released) return;
    released = true;
    const next = entry.waiting.shift();
    if (next)
      next(); // the slot passes on
    else {
      entry.running -= 1;
      if (entry.running === 0) hostQueues.delete(host);
    }
  };
}

/** Requests in flight or waiting per host (tests check the per-host bound). */
export function hostLoad(host: string): number {
  const q = hostQueues.get(host.toLowerCase());
  return q ? q.running + q.waiting.length : 0;
}

// ---------------------------------------------------------------------------------------------

export function createGuardedHttp(o: GuardedHttpOptions): GuardedHttp {
  return { fetch: (url, opts) => tracedFetch(o, url, opts ?? {}) };
}

/** A client span per upstream request (redirects included), while tracing is on: method and status, never the URL (the caller's input). */
function tracedFetch(o: GuardedHttpOptions, url: string | URL, req: GuardedRequest): Promise<GuardedResponse> {
  const method = req.method ?? 'GET';
  const fetched = async () => {
    const res = await guardedFetch(o, url, req);
    annotate({ 'http.response.status_code': res.status, 'tollgate.redirects': res.redirects.length });
    return res;
  };
  return traced(`HTTP ${method}`, fetched, { 'http.request.method': method, 'tollgate.tool': o.tool }, { kind: SpanKind.CLIENT });
}

async function guardedFetch(o: GuardedHttpOptions, raw: string | URL, req: GuardedRequest): Promise<GuardedResponse> {
  const { config, tool } = o;
  const failCode = o.failCode ?? 'fetch_failed';
  const ceilingBytes = o.maxBytes ?? config.WEB_FETCH_MAX_BYTES;
  const ceilingMs = o.timeoutMs ?? config.WEB_FETCH_TIMEOUT_MS;
  const cap = Math.min(req.maxBytes ?? ceilingBytes, ceilingBytes);
  const timeoutMs = Math.min(req.timeoutMs ?? ceilingMs, ceilingMs);
  let current: URL;
  try {
    current = new URL(raw);
  } catch {
    throw new AppError('invalid_input', `${tool}: not a valid URL`, { reason: 'bad_url' });
  }
  if (current.username || current.password) {
    throw new AppError('invalid_input', `${tool}: URLs with embedded credentials are not fetched`, { reason: 'credentials_in_url' });
  }
  current.hash = '';
  const asked = current.href;
  const deadline = AbortSignal.timeout(timeoutMs);
  const signal = AbortSignal.any([o.signal, deadline]);
  const agent = new PinnedAgent({ connectTimeoutMs: timeoutMs });
  const redirects: GuardedResponse['redirects'] = [];
  const follow = req.followRedirects !== false;
  let method = req.method ?? 'GET';
  let body = req.body;

  try {
    for (;;) {
      const dest = await vetDestination(current, { config, resolver: o.resolver, signal, tool });
      agent.pin(dest);
      const release = await acquireHostSlot(current.host, config.WEB_PER_HOST, signal);
      try {
        if (req.reportProgress) await o.progress?.({ stage: 'fetching', done: 0, unit: 'bytes', message: `${method} ${current.origin}` });
        const res = await request(current, {
          method,
          dispatcher: agent.dispatcher,
          signal,
          ...(body !== undefined ? { body } : {}),
          headers: {
            'user-agent': o.userAgent ?? `Mozilla/5.0 (compatible; Tollgate/0.1${config.PUBLIC_BASE_URL ? `; +${config.PUBLIC_BASE_URL}` : ''})`,
            accept: 'text/html,application/xhtml+xml,application/xml;q=0.9,text/plain;q=0.9,*/*;q=0.8',
            'accept-encoding': 'gzip, deflate, br',
            'accept-language': 'en;q=0.9, *;q=0.5',
            ...(req.headers ?? {}),
          },
        });
        const headers = flatHeaders(res.headers);
        const location = headers['location'];
        if (follow && REDIRECT_STATUSES.has(res.statusCode) && location) {
          discard(res.body);
          const next = nextHop(tool, failCode, current, location, redirects.length);
          redirects.push({ url: current.href, status: res.statusCode, location: next.href });
          // 303 (and 301/302 after a POST, as browsers do) turn into a GET without a body.
          if (res.statusCode === 303 || (method === 'POST' && (res.statusCode === 301 || res.statusCode === 302))) {
            method = 'GET';
            body = undefined;
          }
          current = next;
          continue;
        }
        const [mimeRaw, ...params] = (headers['content-type'] ?? '').split(';');
        const contentType = mimeRaw?.trim().toLowerCase() || null;
        const charset = params.map((p) => /^\s*charset\s*=\s*"?([^";\s]+)"?/i.exec(p)?.[1]).find(Boolean) ?? null;
        const declared = Number(headers['content-length']);
        const read =
          method === 'HEAD' || req.skipBody?.(contentType, res.statusCode)
            ? (discard(res.body), { body: Buffer.alloc(0), bytes: 0, truncated: false })
            : await readCapped(res, headers, cap, req.reportProgress ? o.progress : undefined, Number.isFinite(declared) ? declared : undefined);
        return {
          url: asked,
          final_url: current.href,
          status: res.statusCode,
          headers,
          content_type: contentType,
          charset,
          ...read,
          redirects,
          text: () => decodeText(read.body, charset),
        };
      } finally {
        release();
      }
    }
  } catch (e) {
    throw explainFetchError(e, { tool, failCode, outer: o.signal, deadline, host: current.host, timeoutMs });
  } finally {
    await agent.close().catch(() => {});
  }
}

function nextHop(tool: string, failCode: ErrorCode, current: URL, location: string, followed: number): URL {
  if (followed >= MAX_REDIRECTS) {
    throw new AppError(failCode, `${tool} stopped after ${MAX_REDIRECTS} redirects (last from ${current.href})`, { reason: 'too_many_redirects' });
  }
  let next: URL;
  try {
    next = new URL(location, current);
  } catch {
    throw new AppError(failCode, `${tool} failed: ${current.host} redirected to an invalid URL`, { reason: 'bad_redirect' });
  }
  if (next.protocol !== 'http:' && next.protocol !== 'https:') {
    throw new AppError(failCode, `${tool} failed: ${current.host} redirected to a non-HTTP URL (${next.protocol.replace(/:$/, '')})`, {
      reason: 'bad_redirect',
    });
  }
  next.username = '';
  next.password = '';
  next.hash = '';
  return next;
}

type UndiciResponse = Awaited<ReturnType<typeof request>>;

/** Reads at most `cap` decoded bytes, reporting progress about every 64 KiB when asked to. */
export async function readCapped(
  res: UndiciResponse,
  headers: Record<string, string>,
  cap: number,
  progress: ((p: ToolProgress) => Promise<void>) | undefined,
  declaredLength: number | undefined,
): Promise<{ body: Buffer; bytes: number; truncated: boolean }> {
  const encoding = headers['content-encoding']?.trim().toLowerCase();
  const decoder =
    encoding === 'gzip' || encoding === 'x-gzip'
      ? zlib.createGunzip()
      : encoding === 'deflate'
        ? zlib.createInflate()
        : encoding === 'br'
          ? zlib.createBrotliDecompress()
          : null;
  const stream: Readable = decoder ? pipeline(res.body, decoder, () => {}) : res.body;
  // content-length counts encoded bytes, so it is a meaningful total only for identity bodies.
  const total = decoder ? undefined : declaredLength;
  const chunks: Buffer[] = [];
  let bytes = 0;
  let reported = -1;
  let truncated = false;
  const report = async () => {
    reported = bytes;
    await progress?.({ stage: 'fetching', done: bytes, ...(total !== undefined ? { total } : {}), unit: 'bytes' });
  };
  try {
    for await (const chunk of stream as AsyncIterable<Buffer>) {
      if (!chunk.length) continue;
      // Filled exactly to the cap: any further data means the body was cut.
      if (bytes >= cap) {
        truncated = true;
        break;
      }
      const take = Math.min(chunk.length, cap - bytes);
      chunks.push(take < chunk.length ? chunk.subarray(0, take) : chunk);
      bytes += take;
      if (take < chunk.length) {
        truncated = true;
        break;
      }
      if (progress && bytes - Math.max(reported, 0) >= PROGRESS_EVERY_BYTES) await report();
      if (bytes >= cap && total === cap) break;
    }
  } finally {
    discard(stream);
    discard(res.body);
  }
  if (progress && reported !== bytes) await report();
  return { body: Buffer.concat(chunks), bytes, truncated };
}

/** Drops a body we will not read; undici reports that as an abort error, which nobody needs to see. */
export function discard(stream: Readable): void {
  stream.on('error', () => {});
  stream.destroy();
}

export function flatHeaders(raw: Record<string, string | string[] | undefined>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(raw)) {
    if (v === undefined) continue;
    const name = k.toLowerCase();
    out[name] = Array.isArray(v) ? v.join(name === 'set-cookie' ? '\n' : ', ') : v;
  }
  return out;
}

export function decodeText(body: Buffer, charset: string | null): string {
  try {
    return new TextDecoder(charset ?? 'utf-8').decode(body);
  } catch {
    return new TextDecoder('utf-8').decode(body);
  }
}

const TLS_REASONS: Record<string, string> = {
  CERT_HAS_EXPIRED: 'the certificate has expired',
  CERT_NOT_YET_VALID: 'the certificate is not yet valid',
  DEPTH_ZERO_SELF_SIGNED_CERT: 'the certificate is self-signed',
  SELF_SIGNED_CERT_IN_CHAIN: 'the certificate chain is self-signed',
  UNABLE_TO_VERIFY_LEAF_SIGNATURE: 'the certificate is not trusted',
  UNABLE_TO_GET_ISSUER_CERT_LOCALLY: 'the certificate is not trusted',
  ERR_TLS_CERT_ALTNAME_INVALID: 'the certificate does not match the host name',
  CERT_REVOKED: 'the certificate was revoked',
};

const NETWORK_FAILURES: Array<[codes: string[], reason: string, message: (host: string) => string]> = [
  [['ECONNREFUSED'], 'connection_refused', (h) => `${h} refused the connection`],
  [['ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET', 'UND_ERR_CLOSED'], 'connection_reset', (h) => `the connection to ${h} closed unexpectedly`],
  [['EHOSTUNREACH', 'ENETUNREACH', 'EHOSTDOWN', 'ENETDOWN', 'EADDRNOTAVAIL'], 'unreachable', (h) => `${h} is unreachable`],
  [['UND_ERR_CONNECT_TIMEOUT', 'ETIMEDOUT', 'UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT'], 'timeout', (h) => `${h} did not answer in time`],
  [
    ['UND_ERR_RES_CONTENT_LENGTH_MISMATCH', 'UND_ERR_HEADERS_OVERFLOW', 'Z_DATA_ERROR', 'Z_BUF_ERROR'],
    'invalid_response',
    (h) => `${h} sent a malformed response`,
  ],
];

/** Turns what went wrong into the AppError a caller should see; unknown faults pass through. */
export function explainFetchError(
  e: unknown,
  o: { tool: string; failCode: ErrorCode; outer: AbortSignal; deadline: AbortSignal; host: string; timeoutMs: number },
): unknown {
  const { tool, failCode } = o;
  if (e instanceof AppError) {
    // The guard's DNS failures say tool_failed; the catalogue tools call every failure to read fetch_failed.
    return e.code === 'tool_failed' && failCode !== 'tool_failed' ? new AppError(failCode, e.message, e.details) : e;
  }
  if (o.outer.aborted) return new AppError('timeout', `${tool} was cancelled before ${o.host} answered`);
  if (o.deadline.aborted) return new AppError(failCode, `${tool} timed out after ${o.timeoutMs} ms fetching ${o.host}`, { reason: 'timeout' });
  const code = errorCode(e) || errorCode((e as { cause?: unknown })?.cause);
  for (const [codes, reason, message] of NETWORK_FAILURES) {
    if (codes.includes(code)) return new AppError(failCode, `${tool} failed: ${message(o.host)}`, { reason });
  }
  if (code in TLS_REASONS || code.startsWith('ERR_TLS_') || code.startsWith('ERR_SSL_') || code === 'EPROTO' || /CERT/.test(code)) {
    return new AppError(failCode, `${tool} failed: TLS error with ${o.host}: ${TLS_REASONS[code] ?? 'the secure connection could not be set up'}`, {
      reason: 'tls_error',
    });
  }
  // llhttp parse errors are HPE_*, brotli decoder errors ERR__ERROR_*.
  if (code.startsWith('HPE_') || code.startsWith('ERR__ERROR_')) {
    return new AppError(failCode, `${tool} failed: ${o.host} sent a malformed response`, { reason: 'invalid_response' });
  }
  return e;
}

/**
 * Parses a caller's http(s) URL: a bare host such as "example.com" becomes https://example.com/,
 * the fragment is dropped; other schemes and embedded credentials are refused with a reason.
 */
export function parseHttpUrl(raw: string): { url: URL } | { error: string } {
  const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(raw) ? raw : `https://${raw}`;
  let url: URL;
  try {
    url = new URL(withScheme);
  } catch {
    return { error: 'not a valid URL' };
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return { error: `only http and https URLs are supported, not ${url.protocol.replace(/:$/, '')}` };
  if (url.username || url.password) return { error: 'URLs with embedded credentials are not accepted' };
  url.hash = '';
  return { url };
}

/** An http(s) URL field (see parseHttpUrl): the value becomes the normalised href. */
export function httpUrlField(description: string) {
  return z
    .string()
    .trim()
    .min(1)
    .max(2048)
    .describe(description)
    .transform((raw, ctx) => {
      const r = parseHttpUrl(raw);
      if ('error' in r) {
        ctx.addIssue({ code: 'custom', message: r.error });
        return z.NEVER;
      }
      return r.url.href;
    });
}
