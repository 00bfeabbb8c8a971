import { isIPv4, isIPv6 } from 'node:net';
import ipaddr from 'ipaddr.js';
import { z } from 'zod';
import { cfPath, type CfClient, type PlannedWrite } from './cf-client.js';
import { fqdn, hostProblem, normalizeHost, recordName, ttl } from './common.js';

export const RECORD_TYPES = ['A', 'AAAA', 'CNAME', 'MX', 'TXT', 'NS', 'CAA', 'SRV'] as const;
export type RecordType = (typeof RECORD_TYPES)[number];
const PROXIABLE = new Set<string>(['A', 'AAAA', 'CNAME']);

export const recordType = z.enum(RECORD_TYPES).describe('Record type');

/** A DNS record as Cloudflare returns it. */
export interface DnsRecord {
  id: string;
  type: string;
  name: string;
  content: string;
  ttl: number;
  proxied?: boolean;
  proxiable?: boolean;
  priority?: number;
  data?: Record<string, unknown>;
  comment?: string | null;
  tags?: string[];
  created_on?: string;
  modified_on?: string;
}

/** The record types Cloudflare's API description lists (a zone may hold any of them, not only RECORD_TYPES). */
const CF_RECORD_TYPES = [
  'A',
  'AAAA',
  'CAA',
  'CERT',
  'CNAME',
  'DNSKEY',
  'DS',
  'HTTPS',
  'LOC',
  'MX',
  'NAPTR',
  'NS',
  'PTR',
  'SMIMEA',
  'SRV',
  'SSHFP',
  'SVCB',
  'TLSA',
  'TXT',
  'URI',
] as const;

/** recordSummary's shape, in output schemas. */
export const RecordOut = z.object({
  id: z.string().describe('DNS record id (32 hex characters)'),
  type: z.enum(CF_RECORD_TYPES),
  name: z.string().describe('Full name, e.g. www.example.com'),
  content: z.string(),
  ttl: z.number().int().describe('Seconds; 1 means automatic'),
  proxied: z.boolean(),
  priority: z.number().int().optional().describe('MX and SRV (and URI) priority, when the record has one'),
  data: z.record(z.unknown()).optional().describe('Structured value of CAA, SRV and similar records, as Cloudflare returns it (its fields depend on the type)'),
  comment: z.string().optional().describe('The note stored with the record, when it has one'),
});

export function recordSummary(r: DnsRecord) {
  return {
    id: r.id,
    type: r.type,
    name: r.name,
    content: r.content,
    ttl: r.ttl,
    proxied: r.proxied ?? false,
    ...(r.priority !== undefined ? { priority: r.priority } : {}),
    ...(r.data ? { data: r.data } : {}),
    ...(r.comment ? { comment: r.comment } : {}),
  };
}

export const caaData = z
  .object({
    flags: z.number().int().min(0).max(255).default(0).describe('CAA flags, 0 or 128 (critical)'),
    tag: z.enum(['issue', 'issuewild', 'iodef']).describe('What the record restricts'),
    value: z.string().min(1).max(255).describe("The CA's domain (letsencrypt.org) or, for iodef, a mailto:/https: URL"),
  })
  .describe('CAA record data');

export const srvData = z
  .object({
    priority: z.number().int().min(0).max(65535).describe('SRV priority (lower is tried first)'),
    weight: z.number().int().min(0).max(65535).describe('SRV weight among equal priorities'),
    port: z.number().int().min(0).max(65535).describe('Service port'),
    target: z.string().min(1).max(253).describe('Host that provides the service'),
  })
  .describe('SRV record data (the record name carries _service._proto, e.g. _sip._tcp)');

/** Fields a record may carry; create requires type/name and the type's value, updates take a subset. */
export const recordFields = {
  name: recordName.describe("Record name: '@' for the apex, a relative name such as www, or the full name"),
  content: z.string().trim().min(1).max(4096).optional().describe('Value: an IPv4 (A), IPv6 (AAAA), host name (CNAME, MX, NS) or text (TXT)'),
  priority: z.number().int().min(0).max(65535).optional().describe('MX priority (lower is preferred); required for MX'),
  caa: caaData.optional(),
  srv: srvData.optional(),
  ttl: ttl.optional(),
  proxied: z.boolean().optional().describe('Send traffic through Cloudflare (A, AAAA, CNAME only)'),
  comment: z.string().max(100).optional().describe('A note stored with the record'),
};

export const RecordInput = z.object({ type: recordType, ...recordFields }).superRefine((r, ctx) => {
  for (const issue of recordProblems(r)) ctx.addIssue({ code: 'custom', path: issue.path, message: issue.message });
});
export type RecordInput = z.output<typeof RecordInput>;

interface RecordShape {
  type: string;
  name?: string;
  content?: string;
  priority?: number;
  caa?: unknown;
  srv?: unknown;
  ttl?: number;
  proxied?: boolean;
}

/** What is wrong with a record for its type (empty when nothing). */
export function recordProblems(r: RecordShape): Array<{ path: string[]; message: string }> {
  const out: Array<{ path: string[]; message: string }> = [];
  const needContent = ['A', 'AAAA', 'CNAME', 'MX', 'TXT', 'NS'].includes(r.type);
  if (needContent && !r.content) out.push({ path: ['content'], message: `${r.type} records need content` });
  const c = r.content ?? '';
  if (r.content !== undefined) {
    if (r.type === 'A' && !isIPv4(c)) out.push({ path: ['content'], message: `'${c}' is not an IPv4 address` });
    if (r.type === 'AAAA' && !isIPv6(c)) out.push({ path: ['content'], message: `'${c}' is not an IPv6 address` });
    if (['CNAME', 'MX', 'NS'].includes(r.type)) {
      const p = hostProblem(c);
      if (p) out.push({ path: ['content'], message: `${r.type} target '${c}' ${p}` });
    }
    if (r.type === 'TXT' && c.length > 2048) out.push({ path: ['content'], message: 'TXT content is limited to 2048 characters' });
    if (['CAA', 'SRV'].includes(r.type))
      out.push({ path: ['content'], message: `${r.type} records take their value in '${r.type.toLowerCase()}', not content` });
  }
  if (r.type === 'MX' && r.priority === undefined) out.push({ path: ['priority'], message: 'MX records need a priority' });
  if (r.type !== 'MX' && r.priority !== undefined) out.push({ path: ['priority'], message: 'priority applies to MX records only (SRV has it in srv)' });
  if (r.type === 'CAA' && !r.caa) out.push({ path: ['caa'], message: 'CAA records need caa: {flags, tag, value}' });
  if (r.type === 'SRV' && !r.srv) out.push({ path: ['srv'], message: 'SRV records need srv: {priority, weight, port, target}' });
  if (r.type !== 'CAA' && r.caa) out.push({ path: ['caa'], message: 'caa applies to CAA records only' });
  if (r.type !== 'SRV' && r.srv) out.push({ path: ['srv'], message: 'srv applies to SRV records only' });
  if (r.type === 'SRV' && r.srv) {
    const p = hostProblem((r.srv as { target: string }).target);
    if (p) out.push({ path: ['srv', 'target'], message: `SRV target ${p}` });
    if (r.name && r.name !== '@' && !/^_[a-z0-9-]+\._(tcp|udp|tls)(\.|$)/.test(r.name)) {
      out.push({ path: ['name'], message: 'SRV names start with _service._proto, e.g. _sip._tcp' });
    }
  }
  if (r.proxied && !PROXIABLE.has(r.type)) out.push({ path: ['proxied'], message: 'only A, AAAA and CNAME records can be proxied' });
  if (r.proxied && r.ttl !== undefined && r.ttl !== 1) out.push({ path: ['ttl'], message: 'proxied records always use the automatic TTL (1)' });
  return out;
}

/** The JSON body Cloudflare takes for a record (create, overwrite, batch posts/puts). */
export function recordBody(r: RecordShape & { name: string; comment?: string }, zoneName: string): Record<string, unknown> {
  const body: Record<string, unknown> = { type: r.type, name: fqdn(r.name, zoneName), ttl: r.ttl ?? 1 };
  if (r.type === 'CAA') body.data = r.caa;
  else if (r.type === 'SRV') body.data = { ...(r.srv as object), target: normalizeHost((r.srv as { target: string }).target) };
  else if (['CNAME', 'MX', 'NS'].includes(r.type)) body.content = normalizeHost(r.content ?? '');
  else if (r.type === 'AAAA' && r.content && ipaddr.IPv6.isValid(r.content)) body.content = ipaddr.IPv6.parse(r.content).toString();
  else body.content = r.content;
  if (r.type === 'MX') body.priority = r.priority;
  if (PROXIABLE.has(r.type)) body.proxied = r.proxied ?? false;
  if (r.comment !== undefined) body.comment = r.comment;
  return body;
}

/** The record's current values in the shape of a record input (for merging an update). */
export function recordAsInput(r: DnsRecord): RecordShape & { name: string; comment?: string } {
  const base = { type: r.type, name: r.name, ttl: r.ttl, ...(r.comment ? { comment: r.comment } : {}) };
  if (r.type === 'CAA') return { ...base, caa: r.data };
  if (r.type === 'SRV') {
    const d = r.data ?? {};
    return { ...base, srv: { priority: d.priority, weight: d.weight, port: d.port, target: d.target } };
  }
  return {
    ...base,
    content: r.content,
    ...(r.type === 'MX' ? { priority: r.priority } : {}),
    ...(PROXIABLE.has(r.type) ? { proxied: r.proxied ?? false } : {}),
  };
}

/** Content in a comparable form: canonical IPv6, lower-case host names, TXT without wrapping quotes. */
export function normContent(type: string, content: string): string {
  if (type === 'AAAA' && ipaddr.IPv6.isValid(content)) return ipaddr.IPv6.parse(content).toString();
  if (['CNAME', 'MX', 'NS'].includes(type)) return normalizeHost(content);
  if (type === 'TXT') return unquoteTxt(content);
  return content;
}

/** Cloudflare may return TXT content wrapped in quotes ("..." "..."); this gives the text itself. */
export function unquoteTxt(content: string): string {
  const t = content.trim();
  const parts = t.match(/^"((?:[^"\\]|\\.)*)"(\s+"((?:[^"\\]|\\.)*)")*$/) ? [...t.matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((m) => m[1]!) : null;
  return parts ? parts.join('').replace(/\\(.)/g, '$1') : t;
}

/** A record a convenience tool wants to exist. */
export interface Desired {
  type: 'A' | 'AAAA' | 'CNAME' | 'MX' | 'TXT';
  name: string;
  content: string;
  ttl: number;
  proxied?: boolean;
  priority?: number;
}

export interface RecordPlan {
  unchanged: DnsRecord[];
  patches: Array<{ before: DnsRecord; after: Desired }>;
  posts: Desired[];
  deletes: DnsRecord[];
}

function sameAttrs(e: DnsRecord, d: Desired): boolean {
  if (e.ttl !== d.ttl) return false;
  if (PROXIABLE.has(d.type) && (e.proxied ?? false) !== (d.proxied ?? false)) return false;
  if (d.type === 'MX' && e.priority !== d.priority) return false;
  return true;
}

/**
 * Turns "these records should exist" into the fewest changes: records already right stay, records of
 * the same type and name are rewritten in place, the rest are created, and anything left over in
 * `inScope` (the records the tool owns for these names) is deleted.
 */
export function planRecords(inScope: DnsRecord[], desired: Desired[]): RecordPlan {
  const plan: RecordPlan = { unchanged: [], patches: [], posts: [], deletes: [] };
  const used = new Set<string>();
  const pending: Desired[] = [];
  for (const d of desired) {
    const match = inScope.find(
      (e) => !used.has(e.id) && e.type === d.type && e.name === d.name && normContent(e.type, e.content) === normContent(d.type, d.content),
    );
    if (!match) {
      pending.push(d);
      continue;
    }
    used.add(match.id);
    if (sameAttrs(match, d)) plan.unchanged.push(match);
    else plan.patches.push({ before: match, after: d });
  }
  for (const d of pending) {
    const reuse = inScope.find((e) => !used.has(e.id) && e.type === d.type && e.name === d.name);
    if (reuse) {
      used.add(reuse.id);
      plan.patches.push({ before: reuse, after: d });
    } else {
      plan.posts.push(d);
    }
  }
  plan.deletes = inScope.filter((e) => !used.has(e.id));
  return plan;
}

export function desiredBody(d: Desired): Record<string, unknown> {
  return {
    type: d.type,
    name: d.name,
    content: d.content,
    ttl: d.ttl,
    ...(PROXIABLE.has(d.type) ? { proxied: d.proxied ?? false } : {}),
    ...(d.type === 'MX' ? { priority: d.priority } : {}),
  };
}

/** The records exactly at each name, listed one name at a time. */
export async function recordsAt(cf: CfClient, zoneId: string, names: string[]): Promise<Map<string, DnsRecord[]>> {
  const byName = new Map<string, DnsRecord[]>();
  for (const name of names) {
    const { items } = await cf.listAll<DnsRecord>(cfPath`/zones/${zoneId}/dns_records`, { name }, { what: `records of ${name}` });
    byName.set(
      name,
      items.filter((r) => r.name === name),
    );
  }
  return byName;
}

export function planIsEmpty(p: RecordPlan): boolean {
  return !p.patches.length && !p.posts.length && !p.deletes.length;
}

/** One `POST /zones/{id}/dns_records/batch` carrying the plan (Cloudflare runs deletes, patches, puts, posts in that order). */
export function batchWrite(zoneId: string, p: RecordPlan): PlannedWrite {
  const body: Record<string, unknown> = {};
  if (p.deletes.length) body.deletes = p.deletes.map((r) => ({ id: r.id }));
  if (p.patches.length) body.patches = p.patches.map(({ before, after }) => ({ id: before.id, ...desiredBody(after) }));
  if (p.posts.length) body.posts = p.posts.map(desiredBody);
  return { method: 'POST', path: cfPath`/zones/${zoneId}/dns_records/batch`, body };
}

export interface BatchResult {
  deletes?: DnsRecord[];
  patches?: DnsRecord[];
  puts?: DnsRecord[];
  posts?: DnsRecord[];
}

/** desiredBody's shape: a record a convenience tool writes. */
const DesiredOut = z.object({
  type: z.enum(['A', 'AAAA', 'CNAME', 'MX', 'TXT']),
  name: z.string(),
  content: z.string(),
  ttl: z.number().int(),
  proxied: z.boolean().optional().describe('A, AAAA and CNAME only'),
  priority: z.number().int().optional().describe('MX only'),
});

/** planSummary's shape, in output schemas. */
export const PlanChangesOut = z.object({
  created: z.array(DesiredOut).describe('Records created'),
  updated: z.array(z.object({ id: z.string(), from: RecordOut, to: DesiredOut })).describe('Records rewritten in place'),
  deleted: z.array(RecordOut).describe('Records removed'),
  unchanged: z.array(RecordOut).describe('Records that were already right'),
});

export function planSummary(p: RecordPlan) {
  return {
    created: p.posts.map((d) => desiredBody(d)),
    updated: p.patches.map(({ before, after }) => ({ id: before.id, from: recordSummary(before), to: desiredBody(after) })),
    deleted: p.deletes.map(recordSummary),
    unchanged: p.unchanged.map(recordSummary),
  };
}
