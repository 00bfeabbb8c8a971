import { pipeline, type Readable } from 'node:stream';
import zlib from 'node:zlib';
import { request } from 'undici';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool, type ToolContext } from '../types.js';
import { MAX_HTML_DEPTH, MAX_HTML_ELEMENTS, normalisePlainText, type PageContent } from './extract.js';
import { runTask } from '../../sandbox/tasks.js';
import { PinnedAgent, vetDestination } from './net-guard.js';
import { createResolver, errorCode } from './resolver.js';

const TOOL = 'page_fetch';
const MAX_REDIRECTS = 5;
const PROGRESS_EVERY_BYTES = 64 * 1024;
const REDIRECT_STATUSES = new Set([301, 302, 303, 307, 308]);
const HTML_TYPES = new Set(['text/html', 'application/xhtml+xml']);
const TEXT_TYPES = new Set([
  'application/json',
  'application/xml',
  'application/javascript',
  'application/ecmascript',
  'application/x-javascript',
  'application/x-ndjson',
  'application/yaml',
  'application/x-yaml',
  'application/toml',
  'application/sql',
  'application/graphql',
]);

export const PageFetchInput = z.object({
  url: z
    .string()
    .trim()
    .min(1)
    .max(2048)
    .describe('The http or https URL to fetch. A bare host such as "example.com" is fetched over https.')
    .transform((raw, ctx) => {
      const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(raw) ? raw : `https://${raw}`;
      let url: URL;
      try {
        url = new URL(withScheme);
      } catch {
        ctx.addIssue({ code: 'custom', message: 'not a valid URL' });
        return z.NEVER;
      }
      if (url.protocol !== 'http:' && url.protocol !== 'https:') {
        ctx.addIssue({ code: 'custom', message: `only http and https URLs can be fetched, not ${url.protocol.replace(/:$/, '')}` });
        return z.NEVER;
      }
      if (url.username || url.password) {
        ctx.addIssue({ code: 'custom', message: 'URLs with embedded credentials are not fetched' });
        return z.NEVER;
      }
      url.hash = '';
      return url.href;
    }),
  max_bytes: z
    .number()
    .int()
    .min(1024)
    .max(50_000_000)
    .optional()
    .describe('Stop reading the body after this many bytes (never more than the service limit, 2 MB by default).'),
});

export type PageFetchInput = z.infer<typeof PageFetchInput>;

export interface PageFetchRedirect {
  url: string;
  status: number;
  location: string;
}

/** The page's readable content (PageContent; `text_truncated`: cut at 100,000 characters) plus the fetch. */
export interface PageFetchResult extends PageContent {
  url: string;
  final_url: string;
  status: number;
  content_type: string | null;
  bytes: number;
  /**
   * The body was longer than the byte cap and reading stopped there, or its HTML passed a parse cap
   * (MAX_HTML_ELEMENTS elements, MAX_HTML_DEPTH levels of nesting) and only the part before it was read.
   */
  truncated: boolean;
  redirects: PageFetchRedirect[];
}

export const pageFetch = defineTool({
  name: TOOL,
  description:
    'Fetch a public web page over HTTP(S) and return its readable text, title and metadata. Private, loopback and cloud-metadata addresses are refused.',
  tier: 'free',
  priceCents: 0,
  family: 'web',
  qField: 'url',
  input: PageFetchInput,
  examples: [{ url: 'https://example.com/' }, { url: 'https://www.rfc-editor.org/rfc/rfc9110.html', max_bytes: 500_000 }],
  output:
    '{url, final_url, status, content_type, title, description, text, text_truncated, metadata: {lang, canonical, author, published, og:*, twitter:*...}, links_count, bytes, truncated, redirects: [{url, status, location}]}; ' +
    `truncated: the body passed the byte cap, or its HTML passed a parse cap (${MAX_HTML_ELEMENTS.toLocaleString('en')} elements or ${MAX_HTML_DEPTH} levels of nesting) and only the part before it was read`,
  handler: async (input, ctx) => fetchPage(input, ctx),
});

async function fetchPage(input: PageFetchInput, ctx: ToolContext): Promise<PageFetchResult> {
  const { config } = ctx;
  const cap = Math.min(input.max_bytes ?? config.FETCH_MAX_BYTES, config.FETCH_MAX_BYTES);
  const deadline = AbortSignal.timeout(config.FETCH_TIMEOUT_MS);
  const signal = AbortSignal.any([ctx.signal, deadline]);
  const resolver = createResolver(config);
  const agent = new PinnedAgent({ connectTimeoutMs: config.FETCH_TIMEOUT_MS });
  const redirects: PageFetchRedirect[] = [];
  let current = new URL(input.url);

  try {
    for (;;) {
      const dest = await vetDestination(current, { config, resolver, signal, tool: TOOL });
      agent.pin(dest);
      await ctx.progress({ stage: 'fetching', done: 0, unit: 'bytes', message: `GET ${current.origin}` });
      const res = await request(current, {
        method: 'GET',
        dispatcher: agent.dispatcher,
        signal,
        headers: {
          'user-agent': userAgent(config.PUBLIC_BASE_URL),
          accept: 'text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.8',
          'accept-encoding': 'gzip, deflate, br',
          'accept-language': 'en;q=0.9, *;q=0.5',
        },
      });
      const location = header(res.headers, 'location');
      if (REDIRECT_STATUSES.has(res.statusCode) && location) {
        discard(res.body);
        const next = nextHop(current, location, redirects.length);
        redirects.push({ url: current.href, status: res.statusCode, location: next.href });
        current = next;
        continue;
      }
      return await readResponse(res, { input, current, cap, redirects, ctx });
    }
  } catch (e) {
    throw explain(e, { ctx, deadline, host: current.host, timeoutMs: config.FETCH_TIMEOUT_MS });
  } finally {
    await agent.close().catch(() => {});
  }
}

function nextHop(current: URL, location: string, followed: number): URL {
  if (followed >= MAX_REDIRECTS) {
    throw new AppError('tool_failed', `${TOOL} stopped after ${MAX_REDIRECTS} redirects (last from ${current.href})`, {
      reason: 'too_many_redirects',
    });
  }
  let next: URL;
  try {
    next = new URL(location, current);
  } catch {
    throw new AppError('tool_failed', `${TOOL} failed: ${current.host} redirected to an invalid URL`, { reason: 'bad_redirect' });
  }
  if (next.protocol !== 'http:' && next.protocol !== 'https:') {
    throw new AppError('tool_failed', `${TOOL} failed: ${current.host} redirected to a non-HTTP URL (${next.protocol.replace(/:$/, '')})`, {
      reason: 'bad_redirect',
    });
  }
  next.username = '';
  next.password = '';
  next.hash = '';
  return next;
}

interface ReadState {
  input: PageFetchInput;
  current: URL;
  cap: number;
  redirects: PageFetchRedirect[];
  ctx: ToolContext;
}

type UndiciResponse = Awaited<ReturnType<typeof request>>;

async function readResponse(res: UndiciResponse, s: ReadState): Promise<PageFetchResult> {
  const contentTypeHeader = header(res.headers, 'content-type');
  const [mimeRaw, ...params] = (contentTypeHeader ?? '').split(';');
  const mime = mimeRaw?.trim().toLowerCase() || null;
  const charset = params.map((p) => /^\s*charset\s*=\s*"?([^";\s]+)"?/i.exec(p)?.[1]).find(Boolean) ?? null;
  const base = {
    url: s.input.url,
    final_url: s.current.href,
    status: res.statusCode,
    content_type: mime,
    redirects: s.redirects,
  };
  const declaredLength = Number(header(res.headers, 'content-length'));

  let kind = mime === null ? 'unknown' : HTML_TYPES.has(mime) ? 'html' : isTextType(mime) ? 'text' : 'binary';
  if (kind === 'binary') {
    // Binary bodies are not read: their metadata is all this tool reports.
    discard(res.body);
    const metadata: Record<string, string> = {};
    if (Number.isFinite(declaredLength) && declaredLength >= 0) metadata['content_length'] = String(declaredLength);
    const disposition = header(res.headers, 'content-disposition');
    if (disposition) metadata['content_disposition'] = disposition;
    return { ...base, title: null, description: null, text: '', text_truncated: false, metadata, links_count: 0, bytes: 0, truncated: false };
  }

  const { body, bytes, truncated } = await readCapped(res, s.cap, s.ctx, Number.isFinite(declaredLength) ? declaredLength : undefined);
  if (kind === 'unknown') kind = sniff(body);
  if (kind === 'html') {
    // Parsing runs in the sandbox pool, within the parse caps: the page's author chose this markup.
    const { capped, ...page } = await runTask(s.ctx, 'extract_html', { body, baseUrl: s.current.href, headerCharset: charset });
    return { ...base, ...page, bytes, truncated: truncated || capped };
  }
  if (kind === 'text') {
    const { text, truncated: textTruncated } = normalisePlainText(decode(body, charset));
    return { ...base, title: null, description: null, text, text_truncated: textTruncated, metadata: {}, links_count: 0, bytes, truncated };
  }
  return { ...base, title: null, description: null, text: '', text_truncated: false, metadata: {}, links_count: 0, bytes, truncated };
}

/** Reads at most `cap` (decoded) bytes, reporting progress about every 64 KiB. */
async function readCapped(res: UndiciResponse, cap: number, ctx: ToolContext, declaredLength: number | undefined) {
  const encoding = header(res.headers, 'content-encoding')?.trim().toLowerCase();
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
  const report = () => {
    reported = bytes;
    return ctx.progress({ stage: 'fetching', done: bytes, ...(total !== undefined ? { total } : {}), unit: 'bytes' });
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
      if (bytes - Math.max(reported, 0) >= PROGRESS_EVERY_BYTES) await report();
      if (bytes >= cap && total === cap) break;
    }
  } finally {
    discard(stream);
    discard(res.body);
  }
  if (reported !== bytes) await report();
  return { body: Buffer.concat(chunks), bytes, truncated };
}

/** Drops a body we will not read; undici reports that as an abort error, which nobody needs to see. */
function discard(stream: Readable): void {
  stream.on('error', () => {});
  stream.destroy();
}

function isTextType(mime: string): boolean {
  return mime.startsWith('text/') || TEXT_TYPES.has(mime) || mime.endsWith('+json') || mime.endsWith('+xml');
}

/** For bodies without a content type: HTML by its opening markup, text if it has no NUL bytes. */
function sniff(body: Buffer): 'html' | 'text' | 'binary' {
  const head = body.subarray(0, 1024);
  const start = head.toString('latin1').replace(/^\uFEFF|^\xEF\xBB\xBF/, '').trimStart().toLowerCase();
  if (/^<(!doctype html|html|head|body|title|!--)/.test(start)) return 'html';
  return head.includes(0) ? 'binary' : 'text';
}

function decode(body: Buffer, charset: string | null): string {
  try {
    return new TextDecoder(charset ?? 'utf-8').decode(body);
  } catch {
    return new TextDecoder('utf-8').decode(body);
  }
}

function header(headers: Record<string, string | string[] | undefined>, name: string): string | undefined {
  const v = headers[name];
  return Array.isArray(v) ? v[0] : v;
}

function userAgent(publicBaseUrl: string | undefined): string {
  return `Mozilla/5.0 (compatible; TollgatePageFetch/0.1${publicBaseUrl ? `; +${publicBaseUrl}` : ''})`;
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
function explain(e: unknown, o: { ctx: ToolContext; deadline: AbortSignal; host: string; timeoutMs: number }): unknown {
  if (e instanceof AppError) return e;
  if (o.ctx.signal.aborted) return new AppError('timeout', `${TOOL} was cancelled before ${o.host} answered`);
  if (o.deadline.aborted) {
    return new AppError('tool_failed', `${TOOL} timed out after ${o.timeoutMs} ms fetching ${o.host}`, { reason: 'timeout' });
  }
  const code = errorCode(e) || errorCode((e as { cause?: unknown })?.cause);
  for (const [codes, reason, message] of NETWORK_FAILURES) {
    if (codes.includes(code)) return new AppError('tool_failed', `${TOOL} failed: ${message(o.host)}`, { reason });
  }
  if (code in TLS_REASONS || code.startsWith('ERR_TLS_') || code.startsWith('ERR_SSL_') || code === 'EPROTO' || /CERT/.test(code)) {
    return new AppError('tool_failed', `${TOOL} failed: TLS error with ${o.host}: ${TLS_REASONS[code] ?? 'the secure connection could not be set up'}`, {
      reason: 'tls_error',
    });
  }
  // llhttp parse errors are HPE_*, brotli decoder errors ERR__ERROR_*.
  if (code.startsWith('HPE_') || code.startsWith('ERR__ERROR_')) {
    return new AppError('tool_failed', `${TOOL} failed: ${o.host} sent a malformed response`, { reason: 'invalid_response' });
  }
  return e;
}
