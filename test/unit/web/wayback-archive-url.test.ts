import { describe, expect, it } from 'vitest';
import { archiveUrl } from '../../../src/tools/web/grabr-wayback.js';

/** grabr_wayback's archive URLs are built from upstream CDX data and must stay under WAYBACK_BASE_URL. */
describe('archiveUrl', () => {
  const base = 'https://arch.test/web';

  it('builds the raw and the toolbar URL of an ordinary capture', () => {
    expect(archiveUrl(base, '20200101000000', 'https://a.test/', 'id_')).toBe('https://arch.test/web/20200101000000id_/https://a.test/');
    expect(archiveUrl(`${base}/`, '20200101000000', 'https://a.test/', '')).toBe('https://arch.test/web/20200101000000/https://a.test/');
    // The CDX server's form with the default port: normalised, still the same page.
    expect(archiveUrl(base, '2020', 'http://www.a.test:80/p?q=1#frag', 'id_')).toBe('https://arch.test/web/2020id_/http://www.a.test/p?q=1');
  });

  it('keeps dot segments of the original inside its own host, never above it', () => {
    for (const original of [
      'https://a.test/../../../../../private',
      'https://a.test/%2e%2e/%2E%2e/../../../private',
      'https://a.test\\..\\..\\..\\..\\..\\private',
    ]) {
      const url = archiveUrl(base, '2020', original, 'id_');
      expect(url).toBe('https://arch.test/web/2020id_/https://a.test/private');
    }
  });

  it('refuses originals that would climb out or are not http(s) URLs, and bad timestamps', () => {
    expect(archiveUrl(base, '2020', 'http://../../../private', 'id_')).toBeNull();
    expect(archiveUrl(base, '2020', 'http://%2e%2e/x', 'id_')).toBeNull();
    expect(archiveUrl(base, '2020', '../../private', 'id_')).toBeNull();
    expect(archiveUrl(base, '2020', 'file:///etc/passwd', 'id_')).toBeNull();
    expect(archiveUrl(base, '2020', 'dns:a.test', '')).toBeNull();
    expect(archiveUrl(base, '../2020', 'https://a.test/', 'id_')).toBeNull();
    expect(archiveUrl('', '2020', 'https://a.test/', 'id_')).toBeNull();
  });
});
