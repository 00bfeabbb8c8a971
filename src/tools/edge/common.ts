import { isIP, isIPv4, isIPv6 } from 'node:net';
import { domainToASCII } from 'node:url';
import ipaddr from 'ipaddr.js';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool, type ToolContext, type ToolDefinition } from '../types.js';
import { CfClient, cfPath, dryRun, type DryRun, type PlannedWrite } from './cf-client.js';

export const ZONE_ID_RE = /^[0-9a-f]{32}$/;
const LABEL_RE = /^(?!-)[a-z0-9-]{1,63}(?<!-)$/;

/** A registrable-looking domain name in ASCII (punycode), lower case, no trailing dot. */
export function isDomainName(v: string): boolean {
  if (v.length > 253 || isIP(v)) return false;
  const labels = v.split('.');
  if (labels.length < 2) return false;
  if (/^\d+$/.test(labels[labels.length - 1]!)) return false;
  return labels.every((l) => LABEL_RE.test(l));
}

/** Lower-cases, drops a trailing dot and converts IDNs to punycode; '' when it cannot be converted. */
export function normalizeHost(v: string): string {
  const s = v.trim().toLowerCase().replace(/\.$/, '');
  if (/^[\x20-\x7e]*$/.test(s)) return s;
  return domainToASCII(s);
}

export const domainName = z.string().min(1).max(253).transform(normalizeHost).refine(isDomainName, 'expected a domain name such as example.com');

export const zoneRef = z
  .string()
  .min(1)
  .max(253)
  .transform(normalizeHost)
  .refine((v) => ZONE_ID_RE.test(v) || isDomainName(v), 'expected a 32-character zone id or a domain name such as example.com')
  .describe('The zone: its domain name (example.com) or its 32-character Cloudflare zone id');

export const accountId = z
  .string()
  .regex(/^[0-9a-f]{32}$/, 'expected a 32-character Cloudflare account id')
  .optional()
  .describe('Cloudflare account id; may be left out when the token can see exactly one account');

export const ttl = z
  .number()
  .int()
  .refine((v) => v === 1 || (v >= 60 && v <= 86400), 'TTL must be 1 (automatic) or 60..86400 seconds')
  .describe('Time to live in seconds: 1 means automatic, otherwise 60..86400');

export const ipv4 = z
  .string()
  .trim()
  .refine((v) => isIPv4(v), 'expected an IPv4 address such as 203.0.113.10');
export const ipv6 = z
  .string()
  .trim()
  .refine((v) => isIPv6(v), 'expected an IPv6 address such as 2001:db8::10')
  // The canonical (RFC 5952) spelling, so equal addresses compare equal.
  .transform((v) => ipaddr.IPv6.parse(v).toString());

/** Why a value cannot be a host name (for MX, CNAME, NS targets), or null when it can. */
export function hostProblem(raw: string): string | null {
  const v = raw.trim().replace(/\.$/, '');
  if (!v) return 'is empty';
  if (isIP(v) || /^\d+(\.\d+){3}$/.test(v)) return 'is an IP address; it must be a host name such as mail.example.com';
  if (!/^[\x21-\x7e]+$/.test(v) && !domainToASCII(v.toLowerCase())) return 'has characters a host name cannot have';
  const ascii = normalizeHost(v);
  if (!ascii) return 'has characters a host name cannot have';
  if (!ascii.includes('.')) return 'is a single label; it must be a fully qualified host name such as mail.example.com';
  if (ascii.length > 253) return 'is longer than 253 characters';
  const bad = ascii.split('.').find((l) => !LABEL_RE.test(l) && !/^_[a-z0-9-]{1,62}$/.test(l));
  if (bad !== undefined) return `has an invalid label '${bad}' (letters, digits and inner hyphens only)`;
  if (/^\d+$/.test(ascii.split('.').pop()!)) return 'ends in a numeric label, so it is not a host name';
  return null;
}

export const hostName = z
  .string()
  .max(253)
  .superRefine((v, ctx) => {
    const p = hostProblem(v);
    if (p) ctx.addIssue({ code: 'custom', message: `'${v}' ${p}` });
  })
  .transform(normalizeHost);

/** A record name inside a zone: '@' for the apex, a relative name ('www') or the full name. */
export const recordName = z
  .string()
  .trim()
  .min(1)
  .max(255)
  .transform((v) => (v === '@' ? '@' : normalizeHost(v)))
  .refine(
    (v) => v === '@' || /^(\*\.)?([a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)(\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*$/.test(v) || v === '*',
    'expected @, a relative name such as www, or a full name such as www.example.com',
  );

/** The full name of a record: '@' -> zone, 'www' -> www.zone, names already in the zone stay. */
export function fqdn(name: string, zoneName: string): string {
  const n = normalizeHost(name);
  if (n === '@' || n === '' || n === zoneName) return zoneName;
  if (n.endsWith(`.${zoneName}`)) return n;
  return `${n}.${zoneName}`;
}

export interface Zone {
  id: string;
  name: string;
  status?: string;
  paused?: boolean;
  type?: string;
  development_mode?: number;
  name_servers?: string[];
  original_name_servers?: string[] | null;
  account?: { id: string; name?: string };
  plan?: { id?: string; name?: string };
  created_on?: string;
  modified_on?: string;
  activated_on?: string | null;
}

/** How a tool's output names the zone it worked on. */
export const zoneOut = (z: Zone) => ({ id: z.id, name: z.name });

/** zoneOut's shape, in output schemas. */
export const ZoneOut = z.object({ id: z.string().describe('Zone id (32 hex characters)'), name: z.string().describe('Zone name, e.g. example.com') });

export function zoneSummary(z: Zone) {
  return {
    id: z.id,
    name: z.name,
    status: z.status ?? null,
    paused: z.paused ?? false,
    type: z.type ?? null,
    plan: z.plan?.name ?? null,
    name_servers: z.name_servers ?? [],
    account: z.account ? { id: z.account.id, name: z.account.name ?? null } : null,
    created_on: z.created_on ?? null,
    activated_on: z.activated_on ?? null,
  };
}

/** zoneSummary's shape, in output schemas (Cloudflare's zone reduced to what callers use). */
export const ZoneSummaryOut = z.object({
  id: z.string(),
  name: z.string(),
  status: z.string().nullable().describe('Cloudflare zone status: active, pending, initializing, moved...'),
  paused: z.boolean(),
  type: z.string().nullable().describe('full (Cloudflare runs the DNS), partial (CNAME setup) or secondary'),
  plan: z.string().nullable().describe("The plan's name, e.g. Free Website"),
  name_servers: z.array(z.string()).describe('The name servers Cloudflare assigned to the zone'),
  account: z.object({ id: z.string(), name: z.string().nullable() }).nullable(),
  created_on: z.string().nullable(),
  activated_on: z.string().nullable().describe('When the zone last became active; null while pending'),
});

/** Looks the zone up by id or by name; a zone the token cannot see is a `tool_failed`. */
export async function resolveZone(cf: CfClient, ref: string): Promise<Zone> {
  if (ZONE_ID_RE.test(ref)) return cf.get<Zone>(cfPath`/zones/${ref}`);
  const zones = await cf.get<Zone[]>('/zones', { name: ref, per_page: 5 });
  const zone = zones.find((z) => z.name === ref);
  if (!zone) {
    throw new AppError('tool_failed', `No zone named ${ref} is visible to this Cloudflare token (check the name, or the token's zone permissions)`, {
      zone: ref,
    });
  }
  return zone;
}

interface Account {
  id: string;
  name?: string;
}

/** The given account id, or the token's only account. */
export async function resolveAccountId(cf: CfClient, given: string | undefined): Promise<string> {
  if (given) return given;
  const { items } = await cf.listAll<Account>('/accounts', {}, { perPage: 50, max: 50, what: 'accounts' });
  if (items.length === 1) return items[0]!.id;
  if (items.length === 0) throw new AppError('tool_failed', 'This Cloudflare token cannot see any account; pass account_id or use a token with account access');
  throw new AppError(
    'invalid_input',
    `This token can see ${items.length} accounts; pass account_id, one of: ${items.map((a) => `${a.id} (${a.name ?? 'unnamed'})`).join(', ')}`,
    { issues: [{ path: ['account_id'], message: 'required when the token sees several accounts' }] },
  );
}

/** What a sandbox call of a writing tool returns instead (cf-client's dryRun): the writes it would send. */
export const DryRunOut = z.object({
  dry_run: z.literal(true),
  requests: z
    .array(
      z.object({
        method: z.enum(['POST', 'PUT', 'PATCH', 'DELETE']),
        path: z.string().describe('Path under the API base, with any query string'),
        body: z.unknown().optional().describe('The exact JSON body, or {content_type: multipart/form-data, parts} for an upload'),
      }),
    )
    .describe('The requests a real call would send, in order; nothing was sent'),
});

/** A writing tool's output schema: its result, or the dry run a sandbox key gets. */
export function orDryRun<T extends z.ZodTypeAny>(result: T) {
  return z.union([result, DryRunOut]);
}

/** Sandbox calls return the planned writes; others send them one by one and return the results. */
export async function applyWrites(cf: CfClient, ctx: ToolContext, writes: PlannedWrite[]): Promise<{ dry: DryRun } | { results: unknown[] }> {
  if (cf.sandbox) return { dry: dryRun(writes) };
  const results: unknown[] = [];
  for (const [i, w] of writes.entries()) {
    if (writes.length > 1) await ctx.progress({ stage: 'applying changes', done: i, total: writes.length, unit: 'requests' });
    results.push(await cf.write(w));
  }
  return { results };
}

/** A zone setting as `GET /zones/{id}/settings/{setting}` returns it. */
export interface ZoneSetting<V = unknown> {
  id: string;
  value: V;
  editable?: boolean;
  modified_on?: string | null;
  time_remaining?: number;
}

export function settingWrite(zoneId: string, setting: string, value: unknown): PlannedWrite {
  return { method: 'PATCH', path: cfPath`/zones/${zoneId}/settings/${setting}`, body: { value } };
}

/** The input field of a tool that shows or switches a mode through switchSetting. */
export const switchEnabled = z.boolean().optional().describe('true to turn on, false to turn off; leave out to only read the state');

/**
 * Reads an on/off-like zone setting and writes `value(enabled)` when `enabled` asks for the other
 * state. `after` is the setting as written, or null when nothing needed writing.
 */
export async function switchSetting<V>(
  cf: CfClient,
  ctx: ToolContext,
  zoneId: string,
  setting: string,
  isOn: (v: V) => boolean,
  enabled: boolean | undefined,
  value: (enabled: boolean) => V,
): Promise<{ dry: DryRun } | { current: ZoneSetting<V>; after: ZoneSetting<V> | null }> {
  const current = await cf.get<ZoneSetting<V>>(cfPath`/zones/${zoneId}/settings/${setting}`);
  if (enabled === undefined || enabled === isOn(current.value)) return { current, after: null };
  const applied = await applyWrites(cf, ctx, [settingWrite(zoneId, setting, value(enabled))]);
  if ('dry' in applied) return applied;
  return { current, after: applied.results[0] as ZoneSetting<V> };
}

/**
 * Every cf_* tool is in the edge family, unlocked by the pro plan, and needs the caller's edge token:
 * facts of the suite, set once here. Each tool's own file keeps its name, price, input and handler.
 */
export function defineEdgeTool<S extends z.ZodTypeAny, R>(def: Omit<ToolDefinition<S, R>, 'tier' | 'family' | 'needsEdgeToken'>): ToolDefinition<S, R> {
  return defineTool({ ...def, tier: 'pro', family: 'edge', needsEdgeToken: true });
}
