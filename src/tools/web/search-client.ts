import { request } from 'undici';
import { z } from 'zod';
import type { Config } from '../../config.js';
import { AppError } from '../../errors.js';
import type { SearchAnswer, SearchApi, SearchHit, SearchQuery } from '../types.js';

/**
 * ctx.search: a SearXNG instance's JSON API (`GET SEARCH_BASE_URL/search?q=...&format=json`). The
 * instance is the operator's choice, so it is not put through the SSRF guard (it may well be on
 * localhost). SearXNG answers 403 until `json` is listed in its settings' `search.formats`.
 * SEARCH_API_KEY, when set, goes as `Authorization: Bearer <key>` (for instances behind a proxy).
 * Every failure is `tool_unavailable` (503, uncharged): no fallback results.
 */

const SEARCH_TIMEOUT_MS = 10_000;
const MAX_PAGES = 3;
const MAX_RESPONSE_BYTES = 2 * 1024 * 1024;

const SearxResult = z.object({
  url: z.string(),
  title: z.string().optional().default(''),
  content: z.string().nullish(),
  engine: z.string().nullish(),
  engines: z.array(z.string()).nullish(),
  publishedDate: z.string().nullish(),
});

const SearxAnswer = z.object({
  results: z.array(z.unknown()).default([]),
  suggestions: z.array(z.unknown()).default([]),
  answers: z.array(z.unknown()).default([]),
});

export function createSearch(config: Pick<Config, 'SEARCH_BASE_URL' | 'SEARCH_API_KEY'>, signal: AbortSignal): SearchApi | undefined {
  const base = config.SEARCH_BASE_URL;
  if (!base) return undefined;
  return {
    async search(q: SearchQuery): Promise<SearchAnswer> {
      const limit = Math.min(Math.max(q.limit ?? 10, 1), 20);
      const firstPage = Math.max(q.page ?? 1, 1);
      const hits: SearchHit[] = [];
      const seen = new Set<string>();
      let suggestions: string[] = [];
      let answers: string[] = [];
      for (let page = firstPage; page < firstPage + MAX_PAGES && hits.length < limit; page++) {
        const body = await fetchPage(base, config.SEARCH_API_KEY, { ...q, page }, signal);
        if (page === firstPage) {
          suggestions = body.suggestions.filter((s): s is string => typeof s === 'string');
          answers = body.answers
            .map((a) => (typeof a === 'string' ? a : typeof (a as { answer?: unknown })?.answer === 'string' ? (a as { answer: string }).answer : null))
            .filter((a): a is string => a !== null);
        }
        let fresh = 0;
        for (const raw of body.results) {
          const r = SearxResult.safeParse(raw);
          if (!r.success || seen.has(r.data.url)) continue;
          seen.add(r.data.url);
          fresh += 1;
          if (hits.length < limit) {
            hits.push({
              rank: hits.length + 1,
              title: r.data.title,
              url: r.data.url,
              snippet: r.data.content ?? '',
              engines: r.data.engines ?? (r.data.engine ? [r.data.engine] : []),
              published_at: r.data.publishedDate ?? null,
            });
          }
        }
        if (fresh === 0) break; // the engine has nothing more
      }
      return { results: hits, suggestions, answers };
    },
  };
}

async function fetchPage(base: string, apiKey: string, q: SearchQuery, outer: AbortSignal): Promise<z.infer<typeof SearxAnswer>> {
  const url = new URL('search', base.endsWith('/') ? base : `${base}/`);
  url.searchParams.set('q', q.query);
  url.searchParams.set('format', 'json');
  url.searchParams.set('pageno', String(q.page ?? 1));
  if (q.language) url.searchParams.set('language', q.language);
  if (q.time_range) url.searchParams.set('time_range', q.time_range);
  if (q.safesearch !== undefined) url.searchParams.set('safesearch', String(q.safesearch));
  const signal = AbortSignal.any([outer, AbortSignal.timeout(SEARCH_TIMEOUT_MS)]);
  let status: number;
  let text: string;
  try {
    const res = await request(url, {
      method: 'GET',
      signal,
      headers: { accept: 'application/json', ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}) },
    });
    status = res.statusCode;
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > MAX_RESPONSE_BYTES) {
        res.body.destroy();
        throw unavailable('the answer was larger than 2 MiB');
      }
      chunks.push(chunk);
    }
    text = Buffer.concat(chunks).toString('utf8');
  } catch (e) {
    if (e instanceof AppError) throw e;
    if (outer.aborted) throw new AppError('timeout', 'the call was cancelled while the search upstream answered');
    throw unavailable(signal.aborted ? `no answer within ${SEARCH_TIMEOUT_MS} ms` : `unreachable (${(e as { code?: string }).code ?? (e as Error).message})`);
  }
  if (status === 403) throw unavailable('403: is "json" listed in the instance\u2019s search.formats?', status);
  if (status === 429) throw unavailable('429: rate limited by the search upstream', status);
  if (status < 200 || status >= 300) throw unavailable(`answered ${status}`, status);
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    throw unavailable('the answer was not JSON');
  }
  const parsed = SearxAnswer.safeParse(json);
  if (!parsed.success) throw unavailable('the answer was not a SearXNG result list');
  return parsed.data;
}

function unavailable(why: string, status?: number): AppError {
  return new AppError('tool_unavailable', `search upstream failed: ${why}`, status !== undefined ? { upstream_status: status } : {});
}
