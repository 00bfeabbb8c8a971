import { describe, expect, it } from 'vitest';
import { metaTask, MAX_VALUES_PER_FIELD, scrapeTask, selectorError, type FieldSpec } from '../../../src/tools/web/scrape-html.js';
import { AppError } from '../../../src/errors.js';

const scrape = (html: string | Buffer, fields: Record<string, FieldSpec> = {}, caps = { textMax: 100_000, linksMax: 500, maxResultBytes: 900_000 }) =>
  scrapeTask({ body: typeof html === 'string' ? Buffer.from(html) : html, baseUrl: 'https://acme.test/dir/page', headerCharset: null, fields, ...caps });

describe('scrape and meta pool tasks', () => {
  it('selectorError: cheerio syntax and pseudos accepted, broken selectors described', () => {
    expect(selectorError('div > a.x[href^="/"]:not(.y)')).toBeNull();
    expect(selectorError('li:contains("x")')).toBeNull();
    expect(selectorError('a[')).toMatch(/./);
    expect(selectorError(':nosuch')).toMatch(/nosuch/);
  });

  it('fields: text, attributes (URLs made absolute), html, all; a bad selector is invalid_input', () => {
    const html = '<html><body><h1> Hi  <b>there</b></h1><a href="../x">X</a><a href="https://o.test/y">Y</a><p class="p"><i>in</i></p></body></html>';
    const out = scrape(html, {
      h: { selector: 'h1' },
      hrefs: { selector: 'a', attr: 'href', all: true },
      inner: { selector: '.p', attr: 'html' },
      none: { selector: 'table', all: true },
      rel: { selector: 'a', attr: 'rel' },
    });
    expect(out.fields).toEqual({ h: 'Hi there', hrefs: ['https://acme.test/x', 'https://o.test/y'], inner: '<i>in</i>', none: [], rel: null });
    expect(out.links).toEqual([
      { url: 'https://acme.test/x', text: 'X' },
      { url: 'https://o.test/y', text: 'Y' },
    ]);
    expect(() => scrape(html, { bad: { selector: 'a[' } })).toThrow(AppError);
  });

  it('caps: values per field, links, text; each marks truncated', () => {
    const many = `<html><body>${Array.from({ length: MAX_VALUES_PER_FIELD + 10 }, (_, i) => `<a href="/l/${i}">L${i}</a>`).join('')}</body></html>`;
    const out = scrape(many, { all: { selector: 'a', all: true } }, { textMax: 50, linksMax: 20, maxResultBytes: 900_000 });
    expect(out.fields['all']).toHaveLength(MAX_VALUES_PER_FIELD);
    expect(out.links).toHaveLength(20);
    expect(out.text.length).toBeLessThanOrEqual(50);
    expect(out.truncated).toBe(true);
    expect(scrape('<html><body><p>small</p></body></html>').truncated).toBe(false);
  });

  it('a page past the element cap is parsed up to it, quickly', () => {
    const big = Buffer.from(`<html><body><h1>Top</h1>${'<span>x</span>'.repeat(300_000)}</body></html>`);
    const t0 = Date.now();
    const out = scrape(big, { h: { selector: 'h1' }, n: { selector: 'span', all: true } }, { textMax: 100, linksMax: 10, maxResultBytes: 900_000 });
    expect(out.fields['h']).toBe('Top');
    expect(out.truncated).toBe(true);
    expect(Date.now() - t0).toBeLessThan(10_000);
  });

  it('the answer stays within its JSON byte budget: multi-byte text is cut, then JSON-LD, links and fields', () => {
    const cjk = '漢字テキスト'.repeat(20_000); // 120,000 characters, 360,000 bytes
    const html = `<html><head><title>${'T'.repeat(10_000)}</title><script type="application/ld+json">{"a":"${'x'.repeat(90_000)}"}</script></head>
      <body><p>${cjk}</p>${Array.from({ length: 300 }, (_, i) => `<a href="/${'l'.repeat(200)}${i}">L</a>`).join('')}<h1>Head</h1></body></html>`;
    const small = scrape(html, { h: { selector: 'h1' }, all: { selector: 'p', all: true } }, { textMax: 100_000, linksMax: 500, maxResultBytes: 200_000 });
    expect(Buffer.byteLength(JSON.stringify(small))).toBeLessThanOrEqual(200_000);
    expect(small.truncated).toBe(true);
    expect(small.fields['h']).toBe('Head');
    expect(small.metadata.title).toHaveLength(2_000);
    const tiny = scrape(html, { h: { selector: 'h1' }, all: { selector: 'p', all: true } }, { textMax: 100_000, linksMax: 500, maxResultBytes: 2_000 });
    expect(Buffer.byteLength(JSON.stringify(tiny))).toBeLessThanOrEqual(4_500); // the capped title alone is 2,000 bytes
    expect(tiny).toMatchObject({ text: '', jsonld: [], links: [], truncated: true });
  });

  it('meta: title, description (og fallback), canonical, lang, og:*, JSON-LD types (top level and @graph)', () => {
    const out = metaTask({
      body: Buffer.from(`<html lang="de"><head><title>T</title><meta property="og:description" content="D"><link rel="canonical" href="/c">
        <script type="application/ld+json">{"@graph":[{"@type":"WebSite"},{"@type":["Organization","Thing"]}]}</script></head><body><a href="/">x</a></body></html>`),
      baseUrl: 'https://acme.test/a/b',
      headerCharset: null,
    });
    expect(out).toEqual({
      title: 'T',
      description: 'D',
      canonical: 'https://acme.test/c',
      lang: 'de',
      og: { 'og:description': 'D' },
      jsonld_types: ['WebSite', 'Organization', 'Thing'],
      links_count: 1,
      truncated: false,
    });
  });
});
