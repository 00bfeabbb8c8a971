import { z } from 'zod';
import { defineTool, type LlmMeta } from '../types.js';
import { MetaSchema, jaccard, llmOf, mapSettled, mergeMeta, round, stems, unusableReply } from './tool-kit.js';

/**
 * hints_parade: hints on one problem from up to eight expert personas, one model call per persona, all
 * or nothing (one failed call fails the whole call: 503, uncharged, and no further persona is started).
 * Consensus is computed here, not by the model: two hints from different personas agree when the
 * Jaccard similarity of their stemmed content words reaches `consensus_threshold`; agreeing hints form
 * groups (connected components); a group backed by two or more personas is a consensus item whose
 * `hint` is the member most similar to the rest (ties: the earliest, in persona then hint order).
 * Every other hint is `unique`.
 */

const TOOL = 'hints_parade';
const PROMPT_VERSION = 'hints_parade/1';
/** Persona calls in flight at once for one call (LLM_MAX_INFLIGHT still bounds the process). */
const PARALLEL = 4;

export const PERSONAS = ['debugger', 'architect', 'tester', 'security', 'performance', 'ux', 'ops', 'domain_expert'] as const;
export type Persona = (typeof PERSONAS)[number];

const PERSONA_GUIDE: Record<Persona, string> = {
  debugger: 'a debugger: reproduce, isolate, bisect, read the error, check the simplest cause first',
  architect: 'a software architect: boundaries, data flow, coupling, the shape of the system and its trade-offs',
  tester: 'a test engineer: how to prove it works, edge cases, regression tests, what is untested',
  security: 'a security engineer: trust boundaries, inputs, secrets, permissions, abuse cases',
  performance: 'a performance engineer: measure first, hot paths, complexity, I/O, caching, memory',
  ux: 'a user-experience designer: what the person using it sees, expects and struggles with',
  ops: 'an operations engineer: deployment, configuration, monitoring, failure modes, rollback',
  domain_expert: 'a domain expert in the problem’s field: the rules, conventions and pitfalls of that field',
};

const Input = z.object({
  problem: z.string().trim().min(1).max(20_000).describe('The problem to get hints on (up to 20,000 characters)'),
  personas: z
    .array(z.enum(PERSONAS))
    .min(1)
    .max(PERSONAS.length)
    .refine((p) => new Set(p).size === p.length, { message: 'each persona at most once' })
    .default([...PERSONAS])
    .describe(`Personas to ask, each at most once: ${PERSONAS.join(', ')} (default all eight)`),
  hints_per_persona: z.number().int().min(1).max(5).default(3).describe('Hints each persona gives, 1 to 5 (default 3)'),
  consensus_threshold: z
    .number()
    .min(0.1)
    .max(0.9)
    .default(0.35)
    .describe('Word-Jaccard similarity (stemmed content words) at which two personas’ hints count as the same hint, 0.1 to 0.9 (default 0.35)'),
});

const Reply = z.object({
  hints: z.array(
    z.object({ hint: z.string().describe('One actionable hint, one or two sentences'), why: z.string().describe('Why this persona suggests it') }),
  ),
});

const Hint = z.object({ hint: z.string(), why: z.string() });
const Output = z.object({
  by_persona: z.record(z.enum(PERSONAS), z.array(Hint).min(1)),
  personas: z.array(z.enum(PERSONAS)).min(1),
  consensus: z.array(
    z.object({
      hint: z.string(),
      personas: z.array(z.enum(PERSONAS)).min(2),
      support: z.number().int().min(2),
      similarity: z.number().min(0).max(1),
    }),
  ),
  unique: z.array(z.object({ persona: z.enum(PERSONAS), hint: z.string() })),
  meta: MetaSchema,
});

export interface PersonaHint {
  persona: Persona;
  hint: string;
}

export interface ConsensusItem {
  hint: string;
  personas: Persona[];
  support: number;
  similarity: number;
}

/**
 * Consensus over hints listed in persona order, then hint order (see the module comment). `similarity`
 * is the mean Jaccard over the group's cross-persona pairs, rounded to 3 places. Consensus items come
 * by support (most personas first), then by their earliest hint.
 */
export function consensusOf(
  hints: readonly PersonaHint[],
  personaOrder: readonly Persona[],
  threshold: number,
): { consensus: ConsensusItem[]; unique: PersonaHint[] } {
  const sets = hints.map((h) => new Set(stems(h.hint)));
  const n = hints.length;
  const sim = (i: number, j: number) => jaccard(sets[i]!, sets[j]!);
  const parent = hints.map((_, i) => i);
  const find = (i: number): number => (parent[i] === i ? i : (parent[i] = find(parent[i]!)));
  for (let i = 0; i < n; i++)
    for (let j = i + 1; j < n; j++) {
      if (hints[i]!.persona === hints[j]!.persona) continue;
      if (sim(i, j) >= threshold) {
        const a = find(i);
        const b = find(j);
        if (a !== b) parent[Math.max(a, b)] = Math.min(a, b);
      }
    }
  const groups = new Map<number, number[]>();
  for (let i = 0; i < n; i++) {
    const r = find(i);
    const g = groups.get(r);
    if (g) g.push(i);
    else groups.set(r, [i]);
  }
  const items: Array<ConsensusItem & { first: number }> = [];
  const unique: PersonaHint[] = [];
  for (const members of groups.values()) {
    const personas = new Set(members.map((i) => hints[i]!.persona));
    if (personas.size < 2) {
      for (const i of members) unique.push(hints[i]!);
      continue;
    }
    let best = members[0]!;
    let bestScore = -1;
    let pairSum = 0;
    let pairs = 0;
    for (const i of members) {
      let score = 0;
      for (const j of members) {
        if (i === j) continue;
        const s = sim(i, j);
        score += s;
        if (i < j && hints[i]!.persona !== hints[j]!.persona) {
          pairSum += s;
          pairs++;
        }
      }
      if (score > bestScore + 1e-12) {
        best = i;
        bestScore = score;
      }
    }
    items.push({
      hint: hints[best]!.hint,
      personas: personaOrder.filter((p) => personas.has(p)),
      support: personas.size,
      similarity: round(pairs ? pairSum / pairs : 0),
      first: members[0]!,
    });
  }
  items.sort((a, b) => b.support - a.support || a.first - b.first);
  unique.sort((a, b) => hints.indexOf(a) - hints.indexOf(b));
  return { consensus: items.map(({ first: _first, ...item }) => item), unique };
}

export const hintsParade = defineTool({
  name: TOOL,
  description: 'Hints on a problem from up to eight expert personas (one model call each, all or nothing), with the consensus between them computed in code.',
  tier: 'pro',
  priceCents: 100,
  family: 'llm',
  input: Input,
  qField: 'problem',
  needs: ['llm'],
  progress: true,
  output:
    '{by_persona{<persona>:[{hint,why}]}, personas, consensus[{hint,personas,support,similarity}], unique[{persona,hint}], meta}; consensus: hints of two or more personas with word-Jaccard >= consensus_threshold',
  outputSchema: Output,
  examples: [
    { problem: 'Our nightly batch job that imports CSV files from partners started taking 6 hours instead of 40 minutes last week.' },
    {
      problem: 'Users report that password reset emails sometimes arrive after the link has expired.',
      personas: ['debugger', 'security', 'ops'],
      hints_per_persona: 2,
    },
  ],
  handler: async ({ problem, personas, hints_per_persona: perPersona, consensus_threshold: threshold }, ctx) => {
    const llm = llmOf(ctx, TOOL);
    let done = 0;
    await ctx.progress({ stage: 'personas', done: 0, total: personas.length });
    const replies = await mapSettled(personas, PARALLEL, async (persona) => {
      const out = await llm.structured({
        name: `${TOOL}_${persona}`,
        promptVersion: PROMPT_VERSION,
        instructions:
          `You are ${PERSONA_GUIDE[persona]}. Give ${perPersona} hint${perPersona === 1 ? '' : 's'} on the problem in the data block "problem", ` +
          'from your own angle only: concrete next steps that move the problem forward, not a full solution, the most useful first. ' +
          'Each hint has: hint (actionable, one or two sentences) and why (one sentence). Write in the language of the problem.',
        data: [{ name: 'problem', text: problem }],
        schema: Reply,
        maxTokens: Math.min(4_000, 200 + perPersona * 180),
        temperature: 0.5,
        stage: `persona:${persona}`,
      });
      const hints = out.value.hints
        .map((h) => ({ hint: h.hint.trim(), why: h.why.trim() }))
        .filter((h) => h.hint)
        .slice(0, perPersona);
      if (!hints.length) throw unusableReply(TOOL, `no hint from the ${persona} persona`);
      done += 1;
      await ctx.progress({ stage: 'personas', done, total: personas.length, message: persona });
      return { hints, meta: out.meta };
    });
    const byPersona: Partial<Record<Persona, Array<{ hint: string; why: string }>>> = {};
    const flat: PersonaHint[] = [];
    const metas: LlmMeta[] = [];
    personas.forEach((persona, i) => {
      byPersona[persona] = replies[i]!.hints;
      metas.push(replies[i]!.meta);
      for (const h of replies[i]!.hints) flat.push({ persona, hint: h.hint });
    });
    const { consensus, unique } = consensusOf(flat, personas, threshold);
    return { by_persona: byPersona, personas, consensus, unique, meta: mergeMeta(metas, PROMPT_VERSION, ctx.config.LLM_MODEL) };
  },
});
