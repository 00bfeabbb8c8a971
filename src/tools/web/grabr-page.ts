import { AppError } from '../../errors.js';
import type { GuardedResponse, ToolContext } from '../types.js';
import { assertPageOk, grabrFetch, type Robots } from './robots.js';

/** Helpers the grabr_* page tools share (fetching an HTML page through robots.txt and the guard). */

const HTML_TYPES = new Set(['text/html', 'application/xhtml+xml']);
const HTML_ACCEPT = 'text/html,application/xhtml+xml;q=0.9,*/*;q=0.5';

/** HTML by content type, or (without one) by its opening markup. */
export function isHtml(res: GuardedResponse): boolean {
  if (res.content_type) return HTML_TYPES.has(res.content_type);
  const start = res.body
    .subarray(0, 1024)
    .toString('latin1')
    .replace(/^\uFEFF|^\xEF\xBB\xBF/, '')
    .trimStart()
    .toLowerCase();
  return /^<(!doctype html|html|head|body|title|!--)/.test(start);
}

function textual(type: string | null): boolean {
  return (
    type === null ||
    HTML_TYPES.has(type) ||
    type.startsWith('text/') ||
    type.endsWith('+xml') ||
    type.endsWith('+json') ||
    type === 'application/json' ||
    type === 'application/xml'
  );
}

/**
 * GETs a page for a grabr_* tool: robots.txt first, 4xx/5xx answers fail (not_found / fetch_failed),
 * bodies of binary types are not read. `requireHtml`: a non-HTML answer is invalid_input.
 */
export async function fetchPage(
  ctx: ToolContext,
  robots: Robots,
  url: string,
  opts: { requireHtml?: boolean; maxBytes?: number } = {},
): Promise<GuardedResponse> {
  const res = await grabrFetch(ctx, robots, url, {
    accept: HTML_ACCEPT,
    ...(opts.maxBytes !== undefined ? { maxBytes: opts.maxBytes } : {}),
    skipBody: (type) => !textual(type),
  });
  assertPageOk(res);
  if (opts.requireHtml && !isHtml(res)) {
    throw new AppError('invalid_input', `${res.final_url} is not an HTML page (${res.content_type ?? 'no content type'})`, {
      url: res.final_url,
      content_type: res.content_type,
      reason: 'not_html',
    });
  }
  return res;
}

/** An AppError's code and message for a per-item failure (grabr_batch); anything else is internal_error. */
export function itemError(e: unknown): { code: string; message: string } {
  if (e instanceof AppError) return { code: e.code, message: e.message };
  return { code: 'internal_error', message: 'the page could not be processed' };
}
