import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.js';
import { loadConfig } from '../../../src/config.js';
import { createSearch } from '../../../src/tools/web/search-client.js';
import { startFakeSearxng, type FakeSearxng } from '../../helpers/fake-searxng.js';

let searx: FakeSearxng;
beforeAll(async () => {
  searx = await startFakeSearxng();
});
afterAll(async () => {
  await searx.close();
});

const search = (env: Record<string, string> = {}) =>
  createSearch(loadConfig({}, { LOG_LEVEL: 'silent', SEARCH_BASE_URL: searx.url, ...env }), new AbortController().signal)!;

describe('ctx.search (SearXNG JSON API)', () => {
  it('is absent without SEARCH_BASE_URL', () => {
    expect(createSearch(loadConfig({}, { LOG_LEVEL: 'silent' }), new AbortController().signal)).toBeUndefined();
  });

  it('asks the instance for JSON with the query and maps its results, ranks from 1', async () => {
    searx.respond((q, page) =>
      page === 1
        ? [
            { url: 'https://a.example/', title: `About ${q}`, content: 'first', engines: ['ddg', 'brave'], publishedDate: '2024-01-02T00:00:00' },
            { url: 'https://b.example/', title: 'B' },
          ]
        : [],
    );
    searx.suggestions.push('tide times');
    const out = await search({ SEARCH_API_KEY: 'k-123' }).search({ query: 'brighton tides', limit: 5, language: 'en', time_range: 'week', safesearch: 1 });
    expect(out.results).toEqual([
      { rank: 1, title: 'About brighton tides', url: 'https://a.example/', snippet: 'first', engines: ['ddg', 'brave'], published_at: '2024-01-02T00:00:00' },
      { rank: 2, title: 'B', url: 'https://b.example/', snippet: '', engines: ['fakeengine'], published_at: null },
    ]);
    expect(out.suggestions).toEqual(['tide times']);
    const first = searx.requests.find((r) => r.params['q'] === 'brighton tides')!;
    expect(first.params).toMatchObject({ format: 'json', pageno: '1', language: 'en', time_range: 'week', safesearch: '1' });
    expect(first.headers.authorization).toBe('Bearer k-123');
  });

  it('reads further pages until the limit, without repeating a URL', async () => {
    searx.respond((_q, page) => Array.from({ length: 10 }, (_, i) => ({ url: `https://p${page}.example/${i}`, title: `${page}-${i}` })));
    const out = await search().search({ query: 'many', limit: 15 });
    expect(out.results.map((r) => r.rank)).toEqual(Array.from({ length: 15 }, (_, i) => i + 1));
    expect(new Set(out.results.map((r) => r.url)).size).toBe(15);
  });

  it('an instance without the json format (403), a 500 or a non-JSON body is tool_unavailable', async () => {
    searx.failWith = 403;
    const e403 = await search()
      .search({ query: 'x' })
      .catch((e: unknown) => e);
    expect(e403).toBeInstanceOf(AppError);
    expect((e403 as AppError).code).toBe('tool_unavailable');
    expect((e403 as AppError).message).toMatch(/search\.formats/);
    searx.failWith = 500;
    expect(
      (
        (await search()
          .search({ query: 'x' })
          .catch((e: unknown) => e)) as AppError
      ).code,
    ).toBe('tool_unavailable');
    searx.failWith = null;
  });

  it('an instance that is down is tool_unavailable', async () => {
    const e = await createSearch(loadConfig({}, { LOG_LEVEL: 'silent', SEARCH_BASE_URL: 'http://127.0.0.1:1' }), new AbortController().signal)!
      .search({ query: 'x' })
      .catch((err: unknown) => err);
    expect((e as AppError).code).toBe('tool_unavailable');
  });
});
