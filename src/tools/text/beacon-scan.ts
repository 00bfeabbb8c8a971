import { z } from 'zod';
import { defineTool } from '../types.js';
import { tokenCount, type ExactEncoding } from './tokens.js';
import { countTokensA } from './tiktoken-count.js';
import { MAX_TEXT_CHARS } from './text-kit.js';

/**
 * beacon_scan: a token census of a text and a map of its sections. The two exact encodings are
 * js-tiktoken's counts (through tiktoken-count.ts: same counts, special-token spellings counted as text, long
 * runs merged in O(n log n)); any other encoding name is a chars/4 estimate, labelled so.
 * Sections are Markdown headings (ATX `#` and setext `===`/`---` underlines, not inside ``` fences);
 * text before the first heading is a section with heading null. Offsets are JavaScript string indices
 * (UTF-16 code units), end exclusive: text.slice(start, end) is the section.
 */

const DEFAULT_WINDOWS = [8_192, 32_768, 128_000, 200_000, 1_000_000];

const Input = z.object({
  text: z.string().min(1).max(MAX_TEXT_CHARS).describe('The text to measure (up to 400,000 characters)'),
  encoding: z
    .string()
    .min(1)
    .max(64)
    .default('o200k_base')
    .describe('Encoding for section counts and fits: o200k_base and cl100k_base are exact; any other name gets a chars/4 estimate labelled `estimate`'),
  windows: z
    .array(z.number().int().min(1).max(10_000_000))
    .min(1)
    .max(20)
    .optional()
    .describe('Context window sizes in tokens to check the text against (default 8192, 32768, 128000, 200000, 1000000)'),
});

const Section = z.object({
  heading: z.string().nullable(),
  level: z.number().int().min(0).max(6),
  start: z.number().int().min(0),
  end: z.number().int().min(0),
  tokens: z.number().int().min(0),
});

const Output = z.object({
  characters: z.number().int(),
  lines: z.number().int(),
  tokens: z.object({ o200k_base: z.number().int(), cl100k_base: z.number().int() }),
  encoding: z.object({ name: z.string(), tokens: z.number().int(), label: z.enum(['exact', 'estimate']) }),
  sections: z.array(Section),
  heaviest: z.object({ index: z.number().int(), heading: z.string().nullable(), tokens: z.number().int(), share: z.number() }).nullable(),
  fits: z.array(z.object({ window: z.number().int(), fits: z.boolean(), fill_ratio: z.number() })),
});

export interface Heading {
  heading: string;
  level: number;
  /** Where the heading's section starts (the heading line's first character). */
  start: number;
}

/** Markdown headings outside fenced code blocks, in order. */
export function findHeadings(text: string): Heading[] {
  const out: Heading[] = [];
  let fence: string | null = null;
  let pos = 0;
  let prev: { start: number; text: string } | null = null;
  while (pos <= text.length) {
    const nl = text.indexOf('\n', pos);
    const end = nl === -1 ? text.length : nl;
    const line = text.slice(pos, end).replace(/\r$/, '');
    const f = /^ {0,3}(`{3,}|~{3,})/.exec(line);
    if (f) {
      if (!fence) fence = f[1]![0]!;
      else if (f[1]![0] === fence) fence = null;
      prev = null;
    } else if (!fence) {
      // Closing #s are stripped by hand: a regex for them backtracks badly on long runs of spaces.
      const atx = /^ {0,3}(#{1,6})(?:[ \t]+([^\n]*))?$/.exec(line);
      const setext = /^ {0,3}(=+|-+)[ \t]*$/.exec(line);
      if (atx) {
        out.push({ heading: stripClosing(atx[2] ?? ''), level: atx[1]!.length, start: pos });
        prev = null;
      } else if (setext && prev && prev.text.trim() && !/^\s*([-*+>]|#)/.test(prev.text)) {
        out.push({ heading: prev.text.trim(), level: setext[1]![0] === '=' ? 1 : 2, start: prev.start });
        prev = null;
      } else {
        prev = { start: pos, text: line };
      }
    }
    if (nl === -1) break;
    pos = nl + 1;
  }
  return out;
}

/** An ATX heading's text without its optional closing sequence of #s. */
function stripClosing(raw: string): string {
  const s = raw.trim();
  let k = s.length;
  while (k > 0 && s[k - 1] === '#') k--;
  if (k === 0) return '';
  return k < s.length && (s[k - 1] === ' ' || s[k - 1] === '\t') ? s.slice(0, k).trim() : s;
}

export const beaconScan = defineTool({
  name: 'beacon_scan',
  description: 'Counts the tokens of a text exactly (o200k_base, cl100k_base) and maps its Markdown sections with their token weights.',
  tier: 'pro',
  priceCents: 1,
  family: 'text',
  input: Input,
  qField: 'text',
  qParse: 'text',
  output:
    '{characters, lines, tokens{o200k_base,cl100k_base}, encoding{name,tokens,label}, sections[{heading,level,start,end,tokens}], heaviest, fits[{window,fits,fill_ratio}]}',
  outputSchema: Output,
  examples: [
    { text: '# Intro\nTollgate runs tools over HTTP.\n\n## Pricing\nEvery successful call is charged in credits.\n' },
    { text: 'A plain paragraph without headings, measured in cl100k_base.', encoding: 'cl100k_base', windows: [16] },
    { text: 'Counted with an encoding that has no exact table.', encoding: 'p50k_base' },
  ],
  isolated: import.meta.url,
  progress: true,
  limits: { timeMs: 20_000, memoryMb: 384 },
  largestInput: () => ({ text: largeMarkdown(MAX_TEXT_CHARS) }),
  handler: async ({ text, encoding, windows }, ctx) => {
    await ctx.progress({ stage: 'counting', done: 0, total: 3 });
    const o200k = countTokensA(text, 'o200k_base', ctx.signal);
    if (ctx.signal.aborted) throw new Error('aborted');
    const cl100k = countTokensA(text, 'cl100k_base', ctx.signal);
    if (ctx.signal.aborted) throw new Error('aborted');
    await ctx.progress({ stage: 'sections', done: 2, total: 3 });
    const exact = tokenCount('', encoding).exact;
    const count = (s: string) =>
      encoding === 'o200k_base' && s === text
        ? o200k
        : encoding === 'cl100k_base' && s === text
          ? cl100k
          : exact
            ? countTokensA(s, encoding as ExactEncoding)
            : tokenCount(s, encoding).tokens;
    const total = count(text);
    const headings = findHeadings(text);
    const bounds: Array<{ heading: string | null; level: number; start: number }> = [];
    if (headings.length === 0 || text.slice(0, headings[0]!.start).trim()) bounds.push({ heading: null, level: 0, start: 0 });
    bounds.push(...headings);
    // White space before the first heading belongs to it, so the sections always tile the text.
    bounds[0] = { ...bounds[0]!, start: 0 };
    const sections = bounds.map((b, i) => {
      const end = i + 1 < bounds.length ? bounds[i + 1]!.start : text.length;
      if ((i & 0x3f) === 0 && ctx.signal.aborted) throw new Error('aborted');
      return { heading: b.heading, level: b.level, start: b.start, end, tokens: count(text.slice(b.start, end)) };
    });
    let hi = -1;
    sections.forEach((s, i) => {
      if (hi < 0 || s.tokens > sections[hi]!.tokens) hi = i;
    });
    const heaviest =
      hi < 0
        ? null
        : {
            index: hi,
            heading: sections[hi]!.heading,
            tokens: sections[hi]!.tokens,
            share: total ? Math.round((sections[hi]!.tokens / total) * 1000) / 1000 : 0,
          };
    await ctx.progress({ stage: 'done', done: 3, total: 3 });
    return {
      characters: text.length,
      lines: text.split('\n').length,
      tokens: { o200k_base: o200k, cl100k_base: cl100k },
      encoding: { name: encoding, tokens: total, label: exact ? ('exact' as const) : ('estimate' as const) },
      sections,
      heaviest,
      fits: (windows ?? DEFAULT_WINDOWS).map((window) => ({ window, fits: total <= window, fill_ratio: Math.round((total / window) * 10000) / 10000 })),
    };
  },
});

/** A realistic Markdown document of `chars` characters (headings, prose, code, lists). */
export function largeMarkdown(chars: number): string {
  const parts: string[] = [];
  let size = 0;
  for (let i = 0; size < chars; i++) {
    const block =
      `## Section ${i}: request handling\n\n` +
      `Every call is a job in the queue; section ${i} explains how retries, holds and settlement work, and why the ledger (entry ${i * 7}) never double-charges.\n\n` +
      '```ts\nconst price = tool.priceCents * 1.0; // cents\n```\n\n' +
      `- step ${i}.1: admission checks the plan\n- step ${i}.2: the worker runs the tool\n\n`;
    parts.push(block);
    size += block.length;
  }
  return parts.join('').slice(0, chars);
}
