import { isIPv4, isIPv6 } from 'node:net';
import ipaddr from 'ipaddr.js';
import { z } from 'zod';
import { CfClient, cfPath, type PlannedWrite } from './cf-client.js';
import {
  ZoneOut,
  accountId,
  applyWrites,
  orDryRun,
  resolveAccountId,
  resolveZone,
  switchEnabled,
  switchSetting,
  zoneOut,
  zoneRef,
  defineEdgeTool,
} from './common.js';
import { RuleOperationOut, requireOne, ruleOperationFields, ruleOperationProblems, runRuleOperation } from './rulesets.js';

const SECURITY_LEVELS = ['essentially_off', 'low', 'medium', 'high'] as const;
/** The security_level setting's values, as Cloudflare's API description lists them. */
const securityLevel = z.enum(['off', 'essentially_off', 'low', 'medium', 'high', 'under_attack']);

export const cfUnderAttack = defineEdgeTool({
  name: 'cf_under_attack',
  description: "Shows or switches I'm Under Attack mode (every visitor gets a browser check) through the zone's security level.",
  priceCents: 0,
  sideEffects: true,
  // Sets a state or removes a thing: the same call again changes nothing more.
  idempotent: true,
  input: z.object({
    zone: zoneRef,
    enabled: switchEnabled,
    restore_level: z.enum(SECURITY_LEVELS).default('medium').describe('Security level to return to when turning the mode off'),
  }),
  qField: 'zone',
  output: '{zone, under_attack, security_level, previous_level, changed} or, for sandbox keys, {dry_run, requests}',
  outputSchema: orDryRun(
    z.object({
      zone: ZoneOut,
      previous_level: securityLevel.describe('The security level before the call'),
      under_attack: z.boolean(),
      security_level: securityLevel.describe('The security level now'),
      changed: z.boolean(),
    }),
  ),
  examples: [{ zone: 'example.com', enabled: true }, { zone: 'example.com', enabled: false, restore_level: 'high' }, { zone: 'example.com' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const s = await switchSetting<string>(
      cf,
      ctx,
      zone.id,
      'security_level',
      (v) => v === 'under_attack',
      input.enabled,
      (on) => (on ? 'under_attack' : input.restore_level),
    );
    if ('dry' in s) return s.dry;
    const now = s.after ?? s.current;
    return {
      zone: zoneOut(zone),
      previous_level: s.current.value,
      under_attack: now.value === 'under_attack',
      security_level: now.value,
      changed: s.after !== null,
    };
  },
});

interface AccessRule {
  id: string;
  mode: string;
  notes?: string;
  configuration: { target: string; value: string };
  scope?: { type?: string };
  created_on?: string;
}

/** Cloudflare's target for a value: a single address, or a range of the sizes IP access rules accept. */
function accessTarget(raw: string): { target: 'ip' | 'ip6' | 'ip_range'; value: string } | string {
  const v = raw.trim();
  if (isIPv4(v)) return { target: 'ip', value: v };
  if (isIPv6(v)) return { target: 'ip6', value: ipaddr.IPv6.parse(v).toString() };
  if (!ipaddr.isValidCIDR(v)) return `'${raw}' is not an IP address or CIDR range`;
  const [addr, bits] = ipaddr.parseCIDR(v);
  const allowed = addr.kind() === 'ipv4' ? [16, 24] : [32, 48, 64];
  if (!allowed.includes(bits)) {
    return `IP access rules accept ${addr.kind() === 'ipv4' ? 'IPv4 ranges of /16 or /24' : 'IPv6 ranges of /32, /48 or /64'}; block a single address or use cf_firewall_rules for other ranges`;
  }
  // The network address, so 203.0.113.7/24 and 203.0.113.0/24 are the same rule.
  const network = addr.kind() === 'ipv4' ? ipaddr.IPv4.networkAddressFromCIDR(v) : ipaddr.IPv6.networkAddressFromCIDR(v);
  return { target: 'ip_range', value: `${network.toString()}/${bits}` };
}

const AccessRuleOut = z.object({
  id: z.string(),
  mode: z.enum(['block', 'challenge', 'whitelist', 'js_challenge', 'managed_challenge']),
  target: z.enum(['ip', 'ip6', 'ip_range']),
  value: z.string().describe('The address, or the range as its network address and prefix length'),
  notes: z.string(),
});
const changedField = z.boolean().describe('false when the rule already existed as asked (nothing was sent)');
const BlockIpOutput = orDryRun(
  z.discriminatedUnion('scope', [
    z.object({ scope: z.literal('zone'), zone: ZoneOut, rule: AccessRuleOut, changed: changedField }),
    z.object({ scope: z.literal('account'), account_id: z.string(), rule: AccessRuleOut, changed: changedField }),
  ]),
);

export const cfBlockIp = defineEdgeTool({
  name: 'cf_block_ip',
  description: 'Blocks (or challenges) an IP address or range with an IP access rule, for one zone or the whole account.',
  priceCents: 2,
  sideEffects: true,
  input: z
    .object({
      ip: z
        .string()
        .min(2)
        .max(64)
        .superRefine((v, c) => {
          const t = accessTarget(v);
          if (typeof t === 'string') c.addIssue({ code: 'custom', message: t });
        })
        .describe('IPv4 or IPv6 address, or a range: IPv4 /16 or /24, IPv6 /32, /48 or /64'),
      zone: zoneRef.optional().describe('Zone (name or id) the rule applies to; leave out to apply it to every zone of the account'),
      account_id: accountId,
      mode: z
        .enum(['block', 'managed_challenge', 'challenge', 'js_challenge', 'whitelist'])
        .default('block')
        .describe('What happens to matching visitors (whitelist lets them past other security checks)'),
      notes: z.string().max(500).optional().describe('Why the rule exists (shown in the dashboard)'),
    })
    .refine((v) => !(v.zone && v.account_id), { message: 'give zone or account_id, not both', path: ['account_id'] }),
  qField: 'ip',
  output: '{scope: zone|account, zone?, rule: {id, mode, target, value, notes}, changed} or, for sandbox keys, {dry_run, requests}',
  outputSchema: BlockIpOutput,
  examples: [
    { ip: '198.51.100.23', zone: 'example.com' },
    { ip: '2001:db8:1234::/48', mode: 'managed_challenge', zone: 'example.com' },
    { ip: '203.0.113.0/24' },
  ],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const target = accessTarget(input.ip) as { target: string; value: string };
    let base: string;
    let scope: { scope: 'zone'; zone: { id: string; name: string } } | { scope: 'account'; account_id: string };
    if (input.zone) {
      const zone = await resolveZone(cf, input.zone);
      base = cfPath`/zones/${zone.id}/firewall/access_rules/rules`;
      scope = { scope: 'zone', zone: zoneOut(zone) };
    } else {
      const account = await resolveAccountId(cf, input.account_id);
      base = cfPath`/accounts/${account}/firewall/access_rules/rules`;
      scope = { scope: 'account', account_id: account };
    }
    const notes = input.notes ?? `${input.mode} ${target.value} (set through Tollgate)`;
    // Filter by value only: the list endpoint's configuration.target filter has no "ip6".
    const { items } = await cf.listAll<AccessRule>(base, { 'configuration.value': target.value }, { what: 'access rules', max: 50 });
    const existing = items.find((r) => r.configuration.target === target.target && r.configuration.value === target.value);
    const summary = (r: { id: string | null; mode: string; notes?: string }) => ({ id: r.id, mode: r.mode, ...target, notes: r.notes ?? '' });
    if (existing && existing.mode === input.mode && (input.notes === undefined || existing.notes === input.notes)) {
      return { ...scope, rule: summary(existing), changed: false };
    }
    const write: PlannedWrite = existing
      ? { method: 'PATCH', path: `${base}/${encodeURIComponent(existing.id)}`, body: { mode: input.mode, notes: input.notes ?? existing.notes ?? notes } }
      : { method: 'POST', path: base, body: { mode: input.mode, configuration: target, notes } };
    const applied = await applyWrites(cf, ctx, [write]);
    if ('dry' in applied) return applied.dry;
    const rule = applied.results[0] as AccessRule;
    return { ...scope, rule: summary(rule), changed: true };
  },
});

const FW_PHASE = 'http_request_firewall_custom' as const;
const FW_ACTIONS = ['block', 'managed_challenge', 'js_challenge', 'challenge', 'log', 'skip'] as const;

export const cfFirewallRules = defineEdgeTool({
  name: 'cf_firewall_rules',
  description: "Lists, sets or deletes one custom firewall rule (WAF custom rules) without touching the zone's other rules.",
  priceCents: 0,
  sideEffects: true,
  input: z
    .object({
      ...ruleOperationFields,
      action: z
        .enum(FW_ACTIONS)
        .default('block')
        .describe('What happens on a match; skip lets the request past the remaining custom rules; log is Enterprise-only'),
      enabled: z.boolean().default(true).describe('Whether the rule runs'),
    })
    .superRefine((v, c) => {
      ruleOperationProblems(v, c);
    }),
  qField: 'zone',
  output: '{zone, rules: [{id, description, action, expression, enabled}]} for list; {zone, rule, changed} for set/delete; or {dry_run, requests}',
  outputSchema: RuleOperationOut,
  examples: [
    { zone: 'example.com' },
    {
      zone: 'example.com',
      operation: 'set',
      name: 'Challenge admin from abroad',
      expression: '(starts_with(http.request.uri.path, "/admin") and ip.src.country ne "DE")',
      action: 'managed_challenge',
    },
    { zone: 'example.com', operation: 'set', name: 'Block bad bots', match: { user_agent_contains: 'BadBot' } },
    { zone: 'example.com', operation: 'delete', name: 'Block bad bots' },
  ],
  handler: async (input, ctx) =>
    runRuleOperation(ctx, input, FW_PHASE, 'firewall rule', () => ({
      action: input.action,
      expression: requireOne(input.expression, input.match),
      description: input.name!,
      enabled: input.enabled,
      // "skip" needs to say what it skips; the rest of this phase's custom rules is what users mean.
      ...(input.action === 'skip' ? { action_parameters: { ruleset: 'current' } } : {}),
    })),
});
