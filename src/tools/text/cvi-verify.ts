import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool } from '../types.js';
import {
  ClaimResult, claimsOf, MAX_CLAIM_CHARS, MAX_CLAIMS, MAX_SOURCES, MAX_TEXT_CHARS, normaliseSources, SourceSchema, summarise, verifyAll, type Source,
} from './cvi-b.js';

/**
 * cvi_verify: claims checked against sources, lexically (see cvi-b.ts for the method and thresholds).
 * q fills `text`: its sentences are the claims; when `sources` is not given, `text` carries them too,
 * separated by lines of "---" (claims first, then one source per part), so a bare q works:
 * "Revenue grew 12%.\n---\nRevenue grew 15% in 2023.". URLs are not fetched (the tool runs in the
 * sandbox pool with no network): fetch them with page_fetch first and pass the text.
 */

const Input = z
  .object({
    text: z.string().min(1).max(MAX_TEXT_CHARS).optional().describe('The claims as prose (one claim per sentence); without sources, claims then sources separated by lines of ---'),
    claims: z.array(z.string().min(1).max(MAX_CLAIM_CHARS)).min(1).max(MAX_CLAIMS).optional().describe(`The claims, one per item (at most ${MAX_CLAIMS}); instead of text`),
    sources: z.array(SourceSchema).min(1).max(MAX_SOURCES).optional().describe(`The sources to check against (at most ${MAX_SOURCES}): strings or {id, text}`),
  })
  .superRefine((v, ctx) => {
    if (!!v.text === !!v.claims) ctx.addIssue({ code: z.ZodIssueCode.custom, path: ['text'], message: 'Give either text or claims (exactly one)' });
    if (v.claims && !v.sources) ctx.addIssue({ code: z.ZodIssueCode.custom, path: ['sources'], message: 'sources are required with claims' });
    const chars = (v.text?.length ?? 0) + (v.sources ?? []).reduce((a, s) => a + (typeof s === 'string' ? s.length : s.text.length), 0);
    if (chars > MAX_TEXT_CHARS) ctx.addIssue({ code: z.ZodIssueCode.custom, path: ['sources'], message: `text and sources hold ${chars} characters; at most ${MAX_TEXT_CHARS} are allowed` });
  });

const Output = z.object({
  results: z.array(ClaimResult),
  summary: z.object({ supported: z.number().int(), partial: z.number().int(), unsupported: z.number().int(), conflict: z.number().int() }),
  sources: z.array(z.string()),
});

export const cviVerify = defineTool({
  name: 'cvi_verify',
  description: 'Claim–Verify–Iterate step one: each claim checked against sources (BM25 evidence, term recall, exact numbers, negation): supported, partial, unsupported or conflict.',
  tier: 'pro',
  priceCents: 0,
  family: 'text',
  input: Input,
  qField: 'text',
  qParse: 'text',
  output: '{results[{claim, verdict supported|partial|unsupported|conflict, recall, evidence[{source,source_index,quote,start,end,score}], number_mismatches[{claim_value,source_values,source}], negation_mismatch}], summary, sources}',
  outputSchema: Output,
  examples: [
    {
      claims: ['Acme had 340 employees in 2023.', 'Acme revenue rose 15% in 2023.', 'Acme sells outside Europe.'],
      sources: [{ id: 'annual-report', text: 'In 2023 Acme had 340 employees. Revenue rose 12% to $4.2 million in 2023. Acme does not sell outside Europe.' }],
    },
    { text: 'The bridge opened in 1932.\n---\nThe Sydney Harbour Bridge opened in March 1932 after eight years of construction.' },
  ],
  isolated: import.meta.url,
  limits: { timeMs: 15_000, memoryMb: 512 },
  largestInput: () => {
    const para = 'In 2023 the company reported revenue of 4,200,000 dollars, 340 employees and offices in 12 European countries. ';
    const sources = Array.from({ length: MAX_SOURCES }, (_, i) => ({ id: `s${i}`, text: para.repeat(Math.floor((MAX_TEXT_CHARS - 10_000) / MAX_SOURCES / para.length)) }));
    const claims = Array.from({ length: MAX_CLAIMS }, (_, i) => `The company reported revenue of ${i},200,000 dollars and ${300 + i} employees in ${i} European countries in 2023.`);
    return { claims, sources };
  },
  handler: async (input, ctx) => {
    let claims: string[];
    let sources: Source[];
    if (input.sources) {
      sources = normaliseSources(input.sources);
      claims = input.claims ?? claimsOf(input.text!, 'text');
    } else {
      const parts = input.text!.split(/^\s*---+\s*$/m).map((p) => p.trim());
      if (parts.length < 2 || !parts.slice(1).some(Boolean)) {
        throw new AppError('invalid_input', 'No sources: give sources, or put them in text after a line of ---', { issues: [{ path: ['sources'], message: 'required' }] });
      }
      if (parts.length - 1 > MAX_SOURCES) throw new AppError('invalid_input', `text holds ${parts.length - 1} sources; at most ${MAX_SOURCES} are allowed`, { issues: [{ path: ['text'], message: 'too many sources' }] });
      claims = claimsOf(parts[0]!, 'text');
      sources = normaliseSources(parts.slice(1).filter(Boolean));
    }
    const results = verifyAll(claims, sources, ctx.signal);
    return { results, summary: summarise(results), sources: sources.map((s) => s.id) };
  },
});
