import { describe, expect, it } from 'vitest';
import { pgRefuses, pgSafeJson, pgSafeText, pgSafeValue, refusedPath } from '../../../src/db/pg-text.js';

/** What Postgres refuses (U+0000, unpaired surrogates) found at the door and made safe on the way to jsonb. */
describe('pg-text', () => {
  it('finds U+0000 and unpaired surrogates, never a surrogate pair', () => {
    expect(pgRefuses('a\u0000b')).toBe(true);
    expect(pgRefuses('x\ud800y')).toBe(true);
    expect(pgRefuses('x\udc00y')).toBe(true);
    expect(pgRefuses('end\ud83d')).toBe(true);
    expect(pgRefuses('\ude00start')).toBe(true);
    expect(pgRefuses('emoji \u{1F600} ok')).toBe(false);
    expect(pgRefuses('\\u0000 is text')).toBe(false);
    expect(pgSafeText('a\u0000b\ud800c\u{1F600}')).toBe('a\uFFFDb\uFFFDc\u{1F600}');
  });

  it('names the path of the first refused string or key', () => {
    expect(refusedPath({ a: [1, 'ok', { b: 'x\u0000' }] })).toEqual(['a', 2, 'b']);
    expect(refusedPath({ ok: 1, ['k\u0000']: 2 })).toEqual(['k\u0000']);
    expect(refusedPath({ a: ['fine', '\u{1F600}'], n: null, t: true })).toBeNull();
  });

  it('rewrites only real escapes in JSON text: an even number of backslashes before \\u0000', () => {
    const value = { nul: 'a\u0000b', lone: 'x\ud800y', literal: '\\u0000', both: '\\\u0000', pair: '\u{1F600}' };
    const safe = pgSafeJson(JSON.stringify(value));
    expect(JSON.parse(safe)).toEqual({ nul: 'a\uFFFDb', lone: 'x\uFFFDy', literal: '\\u0000', both: '\\\uFFFD', pair: '\u{1F600}' });
    const clean = JSON.stringify({ a: 'nothing to change' });
    expect(pgSafeJson(clean)).toBe(clean);
    expect(pgSafeValue(value)).toEqual(JSON.parse(safe));
    const untouched = { a: ['b'] };
    expect(pgSafeValue(untouched)).toBe(untouched);
  });
});
