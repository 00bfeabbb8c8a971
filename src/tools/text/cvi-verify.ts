import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool, type ToolContext } from '../types.js';
import { runTask } from '../tasks.js';
import {
  ClaimResult,
  claimsOf,
  MAX_CLAIM_CHARS,
  MAX_CLAIMS,
  MAX_SOURCES,
  MAX_TEXT_CHARS,
  normaliseSources,
  SourceSchema,
  summarise,
  verifyAll,
  type Source,
} from './cvi-core.js';

/**
 * cvi_verify: claims checked against sources, lexically (see cvi-core.ts for the method and thresholds).
 * q fills `text`: its sentences are the claims; when `sources` is not given, `text` carries them too,
 * separated by lines of "---" (claims first, then one source per part), so a bare q works:
 * "Revenue grew 12%.\n---\nRevenue grew 15% in 2023.". `urls` (at most 5) are read through the guarded
 * client on the worker's event loop before the check (`prepare`), their readable text becoming sources
 * named by their URL; the check itself runs in the sandbox pool.
 */

const MAX_URLS = 5;

const Input = z
  .object({
    text: z
      .string()
      .min(1)
      .max(MAX_TEXT_CHARS)
      .optional()
      .describe('The claims as prose (one claim per sentence); without sources, claims then sources separated by lines of ---'),
    claims: z
      .array(z.string().min(1).max(MAX_CLAIM_CHARS))
      .min(1)
      .max(MAX_CLAIMS)
      .optional()
      .describe(`The claims, one per item (at most ${MAX_CLAIMS}); instead of text`),
    sources: z.array(SourceSchema).min(1).max(MAX_SOURCES).optional().describe(`The sources to check against (at most ${MAX_SOURCES}): strings or {id, text}`),
    urls: z
      .array(
        z
          .string()
          .trim()
          .url()
          .max(2048)
          .refine((u) => /^https?:\/\//i.test(u), 'only http and https URLs'),
      )
      .min(1)
      .max(MAX_URLS)
      .optional()
      .describe(`Public pages to read as more sources (at most ${MAX_URLS}), each named by its URL; private addresses are refused`),
  })
  .superRefine((v, ctx) => {
    if (!!v.text === !!v.claims) ctx.addIssue({ code: z.ZodIssueCode.custom, path: ['text'], message: 'Give either text or claims (exactly one)' });
    if (v.claims && !v.sources && !v.urls)
      ctx.addIssue({ code: z.ZodIssueCode.custom, path: ['sources'], message: 'sources or urls are required with claims' });
    if ((v.sources?.length ?? 0) + (v.urls?.length ?? 0) > MAX_SOURCES) {
      ctx.addIssue({ code: z.ZodIssueCode.custom, path: ['urls'], message: `at most ${MAX_SOURCES} sources and urls in all` });
    }
    const chars = (v.text?.length ?? 0) + (v.sources ?? []).reduce((a, s) => a + (typeof s === 'string' ? s.length : s.text.length), 0);
    if (chars > MAX_TEXT_CHARS)
      ctx.addIssue({
        code: z.ZodIssueCode.custom,
        path: ['sources'],
        message: `text and sources hold ${chars} characters; at most ${MAX_TEXT_CHARS} are allowed`,
      });
  });

const Output = z.object({
  results: z.array(ClaimResult),
  summary: z.object({ supported: z.number().int(), partial: z.number().int(), unsupported: z.number().int(), conflict: z.number().int() }),
  sources: z.array(z.string()),
});

export const cviVerify = defineTool({
  name: 'cvi_verify',
  description:
    'Claim–Verify–Iterate step one: each claim checked against sources (BM25 evidence, term recall, exact numbers, negation): supported, partial, unsupported or conflict.',
  tier: 'pro',
  priceCents: 0,
  family: 'text',
  input: Input,
  qField: 'text',
  qParse: 'text',
  output:
    '{results[{claim, verdict supported|partial|unsupported|conflict, recall, evidence[{source,source_index,quote,start,end,score}], number_mismatches[{claim_value,source_values,source}], negation_mismatch}], summary, sources}',
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
  prepare: readUrls,
  largestInput: () => {
    const para = 'In 2023 the company reported revenue of 4,200,000 dollars, 340 employees and offices in 12 European countries. ';
    const sources = Array.from({ length: MAX_SOURCES }, (_, i) => ({
      id: `s${i}`,
      text: para.repeat(Math.floor((MAX_TEXT_CHARS - 10_000) / MAX_SOURCES / para.length)),
    }));
    const claims = Array.from(
      { length: MAX_CLAIMS },
      (_, i) => `The company reported revenue of ${i},200,000 dollars and ${300 + i} employees in ${i} European countries in 2023.`,
    );
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
        throw new AppError('invalid_input', 'No sources: give sources, or put them in text after a line of ---', {
          issues: [{ path: ['sources'], message: 'required' }],
        });
      }
      if (parts.length - 1 > MAX_SOURCES)
        throw new AppError('invalid_input', `text holds ${parts.length - 1} sources; at most ${MAX_SOURCES} are allowed`, {
          issues: [{ path: ['text'], message: 'too many sources' }],
        });
      claims = claimsOf(parts[0]!, 'text');
      sources = normaliseSources(parts.slice(1).filter(Boolean));
    }
    const results = verifyAll(claims, sources, ctx.signal);
    return { results, summary: summarise(results), sources: sources.map((s) => s.id) };
  },
});

/** Reads `urls` through the guarded client; each page's readable text becomes a source named by its URL. */
async function readUrls<
  I extends { text?: string | undefined; claims?: string[] | undefined; sources?: z.infer<typeof SourceSchema>[] | undefined; urls?: string[] | undefined },
>(input: I, ctx: ToolContext): Promise<I> {
  if (!input.urls?.length) return input;
  const http = ctx.http;
  if (!http) throw new AppError('tool_unavailable', 'cvi_verify cannot read urls here');
  const given = (input.text?.length ?? 0) + (input.sources ?? []).reduce((a, src) => a + (typeof src === 'string' ? src.length : src.text.length), 0);
  // Fetched text shares the tool's character cap with what the caller sent.
  const share = Math.max(0, Math.floor((MAX_TEXT_CHARS - given) / input.urls.length));
  const fetched: Array<{ id: string; text: string }> = [];
  for (const [i, url] of input.urls.entries()) {
    await ctx.progress({ stage: 'fetching', done: i, total: input.urls.length, unit: 'urls' });
    const res = await http.fetch(url, { maxBytes: 2_000_000 });
    if (res.status >= 400)
      throw new AppError('fetch_failed', `cvi_verify could not read ${url}: it answered ${res.status}`, { reason: 'http_status', status: res.status });
    const mime = res.content_type ?? '';
    const text =
      mime === 'text/html' || mime === 'application/xhtml+xml' || (!mime && /^\s*</.test(res.text().slice(0, 100)))
        ? (await runTask(ctx, 'extract_html', { body: res.body, baseUrl: res.final_url, headerCharset: res.charset })).text
        : mime.startsWith('text/') || mime === ''
          ? res.text()
          : '';
    if (!text.trim()) throw new AppError('fetch_failed', `cvi_verify found no readable text at ${url}`, { reason: 'no_text' });
    fetched.push({ id: url, text: text.slice(0, share) });
  }
  await ctx.progress({ stage: 'fetching', done: input.urls.length, total: input.urls.length, unit: 'urls' });
  let sources = input.sources;
  let text = input.text;
  if (!sources && text !== undefined) {
    // text mode: the claims, then (optionally) sources after lines of ---
    const parts = text.split(/^\s*---+\s*$/m).map((p) => p.trim());
    text = parts[0]!;
    sources = parts.slice(1).filter(Boolean);
  }
  return { ...input, text, sources: [...(sources ?? []), ...fetched], urls: undefined };
}
