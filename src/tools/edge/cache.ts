import { z } from 'zod';
import { CfClient, cfPath, type PlannedWrite } from './cf-client.js';
import { ZoneOut, applyWrites, orDryRun, resolveZone, switchEnabled, switchSetting, zoneOut, zoneRef, defineEdgeTool } from './common.js';
import { RuleOperationOut, requireOne, ruleOperationFields, ruleOperationProblems, runRuleOperation } from './rulesets.js';

/** Cloudflare accepts this many files, tags, hosts or prefixes per purge request on every plan. */
const PURGE_CHUNK = 30;

const httpUrl = z
  .string()
  .url()
  .refine((u) => /^https?:\/\//i.test(u), 'expected an http(s) URL');

export const cfPurgeCache = defineEdgeTool({
  name: 'cf_purge_cache',
  description: "Purges specific URLs, cache tags, host names or URL prefixes from a zone's cache (sent in batches of 30).",
  priceCents: 2,
  sideEffects: true,
  // Sets a state or removes a thing: the same call again changes nothing more.
  idempotent: true,
  input: z
    .object({
      zone: zoneRef,
      files: z.array(httpUrl).max(500).default([]).describe('Full URLs to purge, e.g. https://example.com/app.css'),
      tags: z.array(z.string().min(1).max(1024)).max(500).default([]).describe('Cache-Tag values to purge'),
      hosts: z.array(z.string().min(1).max(253)).max(500).default([]).describe('Purge everything cached for these host names'),
      prefixes: z
        .array(
          z
            .string()
            .min(1)
            .max(1024)
            .refine((p) => !/^https?:/i.test(p), 'a prefix has no scheme: example.com/blog/'),
        )
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
  outputSchema: orDryRun(
    z.object({
      zone: ZoneOut,
      purged: z
        .object({ files: z.number().int().min(0), tags: z.number().int().min(0), hosts: z.number().int().min(0), prefixes: z.number().int().min(0) })
        .describe('How many of each kind were purged'),
      requests: z.number().int().min(1).describe('Purge requests sent (one kind, at most 30 items, per request)'),
    }),
  ),
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
      zone: zoneOut(zone),
      purged: { files: input.files.length, tags: input.tags.length, hosts: input.hosts.length, prefixes: input.prefixes.length },
      requests: writes.length,
    };
  },
});

export const cfPurgeAll = defineEdgeTool({
  name: 'cf_purge_all',
  description: "Purges everything from a zone's cache; the origin sees a burst of requests while the cache refills.",
  priceCents: 2,
  sideEffects: true,
  // Sets a state or removes a thing: the same call again changes nothing more.
  idempotent: true,
  input: z.object({ zone: zoneRef }),
  qField: 'zone',
  output: '{zone, purged_everything: true, purge_id} or, for sandbox keys, {dry_run, requests}',
  outputSchema: orDryRun(
    z.object({
      zone: ZoneOut,
      purged_everything: z.literal(true),
      purge_id: z.string().nullable().describe('The id Cloudflare gave the purge, if it gave one'),
    }),
  ),
  examples: [{ zone: 'example.com' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const applied = await applyWrites(cf, ctx, [{ method: 'POST', path: cfPath`/zones/${zone.id}/purge_cache`, body: { purge_everything: true } }]);
    if ('dry' in applied) return applied.dry;
    return { zone: zoneOut(zone), purged_everything: true, purge_id: (applied.results[0] as { id?: string } | null)?.id ?? null };
  },
});

export const cfDevMode = defineEdgeTool({
  name: 'cf_dev_mode',
  description: 'Shows or switches development mode (bypasses the cache for 3 hours, then turns itself off).',
  priceCents: 0,
  sideEffects: true,
  // Sets a state or removes a thing: the same call again changes nothing more.
  idempotent: true,
  input: z.object({
    zone: zoneRef,
    enabled: switchEnabled,
  }),
  qField: 'zone',
  output: '{zone, enabled, time_remaining_seconds, changed} or, for sandbox keys, {dry_run, requests}',
  outputSchema: orDryRun(
    z.object({
      zone: ZoneOut,
      enabled: z.boolean(),
      time_remaining_seconds: z.number().min(0).describe('Seconds until development mode turns itself off (0 when off)'),
      changed: z.boolean().describe('false when it already was in the asked state (or none was asked)'),
    }),
  ),
  examples: [{ zone: 'example.com', enabled: true }, { zone: 'example.com' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const s = await switchSetting<string>(
      cf,
      ctx,
      zone.id,
      'development_mode',
      (v) => v === 'on',
      input.enabled,
      (on) => (on ? 'on' : 'off'),
    );
    if ('dry' in s) return s.dry;
    const now = s.after ?? s.current;
    return { zone: zoneOut(zone), enabled: now.value === 'on', time_remaining_seconds: Math.max(0, now.time_remaining ?? 0), changed: s.after !== null };
  },
});

const PHASE = 'http_request_cache_settings' as const;

export const cfCacheRules = defineEdgeTool({
  name: 'cf_cache_rules',
  description: "Lists, sets or deletes one cache rule (what to cache or bypass and for how long) without touching the zone's other rules.",
  priceCents: 0,
  sideEffects: true,
  input: z
    .object({
      ...ruleOperationFields,
      cache: z.boolean().default(true).describe('true: make matching responses eligible for caching; false: bypass the cache'),
      edge_ttl_seconds: z.number().int().min(1).max(31536000).optional().describe('Cache at the edge for this long, overriding the origin'),
      browser_ttl_seconds: z.number().int().min(0).max(31536000).optional().describe('Tell browsers to cache for this long, overriding the origin'),
      enabled: z.boolean().default(true).describe('Whether the rule runs'),
    })
    .superRefine((v, c) => {
      ruleOperationProblems(v, c);
      if (!v.cache && (v.edge_ttl_seconds !== undefined || v.browser_ttl_seconds !== undefined)) {
        c.addIssue({ code: 'custom', path: ['cache'], message: 'TTLs apply only when cache is true' });
      }
    }),
  qField: 'zone',
  output:
    '{zone, rules: [{id, description, action, expression, enabled, action_parameters}]} for list; {zone, rule, changed} for set/delete; or {dry_run, requests}',
  outputSchema: RuleOperationOut,
  examples: [
    { zone: 'example.com' },
    { zone: 'example.com', operation: 'set', name: 'Cache static assets', match: { extensions: ['css', 'js', 'png', 'jpg'] }, edge_ttl_seconds: 86400 },
    { zone: 'example.com', operation: 'set', name: 'Bypass admin', match: { path_prefix: '/admin' }, cache: false },
    { zone: 'example.com', operation: 'delete', name: 'Bypass admin' },
  ],
  handler: async (input, ctx) =>
    runRuleOperation(ctx, input, PHASE, 'cache rule', () => {
      const params: Record<string, unknown> = { cache: input.cache };
      if (input.cache && input.edge_ttl_seconds !== undefined) params.edge_ttl = { mode: 'override_origin', default: input.edge_ttl_seconds };
      if (input.cache && input.browser_ttl_seconds !== undefined) params.browser_ttl = { mode: 'override_origin', default: input.browser_ttl_seconds };
      return {
        action: 'set_cache_settings',
        expression: requireOne(input.expression, input.match),
        description: input.name!,
        enabled: input.enabled,
        action_parameters: params,
      };
    }),
});
