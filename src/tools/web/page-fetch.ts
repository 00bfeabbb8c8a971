import { z } from 'zod';
import { defineTool, type GuardedResponse, type ToolContext } from '../types.js';
import { MAX_HTML_DEPTH, MAX_HTML_ELEMENTS, normalisePlainText, type PageContent } from './extract.js';
import { runTask } from '../tasks.js';
import { createGuardedHttp, httpUrlField } from './guarded-http.js';
import { createResolver } from './resolver.js';

const TOOL = 'page_fetch';
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
  url: httpUrlField('The http or https URL to fetch. A bare host such as "example.com" is fetched over https.'),
  max_bytes: z
    .number()
    .int()
    .min(1024)
    .max(50_000_000)
    .optional()
    .describe('Stop reading the body after this many bytes (never more than the service limit, 2 MB by default).'),
});

export type PageFetchInput = z.infer<typeof PageFetchInput>;

export const PageFetchOutput = z.object({
  url: z.string().describe('The URL asked for'),
  final_url: z.string().describe('The URL that answered, after redirects'),
  status: z.number().int().describe('HTTP status of the final answer (non-2xx answers are results too)'),
  content_type: z.string().nullable().describe('The media type without parameters, or null when the server sent none'),
  title: z.string().nullable(),
  description: z.string().nullable(),
  text: z.string().describe('Readable text (HTML without page chrome, or the text body); empty for binary bodies'),
  text_truncated: z.boolean().describe('text was cut at 100,000 characters'),
  metadata: z
    .record(z.string())
    .describe('lang, canonical, author, published, modified, og:*, twitter:*...; content_length and content_disposition for binary bodies'),
  links_count: z.number().int().min(0),
  bytes: z.number().int().min(0).describe('Body bytes read (0 for binary bodies, which are not read)'),
  truncated: z.boolean().describe('The body passed the byte cap, or its HTML passed a parse cap, and only the part before it was read'),
  redirects: z.array(z.object({ url: z.string(), status: z.number().int(), location: z.string() })).describe('Each hop followed, in order'),
});

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
  outputSchema: PageFetchOutput,
  handler: async (input, ctx) => fetchPage(input, ctx),
});

async function fetchPage(input: PageFetchInput, ctx: ToolContext): Promise<PageFetchResult> {
  const { config } = ctx;
  const http = createGuardedHttp({
    config,
    resolver: createResolver(config),
    tool: TOOL,
    signal: ctx.signal,
    progress: (p) => ctx.progress(p),
    failCode: 'tool_failed',
    maxBytes: config.FETCH_MAX_BYTES,
    timeoutMs: config.FETCH_TIMEOUT_MS,
    userAgent: userAgent(config.PUBLIC_BASE_URL),
  });
  const res = await http.fetch(input.url, {
    ...(input.max_bytes !== undefined ? { maxBytes: input.max_bytes } : {}),
    reportProgress: true,
    // Binary bodies are not read: their metadata is all this tool reports.
    skipBody: (mime) => mime !== null && kindOf(mime) === 'binary',
  });
  return readResponse(res, input, ctx);
}

function kindOf(mime: string | null): 'html' | 'text' | 'binary' | 'unknown' {
  return mime === null ? 'unknown' : HTML_TYPES.has(mime) ? 'html' : isTextType(mime) ? 'text' : 'binary';
}

async function readResponse(res: GuardedResponse, input: PageFetchInput, ctx: ToolContext): Promise<PageFetchResult> {
  const mime = res.content_type;
  const base = {
    url: input.url,
    final_url: res.final_url,
    status: res.status,
    content_type: mime,
    redirects: res.redirects,
  };
  let kind = kindOf(mime);
  if (kind === 'binary') {
    const metadata: Record<string, string> = {};
    const declaredLength = Number(res.headers['content-length']);
    if (Number.isFinite(declaredLength) && declaredLength >= 0) metadata['content_length'] = String(declaredLength);
    const disposition = res.headers['content-disposition'];
    if (disposition) metadata['content_disposition'] = disposition;
    return { ...base, title: null, description: null, text: '', text_truncated: false, metadata, links_count: 0, bytes: 0, truncated: false };
  }
  const { body, bytes, truncated } = res;
  if (kind === 'unknown') kind = sniff(body);
  if (kind === 'html') {
    // Parsing runs in the sandbox pool, within the parse caps: the page's author chose this markup.
    const { capped, ...page } = await runTask(ctx, 'extract_html', { body, baseUrl: res.final_url, headerCharset: res.charset });
    return { ...base, ...page, bytes, truncated: truncated || capped };
  }
  if (kind === 'text') {
    const { text, truncated: textTruncated } = normalisePlainText(res.text());
    return { ...base, title: null, description: null, text, text_truncated: textTruncated, metadata: {}, links_count: 0, bytes, truncated };
  }
  return { ...base, title: null, description: null, text: '', text_truncated: false, metadata: {}, links_count: 0, bytes, truncated };
}

function isTextType(mime: string): boolean {
  return mime.startsWith('text/') || TEXT_TYPES.has(mime) || mime.endsWith('+json') || mime.endsWith('+xml');
}

/** For bodies without a content type: HTML by its opening markup, text if it has no NUL bytes. */
function sniff(body: Buffer): 'html' | 'text' | 'binary' {
  const head = body.subarray(0, 1024);
  const start = head
    .toString('latin1')
    .replace(/^\uFEFF|^\xEF\xBB\xBF/, '')
    .trimStart()
    .toLowerCase();
  if (/^<(!doctype html|html|head|body|title|!--)/.test(start)) return 'html';
  return head.includes(0) ? 'binary' : 'text';
}

function userAgent(publicBaseUrl: string | undefined): string {
  return `Mozilla/5.0 (compatible; TollgatePageFetch/0.1${publicBaseUrl ? `; +${publicBaseUrl}` : ''})`;
}
