import { isIP } from 'node:net';
import ipaddr from 'ipaddr.js';
import { z } from 'zod';
import { AppError, isAppError } from '../../errors.js';
import type { ToolContext } from '../types.js';
import { CfClient, cfPath, type PlannedWrite } from './cf-client.js';
import { DryRunOut, ZoneOut, applyWrites, resolveZone, zoneOut, zoneRef } from './common.js';

/**
 * Helpers for the Rulesets API, where custom firewall rules (phase http_request_firewall_custom)
 * and cache rules (phase http_request_cache_settings) live. One rule is added, changed or removed
 * through the per-rule endpoints, so the zone's other rules in the phase are never rewritten.
 */

export interface Rule {
  id: string;
  version?: string;
  action: string;
  expression: string;
  description?: string;
  enabled?: boolean;
  ref?: string;
  action_parameters?: Record<string, unknown>;
  last_updated?: string;
}

export interface Ruleset {
  id: string;
  name?: string;
  kind?: string;
  phase?: string;
  version?: string;
  rules?: Rule[];
}

export type Phase = 'http_request_firewall_custom' | 'http_request_cache_settings';

/** The zone's entry point ruleset for a phase, or null when the zone has none yet. */
export async function getEntrypoint(cf: CfClient, zoneId: string, phase: Phase): Promise<Ruleset | null> {
  try {
    return await cf.get<Ruleset>(cfPath`/zones/${zoneId}/rulesets/phases/${phase}/entrypoint`);
  } catch (e) {
    const status = isAppError(e) ? (e.details.cloudflare as { status?: number } | undefined)?.status : undefined;
    if (isAppError(e) && e.code === 'tool_failed' && status === 404) return null;
    throw e;
  }
}

/** The parts of a rule this service writes. */
export interface RuleSpec {
  action: string;
  expression: string;
  description: string;
  enabled: boolean;
  action_parameters?: Record<string, unknown>;
}

export function ruleBody(spec: RuleSpec): Record<string, unknown> {
  return {
    action: spec.action,
    expression: spec.expression,
    description: spec.description,
    enabled: spec.enabled,
    ...(spec.action_parameters ? { action_parameters: spec.action_parameters } : {}),
  };
}

/** Finds the rule a call means: by id when given, otherwise by its description (its name in the dashboard). */
export function findRule(rs: Ruleset | null, byId: string | undefined, description: string | undefined): Rule | undefined {
  const rules = rs?.rules ?? [];
  if (byId) return rules.find((r) => r.id === byId);
  const d = description?.trim().toLowerCase();
  return d ? rules.find((r) => (r.description ?? '').trim().toLowerCase() === d || r.ref === d) : undefined;
}

function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') {
    return `{${Object.entries(v)
      .filter(([, x]) => x !== undefined)
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([k, x]) => `${JSON.stringify(k)}:${canonical(x)}`)
      .join(',')}}`;
  }
  return JSON.stringify(v);
}

export function ruleMatches(r: Rule, spec: RuleSpec): boolean {
  return (
    r.action === spec.action &&
    r.expression === spec.expression &&
    (r.description ?? '') === spec.description &&
    (r.enabled ?? true) === spec.enabled &&
    canonical(r.action_parameters ?? {}) === canonical(spec.action_parameters ?? {})
  );
}

/**
 * The one write that makes the rule exist as specified: PATCH the matching rule, POST a new rule
 * into the existing entry point, or PUT the entry point when the phase has none yet. Null when the
 * rule is already exactly so.
 */
export function upsertWrite(zoneId: string, phase: Phase, rs: Ruleset | null, existing: Rule | undefined, spec: RuleSpec): PlannedWrite | null {
  if (existing && ruleMatches(existing, spec)) return null;
  if (existing && rs) return { method: 'PATCH', path: cfPath`/zones/${zoneId}/rulesets/${rs.id}/rules/${existing.id}`, body: ruleBody(spec) };
  if (rs) return { method: 'POST', path: cfPath`/zones/${zoneId}/rulesets/${rs.id}/rules`, body: ruleBody(spec) };
  return { method: 'PUT', path: cfPath`/zones/${zoneId}/rulesets/phases/${phase}/entrypoint`, body: { rules: [ruleBody(spec)] } };
}

export function deleteWrite(zoneId: string, rs: Ruleset, rule: Rule): PlannedWrite {
  return { method: 'DELETE', path: cfPath`/zones/${zoneId}/rulesets/${rs.id}/rules/${rule.id}` };
}

/** ruleSummary's shape, in output schemas. */
export const RuleOut = z.object({
  id: z.string(),
  description: z.string().describe("The rule's name"),
  action: z.string().describe('What a match does, e.g. block or set_cache_settings'),
  expression: z.string().describe('The Rules language expression it matches'),
  enabled: z.boolean(),
  action_parameters: z.record(z.unknown()).optional().describe("The action's parameters, as Cloudflare holds them (they depend on the action)"),
  last_updated: z.string().nullable(),
});

/** RuleSpec's shape: what a set returns for the rule when Cloudflare's answer does not show it. */
const RuleSpecOut = z.object({
  action: z.string(),
  expression: z.string(),
  description: z.string(),
  enabled: z.boolean(),
  action_parameters: z.record(z.unknown()).optional(),
});

/**
 * What runRuleOperation returns: the rules (list), the rule deleted (delete), the rule as it is or as
 * written (set), or the dry run of a sandbox key.
 */
export const RuleOperationOut = z.union([
  z.object({ zone: ZoneOut, rules: z.array(RuleOut) }),
  z.object({ zone: ZoneOut, rule: RuleOut, deleted: z.literal(true), changed: z.literal(true) }),
  z.object({ zone: ZoneOut, rule: RuleOut, changed: z.literal(false) }),
  z.object({
    zone: ZoneOut,
    rule: z.union([RuleOut, RuleSpecOut]).describe('The rule as Cloudflare now has it (or, if its answer does not show it, as written, without id)'),
    changed: z.literal(true),
    created: z.boolean().describe('A new rule (rather than a change to the named one)'),
  }),
  DryRunOut,
]);

export function ruleSummary(r: Rule) {
  return {
    id: r.id,
    description: r.description ?? '',
    action: r.action,
    expression: r.expression,
    enabled: r.enabled ?? true,
    ...(r.action_parameters ? { action_parameters: r.action_parameters } : {}),
    last_updated: r.last_updated ?? null,
  };
}

/** A ruleset returned by a write: the rule the call made or changed, found by description. */
export function ruleFrom(result: unknown, description: string): Rule | null {
  const rules = (result as Ruleset | undefined)?.rules ?? [];
  return rules.find((r) => r.description === description) ?? null;
}

const quote = (s: string) => `"${s.replace(/\\/g, '\\\\').replace(/"/g, '\\"')}"`;

const cidrOrIp = z.string().refine((v) => {
  if (isIP(v)) return true;
  return ipaddr.isValidCIDR(v);
}, 'expected an IP address or CIDR range such as 198.51.100.0/24');

/** A simple request match that becomes a Rules language expression, for callers who do not write one. */
export const RuleMatch = z
  .object({
    hosts: z.array(z.string().min(1).max(253)).max(50).optional().describe('Host names, e.g. ["www.example.com"]'),
    path_prefix: z.string().startsWith('/').max(1024).optional().describe('URI path prefix, e.g. /wp-admin'),
    extensions: z
      .array(z.string().regex(/^[a-z0-9]{1,10}$/i, 'a file extension without the dot'))
      .max(50)
      .optional()
      .describe('File extensions, e.g. ["jpg", "css"]'),
    countries: z
      .array(z.string().regex(/^[A-Z]{2}$/, 'a two-letter country code such as CN'))
      .max(250)
      .optional()
      .describe('Visitor countries (ISO 3166-1 alpha-2)'),
    ips: z.array(cidrOrIp).max(100).optional().describe('Visitor IPs or CIDR ranges'),
    asns: z.array(z.number().int().min(1).max(4294967295)).max(100).optional().describe('Visitor autonomous system numbers'),
    methods: z
      .array(z.enum(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']))
      .max(7)
      .optional()
      .describe('HTTP methods'),
    user_agent_contains: z.string().min(1).max(256).optional().describe('Text the User-Agent contains'),
  })
  .refine((m) => Object.values(m).some((v) => v !== undefined), 'give at least one condition')
  .describe('Conditions that must all hold; an alternative to writing expression yourself');

export type RuleMatch = z.output<typeof RuleMatch>;

export function matchExpression(m: RuleMatch): string {
  const parts: string[] = [];
  if (m.hosts?.length) parts.push(`http.host in {${m.hosts.map((h) => quote(h.toLowerCase())).join(' ')}}`);
  if (m.path_prefix) parts.push(`starts_with(http.request.uri.path, ${quote(m.path_prefix)})`);
  if (m.extensions?.length) parts.push(`http.request.uri.path.extension in {${m.extensions.map((e) => quote(e.toLowerCase())).join(' ')}}`);
  if (m.countries?.length) parts.push(`ip.src.country in {${m.countries.map(quote).join(' ')}}`);
  if (m.ips?.length) parts.push(`ip.src in {${m.ips.join(' ')}}`);
  if (m.asns?.length) parts.push(`ip.src.asnum in {${m.asns.join(' ')}}`);
  if (m.methods?.length) parts.push(`http.request.method in {${m.methods.map(quote).join(' ')}}`);
  if (m.user_agent_contains) parts.push(`http.user_agent contains ${quote(m.user_agent_contains)}`);
  return parts.length === 1 ? parts[0]! : parts.map((p) => `(${p})`).join(' and ');
}

export const expressionField = z.string().min(1).max(4096).describe('A Cloudflare Rules language expression, e.g. (http.request.uri.path contains "/admin")');

export function requireOne(expression: string | undefined, match: RuleMatch | undefined): string {
  if (expression) return expression;
  if (match) return matchExpression(match);
  throw new AppError('invalid_input', 'Give expression or match', { issues: [{ path: ['expression'], message: 'expression or match is required' }] });
}

/** The input fields of a tool that lists, sets or deletes one rule of a phase; its own fields follow them. */
export const ruleOperationFields = {
  zone: zoneRef,
  operation: z.enum(['list', 'set', 'delete']).default('list').describe('list the rules, set (create or change) one, or delete one'),
  name: z.string().min(1).max(500).optional().describe("The rule's name (its description); set and delete find the rule by it"),
  rule_id: z
    .string()
    .regex(/^[0-9a-f]{32}$/)
    .optional()
    .describe("The rule's id, to pick it instead of by name"),
  expression: expressionField.optional(),
  match: RuleMatch.optional(),
};

interface RuleOperation {
  zone: string;
  operation: 'list' | 'set' | 'delete';
  name?: string;
  rule_id?: string;
  expression?: string;
  match?: RuleMatch;
}

/** The superRefine checks every such tool needs: which rule, and for set, its name and its match. */
export function ruleOperationProblems(v: RuleOperation, c: z.RefinementCtx): void {
  if (v.operation !== 'list' && !v.name && !v.rule_id) c.addIssue({ code: 'custom', path: ['name'], message: `${v.operation} needs name or rule_id` });
  if (v.operation === 'set' && !v.name) c.addIssue({ code: 'custom', path: ['name'], message: 'set needs a name for the rule' });
  if (v.operation === 'set' && !v.expression && !v.match) c.addIssue({ code: 'custom', path: ['match'], message: 'set needs expression or match' });
}

/**
 * Lists the phase's rules, deletes the named one, or makes it exist as `spec()` describes (called only
 * for set, after the lookups). `noun` names the rule in errors, e.g. 'cache rule'.
 */
export async function runRuleOperation(ctx: ToolContext, input: RuleOperation, phase: Phase, noun: string, spec: () => RuleSpec) {
  const cf = new CfClient(ctx);
  const zone = await resolveZone(cf, input.zone);
  const out = { zone: zoneOut(zone) };
  const rs = await getEntrypoint(cf, zone.id, phase);
  if (input.operation === 'list') return { ...out, rules: (rs?.rules ?? []).map(ruleSummary) };

  const existing = findRule(rs, input.rule_id, input.name);
  if (input.operation === 'delete') {
    if (!existing || !rs) throw new AppError('tool_failed', `No ${noun} ${input.rule_id ?? `named '${input.name}'`} in ${zone.name}`, { zone: zone.name });
    const applied = await applyWrites(cf, ctx, [deleteWrite(zone.id, rs, existing)]);
    if ('dry' in applied) return applied.dry;
    return { ...out, rule: ruleSummary(existing), deleted: true, changed: true };
  }
  const wanted = spec();
  const write = upsertWrite(zone.id, phase, rs, existing, wanted);
  if (!write) return { ...out, rule: ruleSummary(existing!), changed: false };
  const applied = await applyWrites(cf, ctx, [write]);
  if ('dry' in applied) return applied.dry;
  const rule = ruleFrom(applied.results[0], wanted.description);
  return { ...out, rule: rule ? ruleSummary(rule) : wanted, changed: true, created: !existing };
}
