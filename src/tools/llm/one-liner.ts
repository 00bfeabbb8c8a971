import { z } from 'zod';
import { defineTool } from '../types.js';
import { LlmMetaSchema, META_OUTPUT, clean, codePoints, llmOf, unusableReply } from './tool-kit.js';

/**
 * one_liner: one line of text in a chosen style. The model writes the line; code flattens it to one
 * line and, when it is longer than `max_chars` (counted in Unicode code points), cuts it at the last
 * word boundary that fits and sets `truncated: true`. No ellipsis is added.
 */

export const PROMPT_VERSION = 'one_liner/1';
const MAX_TEXT_CHARS = 20_000;
const MAX_TOKENS = 400;

export const STYLES = ['summary', 'tagline', 'commit', 'headline', 'tweet'] as const;
type Style = (typeof STYLES)[number];

const STYLE_RULES: Record<Style, string> = {
  summary: 'a plain, factual one-sentence summary of the whole text',
  tagline: 'a short, memorable marketing tagline for what the text describes',
  commit: 'a git commit subject line for the change the text describes: imperative mood ("Add", "Fix"), no trailing period',
  headline: 'a news-style headline in sentence case, no trailing period',
  tweet: 'a single engaging social-media post about the text, no hashtags unless essential',
};

export const OneLinerModelSchema = z.object({
  line: z.string().describe('The single line, with no line breaks and no surrounding quotes.'),
});

export const OneLinerInput = z.object({
  text: z.string().trim().min(1).max(MAX_TEXT_CHARS).describe(`The text to condense (at most ${MAX_TEXT_CHARS} characters).`),
  style: z.enum(STYLES).default('summary').describe('summary, tagline, commit (a commit subject), headline or tweet.'),
  max_chars: z
    .number()
    .int()
    .min(40)
    .max(280)
    .optional()
    .describe('Longest allowed line in characters (40-280; default 72 for commit, 280 for tweet, 120 otherwise).'),
});

export const OneLinerOutput = z.object({
  line: z.string().min(1),
  chars: z.number().int().min(1).max(280).describe('Length of `line` in Unicode code points.'),
  max_chars: z.number().int().min(40).max(280),
  style: z.enum(STYLES),
  truncated: z.boolean().describe('True when the model went over max_chars and code cut the line at a word boundary.'),
  meta: LlmMetaSchema,
});
export type OneLinerResult = z.infer<typeof OneLinerOutput>;

export function defaultMaxChars(style: Style): number {
  return style === 'commit' ? 72 : style === 'tweet' ? 280 : 120;
}

/**
 * At most `max` code points, cut at a word boundary: the longest prefix that ends at whitespace (or
 * at the end) and fits; trailing separators such as "," ";" ":" "-" are trimmed off the cut. A first
 * word longer than `max` is cut hard at `max`.
 */
export function cutAtWord(line: string, max: number): { line: string; truncated: boolean } {
  const cps = [...line];
  if (cps.length <= max) return { line, truncated: false };
  const head = cps.slice(0, max + 1); // one more: is the cut itself at a boundary?
  let end = -1;
  for (let i = max; i > 0; i--) {
    if (/\s/u.test(head[i]!)) {
      end = i;
      break;
    }
  }
  let out = end > 0 ? cps.slice(0, end).join('') : cps.slice(0, max).join('');
  out = out.replace(/[\s,;:\-–—(]+$/u, '');
  if (!out) out = cps.slice(0, max).join('');
  return { line: out, truncated: true };
}

/** Strips a matching pair of quotes the model may have wrapped the line in. */
function unquote(s: string): string {
  const m = /^(["“'‘`])(.*)(["”'’`])$/su.exec(s);
  return m && m[2]!.trim() ? m[2]!.trim() : s;
}

export const oneLiner = defineTool({
  name: 'one_liner',
  description:
    'One line of text in a style (summary, tagline, commit, headline, tweet), at most max_chars: a longer line is cut at a word boundary in code and flagged truncated.',
  tier: 'starter',
  priceCents: 2,
  family: 'llm',
  input: OneLinerInput,
  examples: [
    { text: 'We moved the billing cron job into the queue so retries no longer double-charge customers.', style: 'commit' },
    { text: 'A self-hosted tool that turns meeting recordings into searchable notes.', style: 'tagline', max_chars: 60 },
  ],
  qField: 'text',
  needs: ['llm'],
  progress: true,
  output: `{line, chars, max_chars, style, truncated, ${META_OUTPUT}}`,
  outputSchema: OneLinerOutput,
  handler: async (input, ctx): Promise<OneLinerResult> => {
    const max = input.max_chars ?? defaultMaxChars(input.style);
    const { value, meta } = await llmOf(ctx, 'one_liner').structured({
      name: 'one_liner',
      promptVersion: PROMPT_VERSION,
      instructions: `Write ${STYLE_RULES[input.style]} for the text in the data block "text". It must be one line of at most ${max} characters. Write in the language of the text.`,
      data: [{ name: 'text', text: input.text }],
      schema: OneLinerModelSchema,
      maxTokens: MAX_TOKENS,
      temperature: 0.4,
    });
    const flat = unquote(clean(value.line));
    if (!flat) throw unusableReply('one_liner', 'empty line');
    const cut = cutAtWord(flat, max);
    return { line: cut.line, chars: codePoints(cut.line), max_chars: max, style: input.style, truncated: cut.truncated, meta };
  },
});
