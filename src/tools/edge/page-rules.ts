import { z } from 'zod';
import { type ToolContext } from '../types.js';
import { CfClient, cfPath, type PlannedWrite } from './cf-client.js';
import { ZoneOut, applyWrites, orDryRun, resolveZone, zoneOut, zoneRef, type Zone, defineEdgeTool } from './common.js';

/**
 * Page rules are Cloudflare's legacy per-URL overrides; they still work at /zones/{id}/pagerules and
 * many zones rely on them. New cache and security behaviour belongs in cf_cache_rules and
 * cf_firewall_rules.
 */

/** The pattern Cloudflare's API description gives for a page rule's URL target. */
const TARGET_RE = /^(https?:\/\/)?(([-a-zA-Z0-9*]*\.)+[-a-zA-Z0-9]{2,20})(:(8080|8443|443|80))?(\/[\S]+)?$/;

const onOff = z.enum(['on', 'off']);
const PageRuleAction = z.discriminatedUnion('id', [
  z.object({
    id: z.literal('forward_url'),
    url: z.string().url().describe('Where to redirect; $1, $2... stand for the *s of the pattern'),
    status_code: z
      .union([z.literal(301), z.literal(302)])
      .default(301)
      .describe('301 permanent or 302 temporary'),
  }),
  z.object({ id: z.literal('always_use_https') }),
  z.object({ id: z.literal('cache_level'), value: z.enum(['bypass', 'basic', 'simplified', 'aggressive', 'cache_everything']) }),
  z.object({ id: z.literal('edge_cache_ttl'), value: z.number().int().min(1).max(2419200).describe('Seconds to cache at the edge') }),
  z.object({ id: z.literal('browser_cache_ttl'), value: z.number().int().min(0).max(31536000).describe('Seconds browsers may cache (0 respects the origin)') }),
  z.object({ id: z.literal('ssl'), value: z.enum(['off', 'flexible', 'full', 'strict']) }),
  z.object({ id: z.literal('security_level'), value: z.enum(['off', 'essentially_off', 'low', 'medium', 'high', 'under_attack']) }),
  z.object({ id: z.literal('automatic_https_rewrites'), value: onOff }),
  z.object({ id: z.literal('browser_check'), value: onOff }),
  z.object({ id: z.literal('email_obfuscation'), value: onOff }),
  z.object({ id: z.literal('rocket_loader'), value: onOff }),
  z.object({ id: z.literal('cache_deception_armor'), value: onOff }),
  z.object({ id: z.literal('disable_performance') }),
]);
type PageRuleAction = z.output<typeof PageRuleAction>;

const actionsField = z
  .array(PageRuleAction)
  .min(1)
  .max(20)
  .refine((a) => !a.some((x) => x.id === 'forward_url') || a.length === 1, 'forward_url cannot be combined with other actions')
  .refine((a) => new Set(a.map((x) => x.id)).size === a.length, 'each action may appear once')
  .describe('What the rule does, e.g. [{"id": "cache_level", "value": "cache_everything"}] or [{"id": "forward_url", "url": "https://example.com/$1"}]');

const urlField = z
  .string()
  .min(3)
  .max(2048)
  .regex(TARGET_RE, 'expected a URL pattern such as *example.com/images/* or https://www.example.com/*')
  .describe('URL pattern the rule applies to; * matches anything');

const pageRuleId = z
  .string()
  .regex(/^[0-9a-f]{32}$/, 'expected a 32-character page rule id')
  .describe('Page rule id, as cf_list_page_rules shows it');

function actionBody(a: PageRuleAction): Record<string, unknown> {
  if (a.id === 'forward_url') return { id: a.id, value: { url: a.url, status_code: a.status_code } };
  return 'value' in a ? { id: a.id, value: a.value } : { id: a.id };
}

const targets = (url: string) => [{ target: 'url', constraint: { operator: 'matches', value: url } }];

interface PageRule {
  id: string;
  targets: Array<{ target: string; constraint: { operator: string; value: string } }>;
  actions: Array<{ id: string; value?: unknown }>;
  priority: number;
  status: string;
  created_on?: string;
  modified_on?: string;
}

/** summary's shape, in output schemas. */
const PageRuleOut = z.object({
  id: z.string(),
  url: z.string().nullable().describe('The URL pattern the rule matches'),
  actions: z
    .array(z.object({ id: z.string(), value: z.unknown().optional() }).passthrough())
    .describe("The rule's actions as Cloudflare holds them, e.g. {id: forward_url, value: {url, status_code}}"),
  priority: z.number().int().describe('Higher wins when several rules match'),
  status: z.enum(['active', 'disabled']),
  modified_on: z.string().nullable(),
});
const WrittenPageRuleOutput = orDryRun(z.object({ zone: ZoneOut, page_rule: PageRuleOut.describe('The rule as Cloudflare now has it') }));

function summary(r: PageRule) {
  return {
    id: r.id,
    url: r.targets[0]?.constraint.value ?? null,
    actions: r.actions,
    priority: r.priority,
    status: r.status,
    modified_on: r.modified_on ?? null,
  };
}

/** Sends the one write that creates or changes a page rule and returns the rule as Cloudflare now has it. */
async function writePageRule(cf: CfClient, ctx: ToolContext, zone: Zone, write: PlannedWrite) {
  const applied = await applyWrites(cf, ctx, [write]);
  if ('dry' in applied) return applied.dry;
  return { zone: zoneOut(zone), page_rule: summary(applied.results[0] as PageRule) };
}

export const cfListPageRules = defineEdgeTool({
  name: 'cf_list_page_rules',
  description: "Lists a zone's page rules (legacy per-URL overrides) in priority order.",
  priceCents: 0,
  input: z.object({ zone: zoneRef, status: z.enum(['active', 'disabled']).optional().describe('Only rules in this status') }),
  qField: 'zone',
  output: '{zone, page_rules: [{id, url, actions, priority, status}], count}',
  outputSchema: z.object({ zone: ZoneOut, page_rules: z.array(PageRuleOut).describe('Highest priority first'), count: z.number().int().min(0) }),
  examples: [{ zone: 'example.com' }, { zone: 'example.com', status: 'active' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const rules = await cf.get<PageRule[]>(cfPath`/zones/${zone.id}/pagerules`, { status: input.status, order: 'priority', direction: 'desc' });
    return { zone: zoneOut(zone), page_rules: rules.map(summary), count: rules.length };
  },
});

export const cfCreatePageRule = defineEdgeTool({
  name: 'cf_create_page_rule',
  description: 'Creates a page rule: a redirect, or setting overrides (cache level, TTLs, SSL, security level...) for a URL pattern.',
  priceCents: 3,
  sideEffects: true,
  input: z.object({
    zone: zoneRef,
    url: urlField,
    actions: actionsField,
    status: z.enum(['active', 'disabled']).default('active').describe('Whether the rule runs'),
    priority: z.number().int().min(1).max(1000).optional().describe('Higher numbers win over lower ones when several rules match'),
  }),
  qField: 'url',
  output: '{zone, page_rule: {id, url, actions, priority, status}} or, for sandbox keys, {dry_run, requests}',
  outputSchema: WrittenPageRuleOutput,
  examples: [
    {
      zone: 'example.com',
      url: '*example.com/static/*',
      actions: [
        { id: 'cache_level', value: 'cache_everything' },
        { id: 'edge_cache_ttl', value: 86400 },
      ],
    },
    { zone: 'example.com', url: 'example.com/*', actions: [{ id: 'forward_url', url: 'https://www.example.com/$1', status_code: 301 }] },
  ],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const body = {
      targets: targets(input.url),
      actions: input.actions.map(actionBody),
      status: input.status,
      ...(input.priority !== undefined ? { priority: input.priority } : {}),
    };
    return writePageRule(cf, ctx, zone, { method: 'POST', path: cfPath`/zones/${zone.id}/pagerules`, body });
  },
});

export const cfUpdatePageRule = defineEdgeTool({
  name: 'cf_update_page_rule',
  description: "Changes a page rule's URL pattern, actions, status or priority (only the fields given).",
  priceCents: 2,
  sideEffects: true,
  // Sets a state or removes a thing: the same call again changes nothing more.
  idempotent: true,
  input: z
    .object({
      zone: zoneRef,
      page_rule_id: pageRuleId,
      url: urlField.optional(),
      actions: actionsField.optional(),
      status: z.enum(['active', 'disabled']).optional().describe('active or disabled'),
      priority: z.number().int().min(1).max(1000).optional().describe('Higher numbers win over lower ones'),
    })
    .refine((v) => v.url !== undefined || v.actions !== undefined || v.status !== undefined || v.priority !== undefined, {
      message: 'give at least one of url, actions, status, priority',
      path: ['status'],
    }),
  qField: 'page_rule_id',
  output: '{zone, page_rule: {id, url, actions, priority, status}} or, for sandbox keys, {dry_run, requests}',
  outputSchema: WrittenPageRuleOutput,
  examples: [
    { zone: 'example.com', page_rule_id: '023e105f4ecef8ad9ca31a8372d0c353', status: 'disabled' },
    { zone: 'example.com', page_rule_id: '023e105f4ecef8ad9ca31a8372d0c353', actions: [{ id: 'cache_level', value: 'bypass' }] },
  ],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const body = {
      ...(input.url !== undefined ? { targets: targets(input.url) } : {}),
      ...(input.actions !== undefined ? { actions: input.actions.map(actionBody) } : {}),
      ...(input.status !== undefined ? { status: input.status } : {}),
      ...(input.priority !== undefined ? { priority: input.priority } : {}),
    };
    return writePageRule(cf, ctx, zone, { method: 'PATCH', path: cfPath`/zones/${zone.id}/pagerules/${input.page_rule_id}`, body });
  },
});

export const cfDeletePageRule = defineEdgeTool({
  name: 'cf_delete_page_rule',
  description: 'Deletes a page rule.',
  priceCents: 2,
  sideEffects: true,
  // Sets a state or removes a thing: the same call again changes nothing more.
  idempotent: true,
  input: z.object({ zone: zoneRef, page_rule_id: pageRuleId }),
  qField: 'page_rule_id',
  output: '{zone, deleted: page_rule_id} or, for sandbox keys, {dry_run, requests}',
  outputSchema: orDryRun(z.object({ zone: ZoneOut, deleted: z.string().describe('The id of the page rule deleted') })),
  examples: [{ zone: 'example.com', page_rule_id: '023e105f4ecef8ad9ca31a8372d0c353' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const applied = await applyWrites(cf, ctx, [{ method: 'DELETE', path: cfPath`/zones/${zone.id}/pagerules/${input.page_rule_id}` }]);
    if ('dry' in applied) return applied.dry;
    return { zone: zoneOut(zone), deleted: input.page_rule_id };
  },
});
