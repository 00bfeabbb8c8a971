import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool, type ToolContext, type ToolDns } from '../types.js';
import { UNREACHABLE_CODES, errorCode } from '../web/resolver.js';
import { LlmMetaSchema, META_OUTPUT, clean, llmOf, unusableReply } from './tool-kit.js';

/**
 * name_it: name candidates, then a DNS look at each candidate domain. The model proposes names and
 * rationales; code derives each domain label from the name (lowercase a-z0-9 and inner hyphens),
 * asks DNS for the domain's NS records, and reports what DNS said:
 * - `resolves: true`: the name exists in DNS (it answered, with or without NS records): registered.
 * - `resolves: false`: NXDOMAIN, the name is not in DNS: LIKELY UNREGISTERED, NOT confirmed available
 *   (registered-but-undelegated, reserved and premium names also look like this; ask a registrar).
 * - `resolves: null`: unknown (resolver timed out, refused or failed, or the TLD itself is not in DNS:
 *   each requested TLD is looked up too, and one that is NXDOMAIN is listed in `tlds_not_in_dns`).
 */

export const PROMPT_VERSION = 'name_it/1';
const MAX_DESCRIPTION_CHARS = 8_000;
const MAX_TOKENS = 2_500;
/** DNS lookups at once for one call. */
const DNS_PARALLEL = 8;
/** Resolver failures (timeout, refused) after which the rest of a call's lookups are skipped as unknown. */
const DNS_DOWN_AFTER = 2;

export const DOMAIN_NOTE =
  'resolves:true means the domain exists in DNS (taken). resolves:false means DNS said NXDOMAIN: the domain is likely unregistered, ' +
  'NOT confirmed available (registered-but-undelegated, reserved or premium names look the same; check with a registrar). ' +
  'resolves:null means nothing is known (the lookup failed, or the TLD itself is not in DNS: see tlds_not_in_dns). Names may still be trademarks.';

export const NameItModelSchema = z.object({
  names: z
    .array(
      z.object({
        name: z.string().describe('The name as it would be written (brand casing), without a domain suffix.'),
        rationale: z.string().describe('One sentence on why it fits.'),
      }),
    )
    .describe('Distinct name candidates, best first.'),
});
type ModelNames = z.infer<typeof NameItModelSchema>;

const TLD = z
  .string()
  .trim()
  .toLowerCase()
  .transform((t) => t.replace(/^\./, ''))
  .pipe(
    z.string().regex(/^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)?(?:[a-z]{2,63}|xn--[a-z0-9-]{1,59})$/, 'a top-level domain such as "com", "io" or "co.uk"'),
  );

export const NameItInput = z.object({
  description: z
    .string()
    .trim()
    .min(1)
    .max(MAX_DESCRIPTION_CHARS)
    .describe(`What needs a name: the product, audience and tone (at most ${MAX_DESCRIPTION_CHARS} characters).`),
  count: z.number().int().min(3).max(20).default(8).describe('How many names to ask for (3-20).'),
  tlds: z
    .array(TLD)
    .min(1)
    .max(5)
    .default(['com'])
    .transform((t) => [...new Set(t)])
    .describe('Top-level domains (or public suffixes such as "co.uk") to check for each name (at most 5, default ["com"]).'),
});

export const NameItOutput = z.object({
  names: z
    .array(
      z.object({
        name: z.string().min(1),
        rationale: z.string(),
        label: z
          .string()
          .regex(/^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/)
          .nullable()
          .describe('The domain label derived from the name (null when no a-z0-9 character is left).'),
        domains: z.array(z.object({ domain: z.string(), resolves: z.boolean().nullable() })),
      }),
    )
    .min(1)
    .max(20),
  tlds: z.array(z.string()).min(1).max(5),
  tlds_not_in_dns: z.array(z.string()).describe('Requested TLDs that DNS says do not exist (NXDOMAIN); their domains are reported unknown (null).'),
  domain_note: z.string(),
  meta: LlmMetaSchema,
});
export type NameItResult = z.infer<typeof NameItOutput>;

/**
 * A name's domain label: diacritics stripped, lowercased, "&" as "and", everything but a-z, 0-9 and
 * "-" removed (so "Brew Buddy" is "brewbuddy"), hyphen runs collapsed and trimmed, at most 63 long.
 */
export function domainLabel(name: string): string | null {
  let s = name
    .normalize('NFKD')
    .replace(/\p{M}+/gu, '')
    .toLowerCase()
    .replace(/&/g, 'and');
  s = s
    .replace(/[^a-z0-9-]+/g, '')
    .replace(/-{2,}/g, '-')
    .replace(/^-+|-+$/g, '');
  s = s.slice(0, 63).replace(/-+$/, '');
  return s || null;
}

/** What DNS says about one domain: true (exists), false (NXDOMAIN), null (unknown). */
export async function probeDomain(dns: ToolDns, domain: string, signal: AbortSignal): Promise<boolean | null> {
  return (await probe(dns, domain, signal)).resolves;
}

/** `unreachable`: the resolver itself did not answer (timeout, refused), as opposed to a per-name failure. */
async function probe(dns: ToolDns, domain: string, signal: AbortSignal): Promise<{ resolves: boolean | null; unreachable: boolean }> {
  try {
    await dns.query('NS', domain, signal);
    return { resolves: true, unreachable: false };
  } catch (e) {
    if (signal.aborted) throw signal.reason instanceof AppError ? signal.reason : e;
    const code = errorCode(e);
    if (code === 'ENOTFOUND') return { resolves: false, unreachable: false };
    if (code === 'ENODATA') return { resolves: true, unreachable: false }; // the name exists, just without NS at this label
    return { resolves: null, unreachable: UNREACHABLE_CODES.has(code) };
  }
}

/** "Brewbuddy.com" -> "Brewbuddy" when the suffix is ".com" or a requested TLD (the model was told not to add one). */
function withoutTld(name: string, tlds: readonly string[]): string {
  const m = /^(.+)\.([A-Za-z]{2,63})$/.exec(name);
  return m && ['com', ...tlds].includes(m[2]!.toLowerCase()) ? m[1]! : name;
}

/** Model reply -> up to `count` distinct names (case-insensitive, and by label), in model order. */
export function pickNames(v: ModelNames, count: number, tlds: readonly string[] = []): Array<{ name: string; rationale: string; label: string | null }> {
  const seenName = new Set<string>();
  const seenLabel = new Set<string>();
  const out: Array<{ name: string; rationale: string; label: string | null }> = [];
  for (const n of v.names) {
    const name = clean(n.name);
    if (!name) continue;
    const label = domainLabel(withoutTld(name, tlds));
    const key = name.toLowerCase();
    if (seenName.has(key) || (label && seenLabel.has(label))) continue;
    seenName.add(key);
    if (label) seenLabel.add(label);
    out.push({ name, rationale: clean(n.rationale), label });
    if (out.length >= count) break;
  }
  return out;
}

/**
 * Looks every distinct domain up (DNS_PARALLEL at once), reporting `resolving` progress. Once the
 * resolver has failed to answer DNS_DOWN_AFTER times, it is taken as down: the remaining domains are
 * reported unknown (null) without waiting for each to time out.
 */
export async function checkDomains(ctx: ToolContext, domains: string[]): Promise<Map<string, boolean | null>> {
  const results = new Map<string, boolean | null>();
  const dns = ctx.dns;
  if (!dns) {
    for (const d of domains) results.set(d, null);
    return results;
  }
  let next = 0;
  let done = 0;
  let unreachable = 0;
  const total = domains.length;
  await ctx.progress({ stage: 'resolving', done: 0, total, unit: 'lookups' });
  const worker = async () => {
    while (next < domains.length) {
      const d = domains[next++]!;
      if (unreachable >= DNS_DOWN_AFTER) results.set(d, null);
      else {
        const r = await probe(dns, d, ctx.signal);
        if (r.unreachable) unreachable += 1;
        results.set(d, r.resolves);
      }
      done += 1;
      await ctx.progress({ stage: 'resolving', done, total, unit: 'lookups' });
    }
  };
  await Promise.all(Array.from({ length: Math.min(DNS_PARALLEL, domains.length) }, worker));
  return results;
}

export const nameIt = defineTool({
  name: 'name_it',
  description: 'Name candidates with rationales, each checked in DNS per TLD: resolves:false (NXDOMAIN) means likely unregistered, not confirmed available.',
  tier: 'starter',
  priceCents: 3,
  family: 'llm',
  input: NameItInput,
  examples: [
    { description: 'A budgeting app for freelancers with irregular income; friendly, not corporate.' },
    { description: 'An open-source CLI that diffs database schemas.', count: 5, tlds: ['dev', 'io'] },
  ],
  qField: 'description',
  needs: ['llm'],
  progress: true,
  output: `{names[{name, rationale, label, domains[{domain, resolves: true|false|null}]}], tlds, tlds_not_in_dns, domain_note, ${META_OUTPUT}}`,
  outputSchema: NameItOutput,
  handler: async (input, ctx): Promise<NameItResult> => {
    const { value, meta } = await llmOf(ctx, 'name_it').structured({
      name: 'name_it',
      promptVersion: PROMPT_VERSION,
      instructions: `Propose exactly ${input.count} distinct names for what the data block "description" describes, best first, each with a one-sentence rationale.
- Names should be short, easy to say and spell, and work as a domain name.
- Avoid well-known existing brands and trademarks.
- Give the name only, without a domain suffix such as ".com".`,
      data: [{ name: 'description', text: input.description }],
      schema: NameItModelSchema,
      maxTokens: MAX_TOKENS,
      temperature: 0.8,
    });
    const names = pickNames(value, input.count, input.tlds);
    if (!names.length) throw unusableReply('name_it', 'no names');
    const domains = [...new Set(names.flatMap((n) => (n.label ? input.tlds.map((t) => `${n.label}.${t}`) : [])))];
    // The TLDs themselves are looked up too: under a TLD that is not in DNS, NXDOMAIN says nothing.
    const found = await checkDomains(ctx, [...input.tlds, ...domains]);
    const missingTlds = input.tlds.filter((t) => found.get(t) === false);
    const resolves = (tld: string, domain: string) => (missingTlds.includes(tld) ? null : (found.get(domain) ?? null));
    return {
      names: names.map((n) => ({
        ...n,
        domains: n.label ? input.tlds.map((t) => ({ domain: `${n.label}.${t}`, resolves: resolves(t, `${n.label}.${t}`) })) : [],
      })),
      tlds: input.tlds,
      tlds_not_in_dns: missingTlds,
      domain_note: DOMAIN_NOTE,
      meta,
    };
  },
});
