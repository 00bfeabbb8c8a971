/**
 * Text Postgres refuses. A JavaScript string may hold U+0000 and UTF-16 surrogates without their pair;
 * Postgres stores neither: `text` refuses U+0000 ("invalid byte sequence"), `jsonb` refuses the escapes
 * `\u0000` and a lone `\ud800` ("unsupported Unicode escape sequence", "Unicode low surrogate must
 * follow a high surrogate"), and a lone surrogate sent as `text` arrives as U+FFFD. Two rules follow:
 *
 * - At the door (src/faces/http/plugins/input-guard.ts, src/faces/http/plugins/json-body.ts) a request whose path, query,
 *   headers or JSON body carries such a character is `400 invalid_input`: it never reaches a query.
 * - What the service writes that a caller did not send as such (a tool's answer, a chain's body) goes
 *   through `pgSafeJson` / `pgSafeValue` on its way to `jsonb`: each such character becomes U+FFFD.
 */

/** U+0000, a high surrogate not followed by a low one, or a low surrogate not preceded by a high one. */
const REFUSED_CHAR = /\u0000|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const REFUSED_CHARS = /\u0000|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/** Whether Postgres would refuse (or silently change) `s`. */
export function pgRefuses(s: string): boolean {
  return REFUSED_CHAR.test(s);
}

/** `s` with every character Postgres refuses replaced by U+FFFD. */
export function pgSafeText(s: string): string {
  return REFUSED_CHAR.test(s) ? s.replace(REFUSED_CHARS, '\uFFFD') : s;
}

/**
 * The path to the first string (or object key) in a parsed JSON value that Postgres refuses, or null.
 * Keys are checked too: a body's keys end up in `jsonb` as much as its values.
 */
export function refusedPath(value: unknown, path: Array<string | number> = []): Array<string | number> | null {
  if (typeof value === 'string') return pgRefuses(value) ? path : null;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = refusedPath(value[i], [...path, i]);
      if (found) return found;
    }
    return null;
  }
  if (value && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      if (pgRefuses(k)) return [...path, k];
      const found = refusedPath(v, [...path, k]);
      if (found) return found;
    }
  }
  return null;
}

/**
 * `\u0000` and escaped lone surrogates in a JSON text (as JSON.stringify writes them) become `\ufffd`,
 * so Postgres takes it as `jsonb`. An escape is real when an even number of backslashes precedes it.
 * JSON.stringify writes a surrogate pair as the characters themselves, so every escaped surrogate in
 * its output is a lone one. Texts without either escape (nearly all) are returned as they are.
 */
const BAD_ESCAPE = /(\\*)\\u(0000|d[89a-f][0-9a-f]{2})/gi;
export function pgSafeJson(json: string): string {
  if (!json.includes('\\u0000') && !/\\u[dD][89a-fA-F]/.test(json)) return json;
  return json.replace(BAD_ESCAPE, (m, slashes: string) => (slashes.length % 2 === 0 ? `${slashes}\\ufffd` : m));
}

/** A JSON value with every string and key Postgres refuses made safe (for `sql.jsonb`); `value` itself when nothing needs to change. */
export function pgSafeValue<T>(value: T): T {
  return refusedPath(value) === null ? value : (JSON.parse(pgSafeJson(JSON.stringify(value))) as T);
}
