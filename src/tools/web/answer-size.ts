/**
 * Sizes as the cap on a tool's answer counts them (TOOL_MAX_RESULT_BYTES, checked on the JSON of the
 * final answer by src/calls/runner.ts): the tools that page or cut their own answers measure with these.
 */

/** Bytes of `v`'s JSON text (UTF-8). */
export function jsonBytes(v: unknown): number {
  return Buffer.byteLength(JSON.stringify(v) ?? 'null');
}

/** The longest start of `text` whose JSON string takes at most `maxBytes` bytes (never splitting a surrogate pair). */
export function cutToJsonBytes(text: string, maxBytes: number): string {
  const fits = (n: number) => jsonBytes(text.slice(0, n)) <= maxBytes;
  let lo = 0;
  let hi = text.length;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  const code = text.charCodeAt(lo - 1);
  return text.slice(0, code >= 0xd800 && code <= 0xdbff ? lo - 1 : lo);
}
