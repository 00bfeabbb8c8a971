import { z } from 'zod';

/**
 * Shared pieces of text group A (quick_vibe, beacon_*): caps, a sentence splitter with offsets, a
 * word tokenizer and stop words. Pure functions, no side effects at load (the module is imported by
 * sandbox threads).
 */

/** CATALOGUE: text ≤ 400,000 characters. */
export const MAX_TEXT_CHARS = 400_000;

export const ENCODINGS = ['o200k_base', 'cl100k_base'] as const;
export const EncodingField = z
  .enum(ENCODINGS)
  .default('o200k_base')
  .describe('Tokenizer the budget is counted in: o200k_base (GPT-4o and later) or cl100k_base (GPT-4, GPT-3.5)');

export interface Span {
  start: number;
  end: number;
}

/** Abbreviations after which a full stop does not end a sentence (lower case, without the dot). */
const ABBREVIATIONS = new Set([
  'mr',
  'mrs',
  'ms',
  'dr',
  'prof',
  'sr',
  'jr',
  'st',
  'mt',
  'vs',
  'etc',
  'e.g',
  'i.e',
  'cf',
  'fig',
  'no',
  'vol',
  'approx',
  'inc',
  'ltd',
  'co',
  'corp',
  'jan',
  'feb',
  'mar',
  'apr',
  'jun',
  'jul',
  'aug',
  'sep',
  'sept',
  'oct',
  'nov',
  'dec',
  'a.m',
  'p.m',
  'u.s',
  'u.k',
  'al',
  'gen',
  'col',
  'lt',
  'sgt',
  'rev',
  'ph.d',
]);

/**
 * A regex sentence splitter (wink-nlp loads a 3 MB model per thread; this is enough for scoring and
 * keeps offsets exact). A sentence ends:
 * - after `.`, `!`, `?` or `…` (runs of them, then closing quotes or brackets) followed by white space,
 *   unless the word before a single `.` is a known abbreviation or a single letter (initials, "U. S."),
 *   or the next character is a lower-case letter (an abbreviation we do not know);
 * - at a blank line; at a line break when the next line starts a list item, a heading or a quote, or
 *   when the line itself has no closing punctuation and the next starts with a capital (titles, lines).
 * Returned spans are trimmed of white space, never empty, in document order, and cover every
 * non-white-space character of the text exactly once.
 */
export function splitSentences(text: string, signal?: AbortSignal): Span[] {
  const spans: Span[] = [];
  let start = 0;
  const n = text.length;
  const push = (end: number) => {
    let s = start;
    let e = end;
    while (s < e && /\s/.test(text[s]!)) s++;
    while (e > s && /\s/.test(text[e - 1]!)) e--;
    if (e > s) spans.push({ start: s, end: e });
    start = end;
  };
  for (let i = 0; i < n; i++) {
    if ((i & 0xfff) === 0 && signal?.aborted) throw new Error('aborted');
    const c = text[i]!;
    if (c === '\n') {
      // Look at the next non-blank line.
      let j = i + 1;
      let blank = false;
      while (j < n && /[ \t\r\n]/.test(text[j]!)) {
        if (text[j] === '\n') blank = true;
        j++;
      }
      // Only white space left: the last span ends here (push(n) below trims it).
      if (j >= n) break;
      const lineStart = text.lastIndexOf('\n', i - 1) + 1;
      const line = text.slice(lineStart, i).trimEnd();
      const next = text.slice(j, Math.min(n, j + 4));
      const startsBlock = /^([-*+•>#|]|\d+[.)]\s)/.test(next) || /^\d+[.)]/.test(next);
      const lineOpen = line.length > 0 && !/[.!?…:;,"'”’)\]]$/.test(line) && /^[A-Z0-9"“'‘(\[]/.test(next);
      const lineIsBlock = /^\s*([-*+•>#|]|\d+[.)]\s)/.test(line);
      if (blank || startsBlock || lineOpen || lineIsBlock) {
        push(i);
        i = j - 1;
      }
      continue;
    }
    if (c !== '.' && c !== '!' && c !== '?' && c !== '…') continue;
    let j = i;
    while (j + 1 < n && /[.!?…]/.test(text[j + 1]!)) j++;
    let k = j;
    while (k + 1 < n && /["'”’)\]]/.test(text[k + 1]!)) k++;
    if (k + 1 < n && !/\s/.test(text[k + 1]!)) {
      i = j;
      continue;
    }
    if (c === '.' && j === i) {
      const word = /([\p{L}.]+)$/u.exec(text.slice(Math.max(0, i - 12), i))?.[1]?.toLowerCase() ?? '';
      if (ABBREVIATIONS.has(word) || /^\p{L}$/u.test(word)) {
        i = k;
        continue;
      }
      let m = k + 1;
      while (m < n && /[ \t]/.test(text[m]!)) m++;
      if (m < n && /\p{Ll}/u.test(text[m]!)) {
        i = k;
        continue;
      }
    }
    push(k + 1);
    i = k;
  }
  push(n);
  return spans;
}

/** English stop words left out of scoring (BM25 query terms and TextRank edges). */
export const STOP_WORDS = new Set(
  (
    'a an and are as at be been being but by can could did do does doing for from had has have having he her hers him his how i if in into is it its ' +
    'itself just me more most my no nor not of off on once only or other our ours out over own same she should so some such than that the their theirs them ' +
    'then there these they this those through to too under until up very was we were what when where which while who whom why will with would you your yours'
  ).split(' '),
);

/** Lower-cased words (letters, digits, apostrophes inside), with their offsets. */
export function words(text: string): Array<{ word: string; start: number; end: number }> {
  const out: Array<{ word: string; start: number; end: number }> = [];
  const re = /[\p{L}\p{N}]+(?:['’][\p{L}]+)*/gu;
  for (let m = re.exec(text); m; m = re.exec(text)) out.push({ word: m[0].toLowerCase().replace(/’/g, "'"), start: m.index, end: m.index + m[0].length });
  return out;
}

/** Terms for search: words without stop words. */
export function terms(text: string): string[] {
  return words(text)
    .map((w) => w.word)
    .filter((w) => !STOP_WORDS.has(w));
}

export function round(x: number, digits = 3): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

export function checkAborted(signal: AbortSignal | undefined, i: number): void {
  if ((i & 0x3ff) === 0 && signal?.aborted) throw new Error('aborted');
}
