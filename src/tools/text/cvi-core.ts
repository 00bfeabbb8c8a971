import { z } from 'zod';
import { AppError } from '../../errors.js';
import { sentences, terms, words, type Span } from './conversation.js';

/**
 * Claim–Verify–Iterate core (cvi_verify, and cvi_loop's rounds through the `cvi_round` sandbox task):
 * lexical checks of claims against sources, not entailment. For each claim, source sentences are
 * ranked by BM25 (k1 1.2, b 0.75) over content words (stopwords out, crude stem); then
 * - recall: the share of the claim's content words found in the best sentence (or the best two together);
 * - numbers: every number in the claim (1,000 = 1000; 12% = 12) must appear in that evidence;
 * - negation: not / no / never / n't / without / none... on one side only.
 * Verdicts: conflict (recall ≥ 0.5 and a claim number missing where the evidence states other numbers,
 * or recall ≥ 0.6 and negation on one side only), supported (recall ≥ 0.8, numbers found), partial
 * (recall ≥ 0.5), else unsupported. Pure functions: no side effects on load (a pool thread imports it).
 */

export const MAX_CLAIMS = 50;
export const MAX_SOURCES = 20;
export const MAX_CLAIM_CHARS = 2000;
export const MAX_TEXT_CHARS = 400_000;

export const SourceSchema = z.union([
  z.string().min(1).max(MAX_TEXT_CHARS),
  z.object({
    id: z.string().min(1).max(200).optional().describe('A name for the source (default "source N", from 1)'),
    text: z.string().min(1).max(MAX_TEXT_CHARS).describe('The source text'),
  }),
]);
export type SourceIn = z.infer<typeof SourceSchema>;
export interface Source {
  id: string;
  text: string;
}

export const VERDICTS = ['supported', 'partial', 'unsupported', 'conflict'] as const;
export type Verdict = (typeof VERDICTS)[number];

export const Evidence = z.object({
  source: z.string(),
  source_index: z.number().int(),
  quote: z.string(),
  start: z.number().int(),
  end: z.number().int(),
  score: z.number(),
});
export const NumberMismatch = z.object({ claim_value: z.string(), source_values: z.array(z.string()), source: z.string() });
export const ClaimResult = z.object({
  claim: z.string(),
  verdict: z.enum(VERDICTS),
  recall: z.number(),
  evidence: z.array(Evidence),
  number_mismatches: z.array(NumberMismatch),
  negation_mismatch: z.boolean(),
});
export type ClaimResultT = z.infer<typeof ClaimResult>;

export function normaliseSources(sources: SourceIn[]): Source[] {
  return sources.map((s, i) => (typeof s === 'string' ? { id: `source ${i + 1}`, text: s } : { id: s.id ?? `source ${i + 1}`, text: s.text }));
}

/** The claims of a text: its sentences (offsets not needed), at most MAX_CLAIMS. */
export function claimsOf(text: string, field: string): string[] {
  const out = sentences(text)
    .map((s) => text.slice(s.start, s.end))
    .filter((c) => /[\p{L}\p{N}]/u.test(c));
  if (!out.length) throw new AppError('invalid_input', `${field} holds no claims`, { issues: [{ path: [field], message: 'no sentences' }] });
  if (out.length > MAX_CLAIMS) {
    throw new AppError('invalid_input', `${field} holds ${out.length} sentences (claims); at most ${MAX_CLAIMS} are checked per call`, {
      issues: [{ path: [field], message: 'too many claims' }],
    });
  }
  return out.map((c) => (c.length > MAX_CLAIM_CHARS ? c.slice(0, MAX_CLAIM_CHARS) : c));
}

interface Unit extends Span {
  source: number;
  terms: Map<string, number>;
  length: number;
  numbers: string[];
  negated: boolean;
}

export interface Index {
  sources: Source[];
  units: Unit[];
  postings: Map<string, number[]>;
  avgdl: number;
}

export function buildIndex(sources: Source[], signal?: AbortSignal): Index {
  const units: Unit[] = [];
  const postings = new Map<string, number[]>();
  sources.forEach((src, si) => {
    if (signal?.aborted) throw new AppError('tool_failed', 'The call was cancelled');
    for (const s of sentences(src.text)) {
      const text = src.text.slice(s.start, s.end);
      const ts = terms(text);
      const tf = new Map<string, number>();
      for (const t of ts) tf.set(t, (tf.get(t) ?? 0) + 1);
      const u = units.length;
      for (const t of tf.keys()) {
        const p = postings.get(t);
        if (p) p.push(u);
        else postings.set(t, [u]);
      }
      units.push({ ...s, source: si, terms: tf, length: ts.length, numbers: numbersOf(text), negated: negated(text) });
    }
  });
  const avgdl = units.length ? units.reduce((a, u) => a + u.length, 0) / units.length : 1;
  return { sources, units, postings, avgdl: avgdl || 1 };
}

export function verifyClaim(claim: string, index: Index): ClaimResultT {
  const cterms = [...new Set(terms(claim))];
  const cnums = numbersOf(claim);
  const N = index.units.length;
  const scores = new Map<number, number>();
  for (const t of cterms) {
    const p = index.postings.get(t);
    if (!p) continue;
    const idf = Math.log(1 + (N - p.length + 0.5) / (p.length + 0.5));
    for (const u of p) {
      const unit = index.units[u]!;
      const f = unit.terms.get(t)!;
      const s = (idf * f * 2.2) / (f + 1.2 * (0.25 + (0.75 * unit.length) / index.avgdl));
      scores.set(u, (scores.get(u) ?? 0) + s);
    }
  }
  // Numbers in common lift a sentence (a claim about "12%" should meet the sentence about 15% or 12%).
  const ranked = [...scores.entries()].sort((a, b) => b[1] - a[1] || a[0] - b[0]).slice(0, 3);
  const recallOf = (units: number[]) => {
    if (!cterms.length) return 0;
    let hit = 0;
    for (const t of cterms) if (units.some((u) => index.units[u]!.terms.has(t))) hit++;
    return hit / cterms.length;
  };
  const best = ranked[0]?.[0];
  const single = best === undefined ? 0 : recallOf([best]);
  const pair = ranked.length > 1 ? recallOf([ranked[0]![0], ranked[1]![0]]) : single;
  // The pair counts only when it adds clearly (a claim spanning two sentences).
  const usePair = pair >= single + 0.2;
  const evidenceUnits = best === undefined ? [] : usePair ? [ranked[0]![0], ranked[1]![0]] : [best];
  const recall = round(usePair ? pair : single);

  const evNums = new Set(evidenceUnits.flatMap((u) => index.units[u]!.numbers));
  const mismatches: z.infer<typeof NumberMismatch>[] = [];
  const missing = cnums.filter((n) => !evNums.has(n));
  if (recall >= 0.5 && missing.length) {
    const others = [...evNums].filter((n) => !cnums.includes(n));
    if (others.length) {
      for (const n of missing) mismatches.push({ claim_value: n, source_values: others, source: index.sources[index.units[evidenceUnits[0]!]!.source]!.id });
    }
  }
  const negMismatch = recall >= 0.6 && evidenceUnits.length > 0 && negated(claim) !== evidenceUnits.some((u) => index.units[u]!.negated);
  let verdict: Verdict;
  if (mismatches.length || negMismatch) verdict = 'conflict';
  else if (recall >= 0.8 && !missing.length) verdict = 'supported';
  else if (recall >= 0.5) verdict = 'partial';
  else verdict = 'unsupported';

  const evidence = ranked.map(([u, score]) => {
    const unit = index.units[u]!;
    const src = index.sources[unit.source]!;
    return { source: src.id, source_index: unit.source, quote: src.text.slice(unit.start, unit.end), start: unit.start, end: unit.end, score: round(score) };
  });
  return { claim, verdict, recall, evidence, number_mismatches: mismatches, negation_mismatch: negMismatch };
}

export function verifyAll(claims: string[], sources: Source[], signal?: AbortSignal): ClaimResultT[] {
  const index = buildIndex(sources, signal);
  return claims.map((c) => {
    if (signal?.aborted) throw new AppError('tool_failed', 'The call was cancelled');
    return verifyClaim(c, index);
  });
}

export function summarise(results: ClaimResultT[]) {
  const s = { supported: 0, partial: 0, unsupported: 0, conflict: 0 };
  for (const r of results) s[r.verdict]++;
  return s;
}

const NUMBER = /(?<![\p{L}\p{N}.,])[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\p{L}\p{N}]|[.,]\d)/gu;

/** Numbers as canonical strings: commas out, a unicode minus as -, trailing zeros of decimals dropped. */
export function numbersOf(text: string): string[] {
  const out: string[] = [];
  for (const m of text.matchAll(NUMBER)) {
    let v = m[0].replace(/,/g, '').replace('−', '-');
    if (v.includes('.')) v = v.replace(/0+$/, '').replace(/\.$/, '');
    if (!out.includes(v)) out.push(v);
  }
  return out;
}

const NEGATION = new Set([
  'not',
  'no',
  'never',
  'none',
  'neither',
  'nor',
  'without',
  'cannot',
  'false',
  'nobody',
  'nothing',
  'lacks',
  'lack',
  'failed',
  'fails',
]);

export function negated(text: string): boolean {
  return words(text).some((w) => NEGATION.has(w) || /n['’]t$/.test(w));
}

function round(x: number): number {
  return Math.round(x * 1000) / 1000;
}

/** cvi_loop's round (sandbox task `cvi_round`): the draft's claims checked, and what changed since the last round. */
export interface CviRoundInput {
  draft: string;
  sources: Source[];
  previous_failing: string[];
}
export interface CviRoundOutput {
  results: ClaimResultT[];
  failing: ClaimResultT[];
  failing_keys: string[];
  fixed_since_last: string[];
}

/** A claim's identity across rounds: its words, lowercased. */
export function claimKey(claim: string): string {
  return words(claim).join(' ');
}

export function cviRoundTask(input: CviRoundInput): CviRoundOutput {
  const claims = claimsOf(input.draft, 'draft');
  const results = verifyAll(claims, input.sources);
  const failing = results.filter((r) => r.verdict !== 'supported');
  const failing_keys = failing.map((r) => claimKey(r.claim));
  const now = new Set(failing_keys);
  const fixed_since_last = input.previous_failing.filter((k) => !now.has(k));
  return { results, failing, failing_keys, fixed_since_last };
}
