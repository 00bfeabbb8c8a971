import nlp from 'compromise';
import { porterStem } from './stem.js';

/**
 * discovery_collision's pool tasks (tasks.ts): search queries from an idea's noun phrases
 * (compromise), and stemmed TF-IDF cosine similarity of the idea against what the searches found.
 * Pure and deterministic (ties keep input order); the module loads without side effects.
 */

export const STOPWORDS: ReadonlySet<string> = new Set(
  (
    'a about above after again against all also am an and any are as at be because been before being below between both but by can could did do does doing down during each few for from further had has have having he her here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not now of off on once only or other our ours ourselves out over own same she should so some such than that the their theirs them themselves then there these they this those through to too under until up very was we were what when where which while who whom why will with would you your yours yourself yourselves ' +
    'using use used uses via like new way ways one two get gets make makes lets let app apps tool tools thing things based within without across etc e.g i.e per'
  ).split(/\s+/),
);

const DETERMINERS = /^(?:a|an|the|this|that|these|those|my|our|your|their|its|his|her|some|any|each|every|no)\s+/i;
const MAX_QUERY_CHARS = 200;

export interface QueriesInput {
  idea: string;
  max: number;
}

export interface QueriesOutput {
  queries: string[];
  phrases: string[];
}

function contentWords(s: string): string[] {
  return (s.toLowerCase().match(/[\p{L}\p{N}][\p{L}\p{N}'-]*/gu) ?? [])
    .map((w) => w.replace(/['-]+$/, ''))
    .filter((w) => w.length > 1 && !STOPWORDS.has(w) && !/^\d+$/.test(w));
}

/** Noun phrases in order of first appearance, determiners and punctuation trimmed, duplicates dropped. */
export function nounPhrases(idea: string): string[] {
  const raw = nlp(idea).nouns().out('array') as string[];
  const out: string[] = [];
  const seen = new Set<string>();
  for (const r of raw) {
    let p = r
      .replace(/[\s.,;:!?()[\]{}"“”‘’]+$/u, '')
      .replace(/^[\s.,;:!?()[\]{}"“”‘’]+/u, '')
      .replace(/\s+/g, ' ')
      .trim();
    while (DETERMINERS.test(p)) p = p.replace(DETERMINERS, '');
    p = p.toLowerCase();
    if (!p || !contentWords(p).length) continue;
    const key = contentWords(p).join(' ');
    if (seen.has(key)) continue;
    seen.add(key);
    out.push(p);
  }
  return out;
}

const clipQuery = (q: string) => (q.length <= MAX_QUERY_CHARS ? q : q.slice(0, MAX_QUERY_CHARS).replace(/\s+\S*$/, ''));

/**
 * Up to `max` queries: the idea's three leading noun phrases together (its core), then neighbouring
 * pairs of phrases. Without noun phrases, the idea's first twelve content words.
 */
export function collisionQueriesTask({ idea, max }: QueriesInput): QueriesOutput {
  const phrases = nounPhrases(idea);
  const queries: string[] = [];
  const add = (q: string) => {
    const c = clipQuery(q.trim());
    if (c && !queries.includes(c) && queries.length < max) queries.push(c);
  };
  if (!phrases.length) add(contentWords(idea).slice(0, 12).join(' '));
  else {
    add(phrases.slice(0, 3).join(' '));
    for (let i = 0; i + 1 < phrases.length && queries.length < max; i++) add(`${phrases[i]} ${phrases[i + 1]}`);
    for (const p of phrases) if (queries.length < max && contentWords(p).length > 1) add(p);
  }
  return { queries, phrases: phrases.slice(0, 30) };
}

export interface ScoreInput {
  idea: string;
  /** Each candidate's texts; a candidate scores its best text (e.g. its snippet, or snippet and page). */
  docs: string[][];
}

export interface ScoreOutput {
  results: Array<{ score: number; shared_terms: string[] }>;
}

interface Bag {
  tf: Map<string, number>;
  /** First surface form of each stem, for display. */
  surface: Map<string, string>;
}

function bag(text: string): Bag {
  const tf = new Map<string, number>();
  const surface = new Map<string, string>();
  for (const w of contentWords(text)) {
    const s = porterStem(w);
    tf.set(s, (tf.get(s) ?? 0) + 1);
    if (!surface.has(s)) surface.set(s, w);
  }
  return { tf, surface };
}

/** Cosine similarity of the idea with each candidate over stemmed, stopword-free TF-IDF vectors (sublinear tf, smoothed idf). */
export function collisionScoreTask({ idea, docs }: ScoreInput): ScoreOutput {
  const ideaBag = bag(idea);
  const docBags = docs.map((texts) => texts.map(bag));
  // Document frequency over the corpus: the idea and each candidate's longest text.
  const corpus: Bag[] = [ideaBag, ...docBags.map((bs) => bs.reduce((a, b) => (b.tf.size > a.tf.size ? b : a), { tf: new Map(), surface: new Map() } as Bag))];
  const df = new Map<string, number>();
  for (const b of corpus) for (const t of b.tf.keys()) df.set(t, (df.get(t) ?? 0) + 1);
  const n = corpus.length;
  const idf = (t: string) => Math.log((n + 1) / ((df.get(t) ?? 0) + 1)) + 1;
  const vector = (b: Bag) => {
    const v = new Map<string, number>();
    let norm = 0;
    for (const [t, c] of b.tf) {
      const w = (1 + Math.log(c)) * idf(t);
      v.set(t, w);
      norm += w * w;
    }
    return { v, norm: Math.sqrt(norm) };
  };
  const iv = vector(ideaBag);
  const results = docBags.map((bags) => {
    let best = { score: 0, shared: [] as Array<[string, number]> };
    for (const b of bags) {
      const dv = vector(b);
      if (!dv.norm || !iv.norm) continue;
      let dot = 0;
      const shared: Array<[string, number]> = [];
      for (const [t, w] of iv.v) {
        const d = dv.v.get(t);
        if (d === undefined) continue;
        dot += w * d;
        shared.push([t, w * d]);
      }
      const score = dot / (iv.norm * dv.norm);
      if (score > best.score) best = { score, shared };
    }
    const shared_terms = best.shared
      .map((s, i) => [s, i] as const)
      .sort((a, b) => b[0][1] - a[0][1] || a[1] - b[1])
      .slice(0, 10)
      .map(([[t]]) => ideaBag.surface.get(t) ?? t);
    return { score: Math.round(Math.min(1, best.score) * 1000) / 1000, shared_terms };
  });
  return { results };
}
