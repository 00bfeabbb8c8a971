import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool } from '../types.js';
import { CfClient, cfPath, type PlannedWrite } from './cf-client.js';
import { applyWrites, resolveZone, settingWrite, zoneRef, type ZoneSetting } from './common.js';
import {
  deleteWrite,
  expressionField,
  findRule,
  getEntrypoint,
  requireOne,
  RuleMatch,
  ruleFrom,
  ruleSummary,
  upsertWrite,
  type RuleSpec,
} from './rulesets.js';

/** Cloudflare accepts this many files, tags, hosts or prefixes per purge request on every plan. */
const PURGE_CHUNK = 30;

const httpUrl = z
  .string()
  .url()
  .refine((u) => /^https?:\/\//i.test(u), 'expected an http(s) URL');

export const cfPurgeCache = defineTool({
  name: 'cf_purge_cache',
  description: "Purges specific URLs, cache tags, host names or URL prefixes from a zone's cache (sent in batches of 30).",
  tier: 'pro',
  priceCents: 2,
  family: 'edge',
  needsEdgeToken: true,
  sideEffects: true,
  input: z
    .object({
      zone: zoneRef,
      files: z.array(httpUrl).max(500).default([]).describe('Full URLs to purge, e.g. https://example.com/app.css'),
      tags: z.array(z.string().min(1).max(1024)).max(500).default([]).describe('Cache-Tag values to purge'),
      hosts: z.array(z.string().min(1).max(253)).max(500).default([]).describe('Purge everything cached for these host names'),
      prefixes: z
        .array(z.string().min(1).max(1024).refine((p) => !/^https?:/i.test(p), 'a prefix has no scheme: example.com/blog/'))
        .max(500)
        .default([])
        .describe('URL prefixes without scheme, e.g. example.com/blog/'),
    })
    .refine((v) => v.files.length + v.tags.length + v.hosts.length + v.prefixes.length > 0, {
      message: 'give files, tags, hosts or prefixes (use cf_purge_all to purge everything)',
      path: ['files'],
    }),
  qField: 'zone',
  output: '{zone, purged: {files, tags, hosts, prefixes}, requests} or, for sandbox keys, {dry_run, requests}',
  examples: [
    { zone: 'example.com', files: ['https://example.com/css/site.css', 'https://example.com/js/app.js'] },
    { zone: 'example.com', tags: ['product-123'] },
  ],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const path = cfPath`/zones/${zone.id}/purge_cache`;
    const writes: PlannedWrite[] = [];
    // One kind per request: Cloudflare refuses purge bodies that mix files, tags, hosts and prefixes.
    for (const kind of ['files', 'tags', 'hosts', 'prefixes'] as const) {
      const list = input[kind];
      for (let i = 0; i < list.length; i += PURGE_CHUNK) writes.push({ method: 'POST', path, body: { [kind]: list.slice(i, i + PURGE_CHUNK) } });
    }
    const applied = await applyWrites(cf, ctx, writes);
    if ('dry' in applied) return applied.dry;
    return {
      zone: { id: zone.id, name: zone.name },
      purged: { files: input.files.length, tags: input.tags.length, hosts: input.hosts.length, prefixes: input.prefixes.length },
      requests: writes.length,
    };
  },
});

export const cfPurgeAll = defineTool({
  name: 'cf_purge_all',
  description: "Purges everything from a zone's cache; the origin sees a burst of requests while the cache refills.",
  tier: 'pro',
  priceCents: 2,
  family: 'edge',
  needsEdgeToken: true,
  sideEffects: true,
  input: z.object({ zone: zoneRef }),
  qField: 'zone',
  output: '{zone, purged_everything: true, purge_id} or, for sandbox keys, {dry_run, requests}',
  examples: [{ zone: 'example.com' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const applied = await applyWrites(cf, ctx, [{ method: 'POST', path: cfPath`/zones/${zone.id}/purge_cache`, body: { purge_everything: true } }]);
    if ('dry' in applied) return applied.dry;
    return { zone: { id: zone.id, name: zone.name }, purged_everything: true, purge_id: (applied.results[0] as { id?: string } | null)?.id ?? null };
  },
});

export const cfDevMode = defineTool({
  name: 'cf_dev_mode',
  description: 'Shows or switches development mode (bypasses the cache for 3 hours, then turns itself off).',
  tier: 'pro',
  priceCents: 0,
  family: 'edge',
  needsEdgeToken: true,
  sideEffects: true,
  input: z.object({
    zone: zoneRef,
    enabled: z.boolean().optional().describe('true to turn on, false to turn off; leave out to only read the state'),
  }),
  qField: 'zone',
  output: '{zone, enabled, time_remaining_seconds, changed} or, for sandbox keys, {dry_run, requests}',
  examples: [{ zone: 'example.com', enabled: true }, { zone: 'example.com' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const current = await cf.get<ZoneSetting<string>>(cfPath`/zones/${zone.id}/settings/development_mode`);
    const on = current.value === 'on';
    const out = { zone: { id: zone.id, name: zone.name } };
    if (input.enabled === undefined || input.enabled === on) {
      return { ...out, enabled: on, time_remaining_seconds: Math.max(0, current.time_remaining ?? 0), changed: false };
    }
    const applied = await applyWrites(cf, ctx, [settingWrite(zone.id, 'development_mode', input.enabled ? 'on' : 'off')]);
    if ('dry' in applied) return applied.dry;
    const after = applied.results[0] as ZoneSetting<string>;
    return { ...out, enabled: after.value === 'on', time_remaining_seconds: Math.max(0, after.time_remaining ?? 0), changed: true };
  },
});

const PHASE = 'http_request_cache_settings' as const;

export const cfCacheRules = defineTool({
  name: 'cf_cache_rules',
  description: "Lists, sets or deletes one cache rule (what to cache or bypass and for how long) without touching the zone's other rules.",
  tier: 'pro',
  priceCents: 0,
  family: 'edge',
  needsEdgeToken: true,
  sideEffects: true,
  input: z
    .object({
      zone: zoneRef,
      operation: z.enum(['list', 'set', 'delete']).default('list').describe('list the rules, set (create or change) one, or delete one'),
      name: z.string().min(1).max(500).optional().describe('The rule\'s name (its description); set and delete find the rule by it'),
      rule_id: z.string().regex(/^[0-9a-f]{32}$/).optional().describe('The rule\'s id, to pick it instead of by name'),
      expression: expressionField.optional(),
      match: RuleMatch.optional(),
      cache: z.boolean().default(true).describe('true: make matching responses eligible for caching; false: bypass the cache'),
      edge_ttl_seconds: z.number().int().min(1).max(31536000).optional().describe('Cache at the edge for this long, overriding the origin'),
      browser_ttl_seconds: z.number().int().min(0).max(31536000).optional().describe('Tell browsers to cache for this long, overriding the origin'),
      enabled: z.boolean().default(true).describe('Whether the rule runs'),
    })
    .superRefine((v, c) => {
      if (v.operation !== 'list' && !v.name && !v.rule_id) c.addIssue({ code: 'custom', path: ['name'], message: `${v.operation} needs name or rule_id` });
      if (v.operation === 'set' && !v.name) c.addIssue({ code: 'custom', path: ['name'], message: 'set needs a name for the rule' });
      if (v.operation === 'set' && !v.expression && !v.match) c.addIssue({ code: 'custom', path: ['match'], message: 'set needs expression or match' });
      if (!v.cache && (v.edge_ttl_seconds !== undefined || v.browser_ttl_seconds !== undefined)) {
        c.addIssue({ code: 'custom', path: ['cache'], message: 'TTLs apply only when cache is true' });
      }
    }),
  qField: 'zone',
  output: '{zone, rules: [{id, description, action, expression, enabled, action_parameters}]} for list; {zone, rule, changed} for set/delete; or {dry_run, requests}',
  examples: [
    { zone: 'example.com' },
    { zone: 'example.com', operation: 'set', name: 'Cache static assets', match: { extensions: ['css', 'js', 'png', 'jpg'] }, edge_ttl_seconds: 86400 },
    { zone: 'example.com', operation: 'set', name: 'Bypass admin', match: { path_prefix: '/admin' }, cache: false },
    { zone: 'example.com', operation: 'delete', name: 'Bypass admin' },
  ],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const out = { zone: { id: zone.id, name: zone.name } };
    const rs = await getEntrypoint(cf, zone.id, PHASE);
    if (input.operation === 'list') return { ...out, rules: (rs?.rules ?? []).map(ruleSummary) };

    const existing = findRule(rs, input.rule_id, input.name);
    if (input.operation === 'delete') {
      if (!existing || !rs) throw new AppError('tool_failed', `No cache rule ${input.rule_id ?? `named '${input.name}'`} in ${zone.name}`, { zone: zone.name });
      const applied = await applyWrites(cf, ctx, [deleteWrite(zone.id, rs, existing)]);
      if ('dry' in applied) return applied.dry;
      return { ...out, rule: ruleSummary(existing), deleted: true, changed: true };
    }

    const params: Record<string, unknown> = { cache: input.cache };
    if (input.cache && input.edge_ttl_seconds !== undefined) params.edge_ttl = { mode: 'override_origin', default: input.edge_ttl_seconds };
    if (input.cache && input.browser_ttl_seconds !== undefined) params.browser_ttl = { mode: 'override_origin', default: input.browser_ttl_seconds };
    const spec: RuleSpec = {
      action: 'set_cache_settings',
      expression: requireOne(input.expression, input.match),
      description: input.name!,
      enabled: input.enabled,
      action_parameters: params,
    };
    const write = upsertWrite(zone.id, PHASE, rs, existing, spec);
    if (!write) return { ...out, rule: ruleSummary(existing!), changed: false };
    const applied = await applyWrites(cf, ctx, [write]);
    if ('dry' in applied) return applied.dry;
    const rule = ruleFrom(applied.results[0], spec.description);
    return { ...out, rule: rule ? ruleSummary(rule) : spec, changed: true, created: !existing };
  },
});
