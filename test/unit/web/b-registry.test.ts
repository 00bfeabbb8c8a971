import { describe, expect, it } from 'vitest';
import { webTools } from '../../../src/tools/web/index.js';
import { TOOLS } from '../../../src/tools/index.js';

/** The grabr tools that read pages, from the family's registry. */
const webToolsB = webTools.filter((t) => ['grabr_scrape', 'grabr_contact', 'grabr_sitemap', 'grabr_batch'].includes(t.name));

describe('group B web tools declare what the registry needs', () => {
  it('the four grabr tools are registered once each', () => {
    expect(webToolsB.map((t) => t.name)).toEqual(['grabr_scrape', 'grabr_contact', 'grabr_sitemap', 'grabr_batch']);
    for (const t of webToolsB) expect(TOOLS.filter((x) => x.name === t.name)).toHaveLength(1);
  });

  it.each(webToolsB.map((t) => [t.name, t] as const))('%s: enterprise, 0¢, web, output schema, limits, examples that parse', (_n, tool) => {
    expect(tool).toMatchObject({ tier: 'enterprise', priceCents: 0, family: 'web' });
    expect(tool.outputSchema).toBeDefined();
    expect(tool.limits).toBeDefined();
    expect(tool.output).not.toMatch(/\n/);
    expect(tool.examples.length).toBeGreaterThan(0);
    for (const ex of tool.examples) expect(tool.input.safeParse(ex).success, JSON.stringify(ex)).toBe(true);
  });

  it('q fields, progress flags and q parsing', () => {
    const byName = Object.fromEntries(webToolsB.map((t) => [t.name, t]));
    expect(byName['grabr_scrape']).toMatchObject({ qField: 'url' });
    expect(byName['grabr_scrape']!.progress).toBeFalsy();
    expect(byName['grabr_contact']).toMatchObject({ qField: 'url', progress: true });
    expect(byName['grabr_sitemap']).toMatchObject({ qField: 'url', progress: true });
    expect(byName['grabr_batch']).toMatchObject({ qField: 'urls', qParse: 'lines', progress: true });
  });

  it('inputs: bare hosts get https, other schemes and credentials are 400s, caps hold', () => {
    const [scrape, contact, sitemap, batch] = webToolsB;
    expect(scrape!.input.parse({ url: 'example.com/a#x' })).toMatchObject({ url: 'https://example.com/a' });
    expect(scrape!.input.safeParse({ url: 'file:///etc/passwd' }).success).toBe(false);
    expect(scrape!.input.safeParse({ url: 'https://u:p@example.com/' }).success).toBe(false);
    expect(scrape!.input.safeParse({ url: 'example.com', fields: Object.fromEntries(Array.from({ length: 51 }, (_, i) => [`f${i}`, 'p'])) }).success).toBe(
      false,
    );
    expect(scrape!.input.safeParse({ url: 'example.com', fields: { __proto__x: 'p' } }).success).toBe(false);
    expect(scrape!.input.safeParse({ url: 'example.com', fields: { a: { selector: 'p', attr: 'on"x' } } }).success).toBe(false);
    expect(contact!.input.safeParse({ url: 'example.com', max_pages: 11 }).success).toBe(false);
    expect(contact!.input.safeParse({ url: 'example.com', country: 'XX' }).success).toBe(false);
    expect(contact!.input.parse({ url: 'example.com', country: 'de' })).toMatchObject({ country: 'DE', max_pages: 5 });
    expect(sitemap!.input.safeParse({ url: 'example.com', max_urls: 50_001 }).success).toBe(false);
    expect(sitemap!.input.safeParse({ url: 'example.com', since: 'yesterday-ish' }).success).toBe(false);
    expect(sitemap!.input.safeParse({ url: 'example.com', path_prefix: 'blog' }).success).toBe(false);
    expect(batch!.input.safeParse({ urls: [] }).success).toBe(false);
    expect(batch!.input.safeParse({ urls: ['example.com'], concurrency: 9 }).success).toBe(false);
    expect(batch!.input.parse({ urls: ['example.com'] })).toMatchObject({ mode: 'text', concurrency: 4 });
  });
});
