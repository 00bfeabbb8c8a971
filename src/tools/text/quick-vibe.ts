import { z } from 'zod';
import Sentiment from 'sentiment';
import { franc } from 'franc-min';
import { syllable } from 'syllable';
import { defineTool } from '../types.js';
import { round, splitSentences, words } from './text-kit.js';

/**
 * quick_vibe: a deterministic tone read of a text (no model). Every figure is computed from the text:
 *
 * - sentiment: AFINN-165 word scores via `sentiment` (with its English negation handling): `score` is
 *   the sum, `comparative` the sum per word, `positive`/`negative` the words that scored.
 * - vibe, from comparative c (and the mix of words):
 *     both positive and negative words and |c| < 0.1 → "mixed";
 *     c ≥ 0.2 → "upbeat"; c ≥ 0.05 → "positive";
 *     c ≤ -0.2 → "hostile" when energy ≥ 0.4, else "downbeat"; c ≤ -0.05 → "negative";
 *     otherwise "neutral".
 * - energy 0..1: 0.35 × exclamation marks per sentence + 0.2 × ALL-CAPS word share (×5) + 0.2 ×
 *   intensifier share (very, really, so, totally..., ×10) + 0.25 × scored-word share (×3), each capped at 1.
 * - formality 0..1: 0.5 + (formal − informal) / 2, where informal = 0.3 × contractions (×8) + 0.2 ×
 *   first/second-person pronouns (×6) + 0.3 × slang (lol, gonna, hey... ×15) + 0.2 × (! and emoji per
 *   sentence), and formal = 0.5 × share of words with 3+ syllables (×3) + 0.3 × formal connectives
 *   (therefore, however, regarding... ×30) + 0.2 × (mean word length − 4) / 2.5, each capped at 1.
 * - readability: Flesch reading ease 206.835 − 1.015 (words/sentences) − 84.6 (syllables/words) and
 *   Flesch–Kincaid grade 0.39 (words/sentences) + 11.8 (syllables/words) − 15.59; syllables by `syllable`,
 *   sentences by the regex splitter in text-kit.ts. English formulas: other languages get rough figures.
 * - language: ISO 639-3 code from franc-min (82 languages); "und" when the text is too short to tell.
 * Limits: sarcasm, irony and domain words (e.g. "sick" as praise) are read literally.
 */

export const MAX_VIBE_CHARS = 20_000;

const Input = z.object({
  text: z.string().min(1).max(MAX_VIBE_CHARS).describe('The text to read (up to 20,000 characters)'),
});

const Output = z.object({
  vibe: z.enum(['upbeat', 'positive', 'neutral', 'mixed', 'negative', 'downbeat', 'hostile']),
  sentiment: z.object({ score: z.number(), comparative: z.number(), positive: z.array(z.string()), negative: z.array(z.string()) }),
  energy: z.number().min(0).max(1),
  formality: z.number().min(0).max(1),
  readability: z.object({
    flesch: z.number().nullable(),
    grade: z.number().nullable(),
    sentences: z.number().int(),
    words: z.number().int(),
    syllables: z.number().int(),
  }),
  language: z.string(),
});

const INTENSIFIERS = new Set([
  'very',
  'really',
  'so',
  'totally',
  'absolutely',
  'extremely',
  'incredibly',
  'super',
  'truly',
  'completely',
  'utterly',
  'seriously',
  'insanely',
  'literally',
  'definitely',
]);
const PRONOUNS_12 = new Set(['i', 'me', 'my', 'mine', 'we', 'us', 'our', 'you', 'your', 'yours', "i'm", "you're", "we're", "i've", "you've"]);
const SLANG = new Set([
  'lol',
  'lmao',
  'omg',
  'btw',
  'gonna',
  'wanna',
  'gotta',
  'yeah',
  'yep',
  'nope',
  'hey',
  'hi',
  'cool',
  'awesome',
  'ok',
  'okay',
  'kinda',
  'sorta',
  'dude',
  'guys',
  'stuff',
  'thx',
  'thanks',
  'pls',
  'tbh',
  'imo',
  'haha',
  'wow',
  'yay',
  'ugh',
  'meh',
]);
const FORMAL = new Set([
  'therefore',
  'however',
  'furthermore',
  'moreover',
  'regarding',
  'pursuant',
  'hereby',
  'accordingly',
  'consequently',
  'nevertheless',
  'sincerely',
  'respectfully',
  'whereas',
  'thus',
  'hence',
  'notwithstanding',
  'herein',
  'aforementioned',
  'kindly',
  'regards',
]);
const EMOJI = /\p{Extended_Pictographic}/gu;

let analyzer: Sentiment | undefined;
const cap = (x: number) => Math.max(0, Math.min(1, x));

export const quickVibe = defineTool({
  name: 'quick_vibe',
  description: 'A deterministic tone read of a text: sentiment (AFINN-165), energy, formality, readability (Flesch) and language.',
  tier: 'free',
  priceCents: 5,
  family: 'text',
  input: Input,
  qField: 'text',
  qParse: 'text',
  output: '{vibe, sentiment{score,comparative,positive,negative}, energy, formality, readability{flesch,grade,sentences,words,syllables}, language}',
  outputSchema: Output,
  examples: [
    { text: 'I love this!' },
    { text: 'Pursuant to our agreement, the invoice is therefore due within thirty days. Kindly confirm receipt.' },
    { text: 'ugh, the build broke AGAIN and nobody knows why. this is terrible.' },
  ],
  isolated: import.meta.url,
  limits: { timeMs: 5_000, memoryMb: 256 },
  largestInput: () => ({ text: largeReview(MAX_VIBE_CHARS) }),
  handler: async ({ text }, ctx) => {
    analyzer ??= new Sentiment();
    const s = analyzer.analyze(text);
    if (ctx.signal.aborted) throw new Error('aborted');
    const ws = words(text).filter((w) => /\p{L}/u.test(w.word));
    const nWords = ws.length;
    const sentences = Math.max(1, splitSentences(text, ctx.signal).length);
    let syllables = 0;
    let long = 0;
    let letters = 0;
    let intens = 0;
    let caps = 0;
    let contractions = 0;
    let pronouns = 0;
    let slang = 0;
    let formal = 0;
    for (const w of ws) {
      const n = syllable(w.word);
      syllables += n;
      if (n >= 3) long++;
      letters += w.word.length;
      if (INTENSIFIERS.has(w.word)) intens++;
      const raw = text.slice(w.start, w.end);
      if (raw.length >= 2 && raw === raw.toUpperCase() && /\p{Lu}/u.test(raw) && raw !== 'I') caps++;
      if (w.word.includes("'")) contractions++;
      if (PRONOUNS_12.has(w.word)) pronouns++;
      if (SLANG.has(w.word)) slang++;
      if (FORMAL.has(w.word)) formal++;
    }
    const per = (x: number) => (nWords ? x / nWords : 0);
    const exclam = (text.match(/!/g) ?? []).length;
    const emoji = (text.match(EMOJI) ?? []).length;
    const scored = s.positive.length + s.negative.length;
    const energy = cap(0.35 * cap(exclam / sentences) + 0.2 * cap(per(caps) * 5) + 0.2 * cap(per(intens) * 10) + 0.25 * cap(per(scored) * 3));
    const informal = 0.3 * cap(per(contractions) * 8) + 0.2 * cap(per(pronouns) * 6) + 0.3 * cap(per(slang) * 15) + 0.2 * cap((exclam + emoji) / sentences);
    const formalScore = 0.5 * cap(per(long) * 3) + 0.3 * cap(per(formal) * 30) + 0.2 * cap((nWords ? letters / nWords - 4 : 0) / 2.5);
    const formality = cap(0.5 + (formalScore - informal) / 2);
    const c = nWords ? s.score / nWords : 0;
    const vibe =
      s.positive.length && s.negative.length && Math.abs(c) < 0.1
        ? 'mixed'
        : c >= 0.2
          ? 'upbeat'
          : c >= 0.05
            ? 'positive'
            : c <= -0.2
              ? energy >= 0.4
                ? 'hostile'
                : 'downbeat'
              : c <= -0.05
                ? 'negative'
                : 'neutral';
    const wps = nWords / sentences;
    const spw = nWords ? syllables / nWords : 0;
    return {
      vibe: vibe as z.infer<typeof Output>['vibe'],
      sentiment: { score: s.score, comparative: round(c, 4), positive: s.positive, negative: s.negative },
      energy: round(energy),
      formality: round(formality),
      readability: {
        flesch: nWords ? round(206.835 - 1.015 * wps - 84.6 * spw, 1) : null,
        grade: nWords ? round(0.39 * wps + 11.8 * spw - 15.59, 1) : null,
        sentences: nWords ? sentences : 0,
        words: nWords,
        syllables,
      },
      language: franc(text, { minLength: 10 }),
    };
  },
});

/** A long mixed review of `chars` characters, for largestInput. */
export function largeReview(chars: number): string {
  const lines = [
    'I absolutely love how fast the new release is!',
    'However, the documentation is confusing and the setup failed twice.',
    'Support answered within an hour, which was great.',
    "Honestly, I'm not sure the pricing is fair for small teams.",
  ];
  let out = '';
  for (let i = 0; out.length < chars; i++) out += lines[i % lines.length] + ' ';
  return out.slice(0, chars);
}
