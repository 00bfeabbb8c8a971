import MiniSearch from 'minisearch';
import { STOP_WORDS, terms } from './text-kit.js';

/**
 * Scoring helpers of text group A: BM25+ over a list of passages (MiniSearch, exact term matching,
 * English stop words removed) and TextRank over sentences. Pure, deterministic functions.
 */

/** BM25+ score of each passage for the query (0 when no query term occurs), plus matched terms. */
export function bm25(passages: string[], query: string, tokenize: (s: string) => string[] = terms): { scores: Float64Array; matched: string[][] } {
  const scores = new Float64Array(passages.length);
  const matched: string[][] = passages.map(() => []);
  const ms = new MiniSearch<{ id: number; t: string }>({
    fields: ['t'],
    idField: 'id',
    tokenize,
    processTerm: (t) => t,
    searchOptions: { combineWith: 'OR', tokenize, processTerm: (t) => t },
  });
  ms.addAll(passages.map((t, id) => ({ id, t })));
  for (const r of ms.search(query)) {
    scores[r.id as number] = r.score;
    matched[r.id as number] = [...r.terms].sort();
  }
  return { scores, matched };
}

/**
 * TextRank (Mihalcea & Tarau 2004): sentences are nodes, edges weigh shared terms over
 * log(|Si|+1) + log(|Sj|+1); PageRank with damping 0.85 until it settles (at most 50 rounds).
 * Terms found in more than max(50, 5%) of the sentences make no edges (they say little and would make
 * the graph quadratic).
 */
export function textRank(sentences: string[], signal?: AbortSignal): Float64Array {
  const n = sentences.length;
  const sets = sentences.map((s) => [...new Set(terms(s))]);
  const postings = new Map<string, number[]>();
  sets.forEach((set, i) => {
    for (const t of set) {
      let p = postings.get(t);
      if (!p) postings.set(t, (p = []));
      p.push(i);
    }
  });
  const maxDf = Math.max(50, Math.floor(n * 0.05));
  const adj: Array<Array<[number, number]>> = sentences.map(() => []);
  const overlap = new Float64Array(n);
  const touched: number[] = [];
  for (let i = 0; i < n; i++) {
    if ((i & 0xff) === 0 && signal?.aborted) throw new Error('aborted');
    for (const t of sets[i]!) {
      const p = postings.get(t)!;
      if (p.length > maxDf) continue;
      for (const j of p) {
        if (j <= i) continue;
        if (overlap[j] === 0) touched.push(j);
        overlap[j]! += 1;
      }
    }
    for (const j of touched) {
      const w = overlap[j]! / (Math.log(sets[i]!.length + 1) + Math.log(sets[j]!.length + 1));
      adj[i]!.push([j, w]);
      adj[j]!.push([i, w]);
      overlap[j] = 0;
    }
    touched.length = 0;
  }
  const out = adj.map((edges) => edges.reduce((s, [, w]) => s + w, 0));
  let score = new Float64Array(n).fill(1);
  for (let round = 0; round < 50; round++) {
    if (signal?.aborted) throw new Error('aborted');
    const next = new Float64Array(n);
    let delta = 0;
    for (let i = 0; i < n; i++) {
      let sum = 0;
      for (const [j, w] of adj[i]!) sum += (w / out[j]!) * score[j]!;
      next[i] = 0.15 + 0.85 * sum;
      delta += Math.abs(next[i]! - score[i]!);
    }
    score = next;
    if (delta < 1e-6 * Math.max(1, n)) break;
  }
  return score;
}

/**
 * Terms for code and logs: each word, plus the parts of camelCase and snake_case identifiers
 * (getUserName → getusername, get, user, name), stop words left out.
 */
export function codeTerms(text: string): string[] {
  const out: string[] = [];
  const re = /[\p{L}\p{N}_]+/gu;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    const whole = m[0].toLowerCase();
    if (!STOP_WORDS.has(whole)) out.push(whole);
    const parts = m[0].split(/_+|(?<=\p{Ll})(?=\p{Lu})|(?<=\p{L})(?=\p{N})|(?<=\p{N})(?=\p{L})/u).filter(Boolean);
    if (parts.length > 1) for (const p of parts) if (!STOP_WORDS.has(p.toLowerCase())) out.push(p.toLowerCase());
  }
  return out;
}
