import { isIP } from 'node:net';
import { domainToASCII } from 'node:url';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool } from '../types.js';
import { ABSENT_CODES, RECORD_TYPES, UNREACHABLE_CODES, createResolver, errorCode, type RecordMap, type RecordType } from './resolver.js';

const LABEL = /^(?!-)[a-z0-9_-]{1,63}(?<!-)$/;

/** A hostname in ASCII (punycode) form; a URL is reduced to its host so chained outputs fit. */
export function normaliseDomain(raw: string): { domain: string } | { error: string } {
  let host = raw.trim();
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(host)) {
    try {
      host = new URL(host).hostname;
    } catch {
      return { error: 'not a valid domain name or URL' };
    }
  }
  host = host.replace(/\.$/, '');
  if (isIP(host.replace(/^\[|\]$/g, ''))) return { error: 'expected a domain name, not an IP address' };
  // domainToASCII quietly drops everything after a "/", "?" or "#", so ASCII is checked first.
  if (/[^\u0080-\u{10FFFF}a-z0-9._-]/iu.test(host)) return { error: 'not a valid domain name' };
  const ascii = domainToASCII(host);
  if (!ascii) return { error: 'not a valid domain name' };
  // The WHATWG host parser turns numeric names like "1.2.3" into IPv4 addresses.
  if (isIP(ascii)) return { error: 'expected a domain name, not an IP address' };
  if (ascii.length > 253) return { error: 'a domain name is at most 253 characters' };
  if (!ascii.split('.').every((l) => LABEL.test(l))) {
    return { error: 'each label must be 1-63 letters, digits, hyphens or underscores, not starting or ending with a hyphen' };
  }
  return { domain: ascii };
}

export const DomainCheckInput = z.object({
  domain: z
    .string()
    .min(1)
    .max(1024)
    .describe('The domain name to look up, e.g. "example.com". Internationalised names are accepted and converted to punycode.')
    .transform((raw, ctx) => {
      const r = normaliseDomain(raw);
      if ('error' in r) {
        ctx.addIssue({ code: 'custom', message: r.error });
        return z.NEVER;
      }
      return r.domain;
    }),
});

export type DomainStatus = 'ok' | 'nxdomain' | 'no_records' | 'error';

export interface DomainCheckResult {
  domain: string;
  /** Has at least one A or AAAA record. */
  resolves: boolean;
  /** ok: some record found; nxdomain: the name does not exist; no_records: it exists with none of these types; error: lookups failed. */
  status: DomainStatus;
  records: RecordMap;
  /** Per record type, failures other than "no such name" / "no such record". */
  errors: Partial<Record<RecordType, string>>;
}

const names = z.array(z.string());
const DomainCheckOutput = z.object({
  domain: z.string().describe('The name looked up, in ASCII (punycode)'),
  resolves: z.boolean().describe('Has at least one A or AAAA record'),
  status: z
    .enum(['ok', 'nxdomain', 'no_records', 'error'])
    .describe('ok: some record found; nxdomain: the name does not exist; no_records: it exists with none of these types; error: lookups failed'),
  records: z.object({
    A: names,
    AAAA: names,
    MX: z.array(z.object({ exchange: z.string(), priority: z.number().int().min(0) })).describe('Lowest priority (most preferred) first'),
    NS: names,
    TXT: names.describe('One string per record, its character-strings joined'),
  }),
  errors: z
    .object({ A: z.string(), AAAA: z.string(), MX: z.string(), NS: z.string(), TXT: z.string() })
    .partial()
    .describe('Per record type, failures other than "no such name" or "no such record"'),
});

const ERROR_TEXT: Record<string, string> = {
  ETIMEOUT: 'timed out',
  ECONNREFUSED: 'the DNS server refused the connection',
  ESERVFAIL: 'SERVFAIL: the name server failed to answer',
  EREFUSED: 'REFUSED: the name server refused the query',
  EFORMERR: 'FORMERR: the name server rejected the query',
  EBADRESP: 'the name server sent a malformed reply',
  ENOTIMP: 'NOTIMP: the name server does not support this query',
};

export const domainCheck = defineTool({
  name: 'domain_check',
  description: "Look up a domain's A, AAAA, MX, NS and TXT records and report whether it resolves.",
  tier: 'free',
  priceCents: 0,
  family: 'web',
  qField: 'domain',
  input: DomainCheckInput,
  examples: [{ domain: 'example.com' }, { domain: 'bücher.de' }],
  output:
    "{domain, resolves, status: 'ok'|'nxdomain'|'no_records'|'error', records: {A: [], AAAA: [], MX: [{exchange, priority}], NS: [], TXT: []}, errors: {<type>: message}}",
  outputSchema: DomainCheckOutput,
  handler: async (input, ctx): Promise<DomainCheckResult> => {
    const domain = input.domain;
    const resolver = createResolver(ctx.config);
    let done = 0;
    await ctx.progress({ stage: 'resolving', done, total: RECORD_TYPES.length, unit: 'lookups' });

    const outcomes = await Promise.all(
      RECORD_TYPES.map(async (type) => {
        try {
          return { type, value: (await resolver.query(type, domain, ctx.signal)) as unknown, code: null };
        } catch (e) {
          return { type, value: null, code: errorCode(e) || 'EUNKNOWN' };
        } finally {
          done += 1;
          await ctx.progress({ stage: 'resolving', done, total: RECORD_TYPES.length, unit: 'lookups', message: type });
        }
      }),
    );
    if (ctx.signal.aborted) throw new AppError('timeout', `domain_check was cancelled before ${domain} was resolved`);
    if (outcomes.every((o) => o.code !== null && UNREACHABLE_CODES.has(o.code))) {
      throw new AppError('tool_unavailable', 'DNS resolver unreachable');
    }

    const records: RecordMap = { A: [], AAAA: [], MX: [], NS: [], TXT: [] };
    const errors: DomainCheckResult['errors'] = {};
    for (const o of outcomes) {
      if (o.code === null) (records as unknown as Record<RecordType, unknown>)[o.type] = o.value;
      else if (!ABSENT_CODES.has(o.code)) errors[o.type] = ERROR_TEXT[o.code] ?? o.code;
    }
    records.MX.sort((a, b) => a.priority - b.priority || a.exchange.localeCompare(b.exchange));

    const found = RECORD_TYPES.some((t) => records[t].length > 0);
    const status: DomainStatus = found ? 'ok' : outcomes.some((o) => o.code === 'ENOTFOUND') ? 'nxdomain' : Object.keys(errors).length ? 'error' : 'no_records';
    return { domain, resolves: records.A.length + records.AAAA.length > 0, status, records, errors };
  },
});
