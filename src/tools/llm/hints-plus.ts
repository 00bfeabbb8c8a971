import { z } from 'zod';
import { defineTool, type LlmDataBlock } from '../types.js';
import { LlmMetaSchema, META_OUTPUT, clean, contextField, jaccard, llmOf, unusableReply, wordSet } from './tool-kit.js';

/**
 * hints_plus: a graded hint ladder, gentlest first. The model writes the hints; code drops any hint
 * whose word set overlaps an approach the caller already tried with Jaccard >= 0.6 (reported in
 * `filtered_as_tried`), keeps at most `count` of the rest in the model's order, and numbers them
 * `level` 1..n.
 */

export const PROMPT_VERSION = 'hints_plus/1';
export const TRIED_JACCARD = 0.6;
const MAX_PROBLEM_CHARS = 20_000;
const MAX_TRIED = 10;
const MAX_TRIED_CHARS = 2_000;
const MAX_TOKENS = 2_000;

export const HINT_KINDS = ['question', 'observation', 'concept', 'strategy', 'step', 'pitfall'] as const;

export const HintsPlusModelSchema = z.object({
  hints: z
    .array(
      z.object({
        kind: z
          .enum(HINT_KINDS)
          .describe(
            'question: a guiding question; observation: a fact to notice; concept: the idea that applies; strategy: an approach; step: a concrete next step; pitfall: a mistake to avoid.',
          ),
        hint: z.string().describe('The hint itself, without giving the final answer.'),
        why: z.string().describe('Why this hint helps at this point.'),
        check_by: z.string().describe('How the learner can check they are on track after using it.'),
      }),
    )
    .describe('Hints ordered from the gentlest nudge to the most revealing one.'),
});
type ModelHints = z.infer<typeof HintsPlusModelSchema>;

export const HintsPlusInput = z.object({
  problem: z.string().trim().min(1).max(MAX_PROBLEM_CHARS).describe('The problem you are stuck on.'),
  context: contextField,
  tried: z
    .array(z.string().trim().min(1).max(MAX_TRIED_CHARS))
    .max(MAX_TRIED)
    .default([])
    .describe(`Approaches already tried (at most ${MAX_TRIED}); hints too similar to one of them are left out.`),
  count: z.number().int().min(3).max(7).default(5).describe('How many hints to ask for (3-7).'),
});

const HintOut = z.object({
  level: z.number().int().min(1),
  kind: z.enum(HINT_KINDS),
  hint: z.string().min(1),
  why: z.string(),
  check_by: z.string(),
});

export const HintsPlusOutput = z.object({
  hints: z.array(HintOut).max(7),
  filtered_as_tried: z.array(
    z.object({
      kind: z.enum(HINT_KINDS),
      hint: z.string(),
      tried_index: z.number().int().min(0).describe('0-based index of the tried approach it matched most.'),
      jaccard: z.number().min(TRIED_JACCARD).max(1),
    }),
  ),
  meta: LlmMetaSchema,
});
export type HintsPlusResult = z.infer<typeof HintsPlusOutput>;

function instructions(count: number, hasTried: boolean): string {
  return `You are a patient tutor. Give a ladder of exactly ${count} hints for the problem in the data block "problem" (background, if any, is in the data block "context").
- Order them from the gentlest nudge to the most revealing step; each hint reveals a little more than the one before.
- Never give the final answer, finished code or a complete derivation, not even in the last hint.
- Each hint is one or two sentences; "why" says why it helps now; "check_by" says how the learner can tell they are on track.${
    hasTried
      ? '\n- The data block "tried" lists approaches the learner already tried, one per line. Do not suggest them again; build on what they teach instead.'
      : ''
  }
- Write in the language of the problem.`;
}

/** Model reply -> ladder: tried-like hints filtered out, at most `count` kept, levels 1..n. */
export function buildLadder(v: ModelHints, tried: readonly string[], count: number): Omit<HintsPlusResult, 'meta'> {
  const triedSets = tried.map((t) => wordSet(t));
  const candidates = v.hints.map((h) => ({ kind: h.kind, hint: clean(h.hint), why: clean(h.why), check_by: clean(h.check_by) })).filter((h) => h.hint);
  if (!candidates.length) throw unusableReply('hints_plus', 'no hints');
  const kept: typeof candidates = [];
  const filtered: HintsPlusResult['filtered_as_tried'] = [];
  for (const h of candidates) {
    const words = wordSet(h.hint);
    let best = -1;
    let bestScore = 0;
    triedSets.forEach((t, i) => {
      const s = jaccard(words, t);
      if (s > bestScore) {
        best = i;
        bestScore = s;
      }
    });
    if (best >= 0 && bestScore >= TRIED_JACCARD) {
      filtered.push({ kind: h.kind, hint: h.hint, tried_index: best, jaccard: Math.round(bestScore * 1000) / 1000 });
    } else kept.push(h);
  }
  return {
    hints: kept.slice(0, count).map((h, i) => ({ level: i + 1, ...h })),
    filtered_as_tried: filtered,
  };
}

export const hintsPlus = defineTool({
  name: 'hints_plus',
  description:
    'A graded hint ladder (levels 1..n, gentlest first) that never gives the answer; hints that repeat an approach you already tried (word Jaccard >= 0.6) are filtered out.',
  tier: 'starter',
  priceCents: 10,
  family: 'llm',
  input: HintsPlusInput,
  examples: [
    { problem: 'Find the longest substring without repeating characters in O(n).' },
    {
      problem: 'My React list re-renders every row when one item changes.',
      tried: ['wrap every row in React.memo', 'use the array index as the key'],
      count: 4,
    },
  ],
  qField: 'problem',
  needs: ['llm'],
  progress: true,
  output: `{hints[{level: 1..n, kind, hint, why, check_by}], filtered_as_tried[{kind, hint, tried_index, jaccard}], ${META_OUTPUT}}`,
  outputSchema: HintsPlusOutput,
  handler: async (input, ctx): Promise<HintsPlusResult> => {
    const data: LlmDataBlock[] = [{ name: 'problem', text: input.problem }];
    if (input.context) data.push({ name: 'context', text: input.context });
    if (input.tried.length) data.push({ name: 'tried', text: input.tried.map((t) => clean(t)).join('\n') });
    const { value, meta } = await llmOf(ctx, 'hints_plus').structured({
      name: 'hints_plus',
      promptVersion: PROMPT_VERSION,
      instructions: instructions(input.count, input.tried.length > 0),
      data,
      schema: HintsPlusModelSchema,
      maxTokens: MAX_TOKENS,
      temperature: 0.4,
    });
    return { ...buildLadder(value, input.tried, input.count), meta };
  },
});
