import { z } from 'zod';
import { type ToolContext } from '../types.js';
import { createResolver, errorCode, ABSENT_CODES } from '../web/resolver.js';
import { CfClient } from './cf-client.js';
import { DryRunOut, ZoneOut, applyWrites, hostName, resolveZone, ttl, zoneRef, type Zone, defineEdgeTool } from './common.js';
import {
  PlanChangesOut,
  batchWrite,
  normContent,
  planIsEmpty,
  planRecords,
  planSummary,
  recordsAt,
  unquoteTxt,
  type BatchResult,
  type Desired,
  type DnsRecord,
  type RecordPlan,
} from './dns-records.js';

const PROVIDERS = ['google_workspace', 'microsoft_365', 'fastmail', 'proton', 'zoho', 'custom'] as const;
type Provider = (typeof PROVIDERS)[number];
const ZOHO_REGIONS = ['com', 'eu', 'in', 'com.au', 'jp', 'ca', 'sa'] as const;

const dkimValue = z
  .string()
  .min(10)
  .max(2048)
  .refine((v) => /^v=DKIM1;/i.test(unquoteTxt(v).trim()), 'a DKIM key record starts with v=DKIM1;');

const EmailInput = z
  .object({
    zone: zoneRef,
    provider: z.enum(PROVIDERS).describe('Mail provider preset, or custom with your own MX hosts'),
    mx_hosts: z
      .array(z.object({ host: hostName.describe('Mail exchanger host name'), priority: z.number().int().min(0).max(65535).describe('Lower is preferred') }))
      .min(1)
      .max(10)
      .optional()
      .describe('custom only: the mail servers, e.g. [{"host": "mx1.mailhost.example", "priority": 10}]'),
    spf_include: z
      .array(hostName)
      .max(5)
      .optional()
      .describe("Domains to include in SPF (custom: your provider's; others: extra senders such as a newsletter service)"),
    dkim: z
      .object({
        selector: z
          .string()
          .regex(/^[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?$/i, 'a DNS label such as google or zmail')
          .describe('DKIM selector'),
        value: dkimValue.describe('The TXT value the provider gave you, starting v=DKIM1;'),
      })
      .optional()
      .describe('DKIM key for providers that generate one per domain (Google Workspace, Zoho, custom)'),
    microsoft_mx_host: hostName
      .optional()
      .describe('microsoft_365: the MX host from the admin center; derived as <domain-with-dashes>.mail.protection.outlook.com when left out'),
    microsoft_tenant: z
      .string()
      .regex(/^[a-z0-9-]+\.onmicrosoft\.com$/i, 'expected the initial domain, e.g. contoso.onmicrosoft.com')
      .transform((s) => s.toLowerCase())
      .optional()
      .describe("microsoft_365: the tenant's initial domain (contoso.onmicrosoft.com), to add the DKIM selector CNAMEs"),
    proton_verification: z
      .string()
      .regex(/^[a-z0-9]{20,100}$/i, 'the code after protonmail-verification=')
      .optional()
      .describe('proton: the domain verification code'),
    proton_dkim_targets: z
      .array(hostName)
      .length(3)
      .optional()
      .describe('proton: the three DKIM CNAME targets (protonmail, protonmail2, protonmail3 ._domainkey) from the Proton dashboard'),
    zoho_region: z.enum(ZOHO_REGIONS).default('com').describe('zoho: the data centre of the Zoho account (com = US)'),
    dmarc_policy: z
      .enum(['none', 'quarantine', 'reject'])
      .optional()
      .describe('DMARC policy to set; when left out an existing DMARC record is kept and a missing one is created with p=none'),
    dmarc_rua: z.string().email().optional().describe('Address for DMARC aggregate reports'),
    replace_mx: z.boolean().default(true).describe('Remove other MX records at the domain (false only adds the missing ones)'),
    ttl: ttl.default(3600),
  })
  .superRefine((v, c) => {
    const only: Array<[keyof typeof v, Provider]> = [
      ['mx_hosts', 'custom'],
      ['microsoft_mx_host', 'microsoft_365'],
      ['microsoft_tenant', 'microsoft_365'],
      ['proton_verification', 'proton'],
      ['proton_dkim_targets', 'proton'],
    ];
    for (const [field, provider] of only) {
      if (v[field] !== undefined && v.provider !== provider)
        c.addIssue({ code: 'custom', path: [field], message: `${field} applies to provider ${provider} only` });
    }
    if (v.provider === 'custom' && !v.mx_hosts) c.addIssue({ code: 'custom', path: ['mx_hosts'], message: 'custom needs mx_hosts' });
    if (v.dkim && ['fastmail', 'microsoft_365', 'proton'].includes(v.provider)) {
      c.addIssue({ code: 'custom', path: ['dkim'], message: `${v.provider} DKIM uses fixed CNAMEs; dkim is for google_workspace, zoho and custom` });
    }
  });
type EmailInput = z.output<typeof EmailInput>;

const ProviderRecordOut = z.object({ type: z.enum(['CNAME', 'TXT']), name: z.string(), content: z.string() });
const warningsOut = z.array(z.string()).describe('Problems found: several SPF records, too many SPF lookups, mail hosts that do not resolve');
const SetupEmailOutput = z.union([
  z.object({
    zone: ZoneOut,
    provider: z.enum(PROVIDERS),
    records: z
      .object({
        mx: z.array(z.object({ host: z.string(), priority: z.number().int() })),
        spf: z.string().nullable().describe('The one SPF record, merged; null when there is none and nothing to include'),
        dkim: z.array(ProviderRecordOut),
        dmarc: z.string().nullable().describe('The DMARC record (an existing one is kept unless dmarc_policy is given)'),
        other: z.array(ProviderRecordOut).describe('Other provider records (autodiscover, domain verification)'),
      })
      .describe('The mail records the zone has for this provider after the call'),
    warnings: warningsOut,
    next_steps: z.array(z.string()).describe('What remains to do at the provider'),
    changed: z.boolean().describe('false when every record was already right (nothing was sent)'),
    changes: PlanChangesOut.extend({
      applied: z
        .object({ created: z.number().int().min(0), updated: z.number().int().min(0), deleted: z.number().int().min(0) })
        .optional()
        .describe("Counts from Cloudflare's batch answer, when a batch was sent"),
    }),
  }),
  DryRunOut.extend({ changes: PlanChangesOut, warnings: warningsOut }),
]);

interface Preset {
  mx: Array<{ host: string; priority: number }>;
  spf: string[];
  /** DKIM and other provider records, by relative name. */
  extra: Array<{ type: 'CNAME' | 'TXT'; name: string; content: string }>;
  notes: string[];
}

function preset(input: EmailInput, domain: string): Preset {
  const dashed = domain.replace(/\./g, '-');
  const dkimTxt = input.dkim ? [{ type: 'TXT' as const, name: `${input.dkim.selector}._domainkey`, content: unquoteTxt(input.dkim.value) }] : [];
  switch (input.provider) {
    case 'google_workspace':
      return {
        mx: [{ host: 'smtp.google.com', priority: 1 }],
        spf: ['_spf.google.com'],
        extra: dkimTxt,
        notes: input.dkim
          ? []
          : ['Generate a DKIM key in the Google Admin console (Apps > Google Workspace > Gmail > Authenticate email) and run again with dkim.'],
      };
    case 'microsoft_365':
      return {
        mx: [{ host: input.microsoft_mx_host ?? `${dashed}.mail.protection.outlook.com`, priority: 0 }],
        spf: ['spf.protection.outlook.com'],
        extra: [
          { type: 'CNAME', name: 'autodiscover', content: 'autodiscover.outlook.com' },
          ...(input.microsoft_tenant
            ? [1, 2].map((n) => ({
                type: 'CNAME' as const,
                name: `selector${n}._domainkey`,
                content: `selector${n}-${dashed}._domainkey.${input.microsoft_tenant}`,
              }))
            : []),
        ],
        notes: [
          ...(input.microsoft_mx_host
            ? []
            : [`The MX host was derived as ${dashed}.mail.protection.outlook.com; compare it with the value in the Microsoft 365 admin center.`]),
          ...(input.microsoft_tenant
            ? ['Turn DKIM signing on in the Microsoft Defender portal once the CNAMEs resolve.']
            : ['Pass microsoft_tenant (xxx.onmicrosoft.com) to add the DKIM CNAMEs.']),
        ],
      };
    case 'fastmail':
      return {
        mx: [
          { host: 'in1-smtp.messagingengine.com', priority: 10 },
          { host: 'in2-smtp.messagingengine.com', priority: 20 },
        ],
        spf: ['spf.messagingengine.com'],
        extra: [1, 2, 3].map((n) => ({ type: 'CNAME' as const, name: `fm${n}._domainkey`, content: `fm${n}.${domain}.dkim.fmhosted.com` })),
        notes: [],
      };
    case 'proton':
      return {
        mx: [
          { host: 'mail.protonmail.ch', priority: 10 },
          { host: 'mailsec.protonmail.ch', priority: 20 },
        ],
        spf: ['_spf.protonmail.ch'],
        extra: [
          ...(input.proton_verification ? [{ type: 'TXT' as const, name: '@', content: `protonmail-verification=${input.proton_verification}` }] : []),
          ...(input.proton_dkim_targets ?? []).map((target, i) => ({
            type: 'CNAME' as const,
            name: `protonmail${i === 0 ? '' : i + 1}._domainkey`,
            content: target,
          })),
        ],
        notes: [
          ...(input.proton_verification ? [] : ['Pass proton_verification (from Proton > Settings > Domain names) to add the verification record.']),
          ...(input.proton_dkim_targets ? [] : ['Pass proton_dkim_targets (the three CNAME targets Proton shows) to add DKIM.']),
        ],
      };
    case 'zoho': {
      const r = input.zoho_region;
      return {
        mx: [
          { host: `mx.zoho.${r}`, priority: 10 },
          { host: `mx2.zoho.${r}`, priority: 20 },
          { host: `mx3.zoho.${r}`, priority: 50 },
        ],
        spf: [`zohomail.${r}`],
        extra: dkimTxt,
        notes: input.dkim ? [] : ['Create a DKIM selector in the Zoho Mail admin console (Domains > Email configuration > DKIM) and run again with dkim.'],
      };
    }
    case 'custom':
      return { mx: input.mx_hosts ?? [], spf: [], extra: dkimTxt, notes: [] };
  }
}

const ALL_RE = /^[+\-~?]?all$/i;
const LOOKUP_RE = /^[+\-~?]?(include:|a$|a:|a\/|mx$|mx:|mx\/|ptr|exists:)|^redirect=/i;

/**
 * Adds include: terms to an SPF record without a second record (two SPF records make every check
 * fail, RFC 7208 4.5): new includes go before the closing all (or redirect=), duplicates are skipped.
 */
export function mergeSpf(existing: string | null, includes: string[]): { content: string; added: string[] } {
  const wanted = [...new Set(includes.map((i) => `include:${i.toLowerCase()}`))];
  if (!existing) return { content: ['v=spf1', ...wanted, '~all'].join(' '), added: wanted };
  const before = unquoteTxt(existing).trim();
  const have = termSet(before);
  return { content: mergeTerms(before, wanted), added: wanted.filter((w) => !have.has(w)) };
}

/** SPF terms compared case-insensitively, "+" being the default qualifier. */
function termSet(spf: string): Set<string> {
  return new Set(spf.split(/\s+/).map((x) => x.toLowerCase().replace(/^\+/, '')));
}

const isSpf = (r: DnsRecord) => r.type === 'TXT' && /^v=spf1(\s|$)/i.test(unquoteTxt(r.content));
const isDmarc = (r: DnsRecord) => r.type === 'TXT' && /^v=DMARC1/i.test(unquoteTxt(r.content));

function mergePlans(plans: RecordPlan[]): RecordPlan {
  return {
    unchanged: plans.flatMap((p) => p.unchanged),
    patches: plans.flatMap((p) => p.patches),
    posts: plans.flatMap((p) => p.posts),
    deletes: plans.flatMap((p) => p.deletes),
  };
}

async function mailHostWarnings(ctx: ToolContext, hosts: string[]): Promise<string[]> {
  let resolver: ReturnType<typeof createResolver>;
  try {
    resolver = createResolver(ctx.config);
  } catch {
    return ['Could not check whether the mail hosts resolve: DNS_SERVERS is not usable'];
  }
  const results = await Promise.all(
    hosts.map(async (host) => {
      try {
        await resolver.lookupAddresses(host, ctx.signal);
        return null;
      } catch (e) {
        const code = errorCode(e);
        return ABSENT_CODES.has(code)
          ? `Mail host ${host} does not resolve to any address (${code}); check the MX value with your provider`
          : `Could not check whether mail host ${host} resolves (${code || 'lookup failed'})`;
      }
    }),
  );
  return results.filter((w): w is string => w !== null);
}

export const cfSetupEmail = defineEdgeTool({
  name: 'cf_setup_email',
  description:
    'Sets up email DNS for a mail provider (Google Workspace, Microsoft 365, Fastmail, Proton, Zoho or custom): MX, SPF merged into any existing record, DKIM and DMARC, in one batch.',
  priceCents: 3,
  sideEffects: true,
  // Sets a state or removes a thing: the same call again changes nothing more.
  idempotent: true,
  input: EmailInput,
  qField: 'zone',
  output:
    '{zone, provider, changed, records: {mx, spf, dkim, dmarc, other}, changes: {created, updated, deleted, unchanged}, warnings, next_steps} or, for sandbox keys, {dry_run, requests, changes, warnings}',
  outputSchema: SetupEmailOutput,
  examples: [
    { zone: 'example.com', provider: 'google_workspace' },
    { zone: 'example.com', provider: 'fastmail', dmarc_policy: 'quarantine', dmarc_rua: 'dmarc@example.com' },
    {
      zone: 'example.com',
      provider: 'custom',
      mx_hosts: [
        { host: 'mx1.mailhost.example', priority: 10 },
        { host: 'mx2.mailhost.example', priority: 20 },
      ],
      spf_include: ['spf.mailhost.example'],
    },
  ],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone: Zone = await resolveZone(cf, input.zone);
    const apex = zone.name;
    const p = preset(input, apex);
    const full = (rel: string) => (rel === '@' ? apex : `${rel}.${apex}`);

    const names = [...new Set([apex, `_dmarc.${apex}`, ...p.extra.map((e) => full(e.name))])];
    const byName = await recordsAt(cf, zone.id, names);
    const at = (name: string) => byName.get(name) ?? [];
    const warnings: string[] = [];
    const t = input.ttl;

    // MX at the apex.
    const mxDesired: Desired[] = p.mx.map((m) => ({ type: 'MX', name: apex, content: m.host, priority: m.priority, ttl: t }));
    const wanted = new Set(mxDesired.map((d) => normContent('MX', d.content)));
    const mxExisting = at(apex).filter((r) => r.type === 'MX' && (input.replace_mx || wanted.has(normContent('MX', r.content))));
    const plans: RecordPlan[] = [planRecords(mxExisting, mxDesired)];

    // SPF: one record, merged.
    const spfRecords = at(apex).filter(isSpf);
    const includes = [...p.spf, ...(input.spf_include ?? [])];
    let spf: string | null = spfRecords[0] ? unquoteTxt(spfRecords[0].content) : null;
    if (spfRecords.length > 1) {
      // Several SPF records already fail every check; fold the others' terms into the first.
      const extraTerms = spfRecords.slice(1).flatMap((r) =>
        unquoteTxt(r.content)
          .split(/\s+/)
          .slice(1)
          .filter((x) => !ALL_RE.test(x)),
      );
      spf = mergeTerms(spf!, extraTerms);
      warnings.push(`Found ${spfRecords.length} SPF records at ${apex}; merged them into one, as receivers reject mail when there are several.`);
    }
    if (includes.length || spf) {
      const merged = includes.length ? mergeSpf(spf, includes).content : spf!;
      const lookups = merged.split(/\s+/).filter((x) => LOOKUP_RE.test(x)).length;
      if (lookups > 10)
        warnings.push(`The SPF record needs ${lookups} DNS lookups; receivers allow 10, so SPF checks will fail until some includes are removed.`);
      const keep = spfRecords[0];
      // An existing SPF record keeps its TTL: only its terms are ours to change.
      plans.push(planRecords(spfRecords, [{ type: 'TXT', name: apex, content: merged, ttl: keep ? keep.ttl : t }]));
      spf = merged;
    }

    // DKIM and provider records: whatever sits at those names would conflict (a CNAME stands alone).
    for (const e of p.extra) {
      const name = full(e.name);
      const scope =
        e.name === '@'
          ? at(name).filter((r) => r.type === 'TXT' && /^protonmail-verification=/i.test(unquoteTxt(r.content)))
          : at(name).filter((r) => ['CNAME', 'TXT', 'A', 'AAAA'].includes(r.type));
      plans.push(planRecords(scope, [{ type: e.type, name, content: e.content, ttl: t }]));
    }

    // DMARC: set when asked, created with p=none when missing, otherwise left as the owner set it.
    const dmarcName = `_dmarc.${apex}`;
    const dmarcExisting = at(dmarcName).filter(isDmarc);
    let dmarc: string | null = dmarcExisting[0] ? unquoteTxt(dmarcExisting[0].content) : null;
    if (input.dmarc_policy || !dmarcExisting.length) {
      dmarc = `v=DMARC1; p=${input.dmarc_policy ?? 'none'}${input.dmarc_rua ? `; rua=mailto:${input.dmarc_rua}` : ''}`;
      plans.push(planRecords(dmarcExisting, [{ type: 'TXT', name: dmarcName, content: dmarc, ttl: t }]));
    }

    const plan = mergePlans(plans);
    warnings.push(
      ...(await mailHostWarnings(
        ctx,
        p.mx.map((m) => m.host),
      )),
    );
    const changes = planSummary(plan);
    const records = {
      mx: p.mx,
      spf,
      dkim: p.extra.filter((e) => e.name.endsWith('._domainkey')).map((e) => ({ type: e.type, name: full(e.name), content: e.content })),
      dmarc,
      other: p.extra.filter((e) => !e.name.endsWith('._domainkey')).map((e) => ({ type: e.type, name: full(e.name), content: e.content })),
    };
    const out = { zone: { id: zone.id, name: apex }, provider: input.provider, records, warnings, next_steps: p.notes };
    if (planIsEmpty(plan)) return { ...out, changed: false, changes };

    const applied = await applyWrites(cf, ctx, [batchWrite(zone.id, plan)]);
    if ('dry' in applied) return { ...applied.dry, changes, warnings };
    const result = (applied.results[0] ?? {}) as BatchResult;
    return {
      ...out,
      changed: true,
      changes: { ...changes, applied: { created: result.posts?.length ?? 0, updated: result.patches?.length ?? 0, deleted: result.deletes?.length ?? 0 } },
    };
  },
});

/** Adds mechanisms to an SPF record before its all/redirect term, skipping ones it already has. */
function mergeTerms(spf: string, extra: string[]): string {
  const terms = spf.split(/\s+/);
  const have = termSet(spf);
  const add: string[] = [];
  for (const x of extra) {
    const k = x.toLowerCase().replace(/^\+/, '');
    if (!have.has(k) && !/^v=spf1$/i.test(x)) {
      have.add(k);
      add.push(x);
    }
  }
  let at = terms.findIndex((x) => ALL_RE.test(x) || /^redirect=/i.test(x));
  if (at === -1) at = terms.length;
  terms.splice(at, 0, ...add);
  return terms.join(' ');
}
