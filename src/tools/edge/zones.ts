import { z } from 'zod';
import { CfClient, cfPath } from './cf-client.js';
import {
  ZoneSummaryOut,
  accountId,
  applyWrites,
  domainName,
  orDryRun,
  resolveAccountId,
  resolveZone,
  zoneRef,
  zoneSummary,
  type Zone,
  type ZoneSetting,
  defineEdgeTool,
} from './common.js';

const ListZonesOutput = z.object({
  zones: z.array(ZoneSummaryOut),
  count: z.number().int().min(0).describe('Zones returned'),
  total: z.number().int().min(0).describe('Zones matching, as Cloudflare counts them'),
  truncated: z.boolean().describe('More zones match than limit allowed'),
});

export const cfListZones = defineEdgeTool({
  name: 'cf_list_zones',
  description: 'Lists the zones (domains) the Cloudflare token can see, with status, plan and name servers.',
  priceCents: 0,
  input: z.object({
    name: z.string().max(253).optional().describe('Only zones whose name contains this text (e.g. shop)'),
    status: z.enum(['active', 'pending', 'initializing', 'moved', 'deleted', 'deactivated']).optional().describe('Only zones in this status'),
    account_id: accountId.describe('Only zones of this account'),
    limit: z.number().int().min(1).max(5000).default(500).describe('Most zones to return'),
  }),
  qField: 'name',
  output: '{zones: [{id, name, status, paused, type, plan, name_servers, account}], count, total, truncated}',
  outputSchema: ListZonesOutput,
  examples: [{}, { status: 'pending' }, { name: 'shop' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const query = {
      // Cloudflare's name filter takes "contains:" for substring matches.
      name: input.name ? `contains:${input.name.toLowerCase()}` : undefined,
      status: input.status,
      'account.id': input.account_id,
    };
    const { items, total, truncated } = await cf.listAll<Zone>('/zones', query, { perPage: 50, max: input.limit, what: 'zones' });
    return { zones: items.map(zoneSummary), count: items.length, total, truncated };
  },
});

const KEY_SETTINGS = ['ssl', 'security_level', 'development_mode', 'always_use_https', 'min_tls_version', 'cache_level', 'browser_cache_ttl'];

const onOff = z.enum(['on', 'off']);
/** The KEY_SETTINGS values, as Cloudflare's API description types them; a setting the zone does not report is left out. */
const KeySettingsOut = z
  .object({
    ssl: z.enum(['off', 'flexible', 'full', 'strict']),
    security_level: z.enum(['off', 'essentially_off', 'low', 'medium', 'high', 'under_attack']),
    development_mode: onOff,
    always_use_https: onOff,
    min_tls_version: z.enum(['1.0', '1.1', '1.2', '1.3']),
    cache_level: z.enum(['aggressive', 'basic', 'simplified']),
    browser_cache_ttl: z.number().int().min(0).describe('Seconds; 0 respects the origin'),
  })
  .partial();

const GetZoneOutput = z.object({
  zone: ZoneSummaryOut.extend({
    original_name_servers: z.array(z.string()).describe('Name servers before the move to Cloudflare'),
    development_mode_seconds: z.number().int().describe('Seconds until development mode ends (positive) or since it last ended (negative); 0 if never used'),
  }),
  settings: KeySettingsOut,
});

export const cfGetZone = defineEdgeTool({
  name: 'cf_get_zone',
  description: 'Gets one zone: status, plan, name servers and its key settings (SSL mode, security level, dev mode...).',
  priceCents: 0,
  input: z.object({ zone: zoneRef }),
  qField: 'zone',
  output: '{zone: {id, name, status, paused, type, plan, name_servers, original_name_servers, account}, settings: {ssl, security_level, ...}}',
  outputSchema: GetZoneOutput,
  examples: [{ zone: 'example.com' }, { zone: '023e105f4ecef8ad9ca31a8372d0c353' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const all = await cf.get<ZoneSetting[]>(cfPath`/zones/${zone.id}/settings`);
    const settings = Object.fromEntries(all.filter((s) => KEY_SETTINGS.includes(s.id)).map((s) => [s.id, s.value]));
    return {
      zone: { ...zoneSummary(zone), original_name_servers: zone.original_name_servers ?? [], development_mode_seconds: zone.development_mode ?? 0 },
      settings,
    };
  },
});

const CreateZoneOutput = orDryRun(
  z.object({
    zone: ZoneSummaryOut,
    next_step: z.string().describe('What to do at the registrar for the zone to become active'),
  }),
);

export const cfCreateZone = defineEdgeTool({
  name: 'cf_create_zone',
  description: 'Adds a domain to the Cloudflare account as a new zone and returns the name servers to set at the registrar.',
  priceCents: 3,
  sideEffects: true,
  input: z.object({
    name: domainName.describe('The domain to add, e.g. example.com'),
    account_id: accountId,
    type: z
      .enum(['full', 'partial'])
      .default('full')
      .describe('full: Cloudflare runs the DNS (change name servers); partial: CNAME setup (Business plans and up)'),
  }),
  qField: 'name',
  output: '{zone: {id, name, status, name_servers, ...}, next_step} or, for sandbox keys, {dry_run, requests}',
  outputSchema: CreateZoneOutput,
  examples: [{ name: 'example.com' }, { name: 'example.org', account_id: '01a7362d577a6c3019a474fd6f485823', type: 'full' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const account = await resolveAccountId(cf, input.account_id);
    const applied = await applyWrites(cf, ctx, [{ method: 'POST', path: '/zones', body: { name: input.name, account: { id: account }, type: input.type } }]);
    if ('dry' in applied) return applied.dry;
    const zone = applied.results[0] as Zone;
    const ns = zone.name_servers ?? [];
    return {
      zone: zoneSummary(zone),
      next_step:
        input.type === 'full' && ns.length
          ? `At the registrar of ${zone.name}, replace the name servers with ${ns.join(' and ')}; the zone becomes active once Cloudflare sees them.`
          : 'Follow the verification steps Cloudflare shows for this zone.',
    };
  },
});

/** Candidate zone names for a host, longest first: a.b.example.com -> a.b.example.com, b.example.com, example.com. */
export function zoneCandidates(host: string): string[] {
  const labels = host.split('.');
  const out: string[] = [];
  for (let i = 0; i <= labels.length - 2; i++) out.push(labels.slice(i).join('.'));
  return out;
}

const checkedField = z.array(z.string()).describe('The names looked up, longest first');
const FindZoneOutput = z.discriminatedUnion('found', [
  z.object({
    host: z.string(),
    found: z.literal(true),
    zone: ZoneSummaryOut,
    record_name: z.string().describe("The host relative to the zone ('@' for the apex)"),
    checked: checkedField,
  }),
  z.object({ host: z.string(), found: z.literal(false), zone: z.null(), record_name: z.null(), checked: checkedField }),
]);

export const cfFindZone = defineEdgeTool({
  name: 'cf_find_zone',
  description: 'Finds the zone that holds a host name (api.shop.example.com -> shop.example.com or example.com, the longest match).',
  priceCents: 0,
  input: z.object({
    host: z
      .string()
      .max(253)
      .transform((v) => v.replace(/^https?:\/\//i, '').replace(/[/:].*$/, ''))
      .pipe(domainName)
      .describe('A host name (or URL) inside the zone, e.g. api.shop.example.com'),
  }),
  qField: 'host',
  output: '{host, found, zone: {id, name, status, ...} | null, record_name (host relative to the zone), checked: [names queried]}',
  outputSchema: FindZoneOutput,
  examples: [{ host: 'api.shop.example.com' }, { host: 'https://www.example.com/pricing' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const checked: string[] = [];
    const candidates = zoneCandidates(input.host);
    for (const [i, name] of candidates.entries()) {
      await ctx.progress({ stage: 'looking up zones', done: i, total: candidates.length, unit: 'names' });
      checked.push(name);
      const zones = await cf.get<Zone[]>('/zones', { name, per_page: 5 });
      const zone = zones.find((z) => z.name === name);
      if (zone) {
        const rel = input.host === zone.name ? '@' : input.host.slice(0, -(zone.name.length + 1));
        return { host: input.host, found: true, zone: zoneSummary(zone), record_name: rel, checked };
      }
    }
    return { host: input.host, found: false, zone: null, record_name: null, checked };
  },
});
