import { getEncoding, type Tiktoken } from 'js-tiktoken';

/** The exact encodings (o200k_base for GPT-4o and later, cl100k_base for GPT-4 and GPT-3.5), from js-tiktoken's tables. */
export const EXACT_ENCODINGS = ['o200k_base', 'cl100k_base'] as const;
export type ExactEncoding = (typeof EXACT_ENCODINGS)[number];

const encoders = new Map<ExactEncoding, Tiktoken>();

/** Loaded on first use (the tables are large), then kept for the thread's life. */
export function encoder(encoding: ExactEncoding = 'o200k_base'): Tiktoken {
  let e = encoders.get(encoding);
  if (!e) {
    e = getEncoding(encoding);
    encoders.set(encoding, e);
  }
  return e;
}

/**
 * Exact token counts for text group A, equal to js-tiktoken's `encode(text, [], []).length`, with two
 * fixes for caller text (tokens.ts's countTokens calls `encode(text)`):
 *
 * 1. Text holding a special token's spelling (`<|endoftext|>`, common in pasted chat templates) is
 *    counted as ordinary text, as tiktoken's `disallowed_special=()` does; js-tiktoken's default
 *    throws on it, which would turn a caller's text into an internal error.
 * 2. js-tiktoken merges byte pairs by rescanning the whole piece after every merge: quadratic in the
 *    length of a piece, so a 40,000-letter run without spaces takes over a minute. This merges with a
 *    heap and a linked list (lowest rank first, leftmost on ties: the same order, so the same
 *    tokens) in O(n log n).
 *
 * It reads two fields js-tiktoken marks internal (`patStr`, `rankMap`: byte lists joined by commas);
 * test/unit/text/tokens-a.test.ts checks the counts against js-tiktoken's on random and long input.
 */

interface Internals {
  patStr: string;
  rankMap: Map<string, number>;
}

const utf8 = new TextEncoder();
const longest = new Map<ExactEncoding, number>();

function maxTokenBytes(enc: ExactEncoding, ranks: Map<string, number>): number {
  let n = longest.get(enc);
  if (n === undefined) {
    n = 1;
    for (const k of ranks.keys()) {
      let c = 1;
      for (let i = 0; i < k.length; i++) if (k.charCodeAt(i) === 44) c++;
      if (c > n) n = c;
    }
    longest.set(enc, n);
  }
  return n;
}

export function countTokensA(text: string, enc: ExactEncoding = 'o200k_base', signal?: AbortSignal): number {
  if (!text) return 0;
  const e = encoder(enc) as unknown as Internals;
  const ranks = e.rankMap;
  const maxLen = maxTokenBytes(enc, ranks);
  const re = new RegExp(e.patStr, 'ug');
  let count = 0;
  let i = 0;
  for (const m of text.matchAll(re)) {
    if ((++i & 0xfff) === 0 && signal?.aborted) throw new Error('aborted');
    const piece = utf8.encode(m[0]);
    if (piece.length === 1 || ranks.has(piece.join(','))) count++;
    else count += mergeCount(piece, ranks, maxLen);
  }
  return count;
}

/** How many tokens byte-pair merging leaves of `piece` (every single byte has a rank in these encodings). */
function mergeCount(piece: Uint8Array, ranks: Map<string, number>, maxLen: number): number {
  const n = piece.length;
  // Node k covers bytes [start[k], start[next[k]]); nodes are removed as they merge into their left neighbour.
  const next = new Int32Array(n);
  const prev = new Int32Array(n);
  const version = new Int32Array(n);
  const alive = new Uint8Array(n).fill(1);
  for (let k = 0; k < n; k++) {
    next[k] = k + 1;
    prev[k] = k - 1;
  }
  const rankOf = (k: number): number | undefined => {
    // The pair (k, next k): from k's first byte to the end of its right neighbour (node ids are first bytes).
    const right = next[k]!;
    if (right >= n) return undefined;
    const stop = next[right]!;
    if (stop - k > maxLen) return undefined;
    let key = String(piece[k]);
    for (let b = k + 1; b < stop; b++) key += ',' + piece[b];
    return ranks.get(key);
  };
  // Binary heap of [rank, start, version].
  const heap: Array<[number, number, number]> = [];
  const less = (a: [number, number, number], b: [number, number, number]) => a[0] < b[0] || (a[0] === b[0] && a[1] < b[1]);
  const push = (item: [number, number, number]) => {
    heap.push(item);
    let c = heap.length - 1;
    while (c > 0) {
      const p = (c - 1) >> 1;
      if (!less(heap[c]!, heap[p]!)) break;
      [heap[c], heap[p]] = [heap[p]!, heap[c]!];
      c = p;
    }
  };
  const pop = (): [number, number, number] => {
    const top = heap[0]!;
    const last = heap.pop()!;
    if (heap.length) {
      heap[0] = last;
      let c = 0;
      for (;;) {
        const l = 2 * c + 1;
        const r = l + 1;
        let m = c;
        if (l < heap.length && less(heap[l]!, heap[m]!)) m = l;
        if (r < heap.length && less(heap[r]!, heap[m]!)) m = r;
        if (m === c) break;
        [heap[c], heap[m]] = [heap[m]!, heap[c]!];
        c = m;
      }
    }
    return top;
  };
  const schedule = (k: number) => {
    version[k]!++;
    const r = rankOf(k);
    if (r !== undefined) push([r, k, version[k]!]);
  };
  for (let k = 0; k < n - 1; k++) schedule(k);
  let parts = n;
  while (heap.length) {
    const [, k, v] = pop();
    if (!alive[k] || version[k] !== v) continue;
    // Merge k with its right neighbour.
    const right = next[k]!;
    alive[right] = 0;
    next[k] = next[right]!;
    if (next[k]! < n) prev[next[k]!] = k;
    parts--;
    schedule(k);
    if (prev[k]! >= 0) schedule(prev[k]!);
  }
  return parts;
}
