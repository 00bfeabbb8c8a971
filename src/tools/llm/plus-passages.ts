import { bm25 } from '../text/bm25.js';
import { splitSentences } from '../text/text-kit.js';
import { countTokensA } from '../text/tiktoken-count.js';

/**
 * genius_plus's passage selection, a sandbox-pool task (tasks.ts: `genius_plus_passages`): the pages
 * are text the web chose, so cutting, scoring and counting them runs in a thread. Pure, deterministic.
 *
 * - Each source's text is cut into lines; a line longer than MAX_CHUNK characters into runs of whole
 *   sentences of at most MAX_CHUNK (a sentence longer than that alone is cut at white space).
 * - Chunks are scored by BM25+ against the query (text group A's `bm25`, exact terms, stop words out).
 * - Selection within `budgetTokens` (o200k_base, counted exactly): first each source's best chunk, in
 *   source order (its first chunk when nothing matches, so every source read gets a say), then the
 *   remaining chunks best first (ties: earlier source, then earlier chunk). A chunk that does not fit is
 *   skipped, never cut.
 * - Passages come back in source order, then document order; each `text` is exactly
 *   source.text.slice(start, end).
 */

const MAX_CHUNK = 1_200;
/** Chunks shorter than this (menus, bylines) are left out unless they are all a source has. */
const MIN_CHUNK = 20;

export interface PassagesInput {
  query: string;
  sources: Array<{ n: number; text: string }>;
  budgetTokens: number;
}

export interface Passage {
  n: number;
  start: number;
  end: number;
  text: string;
  score: number;
  tokens: number;
}

export interface PassagesOutput {
  passages: Passage[];
  tokens: number;
}

interface Chunk {
  n: number;
  source: number;
  pos: number;
  start: number;
  end: number;
}

export function selectPassagesTask({ query, sources, budgetTokens }: PassagesInput): PassagesOutput {
  const chunks: Chunk[] = [];
  sources.forEach((s, source) => {
    const spans = chunkSpans(s.text);
    const kept = spans.filter((c) => c.end - c.start >= MIN_CHUNK);
    (kept.length ? kept : spans).forEach((c, pos) => chunks.push({ n: s.n, source, pos, ...c }));
  });
  if (!chunks.length) return { passages: [], tokens: 0 };
  const { scores } = bm25(
    chunks.map((c) => sources[c.source]!.text.slice(c.start, c.end)),
    query,
  );
  const chosen = new Set<number>();
  const out: Passage[] = [];
  let used = 0;
  const take = (i: number) => {
    if (chosen.has(i)) return;
    const c = chunks[i]!;
    const text = sources[c.source]!.text.slice(c.start, c.end);
    const left = budgetTokens - used;
    // Over 64 characters per token left: skipped uncounted, as beacon_focus does (real text is never that
    // dense, and counting very long runs is slow). Skipping can only leave a passage out, never break the budget.
    if (left <= 0 || text.length > left * 64) return;
    const tokens = countTokensA(text);
    if (tokens > left) return;
    chosen.add(i);
    used += tokens;
    out.push({ n: c.n, start: c.start, end: c.end, text, score: Math.round(scores[i]! * 10_000) / 10_000, tokens });
  };
  // First pass: each source's best chunk (or its first, when nothing in it matches).
  for (let source = 0; source < sources.length; source++) {
    let best = -1;
    for (let i = 0; i < chunks.length; i++) {
      if (chunks[i]!.source !== source) continue;
      if (best < 0 || scores[i]! > scores[best]!) best = i;
    }
    if (best >= 0) take(best);
  }
  // Second pass: everything else that matches, best first.
  const order = chunks
    .map((_, i) => i)
    .filter((i) => scores[i]! > 0)
    .sort((a, b) => scores[b]! - scores[a]! || chunks[a]!.source - chunks[b]!.source || chunks[a]!.pos - chunks[b]!.pos);
  for (const i of order) {
    if (used >= budgetTokens) break;
    take(i);
  }
  out.sort((a, b) => a.n - b.n || a.start - b.start);
  return { passages: out, tokens: used };
}

/** Non-empty lines, long ones as runs of sentences of at most MAX_CHUNK characters. */
export function chunkSpans(text: string): Array<{ start: number; end: number }> {
  const out: Array<{ start: number; end: number }> = [];
  let pos = 0;
  while (pos <= text.length) {
    const nl = text.indexOf('\n', pos);
    const lineEnd = nl === -1 ? text.length : nl;
    let s = pos;
    let e = lineEnd;
    while (s < e && /\s/.test(text[s]!)) s++;
    while (e > s && /\s/.test(text[e - 1]!)) e--;
    if (e > s) {
      if (e - s <= MAX_CHUNK) out.push({ start: s, end: e });
      else out.push(...sentenceRuns(text, s, e));
    }
    if (nl === -1) break;
    pos = nl + 1;
  }
  return out;
}

function sentenceRuns(text: string, from: number, to: number): Array<{ start: number; end: number }> {
  const out: Array<{ start: number; end: number }> = [];
  const pieces: Array<{ start: number; end: number }> = [];
  for (const sp of splitSentences(text.slice(from, to))) {
    let s = from + sp.start;
    const e = from + sp.end;
    while (e - s > MAX_CHUNK) {
      let cut = text.lastIndexOf(' ', s + MAX_CHUNK);
      if (cut <= s + MAX_CHUNK / 2) cut = s + MAX_CHUNK;
      if (/[\uD800-\uDBFF]/.test(text[cut - 1]!)) cut--;
      pieces.push({ start: s, end: cut });
      s = cut;
      while (s < e && /\s/.test(text[s]!)) s++;
    }
    if (e > s) pieces.push({ start: s, end: e });
  }
  let cur: { start: number; end: number } | null = null;
  for (const p of pieces) {
    if (cur && p.end - cur.start <= MAX_CHUNK) cur.end = p.end;
    else {
      if (cur) out.push(cur);
      cur = { ...p };
    }
  }
  if (cur) out.push(cur);
  return out;
}
