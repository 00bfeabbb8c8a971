import { z } from 'zod';
import { defineTool } from '../types.js';
import { MetaSchema, llmOf, unusableReply } from './tool-kit.js';

/**
 * mind_opener: a problem reframed through chosen thinking lenses. The model's schema is built for each
 * call with exactly one key per requested lens, so every reframe is attributed to its lens by the
 * structure of the reply, never by the model's say-so. Code orders the lenses (as requested), trims
 * each lens to `per_lens` reframes, and fails (503, uncharged) when a lens came back empty.
 */

const TOOL = 'mind_opener';
const PROMPT_VERSION = 'mind_opener/1';

export const LENSES = [
  'inversion',
  'first_principles',
  'analogy',
  'constraint_removal',
  'scale_shift',
  'stakeholder_swap',
  'time_shift',
  'worst_idea',
] as const;
export type Lens = (typeof LENSES)[number];
export const DEFAULT_LENSES: readonly Lens[] = ['inversion', 'first_principles', 'constraint_removal'];

/** What each lens asks of the model (our text, never the caller's). */
const LENS_GUIDE: Record<Lens, string> = {
  inversion: 'Turn the goal around: how would one guarantee failure, or what is the opposite problem? Then read the answer back as a way forward.',
  first_principles:
    'Strip the problem to facts that must hold (physics, money, time, people) and rebuild a solution from them, ignoring how it is usually done.',
  analogy: 'Find a different field that solved a structurally similar problem and carry its mechanism over.',
  constraint_removal:
    'Remove one assumed constraint at a time (budget, time, technology, rules) and see what becomes possible, then what part of that survives the constraint.',
  scale_shift: 'Look at the problem at 10x smaller and 100x larger scale (users, money, time, data) and see what changes or breaks.',
  stakeholder_swap: 'See the problem through the eyes of another party involved (customer, operator, competitor, regulator, newcomer).',
  time_shift: 'Look from the past (how it was solved before) and the future (how it looks in 10 years, or after the problem is solved).',
  worst_idea: 'Propose a deliberately terrible solution, then find the valuable seed inside it.',
};

const Input = z.object({
  problem: z.string().trim().min(1).max(20_000).describe('The problem, decision or situation to reframe (up to 20,000 characters)'),
  lenses: z
    .array(z.enum(LENSES))
    .min(1)
    .max(LENSES.length)
    .refine((l) => new Set(l).size === l.length, { message: 'each lens at most once' })
    .default([...DEFAULT_LENSES])
    .describe(`Lenses to look through, each at most once: ${LENSES.join(', ')} (default ${DEFAULT_LENSES.join(', ')})`),
  per_lens: z.number().int().min(1).max(5).default(2).describe('Reframes per lens, 1 to 5 (default 2)'),
});

const Reframe = z.object({
  question: z.string().describe('The reframed question the lens raises'),
  insight: z.string().describe('What looking at it this way reveals'),
  first_step: z.string().describe('One concrete action to take this week'),
});

/** The reply schema for these lenses: one required key per lens, nothing else (OpenAI strict mode). */
export function reframeSchema(lenses: readonly Lens[]) {
  const shape: Record<string, z.ZodTypeAny> = {};
  for (const lens of lenses) shape[lens] = z.array(Reframe).describe(LENS_GUIDE[lens]);
  return z.object({ reframes: z.object(shape) });
}

const Output = z.object({
  reframes: z.record(z.enum(LENSES), z.array(Reframe).min(1)),
  lenses: z.array(z.enum(LENSES)).min(1),
  meta: MetaSchema,
});

export const mindOpener = defineTool({
  name: TOOL,
  description:
    'Reframes a problem through chosen thinking lenses (inversion, first principles, analogy...): a question, an insight and a first step per reframe.',
  tier: 'pro',
  priceCents: 8,
  family: 'llm',
  input: Input,
  qField: 'problem',
  needs: ['llm'],
  progress: true,
  output: '{reframes{<lens>:[{question,insight,first_step}]}, lenses, meta{model,usage,prompt_version}}: one key per requested lens, in the order asked',
  outputSchema: Output,
  examples: [
    { problem: 'Our open-source library has 40k users but only two maintainers, and both are burning out.' },
    { problem: 'Customers churn in their second month of our meal-kit subscription.', lenses: ['inversion', 'stakeholder_swap', 'worst_idea'], per_lens: 1 },
  ],
  handler: async ({ problem, lenses, per_lens: perLens }, ctx) => {
    const llm = llmOf(ctx, TOOL);
    const guide = lenses.map((l) => `- ${l}: ${LENS_GUIDE[l]}`).join('\n');
    const { value, meta } = await llm.structured({
      name: TOOL,
      promptVersion: PROMPT_VERSION,
      instructions:
        'You help people see a problem differently. Reframe the problem in the data block "problem" through each of these lenses, ' +
        `giving ${perLens} reframe${perLens === 1 ? '' : 's'} per lens under that lens's key:\n${guide}\n\n` +
        'Each reframe has: question (the problem restated as the lens sees it, one sentence ending in "?"), insight (what this view reveals ' +
        'that the original framing hides, one to three sentences), first_step (one concrete, small action someone could take this week). ' +
        'Be specific to this problem; no generic advice. Write in the language of the problem.',
      data: [{ name: 'problem', text: problem }],
      schema: reframeSchema(lenses),
      maxTokens: Math.min(8_000, 300 + lenses.length * perLens * 220),
      temperature: 0.8,
    });
    const got = value.reframes as Record<string, Array<z.infer<typeof Reframe>>>;
    const reframes: Partial<Record<Lens, Array<z.infer<typeof Reframe>>>> = {};
    for (const lens of lenses) {
      const items = (got[lens] ?? [])
        .map((r) => ({ question: r.question.trim(), insight: r.insight.trim(), first_step: r.first_step.trim() }))
        .filter((r) => r.question && r.insight && r.first_step)
        .slice(0, perLens);
      if (!items.length) throw unusableReply(TOOL, `no usable reframe for the lens ${lens}`);
      reframes[lens] = items;
    }
    return { reframes, lenses, meta };
  },
});
