import nlp from 'compromise';
import { splitSentences, words, STOP_WORDS } from '../text/text-kit.js';
import { textRank } from '../text/bm25.js';
import { descriptionChapters } from './parse.js';

/**
 * grabr_video_intel's analysis (task `yt_intel`, run in a sandbox pool thread): chapters, keywords,
 * entities, summary and speaking rate, all computed here without a model. Deterministic: the same
 * transcript and metadata give the same result; ties go to the earlier position. No side effects at
 * load.
 */

export interface IntelInput {
  title: string;
  description: string;
  tags: string[];
  /** The video's length in seconds when the page says (0 or null for live streams). */
  duration_s: number | null;
  /** The transcript's segments (empty when there are no captions). */
  starts: number[];
  durs: number[];
  texts: string[];
  max_keywords: number;
  summary_sentences: number;
}

export interface IntelChapter {
  start: number;
  end: number | null;
  title: string;
  summary: string | null;
}

export interface IntelKeyword {
  term: string;
  score: number;
  count: number;
}

export type EntityType = 'person' | 'organisation' | 'place';

export interface IntelEntity {
  text: string;
  type: EntityType;
  count: number;
}

export interface IntelOutput {
  chapters: IntelChapter[];
  chapters_source: 'description' | 'transcript' | 'none';
  keywords: IntelKeyword[];
  entities: IntelEntity[];
  summary: string;
  summary_source: 'transcript' | 'description' | 'none';
  words: number;
  /** Words per minute over the video's duration (or the transcript's span when the duration is unknown); null without a transcript. */
  wpm: number | null;
}

/** Spoken filler and verbs too common to be keywords (on top of the English stop words). */
const FILLER = new Set(
  (
    'um uh uhm erm hmm ah oh yeah yes yep okay ok like just really actually basically literally gonna wanna gotta kinda sorta ' +
    'know think mean right well so lot lots thing things stuff something anything everything nothing someone going get got getting ' +
    "go goes went make makes made say says said see look looking want wanted let lets let's come take put also even still much many " +
    'way kind sort one two three first next now then here there today thank thanks guys everybody everyone people time little bit ' +
    "good great need use using used can't don't doesn't didn't isn't it's that's there's i'm you're we're they're i've you've " +
    "we've i'll you'll we'll what's here's he's she's music applause laughter " +
    'every each before after because always never often usually sometimes maybe probably really quite rather almost already ' +
    'another around away back best better big different done else enough ever few find found give given gives keep keeps ' +
    'last least less long new old part place point same show shows small start starts sure tell try trying turn want ways ' +
    'whole whether yet able across along among upon without within while since though although unless until toward towards ' +
    'takes took taken shows showed helps helped needs needed works worked uses tries tried gets comes seems looks means called ' +
    'pretty sure actually certainly definitely simply'
  ).split(' '),
);

/** Characters of text that compromise reads for entities (about 2 s per 100k); past it, chunks spread over the whole text. */
export const MAX_ENTITY_CHARS = 120_000;
const MAX_ENTITIES = 30;
const MAX_CHAPTERS = 12;
/** Below this many transcript words, lexical segmentation gives one chapter. */
const MIN_SEGMENT_WORDS = 300;
const BLOCK_WORDS = 60;
const UNIT_WORDS = 20;
const CHAPTER_SUMMARY_CHARS = 300;
const SUMMARY_CHARS = 2_000;

interface Unit {
  /** Offsets in the joined transcript. */
  start: number;
  end: number;
  /** Start time (s) of the segment the unit starts in. */
  time: number;
  text: string;
}

const round = (x: number, digits = 3) => Math.round(x * 10 ** digits) / 10 ** digits;

/** Content terms of a text: lower-case words that are neither stop words, filler, numbers nor shorter than 3 letters. */
function contentWords(text: string): Array<{ word: string; start: number; end: number }> {
  return words(text).filter((w) => w.word.length >= 3 && !STOP_WORDS.has(w.word) && !FILLER.has(w.word) && !/^\d/.test(w.word));
}

export function videoIntelTask(input: IntelInput): IntelOutput {
  const { starts, texts } = input;
  // The transcript as one text, with each segment's offset (for mapping sentences back to times).
  const offsets: number[] = [];
  let transcript = '';
  for (let i = 0; i < texts.length; i++) {
    offsets.push(transcript.length);
    transcript += (i ? ' ' : '') + texts[i];
    if (i) offsets[i]! += 1;
  }
  const hasTranscript = transcript.trim().length > 0;
  const allWords = hasTranscript ? words(transcript).length : 0;
  let lastEnd = 0;
  for (let i = 0; i < starts.length; i++) lastEnd = Math.max(lastEnd, starts[i]! + (input.durs[i] ?? 0));
  const duration = input.duration_s && input.duration_s > 0 ? input.duration_s : lastEnd > 0 ? lastEnd : null;

  const units = hasTranscript ? unitsOf(transcript, offsets, starts) : [];
  const ranks = units.length ? textRank(units.map((u) => u.text)) : new Float64Array(0);

  // Chapters: the description's, else the transcript's topic shifts.
  let chapters: IntelChapter[] = [];
  let chaptersSource: IntelOutput['chapters_source'] = 'none';
  const described = descriptionChapters(input.description, input.duration_s);
  if (described.length) {
    chaptersSource = 'description';
    chapters = described.map((c, i) => ({
      start: c.start,
      end: described[i + 1]?.start ?? duration,
      title: c.title,
      summary: hasTranscript ? chapterSummary(units, ranks, c.start, described[i + 1]?.start ?? Infinity) : null,
    }));
  } else if (hasTranscript) {
    chaptersSource = 'transcript';
    chapters = segmentChapters(units, ranks, duration);
  }

  // Keywords: TF-IDF with the chapters (or fixed blocks) of the transcript as documents.
  const docs = hasTranscript ? documentsOf(units, chapters) : [[input.title, input.description, input.tags.join(' ')].join('\n')];
  const keywords = rankKeywords(docs, input.title, `${input.description}\n${input.tags.join(' ')}`, input.max_keywords);

  const entityText = [input.title, input.description, transcript].filter(Boolean).join('\n');
  const entities = findEntities(entityText);

  let summary = '';
  let summarySource: IntelOutput['summary_source'] = 'none';
  if (units.length) {
    summarySource = 'transcript';
    // The best-ranked units, a repeated one only once, in the order they were said.
    const seen = new Set<string>();
    const top: number[] = [];
    for (const i of [...ranks.keys()].sort((a, b) => ranks[b]! - ranks[a]! || a - b)) {
      if (top.length >= input.summary_sentences) break;
      const key = words(units[i]!.text)
        .map((w) => w.word)
        .join(' ');
      if (seen.has(key)) continue;
      seen.add(key);
      top.push(i);
    }
    summary = clip(
      top
        .sort((a, b) => a - b)
        .map((i) => units[i]!.text)
        .join(' '),
      SUMMARY_CHARS,
    );
  } else if (input.description.trim()) {
    // Without captions: the description's opening sentences, before any chapter list or links.
    const prose = input.description
      .split(/\r?\n/)
      .filter((l) => l.trim() && !/https?:\/\/|\d:\d\d/.test(l))
      .join('\n');
    const spans = splitSentences(prose).slice(0, input.summary_sentences);
    summary = clip(spans.map((s) => prose.slice(s.start, s.end)).join(' '), SUMMARY_CHARS);
    if (summary) summarySource = 'description';
  }

  return {
    chapters,
    chapters_source: chaptersSource,
    keywords,
    entities,
    summary,
    summary_source: summarySource,
    words: allWords,
    wpm: hasTranscript && duration ? round(allWords / (duration / 60), 1) : null,
  };
}

function clip(text: string, max: number): string {
  if (text.length <= max) return text;
  const cut = text.lastIndexOf(' ', max - 1);
  return `${text.slice(0, cut > max / 2 ? cut : max - 1)}…`;
}

/**
 * Sentence-like units of a transcript: its sentences when it is punctuated (manual captions), else
 * runs of whole segments of about UNIT_WORDS words (automatic captions carry no punctuation).
 */
function unitsOf(transcript: string, offsets: number[], starts: number[]): Unit[] {
  const timeAt = (offset: number) => {
    let lo = 0;
    let hi = offsets.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (offsets[mid]! <= offset) lo = mid;
      else hi = mid - 1;
    }
    return starts[lo] ?? 0;
  };
  const total = words(transcript).length;
  const ends = (transcript.match(/[.!?…](?=\s|$)/g) ?? []).length;
  const out: Unit[] = [];
  if (ends >= total / 40) {
    for (const s of splitSentences(transcript)) {
      // A very long "sentence" is cut at segment boundaries like unpunctuated text.
      const text = transcript.slice(s.start, s.end);
      if (words(text).length <= UNIT_WORDS * 4) out.push({ start: s.start, end: s.end, time: timeAt(s.start), text });
      else out.push(...groupSegments(transcript, offsets, starts, s.start, s.end));
    }
    return out;
  }
  return groupSegments(transcript, offsets, starts, 0, transcript.length);
}

function groupSegments(transcript: string, offsets: number[], starts: number[], from: number, to: number): Unit[] {
  const out: Unit[] = [];
  let unitStart = -1;
  let count = 0;
  for (let i = 0; i < offsets.length; i++) {
    const segStart = offsets[i]!;
    const segEnd = i + 1 < offsets.length ? offsets[i + 1]! - 1 : transcript.length;
    if (segEnd <= from || segStart >= to) continue;
    if (unitStart < 0) unitStart = i;
    count += words(transcript.slice(Math.max(segStart, from), Math.min(segEnd, to))).length;
    if (count >= UNIT_WORDS || i === offsets.length - 1 || offsets[i + 1]! >= to) {
      const s = Math.max(offsets[unitStart]!, from);
      const e = Math.min(segEnd, to);
      out.push({ start: s, end: e, time: starts[unitStart]!, text: transcript.slice(s, e) });
      unitStart = -1;
      count = 0;
    }
  }
  return out;
}

/** The chapter's best-ranked unit (TextRank over the whole transcript), clipped; null when no unit starts inside it. */
function chapterSummary(units: Unit[], ranks: Float64Array, from: number, to: number): string | null {
  let best = -1;
  for (let i = 0; i < units.length; i++) {
    const t = units[i]!.time;
    if (t < from || t >= to) continue;
    if (best < 0 || ranks[i]! > ranks[best]!) best = i;
  }
  return best < 0 ? null : clip(units[best]!.text, CHAPTER_SUMMARY_CHARS);
}

type Vector = Map<string, number>;

function vectorOf(text: string): Vector {
  const v: Vector = new Map();
  for (const w of contentWords(text)) v.set(w.word, (v.get(w.word) ?? 0) + 1);
  return v;
}

function cosine(a: Vector, b: Vector): number {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (const [k, x] of a) {
    na += x * x;
    const y = b.get(k);
    if (y) dot += x * y;
  }
  for (const y of b.values()) nb += y * y;
  return na && nb ? dot / Math.sqrt(na * nb) : 0;
}

function add(into: Vector, v: Vector): Vector {
  for (const [k, x] of v) into.set(k, (into.get(k) ?? 0) + x);
  return into;
}

/**
 * Lexical segmentation (TextTiling, Hearst 1997): units are grouped into blocks of about BLOCK_WORDS
 * words; at each gap between blocks the vocabulary of the two blocks before is compared (cosine) with
 * that of the two after; a gap's depth is how far its similarity sits below the nearest peaks on
 * either side. The deepest gaps above mean + sd/2 become boundaries, deepest first, as long as every
 * chapter lasts at least max(60 s, duration / 10); at most MAX_CHAPTERS chapters. A chapter's title is
 * its three most distinctive terms (TF-IDF against the other chapters); its summary its best-ranked
 * unit. A short transcript (under MIN_SEGMENT_WORDS words) is one chapter.
 */
function segmentChapters(units: Unit[], ranks: Float64Array, duration: number | null): IntelChapter[] {
  const blocks: Array<{ first: number; last: number; vec: Vector }> = [];
  let current: { first: number; last: number; vec: Vector } | null = null;
  let n = 0;
  let totalWords = 0;
  for (let i = 0; i < units.length; i++) {
    const vec = vectorOf(units[i]!.text);
    const count = words(units[i]!.text).length;
    totalWords += count;
    if (!current) current = { first: i, last: i, vec: new Map() };
    add(current.vec, vec);
    current.last = i;
    n += count;
    if (n >= BLOCK_WORDS) {
      blocks.push(current);
      current = null;
      n = 0;
    }
  }
  if (current) blocks.push(current);
  const boundaries: number[] = []; // block indexes that start a chapter
  if (totalWords >= MIN_SEGMENT_WORDS && blocks.length >= 4) {
    const K = 2;
    const sims: number[] = [];
    for (let g = 1; g < blocks.length; g++) {
      const left: Vector = new Map();
      const right: Vector = new Map();
      for (let b = Math.max(0, g - K); b < g; b++) add(left, blocks[b]!.vec);
      for (let b = g; b < Math.min(blocks.length, g + K); b++) add(right, blocks[b]!.vec);
      sims.push(cosine(left, right));
    }
    const depths = sims.map((s, i) => {
      let l = s;
      for (let j = i - 1; j >= 0 && sims[j]! >= l; j--) l = sims[j]!;
      let r = s;
      for (let j = i + 1; j < sims.length && sims[j]! >= r; j++) r = sims[j]!;
      return l - s + (r - s);
    });
    const mean = depths.reduce((a, b) => a + b, 0) / depths.length;
    const sd = Math.sqrt(depths.reduce((a, b) => a + (b - mean) ** 2, 0) / depths.length);
    const cutoff = mean + sd / 2;
    const end = duration ?? units[units.length - 1]!.time;
    const minLength = Math.max(60, end / 10);
    const order = depths.map((d, i) => i).sort((a, b) => depths[b]! - depths[a]! || a - b);
    const times = [0, end];
    for (const gap of order) {
      if (boundaries.length >= MAX_CHAPTERS - 1) break;
      if (depths[gap]! <= 0 || depths[gap]! < cutoff) break;
      const block = gap + 1;
      const t = units[blocks[block]!.first]!.time;
      if (times.some((x) => Math.abs(x - t) < minLength)) continue;
      boundaries.push(block);
      times.push(t);
    }
    boundaries.sort((a, b) => a - b);
  }
  const starts = [0, ...boundaries];
  const spans = starts.map((b, i) => ({ firstUnit: blocks[b]!.first, lastUnit: i + 1 < starts.length ? blocks[starts[i + 1]!]!.first - 1 : units.length - 1 }));
  const texts = spans.map((s) =>
    units
      .slice(s.firstUnit, s.lastUnit + 1)
      .map((u) => u.text)
      .join(' '),
  );
  const titled = rankKeywordsPerDoc(texts, 3);
  return spans.map((s, i) => {
    const start = i === 0 ? 0 : units[s.firstUnit]!.time;
    const next = i + 1 < spans.length ? units[spans[i + 1]!.firstUnit]!.time : null;
    let best = s.firstUnit;
    for (let u = s.firstUnit; u <= s.lastUnit; u++) if (ranks[u]! > ranks[best]!) best = u;
    const terms = titled[i]!;
    const title = terms.length ? terms.join(', ').replace(/^\p{L}/u, (c) => c.toUpperCase()) : `Part ${i + 1}`;
    return { start, end: next ?? duration, title, summary: clip(units[best]!.text, CHAPTER_SUMMARY_CHARS) };
  });
}

/** The documents for IDF: the chapters' texts when there are two or more, else blocks of ~10 units. */
function documentsOf(units: Unit[], chapters: IntelChapter[]): string[] {
  if (chapters.length >= 2) {
    const docs: string[] = chapters.map(() => '');
    let c = 0;
    for (const u of units) {
      while (c + 1 < chapters.length && u.time >= chapters[c + 1]!.start) c++;
      docs[c] += ` ${u.text}`;
    }
    return docs.filter((d) => d.trim());
  }
  const docs: string[] = [];
  for (let i = 0; i < units.length; i += 10)
    docs.push(
      units
        .slice(i, i + 10)
        .map((u) => u.text)
        .join(' '),
    );
  return docs;
}

interface TermStats {
  /** Total occurrences, and in how many documents. */
  tf: number;
  df: number;
  first: number;
  /** Surface forms (original case) and how often each was written. */
  forms: Map<string, number>;
}

/** Counts of content words and of two-word phrases of adjacent content words, per document. */
function termStats(docs: string[]): { stats: Map<string, TermStats>; perDoc: Array<Map<string, number>> } {
  const stats = new Map<string, TermStats>();
  const perDoc: Array<Map<string, number>> = [];
  let position = 0;
  for (const doc of docs) {
    const local = new Map<string, number>();
    const all = words(doc);
    const bump = (key: string, form: string) => {
      local.set(key, (local.get(key) ?? 0) + 1);
      let s = stats.get(key);
      if (!s) stats.set(key, (s = { tf: 0, df: 0, first: position, forms: new Map() }));
      s.tf++;
      s.forms.set(form, (s.forms.get(form) ?? 0) + 1);
      position++;
    };
    const isContent = (w: string) => w.length >= 3 && !STOP_WORDS.has(w) && !FILLER.has(w) && !/^\d/.test(w);
    for (let i = 0; i < all.length; i++) {
      const w = all[i]!;
      if (!isContent(w.word)) continue;
      bump(w.word, doc.slice(w.start, w.end));
      const next = all[i + 1];
      // Two content words side by side, with only a space or hyphen between them.
      if (next && isContent(next.word) && /^[ -]$/.test(doc.slice(w.end, next.start))) bump(`${w.word} ${next.word}`, doc.slice(w.start, next.end));
    }
    for (const k of local.keys()) stats.get(k)!.df++;
    perDoc.push(local);
  }
  return { stats, perDoc };
}

function displayForm(s: TermStats): string {
  let best = '';
  let n = -1;
  for (const [form, c] of s.forms) {
    // The commonest spelling; lower case wins a tie (sentence-initial capitals are not names).
    if (c > n || (c === n && form < best && form.toLowerCase() === form)) {
      best = form;
      n = c;
    }
  }
  return best.replace(/\s+/g, ' ');
}

/**
 * TF-IDF keywords: score = tf × ln(1 + N/df) over the documents, × 1.5 for terms in the title and
 * × 1.2 for terms in the description or tags. Two-word phrases of adjacent content words count when
 * they occur at least twice, and not when they share a word with a better-scoring phrase; a single
 * word is left out when a listed phrase accounts for at least half its occurrences. Scores are scaled
 * so the best is 1.
 */
function rankKeywords(docs: string[], title: string, description: string, max: number): IntelKeyword[] {
  const { stats } = termStats(docs);
  const N = docs.length;
  const inTitle = new Set(contentWords(title).map((w) => w.word));
  const inDescription = new Set(contentWords(description).map((w) => w.word));
  const scored: Array<{ key: string; s: TermStats; score: number }> = [];
  for (const [key, s] of stats) {
    const phrase = key.includes(' ');
    if (phrase && s.tf < 2) continue;
    let score = s.tf * Math.log(1 + N / s.df);
    const parts = key.split(' ');
    if (parts.every((p) => inTitle.has(p))) score *= 1.5;
    else if (parts.every((p) => inDescription.has(p))) score *= 1.2;
    scored.push({ key, s, score });
  }
  scored.sort((a, b) => b.score - a.score || a.s.first - b.s.first);
  // Phrases, best first, none sharing a word with a better one ("learning models" after "machine learning").
  const phrases = new Set<string>();
  const phraseWords = new Set<string>();
  for (const c of scored) {
    if (!c.key.includes(' ')) continue;
    const parts = c.key.split(' ');
    if (parts.some((p) => phraseWords.has(p))) continue;
    phrases.add(c.key);
    for (const p of parts) phraseWords.add(p);
  }
  // A word that is mostly said inside one of them ("machine" in "machine learning") is that phrase's.
  const dominated = new Set<string>();
  for (const key of phrases) {
    const tf = stats.get(key)!.tf;
    for (const part of key.split(' ')) if (tf * 2 >= stats.get(part)!.tf) dominated.add(part);
  }
  const kept: typeof scored = [];
  for (const c of scored) {
    if (kept.length >= max) break;
    if (c.key.includes(' ') ? !phrases.has(c.key) : dominated.has(c.key)) continue;
    kept.push(c);
  }
  const top = kept[0]?.score ?? 1;
  return kept.map((k) => ({ term: displayForm(k.s), score: round(k.score / top), count: k.s.tf }));
}

/** Each document's `n` most distinctive single terms (TF-IDF against the other documents), for chapter titles. */
function rankKeywordsPerDoc(docs: string[], n: number): string[][] {
  const { stats, perDoc } = termStats(docs);
  const N = docs.length;
  return perDoc.map((local) => {
    const ranked = [...local.entries()]
      .filter(([k]) => !k.includes(' '))
      .map(([k, tf]) => ({ k, score: tf * Math.log(1 + N / stats.get(k)!.df), first: stats.get(k)!.first }))
      .sort((a, b) => b.score - a.score || a.first - b.first);
    return ranked.slice(0, n).map((r) => displayForm(stats.get(r.k)!));
  });
}

/**
 * People, organisations and places found by compromise, read in chunks of about 2,000 characters at
 * sentence boundaries (its cost grows faster than linearly with a chunk's length). Names are grouped
 * case-insensitively without a possessive 's; each keeps its commonest spelling and type. Sorted by
 * count, then first appearance; at most MAX_ENTITIES.
 */
function findEntities(text: string): IntelEntity[] {
  const found = new Map<string, { forms: Map<string, number>; types: Map<EntityType, number>; count: number; first: number }>();
  const spans = splitSentences(text);
  const chunks: Array<[number, number]> = [];
  for (let k = 0; k < spans.length; ) {
    const from = spans[k]!.start;
    let to = spans[k]!.end;
    k++;
    while (k < spans.length && spans[k]!.end - from <= 2_000) to = spans[k++]!.end;
    chunks.push([from, Math.min(to, from + 4_000)]);
  }
  // Past the budget, chunks spread evenly over the whole text (the first, with the title and description, always).
  const total = chunks.reduce((n, [a, b]) => n + b - a, 0);
  const take = total > MAX_ENTITY_CHARS ? Math.max(1, Math.floor((chunks.length * MAX_ENTITY_CHARS) / total)) : chunks.length;
  let order = 0;
  for (let j = 0; j < take; j++) {
    const c = Math.floor((j * chunks.length) / take);
    const chunk = text.slice(chunks[c]![0], chunks[c]![1]);
    if (!/\p{Lu}/u.test(chunk)) continue;
    const doc = nlp(chunk);
    const groups: Array<[EntityType, { out(f: string): string[] }]> = [
      ['person', doc.people() as unknown as { out(f: string): string[] }],
      ['organisation', doc.organizations() as unknown as { out(f: string): string[] }],
      ['place', doc.places() as unknown as { out(f: string): string[] }],
    ];
    for (const [type, view] of groups) {
      for (const raw of view.out('array')) {
        const form = raw
          .replace(/['’]s$/i, '')
          .replace(/^[^\p{L}\p{N}]+|[^\p{L}\p{N}]+$/gu, '')
          .trim();
        if (form.length < 2 || !/\p{Lu}/u.test(form)) continue;
        const key = form.toLowerCase();
        let e = found.get(key);
        if (!e) found.set(key, (e = { forms: new Map(), types: new Map(), count: 0, first: order++ }));
        e.count++;
        e.forms.set(form, (e.forms.get(form) ?? 0) + 1);
        e.types.set(type, (e.types.get(type) ?? 0) + 1);
      }
    }
  }
  const best = <T>(m: Map<T, number>): T => [...m.entries()].sort((a, b) => b[1] - a[1])[0]![0];
  return [...found.values()]
    .sort((a, b) => b.count - a.count || a.first - b.first)
    .slice(0, MAX_ENTITIES)
    .map((e) => ({ text: best(e.forms), type: best(e.types), count: e.count }));
}
