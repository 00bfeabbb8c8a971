import { z } from 'zod';

/**
 * SPF (RFC 7208) and DMARC (RFC 7489) records read from a domain's TXT records, for grabr_intel.
 * Pure functions over at most a few kilobytes of DNS text.
 */

export const SpfSchema = z.object({
  record: z.string(),
  valid: z.boolean(),
  mechanisms: z.array(z.object({ qualifier: z.enum(['+', '-', '~', '?']), type: z.string(), value: z.string().nullable() })),
  /** The `all` mechanism with its qualifier ("-all", "~all"...), or null. */
  all: z.string().nullable(),
  includes: z.array(z.string()),
  redirect: z.string().nullable(),
  /** Mechanisms and modifiers that cost a DNS lookup (include, a, mx, ptr, exists, redirect); RFC 7208 allows 10. */
  dns_lookups: z.number().int(),
  warnings: z.array(z.string()),
});
export type Spf = z.infer<typeof SpfSchema>;

export const DmarcSchema = z.object({
  record: z.string(),
  valid: z.boolean(),
  policy: z.string().nullable(),
  subdomain_policy: z.string().nullable(),
  pct: z.number().int().nullable(),
  rua: z.array(z.string()),
  ruf: z.array(z.string()),
  adkim: z.string().nullable(),
  aspf: z.string().nullable(),
  tags: z.record(z.string()),
  warnings: z.array(z.string()),
});
export type Dmarc = z.infer<typeof DmarcSchema>;

const LOOKUP_TYPES = new Set(['include', 'a', 'mx', 'ptr', 'exists']);
const MECHANISMS = new Set(['all', 'include', 'a', 'mx', 'ptr', 'ip4', 'ip6', 'exists']);

/** The domain's SPF policy: the TXT record starting "v=spf1", or null when there is none. */
export function parseSpf(txt: string[]): Spf | null {
  const records = txt.filter((t) => /^v=spf1(?:\s|$)/i.test(t.trim()));
  if (!records.length) return null;
  const record = records[0]!.trim();
  const warnings: string[] = [];
  let valid = true;
  if (records.length > 1) {
    warnings.push(`${records.length} SPF records: receivers treat this as a permanent error`);
    valid = false;
  }
  const mechanisms: Spf['mechanisms'] = [];
  const includes: string[] = [];
  let redirect: string | null = null;
  let all: string | null = null;
  let lookups = 0;
  for (const term of record.split(/\s+/).slice(1)) {
    if (!term) continue;
    const mod = /^([a-z][a-z0-9_.-]*)=(.*)$/i.exec(term);
    if (mod) {
      const name = mod[1]!.toLowerCase();
      if (name === 'redirect') {
        redirect = mod[2]!;
        lookups += 1;
      }
      continue;
    }
    const m = /^([+\-~?]?)([a-z0-9]+)(?:[:/](.*))?$/i.exec(term);
    const type = m?.[2]?.toLowerCase();
    if (!m || !type || !MECHANISMS.has(type)) {
      warnings.push(`unknown term "${term}"`);
      valid = false;
      continue;
    }
    const qualifier = (m[1] || '+') as '+' | '-' | '~' | '?';
    // "ip4:192.0.2.0/24" -> "192.0.2.0/24"; "a/24" keeps its "/24".
    const value = term.slice(m[1]!.length + m[2]!.length).replace(/^:/, '') || null;
    mechanisms.push({ qualifier, type, value });
    if (LOOKUP_TYPES.has(type)) lookups += 1;
    if (type === 'include' && value) includes.push(value);
    if (type === 'all') all = `${qualifier}all`;
  }
  if (lookups > 10) {
    warnings.push(`${lookups} DNS-querying terms: more than the 10 RFC 7208 allows (permerror)`);
    valid = false;
  }
  if (all === '+all') warnings.push('+all lets any server send mail as this domain');
  if (all === '?all') warnings.push('?all is neutral: it does not ask receivers to reject anything');
  if (all === null && redirect === null) warnings.push('no "all" mechanism or redirect: unmatched senders get a neutral result');
  return { record, valid, mechanisms, all, includes, redirect, dns_lookups: lookups, warnings };
}

/** The DMARC policy from the TXT records of _dmarc.<domain>, or null when there is none. */
export function parseDmarc(txt: string[]): Dmarc | null {
  const records = txt.filter((t) => /^v\s*=\s*DMARC1\s*(?:;|$)/i.test(t.trim()));
  if (!records.length) return null;
  const record = records[0]!.trim();
  const warnings: string[] = [];
  let valid = true;
  if (records.length > 1) {
    warnings.push(`${records.length} DMARC records: receivers ignore them all`);
    valid = false;
  }
  const tags: Record<string, string> = {};
  for (const part of record.split(';')) {
    const eq = part.indexOf('=');
    if (eq < 0) continue;
    const k = part.slice(0, eq).trim().toLowerCase();
    const v = part.slice(eq + 1).trim();
    if (k && !(k in tags)) tags[k] = v;
  }
  const policy = tags['p']?.toLowerCase() ?? null;
  if (!policy || !['none', 'quarantine', 'reject'].includes(policy)) {
    warnings.push(policy ? `unknown policy p=${policy}` : 'no p= tag: the record is invalid');
    valid = false;
  } else if (policy === 'none') warnings.push('p=none only monitors: spoofed mail is still delivered');
  const uris = (v: string | undefined) =>
    v
      ? v
          .split(',')
          .map((s) => s.trim())
          .filter(Boolean)
      : [];
  const pctRaw = tags['pct'];
  const pct = pctRaw !== undefined && /^\d{1,3}$/.test(pctRaw) ? Number(pctRaw) : null;
  if (pct !== null && pct < 100) warnings.push(`pct=${pct}: the policy applies to only ${pct}% of failing mail`);
  const rua = uris(tags['rua']);
  if (!rua.length) warnings.push('no rua= address: no aggregate reports are sent');
  return {
    record,
    valid,
    policy,
    subdomain_policy: tags['sp']?.toLowerCase() ?? null,
    pct,
    rua,
    ruf: uris(tags['ruf']),
    adkim: tags['adkim']?.toLowerCase() ?? null,
    aspf: tags['aspf']?.toLowerCase() ?? null,
    tags,
    warnings,
  };
}
