import { stems } from './tool-kit.js';

/**
 * idea_fold's clustering, a sandbox-pool task (tasks.ts: `idea_fold_cluster`): the ideas are caller
 * input, so the CPU work runs in a thread. Pure and deterministic.
 *
 * - Each idea becomes a TF-IDF vector over its stemmed content words (Porter2; stop words dropped):
 *   tf = 1 + ln(count), idf = ln((1 + N) / (1 + df)) + 1 (smoothed, so a word in every idea still
 *   counts a little), L2-normalised.
 * - Similarity is the cosine of two vectors (an idea with no content words is similar to nothing).
 * - Average-linkage agglomerative clustering: while some pair of clusters has an average pairwise
 *   similarity at or above `threshold`, the most similar pair merges (Lance-Williams update). Ties go
 *   to the pair whose earlier members come first in the input.
 * - Clusters list member indexes ascending; clusters are ordered by their first member.
 */

export interface FoldClusterInput {
  texts: string[];
  /** Average cosine similarity a merge needs, 0 to 1. */
  threshold: number;
}

export interface FoldClusterOutput {
  clusters: number[][];
  /** Each cluster's average pairwise similarity (1 for a singleton), rounded to 4 places. */
  cohesion: number[];
}

export function foldClusterTask({ texts, threshold }: FoldClusterInput): FoldClusterOutput {
  const sim = similarityMatrix(texts);
  return averageLinkage(sim, threshold);
}

/** Cosine similarities of the ideas' TF-IDF vectors (n × n, symmetric, diagonal 1). */
export function similarityMatrix(texts: readonly string[]): Float64Array[] {
  const n = texts.length;
  const counts = texts.map((t) => {
    const c = new Map<string, number>();
    for (const s of stems(t)) c.set(s, (c.get(s) ?? 0) + 1);
    return c;
  });
  const df = new Map<string, number>();
  for (const c of counts) for (const term of c.keys()) df.set(term, (df.get(term) ?? 0) + 1);
  const vectors = counts.map((c) => {
    const v = new Map<string, number>();
    let norm = 0;
    for (const [term, k] of c) {
      const w = (1 + Math.log(k)) * (Math.log((1 + n) / (1 + df.get(term)!)) + 1);
      v.set(term, w);
      norm += w * w;
    }
    norm = Math.sqrt(norm);
    if (norm > 0) for (const [term, w] of v) v.set(term, w / norm);
    return v;
  });
  const sim = Array.from({ length: n }, () => new Float64Array(n));
  for (let i = 0; i < n; i++) {
    sim[i]![i] = 1;
    for (let j = i + 1; j < n; j++) {
      const [a, b] = vectors[i]!.size <= vectors[j]!.size ? [vectors[i]!, vectors[j]!] : [vectors[j]!, vectors[i]!];
      let dot = 0;
      for (const [term, w] of a) dot += w * (b.get(term) ?? 0);
      sim[i]![j] = dot;
      sim[j]![i] = dot;
    }
  }
  return sim;
}

/** Average-linkage agglomeration of a similarity matrix down to `threshold` (see the module comment). */
export function averageLinkage(sim: readonly Float64Array[], threshold: number): FoldClusterOutput {
  const n = sim.length;
  // Live clusters by slot; a slot is named by its smallest member, so slot order is input order.
  const members: Array<number[] | null> = Array.from({ length: n }, (_, i) => [i]);
  const link = sim.map((row) => Float64Array.from(row));
  const sumWithin = new Float64Array(n); // sum of pairwise similarities inside each cluster
  const EPS = 1e-12;
  for (;;) {
    let best = -Infinity;
    let bi = -1;
    let bj = -1;
    for (let i = 0; i < n; i++) {
      if (!members[i]) continue;
      for (let j = i + 1; j < n; j++) {
        if (!members[j]) continue;
        const s = link[i]![j]!;
        // Strictly better only: equal pairs keep the first one found (earlier i, then earlier j).
        if (s > best + EPS) {
          best = s;
          bi = i;
          bj = j;
        }
      }
    }
    if (bi < 0 || best < threshold - EPS) break;
    const a = members[bi]!;
    const b = members[bj]!;
    // Lance-Williams for average linkage: the merged cluster's link to k is the size-weighted mean.
    for (let k = 0; k < n; k++) {
      if (!members[k] || k === bi || k === bj) continue;
      const s = (a.length * link[bi]![k]! + b.length * link[bj]![k]!) / (a.length + b.length);
      link[bi]![k] = s;
      link[k]![bi] = s;
    }
    sumWithin[bi] = sumWithin[bi]! + sumWithin[bj]! + best * a.length * b.length;
    members[bi] = [...a, ...b].sort((x, y) => x - y);
    members[bj] = null;
  }
  const clusters: number[][] = [];
  const cohesion: number[] = [];
  for (let i = 0; i < n; i++) {
    const m = members[i];
    if (!m) continue;
    clusters.push(m);
    const pairs = (m.length * (m.length - 1)) / 2;
    cohesion.push(pairs ? Math.round(Math.min(1, Math.max(0, sumWithin[i]! / pairs)) * 10_000) / 10_000 : 1);
  }
  return { clusters, cohesion };
}
