import { z } from 'zod';
import { runTask } from '../tasks.js';
import { defineTool, type LlmMeta } from '../types.js';
import { MetaSchema, llmOf, mapSettled, mergeMeta, unusableReply } from './tool-kit.js';

/**
 * idea_fold: 2 to 200 ideas folded into a few merged ones. Code clusters the ideas (b-cluster.ts:
 * stemmed TF-IDF, cosine, average linkage down to `similarity`; deterministic, ties by input order) in
 * the sandbox pool, since it is CPU work on caller input. Then one model call per cluster of two or
 * more ideas writes its title, merged idea and the tension between its members; `members` (indexes
 * into the input, 0-based, with their text) always come from the clustering, never from the model.
 * Ideas alone in their cluster are listed as singletons. Any failed call fails the whole call (503,
 * uncharged).
 */

const TOOL = 'idea_fold';
const PROMPT_VERSION = 'idea_fold/1';
const PARALLEL = 4;
const MAX_IDEA_CHARS = 2_000;

const Input = z.object({
  ideas: z
    .array(z.string().trim().min(1).max(MAX_IDEA_CHARS))
    .min(2)
    .max(200)
    .describe('The ideas, 2 to 200, each up to 2,000 characters (with q: one idea per line)'),
  similarity: z
    .number()
    .min(0.05)
    .max(0.95)
    .default(0.3)
    .describe('Average cosine similarity (stemmed TF-IDF) that ideas need to fold together, 0.05 to 0.95 (default 0.3; lower folds more)'),
});

const Reply = z.object({
  title: z.string().describe('A short title for the merged idea, at most eight words'),
  merged_idea: z.string().describe('One idea that keeps what is valuable in every member, two to four sentences'),
  tension: z.string().describe('Where the members disagree or trade off against each other; an empty string when they do not'),
});

const Member = z.object({ index: z.number().int().min(0), text: z.string() });
const Output = z.object({
  folds: z.array(
    z.object({
      title: z.string(),
      merged_idea: z.string(),
      members: z.array(Member).min(2),
      tension: z.string().nullable(),
      cohesion: z.number().min(0).max(1),
    }),
  ),
  singletons: z.array(Member),
  meta: MetaSchema,
});

export const ideaFold = defineTool({
  name: TOOL,
  description: 'Folds 2-200 ideas into a few merged ones: code clusters similar ideas (stemmed TF-IDF, average linkage), a model writes one merge per cluster.',
  tier: 'pro',
  priceCents: 10,
  family: 'llm',
  input: Input,
  qField: 'ideas',
  qParse: 'lines',
  needs: ['llm'],
  progress: true,
  limits: { timeMs: 20_000, memoryMb: 256 },
  output:
    '{folds[{title,merged_idea,members[{index,text}],tension,cohesion}], singletons[{index,text}], meta}; members and singletons come from the clustering (0-based input indexes), one model call per fold',
  outputSchema: Output,
  examples: [
    {
      ideas: [
        'Offer a referral discount to customers who invite friends',
        'Give customers a discount for every friend they refer',
        'Rewrite the onboarding emails to be shorter',
        'Shorten the onboarding email sequence',
        'Sponsor a local running club',
      ],
    },
  ],
  handler: async ({ ideas, similarity }, ctx) => {
    const llm = llmOf(ctx, TOOL);
    await ctx.progress({ stage: 'clustering', total: ideas.length, unit: 'ideas' });
    const { clusters, cohesion } = await runTask(ctx, 'idea_fold_cluster', { texts: ideas, threshold: similarity });
    const multi = clusters.map((members, k) => ({ members, cohesion: cohesion[k]! })).filter((c) => c.members.length > 1);
    let done = 0;
    await ctx.progress({ stage: 'merging', done: 0, total: multi.length, unit: 'folds' });
    const merged = await mapSettled(multi, PARALLEL, async (c) => {
      const out = await llm.structured({
        name: TOOL,
        promptVersion: PROMPT_VERSION,
        instructions:
          `The ${c.members.length} data blocks named idea_<n> hold ideas that are similar enough to merge. Fold them into one: ` +
          'title (at most eight words), merged_idea (two to four sentences that keep what is valuable in each idea and drop repetition), ' +
          'tension (where the ideas disagree, compete or trade off; an empty string when they do not). Use only what the ideas say. ' +
          'Write in the language of the ideas.',
        data: c.members.map((i) => ({ name: `idea_${i + 1}`, text: ideas[i]! })),
        schema: Reply,
        maxTokens: 600,
        temperature: 0.4,
        stage: 'merging',
      });
      const title = out.value.title.trim();
      const mergedIdea = out.value.merged_idea.trim();
      if (!title || !mergedIdea) throw unusableReply(TOOL, 'an empty title or merged idea');
      done += 1;
      await ctx.progress({ stage: 'merging', done, total: multi.length, unit: 'folds' });
      return { title, merged_idea: mergedIdea, tension: out.value.tension.trim() || null, meta: out.meta };
    });
    const metas: LlmMeta[] = merged.map((m) => m.meta);
    const folds = multi.map((c, k) => ({
      title: merged[k]!.title,
      merged_idea: merged[k]!.merged_idea,
      members: c.members.map((index) => ({ index, text: ideas[index]! })),
      tension: merged[k]!.tension,
      cohesion: c.cohesion,
    }));
    const singletons = clusters.filter((m) => m.length === 1).map(([index]) => ({ index: index!, text: ideas[index!]! }));
    return { folds, singletons, meta: mergeMeta(metas, PROMPT_VERSION, ctx.config.LLM_MODEL) };
  },
});
