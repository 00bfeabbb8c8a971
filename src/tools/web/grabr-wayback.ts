import { createHash } from 'node:crypto';
import { LRUCache } from 'lru-cache';
import { request } from 'undici';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { runTask } from '../tasks.js';
import { defineTool, type ToolContext } from '../types.js';
import { httpUrlField } from './web-common.js';
import { normalisePlainText } from './extract.js';
import { jsonBytes } from './answer-size.js';

/**
 * grabr_wayback: a URL's capture history from the Wayback Machine's CDX API (WAYBACK_CDX_URL,
 * `?output=json`, whose first row names the columns) and, on request, the archived text of the newest
 * successful capture (`WAYBACK_BASE_URL/{timestamp}id_/{url}`, the raw capture without the Archive's
 * toolbar). Both upstreams are the operator's choice, so they are called directly (not through the
 * SSRF guard) with a deadline and a size cap. An upstream that is down, slow, 429 or 5xx is 503
 * tool_unavailable. Answers are kept for an hour in this process (an LRU keyed by the request).
 */

const TOOL = 'grabr_wayback';
const UPSTREAM_TIMEOUT_MS = 20_000;
const CDX_MAX_BYTES = 8 * 1024 * 1024;
const SNAPSHOT_MAX_BYTES = 2 * 1024 * 1024;
const CACHE_TTL_MS = 60 * 60 * 1000;
const TIMESTAMP = /^\d{4,14}$/;

// A plain object schema (MCP, OpenAPI and q read its shape); `from` after `to` is checked in the handler.
const Input = z.object({
  url: httpUrlField('The page or site to look up, e.g. "https://example.com/pricing" or "example.com"'),
  match: z
    .enum(['exact', 'prefix', 'host', 'domain'])
    .default('exact')
    .describe('exact: this URL only; prefix: every URL under this path; host: the whole host; domain: the host and its subdomains'),
  from: z
    .string()
    .regex(TIMESTAMP, 'a timestamp prefix yyyy[MM[dd[hh[mm[ss]]]]]')
    .optional()
    .describe('Earliest capture, as a timestamp prefix such as "2019" or "20190601"'),
  to: z.string().regex(TIMESTAMP, 'a timestamp prefix yyyy[MM[dd[hh[mm[ss]]]]]').optional().describe('Latest capture, as a timestamp prefix'),
  limit: z.number().int().min(1).max(1000).default(100).describe('Captures to return, 1-1,000 (default 100)'),
  order: z.enum(['newest', 'oldest']).default('newest').describe('Which end of the history the limit keeps (results are always listed oldest first)'),
  snapshot: z.boolean().default(false).describe('Also read the text of the newest capture that answered 200'),
});

const Capture = z.object({
  timestamp: z.string(),
  original: z.string(),
  status: z.number().int().nullable(),
  mimetype: z.string().nullable(),
  digest: z.string().nullable(),
  length: z.number().int().nullable(),
  archive_url: z.string(),
});
type Capture = z.infer<typeof Capture>;

const Snapshot = z.object({
  timestamp: z.string(),
  url: z.string(),
  status: z.number().int(),
  content_type: z.string().nullable(),
  title: z.string().nullable(),
  text: z.string(),
  truncated: z.boolean(),
});

export const GrabrWaybackOutput = z.object({
  url: z.string(),
  match: z.enum(['exact', 'prefix', 'host', 'domain']),
  captures: z.array(Capture),
  total: z.number().int(),
  /** Distinct content digests among the captures returned. */
  distinct_versions: z.number().int(),
  first: z.string().nullable(),
  last: z.string().nullable(),
  snapshot: Snapshot.nullable(),
  /** Why a snapshot asked for is missing, or other things worth knowing. */
  notes: z.array(z.string()),
  /** Served from this process's one-hour cache. */
  cached: z.boolean(),
});
export type GrabrWaybackOutput = z.infer<typeof GrabrWaybackOutput>;
type WaybackInput = z.output<typeof Input>;

/** The cache holds at most 500 answers and about 32 MB of them (an answer's size is estimated, not serialised). */
const CACHE_MAX_BYTES = 32 * 1024 * 1024;
const cache = new LRUCache<string, Omit<GrabrWaybackOutput, 'cached'>>({
  max: 500,
  ttl: CACHE_TTL_MS,
  maxSize: CACHE_MAX_BYTES,
  sizeCalculation: (v) => 1024 + v.captures.reduce((n, c) => n + 160 + c.original.length * 2, 0) + (v.snapshot ? v.snapshot.text.length * 2 : 0),
});

/** Empties the answer cache (tests). */
export function clearWaybackCache(): void {
  cache.clear();
}

export const grabrWayback = defineTool({
  name: TOOL,
  description:
    'Internet Archive capture history of a URL, host or domain (timestamps, statuses, digests, archive links, distinct versions), optionally with the archived text of the newest capture.',
  tier: 'enterprise',
  priceCents: 0,
  family: 'web',
  qField: 'url',
  needs: ['wayback'],
  progress: true,
  input: Input,
  examples: [
    { url: 'https://example.com/' },
    { url: 'example.com', match: 'host', from: '2015', to: '2020', limit: 50, order: 'oldest' },
    { url: 'https://www.iana.org/domains/reserved', snapshot: true, limit: 10 },
  ],
  output:
    '{url, match, captures: [{timestamp, original, status, mimetype, digest, length, archive_url}], total, distinct_versions, first, last, snapshot: {timestamp, url, status, content_type, title, text, truncated}|null, notes: [], cached}',
  outputSchema: GrabrWaybackOutput,
  limits: { timeMs: 10_000, memoryMb: 256 },
  largestInput: () => ({ url: 'https://example.com/', match: 'domain' as const, limit: 1000, snapshot: true }),
  handler: async (input, ctx): Promise<GrabrWaybackOutput> => {
    const cdxUrl = ctx.config.WAYBACK_CDX_URL;
    if (!cdxUrl)
      throw new AppError('tool_unavailable', 'grabr_wayback needs the Wayback CDX API (WAYBACK_CDX_URL), which is disabled here. Nothing was charged.', {
        needs: ['wayback'],
      });
    if (input.from && input.to && input.from.padEnd(14, '0') > input.to.padEnd(14, '9')) {
      throw new AppError('invalid_input', '`from` must not be after `to`', { issues: [{ path: ['from'], message: '`from` must not be after `to`' }] });
    }
    const base = ctx.config.WAYBACK_BASE_URL;
    const key = createHash('sha256')
      .update(JSON.stringify([cdxUrl, base, input]))
      .digest('hex');
    const hit = cache.get(key);
    if (hit) {
      await ctx.progress({ stage: 'cached' });
      return { ...hit, cached: true };
    }
    const result = await lookUp(input, ctx, cdxUrl, base);
    cache.set(key, result);
    return { ...result, cached: false };
  },
});

/** The CDX query a request maps to (exported for tests). */
export function cdxQuery(cdxUrl: string, input: Pick<WaybackInput, 'url' | 'match' | 'from' | 'to' | 'limit' | 'order'>): URL {
  const q = new URL(cdxUrl);
  q.searchParams.set('url', input.url);
  q.searchParams.set('output', 'json');
  q.searchParams.set('matchType', input.match);
  q.searchParams.set('fl', 'timestamp,original,statuscode,mimetype,digest,length');
  if (input.from) q.searchParams.set('from', input.from);
  if (input.to) q.searchParams.set('to', input.to);
  // A negative limit is the CDX server's "the last N".
  q.searchParams.set('limit', String(input.order === 'newest' ? -input.limit : input.limit));
  return q;
}

/**
 * The archive's URL of a capture (`flag` "id_" for the raw capture, "" for the page with the
 * Archive's toolbar), or null when the capture's data would lead it out of `archiveBase`. The CDX
 * answer is data from upstream: its `original` must be an absolute http(s) URL, used in its
 * normalised form (no `.` or `..` segments, no backslashes, no fragment), and the whole URL must come
 * back from the URL parser unchanged (nothing resolved away) and still under the base's path.
 */
export function archiveUrl(archiveBase: string, timestamp: string, original: string, flag: '' | 'id_'): string | null {
  if (!archiveBase || !/^\d{1,14}$/.test(timestamp)) return null;
  let base: URL;
  let target: URL;
  try {
    base = new URL(archiveBase);
    target = new URL(original);
  } catch {
    return null;
  }
  if (target.protocol !== 'http:' && target.protocol !== 'https:') return null;
  if (!target.hostname || /^\.+$/.test(target.hostname)) return null;
  target.hash = '';
  base.search = '';
  base.hash = '';
  const prefix = `${base.href.replace(/\/+$/, '')}/`;
  const built = `${prefix}${timestamp}${flag}/${target.href}`;
  let parsed: URL;
  try {
    parsed = new URL(built);
  } catch {
    return null;
  }
  if (parsed.href !== built || !parsed.href.startsWith(prefix) || parsed.origin !== base.origin) return null;
  return built;
}

/** Rows of `?output=json` (a header row of column names, then one array per capture) as captures. */
export function parseCdxRows(body: unknown, archiveBase: string): Capture[] {
  if (!Array.isArray(body)) throw new AppError('tool_unavailable', 'Wayback CDX upstream failed: the answer was not a JSON array of rows');
  if (body.length === 0) return [];
  const header = body[0];
  if (!Array.isArray(header) || !header.every((h) => typeof h === 'string')) {
    throw new AppError('tool_unavailable', 'Wayback CDX upstream failed: the first row was not a header of column names');
  }
  const col = (name: string) => (header as string[]).indexOf(name);
  const [ts, orig, status, mime, digest, length] = ['timestamp', 'original', 'statuscode', 'mimetype', 'digest', 'length'].map(col) as [
    number,
    number,
    number,
    number,
    number,
    number,
  ];
  if (ts < 0 || orig < 0) throw new AppError('tool_unavailable', 'Wayback CDX upstream failed: the header names no timestamp or original column');
  const str = (row: unknown[], i: number) => (i >= 0 && typeof row[i] === 'string' && row[i] !== '-' && row[i] !== '' ? (row[i] as string) : null);
  const int = (row: unknown[], i: number) => {
    const s = str(row, i);
    return s !== null && /^\d+$/.test(s) ? Number(s) : null;
  };
  const out: Capture[] = [];
  for (const row of body.slice(1)) {
    if (!Array.isArray(row)) continue;
    const timestamp = str(row, ts);
    const original = str(row, orig);
    if (!timestamp || !original || !/^\d{1,14}$/.test(timestamp)) continue;
    out.push({
      timestamp,
      original,
      status: int(row, status),
      mimetype: str(row, mime),
      digest: str(row, digest),
      length: int(row, length),
      // Empty when there is no archive base, or when this row's data would lead out of it.
      archive_url: archiveUrl(archiveBase, timestamp, original, '') ?? '',
    });
  }
  // Oldest first, whatever order the server used; equal timestamps keep the server's order.
  return out
    .map((c, i) => [c, i] as const)
    .sort((a, b) => a[0].timestamp.localeCompare(b[0].timestamp) || a[1] - b[1])
    .map(([c]) => c);
}

async function lookUp(input: WaybackInput, ctx: ToolContext, cdxUrl: string, base: string): Promise<Omit<GrabrWaybackOutput, 'cached'>> {
  await ctx.progress({ stage: 'querying', message: 'Wayback CDX' });
  const res = await upstream(cdxQuery(cdxUrl, input), CDX_MAX_BYTES, ctx.signal, 'Wayback CDX');
  if (res.status === 404)
    throw new AppError('tool_unavailable', 'Wayback CDX upstream failed: answered 404 (is WAYBACK_CDX_URL the CDX endpoint?)', { upstream_status: 404 });
  if (res.status < 200 || res.status >= 300) {
    throw new AppError('tool_unavailable', `Wayback CDX upstream failed: answered ${res.status}`, { upstream_status: res.status });
  }
  const text = res.body.toString('utf8').trim();
  let rows: unknown = [];
  if (text) {
    try {
      rows = JSON.parse(text);
    } catch {
      throw new AppError('tool_unavailable', 'Wayback CDX upstream failed: the answer was not JSON');
    }
  }
  const all = parseCdxRows(rows, base);
  // The server applies the limit; a server that ignores it still cannot make the answer longer.
  const captures = input.order === 'newest' ? all.slice(-input.limit) : all.slice(0, input.limit);
  await ctx.progress({ stage: 'captures', done: captures.length, unit: 'captures' });
  const notes: string[] = [];
  let snapshot: GrabrWaybackOutput['snapshot'] = null;
  if (input.snapshot) {
    const pick = [...captures].reverse().find((c) => c.status === 200);
    if (!base) notes.push('snapshot skipped: WAYBACK_BASE_URL is disabled on this service');
    else if (!pick) notes.push('snapshot skipped: no capture in the range answered 200');
    else snapshot = await readSnapshot(pick, base, ctx, notes);
  }
  return withinSize(
    {
      url: input.url,
      match: input.match,
      captures,
      total: captures.length,
      distinct_versions: new Set(captures.map((c) => c.digest ?? `${c.timestamp}`)).size,
      first: captures[0]?.timestamp ?? null,
      last: captures.at(-1)?.timestamp ?? null,
      snapshot,
      notes,
    },
    input.order,
    ctx.config.TOOL_MAX_RESULT_BYTES - 1_024,
  );
}

/**
 * Holds the answer to `budget` JSON bytes (the service refuses a larger one; long archived URLs make
 * 1,000 captures several MB): the snapshot's text is cut first, then captures go from the end `order`
 * keeps least (the oldest for `newest`), each said in `notes`.
 */
function withinSize(out: Omit<GrabrWaybackOutput, 'cached'>, order: 'newest' | 'oldest', budget: number): Omit<GrabrWaybackOutput, 'cached'> {
  let size = jsonBytes(out) + 20;
  if (size <= budget) return out;
  const room = 200;
  if (out.snapshot && out.snapshot.text.length) {
    const over = size - budget;
    const textBytes = jsonBytes(out.snapshot.text);
    // Cut the text (by characters, to at most what the budget leaves it), keeping at least the captures' room.
    let text = out.snapshot.text;
    const target = Math.max(0, textBytes - over - room);
    while (text.length && jsonBytes(text) > target) text = text.slice(0, Math.floor(text.length * Math.max(0.5, target / jsonBytes(text))));
    if (text.length < out.snapshot.text.length) {
      out.notes.push('snapshot text cut to stay within the answer size limit (TOOL_MAX_RESULT_BYTES)');
      out.snapshot = { ...out.snapshot, text, truncated: true };
      size = jsonBytes(out) + 20;
    }
  }
  if (size > budget && out.captures.length) {
    const captures = [...out.captures];
    let dropped = 0;
    while (captures.length && size > budget) {
      const c = order === 'newest' ? captures.shift()! : captures.pop()!;
      size -= jsonBytes(c) + 1;
      dropped++;
    }
    out.notes.push(
      `${dropped} ${order === 'newest' ? 'oldest' : 'newest'} capture${dropped > 1 ? 's' : ''} left out to stay within the answer size limit (TOOL_MAX_RESULT_BYTES)`,
    );
    out.captures = captures;
    out.total = captures.length;
    out.distinct_versions = new Set(captures.map((c) => c.digest ?? `${c.timestamp}`)).size;
    out.first = captures[0]?.timestamp ?? null;
    out.last = captures.at(-1)?.timestamp ?? null;
  }
  return out;
}

async function readSnapshot(c: Capture, base: string, ctx: ToolContext, notes: string[]): Promise<GrabrWaybackOutput['snapshot']> {
  await ctx.progress({ stage: 'reading snapshot', message: c.timestamp });
  const url = archiveUrl(base, c.timestamp, c.original, 'id_');
  if (!url) {
    notes.push(`snapshot skipped: the archive's data for ${c.timestamp} does not name an http(s) URL under WAYBACK_BASE_URL`);
    return null;
  }
  const res = await upstream(url, SNAPSHOT_MAX_BYTES, ctx.signal, 'Wayback snapshot');
  if (res.status < 200 || res.status >= 300) {
    if (res.status >= 500 || res.status === 429)
      throw new AppError('tool_unavailable', `Wayback snapshot upstream failed: answered ${res.status}`, { upstream_status: res.status });
    notes.push(`snapshot unavailable: the archive answered ${res.status} for ${c.timestamp}`);
    return null;
  }
  const mime = (res.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase() || null;
  const charset = /charset\s*=\s*"?([^";\s]+)/i.exec(res.headers['content-type'] ?? '')?.[1] ?? null;
  if (
    mime === 'text/html' ||
    mime === 'application/xhtml+xml' ||
    (mime === null && /^\s*<(!doctype html|html)/i.test(res.body.subarray(0, 512).toString('latin1')))
  ) {
    // HTML from the archive is a stranger's markup: parsed in the sandbox pool within the parse caps.
    const page = await runTask(ctx, 'extract_html', { body: res.body, baseUrl: c.original, headerCharset: charset });
    return {
      timestamp: c.timestamp,
      url,
      status: res.status,
      content_type: mime,
      title: page.title,
      text: page.text,
      truncated: res.truncated || page.text_truncated || page.capped,
    };
  }
  if (mime === null || mime.startsWith('text/') || mime.endsWith('json') || mime.endsWith('xml')) {
    const { text, truncated } = normalisePlainText(decode(res.body, charset));
    return { timestamp: c.timestamp, url, status: res.status, content_type: mime, title: null, text, truncated: res.truncated || truncated };
  }
  notes.push(`snapshot text not extracted: the capture is ${mime}`);
  return { timestamp: c.timestamp, url, status: res.status, content_type: mime, title: null, text: '', truncated: false };
}

function decode(body: Buffer, charset: string | null): string {
  try {
    return new TextDecoder(charset ?? 'utf-8').decode(body);
  } catch {
    return new TextDecoder('utf-8').decode(body);
  }
}

interface UpstreamResponse {
  status: number;
  headers: Record<string, string>;
  body: Buffer;
  truncated: boolean;
}

async function upstream(url: URL | string, maxBytes: number, outer: AbortSignal, what: string): Promise<UpstreamResponse> {
  const signal = AbortSignal.any([outer, AbortSignal.timeout(UPSTREAM_TIMEOUT_MS)]);
  try {
    const res = await request(url, {
      method: 'GET',
      signal,
      headers: { accept: 'application/json, text/html;q=0.9, */*;q=0.5', 'user-agent': 'TollgateGrabr/0.1 (grabr_wayback)' },
    });
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(res.headers)) if (v !== undefined) headers[k.toLowerCase()] = Array.isArray(v) ? v.join(', ') : v;
    if (res.statusCode === 429 || res.statusCode >= 500) {
      res.body.on('error', () => {}).destroy();
      throw new AppError('tool_unavailable', `${what} upstream failed: answered ${res.statusCode}`, { upstream_status: res.statusCode });
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let truncated = false;
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      if (size + chunk.length > maxBytes) {
        chunks.push(chunk.subarray(0, maxBytes - size));
        size = maxBytes;
        truncated = true;
        res.body.on('error', () => {}).destroy();
        break;
      }
      chunks.push(chunk);
      size += chunk.length;
    }
    if (truncated && what === 'Wayback CDX') throw new AppError('tool_unavailable', `${what} upstream failed: the answer was larger than ${maxBytes} bytes`);
    return { status: res.statusCode, headers, body: Buffer.concat(chunks), truncated };
  } catch (e) {
    if (e instanceof AppError) throw e;
    if (outer.aborted) throw new AppError('timeout', `${TOOL} was cancelled while ${what} answered`);
    if (signal.aborted) throw new AppError('tool_unavailable', `${what} upstream failed: no answer within ${UPSTREAM_TIMEOUT_MS} ms`);
    const code = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
    throw new AppError('tool_unavailable', `${what} upstream failed: unreachable (${code})`);
  }
}
