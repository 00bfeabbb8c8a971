import { z } from 'zod';
import { defineTool, type LlmDataBlock } from '../types.js';
import { LlmMetaSchema, META_OUTPUT, clean, cleanList, contextField, llmOf, mdText, unusableReply } from './tool-kit.js';

/**
 * intent_to_spec: a plain-language intent becomes a testable specification. The model writes the
 * content; code assigns the ids (R1, R2... and N1, N2... in the model's order), drops empty items,
 * and renders `markdown` from the checked structure (so the Markdown never says more than the data).
 * Acceptance criteria are nested inside their requirement, so none can dangle.
 */

export const PROMPT_VERSION = 'intent_to_spec/1';
const MAX_INTENT_CHARS = 8_000;
const MAX_TOKENS = 6_000;

const PRIORITIES = ['must', 'should', 'could'] as const;
const NFR_CATEGORIES = [
  'performance',
  'security',
  'privacy',
  'reliability',
  'availability',
  'scalability',
  'usability',
  'accessibility',
  'compliance',
  'maintainability',
  'observability',
  'other',
] as const;

const AcceptanceSchema = z.object({
  given: z.string().describe('The starting state, e.g. "a signed-in user with an empty cart".'),
  when: z.string().describe('The action or event.'),
  then: z.string().describe('The observable outcome a tester can check.'),
});

/** What the model returns (strict-mode friendly: all required, no limits; code checks after). */
export const IntentSpecModelSchema = z.object({
  title: z.string().describe('A short title for the specification.'),
  actors: z.array(z.string()).describe('Who or what interacts with the system (roles, external systems).'),
  requirements: z
    .array(
      z.object({
        text: z.string().describe('One functional requirement, phrased as "The system shall ..." or similar; one behaviour each.'),
        priority: z.enum(PRIORITIES).describe('MoSCoW priority: must, should or could.'),
        acceptance: z.array(AcceptanceSchema).describe('Given/when/then criteria that together show the requirement is met.'),
      }),
    )
    .describe('Functional requirements in a sensible reading order.'),
  non_functional: z
    .array(z.object({ category: z.enum(NFR_CATEGORIES), text: z.string().describe('A measurable quality requirement.') }))
    .describe('Quality requirements (performance, security...), measurable where possible.'),
  open_questions: z.array(z.string()).describe('Questions the intent leaves open that a stakeholder must answer.'),
  assumptions: z.array(z.string()).describe('Assumptions made to fill gaps in the intent.'),
});
type ModelSpec = z.infer<typeof IntentSpecModelSchema>;

export const IntentToSpecInput = z.object({
  intent: z.string().trim().min(1).max(MAX_INTENT_CHARS).describe(`What should be built, in plain language (at most ${MAX_INTENT_CHARS} characters).`),
  context: contextField,
});

const RequirementOut = z.object({
  id: z.string().regex(/^R[1-9]\d*$/),
  text: z.string().min(1),
  priority: z.enum(PRIORITIES),
  acceptance: z.array(z.object({ given: z.string().min(1), when: z.string().min(1), then: z.string().min(1) })),
});

export const IntentToSpecOutput = z.object({
  title: z.string().min(1),
  actors: z.array(z.string().min(1)),
  requirements: z.array(RequirementOut).min(1),
  non_functional: z.array(z.object({ id: z.string().regex(/^N[1-9]\d*$/), category: z.enum(NFR_CATEGORIES), text: z.string().min(1) })),
  open_questions: z.array(z.string().min(1)),
  assumptions: z.array(z.string().min(1)),
  markdown: z.string().min(1),
  meta: LlmMetaSchema,
});
export type IntentToSpecResult = z.infer<typeof IntentToSpecOutput>;

const INSTRUCTIONS = `You turn a product or feature intent into a testable specification.
The intent is in the data block "intent"; optional background is in the data block "context".
- Write functional requirements, one behaviour each, each with acceptance criteria in given/when/then form that a tester could check without asking anyone.
- Prioritise with MoSCoW (must, should, could). Only what the intent needs is "must".
- Put measurable quality requirements (latency, availability, security...) in non_functional, not in requirements.
- Do not invent facts: where the intent is silent, either record an assumption or ask an open question.
- Keep each string to one or two sentences, plain text, no Markdown.
- Do not number or label the requirements; numbering is added afterwards.
- Write in the language of the intent.`;

/** Model reply -> result: strings cleaned, empty items dropped, ids assigned in model order. */
export function buildSpec(v: ModelSpec, intent: string): Omit<IntentToSpecResult, 'meta'> {
  const requirements = v.requirements
    .map((r) => ({
      text: clean(r.text),
      priority: r.priority,
      acceptance: r.acceptance.map((a) => ({ given: clean(a.given), when: clean(a.when), then: clean(a.then) })).filter((a) => a.given && a.when && a.then),
    }))
    .filter((r) => r.text)
    .map((r, i) => ({ id: `R${i + 1}`, ...r }));
  if (!requirements.length) throw unusableReply('intent_to_spec', 'no requirements');
  const nonFunctional = v.non_functional
    .map((n) => ({ category: n.category, text: clean(n.text) }))
    .filter((n) => n.text)
    .map((n, i) => ({ id: `N${i + 1}`, ...n }));
  const title = clean(v.title) || fallbackTitle(intent);
  const spec = {
    title,
    actors: cleanList(v.actors),
    requirements,
    non_functional: nonFunctional,
    open_questions: cleanList(v.open_questions),
    assumptions: cleanList(v.assumptions),
  };
  return { ...spec, markdown: renderMarkdown(spec) };
}

function fallbackTitle(intent: string): string {
  const first = clean(intent);
  return first.length > 60 ? `${first.slice(0, 57).trimEnd()}...` : first;
}

/** The Markdown view of the structure; every model string is escaped (no HTML, links or images). */
export function renderMarkdown(s: Omit<IntentToSpecResult, 'markdown' | 'meta'>): string {
  const list = (items: string[]) => (items.length ? items.map((i) => `- ${mdText(i)}`).join('\n') : '_None._');
  const out: string[] = [`# ${mdText(s.title)}`, '', '## Actors', '', list(s.actors), '', '## Requirements', ''];
  for (const r of s.requirements) {
    out.push(`### ${r.id} (${r.priority})`, '', mdText(r.text), '');
    if (r.acceptance.length) {
      out.push('Acceptance criteria:', '');
      r.acceptance.forEach((a, i) => out.push(`${i + 1}. **Given** ${mdText(a.given)}, **when** ${mdText(a.when)}, **then** ${mdText(a.then)}`));
    } else out.push('_No acceptance criteria: not yet testable._');
    out.push('');
  }
  out.push('## Non-functional requirements', '');
  out.push(s.non_functional.length ? s.non_functional.map((n) => `- **${n.id}** (${n.category}): ${mdText(n.text)}`).join('\n') : '_None._');
  out.push('', '## Assumptions', '', list(s.assumptions), '', '## Open questions', '', list(s.open_questions), '');
  return out.join('\n');
}

export const intentToSpec = defineTool({
  name: 'intent_to_spec',
  description:
    'Turns a plain-language intent into a testable spec: prioritised requirements (ids R1...) with nested given/when/then acceptance criteria, non-functional requirements, assumptions, open questions and Markdown.',
  tier: 'free',
  priceCents: 5,
  family: 'llm',
  input: IntentToSpecInput,
  examples: [
    { intent: 'Let customers reset their password by email; links expire after an hour.' },
    { intent: 'A CSV export of invoices for accountants.', context: 'B2B SaaS, invoices live in Postgres, about 2 million rows per large customer.' },
  ],
  qField: 'intent',
  needs: ['llm'],
  progress: true,
  output: `{title, actors[], requirements[{id: "R1"..., text, priority: must|should|could, acceptance[{given, when, then}]}], non_functional[{id: "N1"..., category, text}], open_questions[], assumptions[], markdown, ${META_OUTPUT}}`,
  outputSchema: IntentToSpecOutput,
  handler: async (input, ctx): Promise<IntentToSpecResult> => {
    const data: LlmDataBlock[] = [{ name: 'intent', text: input.intent }];
    if (input.context) data.push({ name: 'context', text: input.context });
    const { value, meta } = await llmOf(ctx, 'intent_to_spec').structured({
      name: 'intent_to_spec',
      promptVersion: PROMPT_VERSION,
      instructions: INSTRUCTIONS,
      data,
      schema: IntentSpecModelSchema,
      maxTokens: MAX_TOKENS,
      temperature: 0.2,
    });
    return { ...buildSpec(value, input.intent), meta };
  },
});
