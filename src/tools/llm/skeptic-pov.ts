import { z } from 'zod';
import { defineTool } from '../types.js';
import { MetaSchema, findVerbatim, llmOf, unusableReply } from './tool-kit.js';

/**
 * skeptic_pov: an adversarial review of a claim. The model steelmans the claim, then objects, each
 * objection aimed at a quote from the claim. Code checks every quote: `anchored` is true only when the
 * quote occurs verbatim in the claim (white space runs count as one space; case and punctuation must
 * match), and then `start`/`end` locate it. Code orders the objections (severity, then the model's
 * order), keeps the first `max_objections` (so a surplus drops the least severe) and numbers them.
 */

const TOOL = 'skeptic_pov';
const PROMPT_VERSION = 'skeptic_pov/1';

const STANCES = ['skeptic', 'hostile', 'constructive'] as const;
const STANCE_GUIDE: Record<(typeof STANCES)[number], string> = {
  skeptic: 'a fair but demanding skeptic who wants evidence for every step',
  hostile: 'a hostile reviewer looking for the weakest point, short of straw-manning',
  constructive: 'a constructive critic who objects in order to make the claim stronger',
};
const SEVERITIES = ['critical', 'high', 'medium', 'low'] as const;
const VERDICTS = ['holds', 'holds_with_caveats', 'unproven', 'fails'] as const;

const Input = z.object({
  claim: z.string().trim().min(1).max(8_000).describe('The claim, argument, plan or pitch to review (up to 8,000 characters)'),
  stance: z
    .enum(STANCES)
    .default('skeptic')
    .describe(`How adversarial to be: ${STANCES.join(', ')} (default skeptic)`),
  max_objections: z.number().int().min(3).max(15).default(5).describe('Most objections to return, 3 to 15 (default 5)'),
});

/** The model's schema (strict mode: every property required, no bounds; counts are checked here). */
const Reply = z.object({
  steelman: z.string(),
  objections: z.array(
    z.object({
      target_quote: z.string().describe('An exact, contiguous quote from the claim that the objection targets, copied character for character'),
      severity: z.enum(SEVERITIES),
      objection: z.string(),
      test: z.string().describe('An observation or experiment that would settle the objection'),
    }),
  ),
  assumptions: z.array(z.string()),
  verdict: z.enum(VERDICTS),
  verdict_reason: z.string(),
});

const Objection = z.object({
  id: z.number().int().min(1),
  target_quote: z.string(),
  anchored: z.boolean(),
  start: z.number().int().min(0).nullable(),
  end: z.number().int().min(0).nullable(),
  severity: z.enum(SEVERITIES),
  objection: z.string(),
  test: z.string(),
});

const Output = z.object({
  steelman: z.string(),
  objections: z.array(Objection).min(1).max(15),
  assumptions: z.array(z.string()),
  verdict: z.enum(VERDICTS),
  verdict_reason: z.string(),
  anchored_ratio: z.number().min(0).max(1),
  meta: MetaSchema,
});

export const skepticPov = defineTool({
  name: TOOL,
  description: 'An adversarial review of a claim: a steelman, objections anchored to verbatim quotes (checked), hidden assumptions and a verdict.',
  tier: 'enterprise',
  priceCents: 30,
  family: 'llm',
  input: Input,
  qField: 'claim',
  needs: ['llm'],
  progress: true,
  output:
    '{steelman, objections[{id,target_quote,anchored,start,end,severity,objection,test}], assumptions, verdict: holds|holds_with_caveats|unproven|fails, verdict_reason, anchored_ratio, meta}; anchored: the quote is verbatim in the claim (checked in code)',
  outputSchema: Output,
  examples: [
    { claim: 'Rewriting our backend in Rust will cut our cloud bill by 70% because Rust is faster than Python.' },
    { claim: 'Remote teams are less productive, so we should require five office days a week.', stance: 'hostile', max_objections: 7 },
  ],
  handler: async ({ claim, stance, max_objections: max }, ctx) => {
    const llm = llmOf(ctx, TOOL);
    const { value, meta } = await llm.structured({
      name: TOOL,
      promptVersion: PROMPT_VERSION,
      instructions:
        `Review the claim in the data block "claim" as ${STANCE_GUIDE[stance]}.\n` +
        '- steelman: the strongest honest version of the claim, in two to four sentences.\n' +
        `- objections: up to ${max}, the most important first. For each, target_quote is a short exact quote copied character for ` +
        'character from the claim (the words the objection attacks); severity is critical, high, medium or low; objection says what ' +
        'is wrong or unsupported; test says what observation, data or experiment would settle it.\n' +
        '- assumptions: the unstated assumptions the claim depends on.\n' +
        '- verdict: holds, holds_with_caveats, unproven or fails; verdict_reason: one or two sentences why.\n' +
        'Attack the reasoning and evidence, not the author. Write in the language of the claim.',
      data: [{ name: 'claim', text: claim }],
      schema: Reply,
      maxTokens: Math.min(8_000, 700 + max * 260),
      temperature: 0.4,
    });
    const rank = (s: (typeof SEVERITIES)[number]) => SEVERITIES.indexOf(s);
    const objections = value.objections
      .map((o, i) => ({ ...o, i, target_quote: o.target_quote.trim(), objection: o.objection.trim(), test: o.test.trim() }))
      .filter((o) => o.objection)
      .sort((a, b) => rank(a.severity) - rank(b.severity) || a.i - b.i)
      .slice(0, max)
      .map((o, k) => {
        const at = findVerbatim(claim, o.target_quote);
        return {
          id: k + 1,
          target_quote: o.target_quote,
          anchored: at !== null,
          start: at?.start ?? null,
          end: at?.end ?? null,
          severity: o.severity,
          objection: o.objection,
          test: o.test,
        };
      });
    if (!objections.length) throw unusableReply(TOOL, 'no objection');
    const anchored = objections.filter((o) => o.anchored).length;
    return {
      steelman: value.steelman.trim(),
      objections,
      assumptions: value.assumptions.map((a) => a.trim()).filter(Boolean),
      verdict: value.verdict,
      verdict_reason: value.verdict_reason.trim(),
      anchored_ratio: Math.round((anchored / objections.length) * 1000) / 1000,
      meta,
    };
  },
});
