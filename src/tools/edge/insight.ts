import { z } from 'zod';
import { AppError } from '../../errors.js';
import { type ToolContext } from '../types.js';
import { CfClient } from './cf-client.js';
import { ZoneOut, resolveZone, zoneOut, zoneRef, type Zone, defineEdgeTool } from './common.js';

/**
 * Analytics, bandwidth and threats come from the GraphQL Analytics API (POST /graphql): the REST
 * zone analytics dashboard endpoints are retired. httpRequests1dGroups holds daily rollups;
 * firewallEventsAdaptiveGroups holds security events.
 */

const isoDate = z
  .string()
  .regex(/^\d{4}-\d{2}-\d{2}$/, 'expected a date as YYYY-MM-DD')
  .refine((d) => !Number.isNaN(Date.parse(`${d}T00:00:00Z`)), 'not a real date');

const PeriodInput = {
  zone: zoneRef,
  days: z.number().int().min(1).max(365).default(7).describe('The last N days, today included (ignored when since is given)'),
  since: isoDate.optional().describe('First day, YYYY-MM-DD (UTC)'),
  until: isoDate.optional().describe('Last day, YYYY-MM-DD (UTC); defaults to today'),
};

function day(d: Date): string {
  return d.toISOString().slice(0, 10);
}

function period(input: { days: number; since?: string; until?: string }): { since: string; until: string } {
  const until = input.until ?? day(new Date());
  const since = input.since ?? day(new Date(Date.parse(`${until}T00:00:00Z`) - (input.days - 1) * 86_400_000));
  if (since > until)
    throw new AppError('invalid_input', `since (${since}) is after until (${until})`, { issues: [{ path: ['since'], message: 'after until' }] });
  if ((Date.parse(until) - Date.parse(since)) / 86_400_000 > 366) {
    throw new AppError('invalid_input', 'The period may span at most 366 days', { issues: [{ path: ['since'], message: 'period too long' }] });
  }
  return { since, until };
}

interface DayGroup {
  dimensions: { date: string };
  sum: {
    requests?: number;
    cachedRequests?: number;
    bytes?: number;
    cachedBytes?: number;
    encryptedBytes?: number;
    threats?: number;
    pageViews?: number;
    responseStatusMap?: Array<{ edgeResponseStatus: number; requests: number }>;
    countryMap?: Array<{ clientCountryName: string; requests?: number; bytes?: number; threats?: number }>;
    contentTypeMap?: Array<{ edgeResponseContentTypeName: string; requests?: number; bytes?: number }>;
  };
  uniq?: { uniques?: number };
}

async function dayGroups(cf: CfClient, zone: Zone, p: { since: string; until: string }, sumFields: string, withUniq: boolean): Promise<DayGroup[]> {
  const query = `query ZoneDaily($zoneTag: string, $since: Date, $until: Date) {
  viewer {
    zones(filter: { zoneTag: $zoneTag }) {
      days: httpRequests1dGroups(limit: 400, filter: { date_geq: $since, date_leq: $until }, orderBy: [date_ASC]) {
        dimensions { date }
        sum { ${sumFields} }${withUniq ? '\n        uniq { uniques }' : ''}
      }
    }
  }
}`;
  const data = await cf.graphql<{ viewer: { zones: Array<{ days: DayGroup[] }> } }>(query, { zoneTag: zone.id, ...p });
  return data.viewer.zones[0]?.days ?? [];
}

/** The zone, the period the input asks for, and the zone's daily rollups over it with the given sums. */
async function dailyReport(ctx: ToolContext, input: z.output<z.ZodObject<typeof PeriodInput>>, sumFields: string, withUniq: boolean) {
  const cf = new CfClient(ctx);
  const zone = await resolveZone(cf, input.zone);
  const p = period(input);
  await ctx.progress({ stage: 'querying analytics' });
  return { zone, p, groups: await dayGroups(cf, zone, p, sumFields, withUniq) };
}

const add = (a: number | undefined, b: number | undefined) => (a ?? 0) + (b ?? 0);

/** The n largest entries of a tally, largest first. */
function topN(m: Map<string, number>, n: number): Array<[string, number]> {
  return [...m].sort((a, b) => b[1] - a[1]).slice(0, n);
}

function mergeMap<T>(groups: DayGroup[], pick: (g: DayGroup) => T[] | undefined, key: (t: T) => string, value: (t: T) => number): Map<string, number> {
  const m = new Map<string, number>();
  for (const g of groups) for (const t of pick(g) ?? []) m.set(key(t), (m.get(key(t)) ?? 0) + value(t));
  return m;
}

export function humanBytes(n: number): string {
  const units = ['B', 'KB', 'MB', 'GB', 'TB', 'PB'];
  let v = n;
  let i = 0;
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i++;
  }
  return `${i === 0 ? v : v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)} ${units[i]}`;
}

const ratio = (part: number, whole: number) => (whole ? Math.round((part / whole) * 10000) / 10000 : 0);

const count = z.number().int().min(0);
const cacheRatio = z.number().min(0).max(1).describe('Cached share, rounded to 4 decimals (0 when there was nothing)');
const PeriodOut = z.object({ since: z.string().describe('First day, YYYY-MM-DD (UTC)'), until: z.string().describe('Last day, YYYY-MM-DD (UTC)') });

const AnalyticsOutput = z.object({
  zone: ZoneOut,
  period: PeriodOut,
  totals: z.object({ requests: count, cached_requests: count, page_views: count, threats: count, bytes: count, cache_ratio: cacheRatio }),
  status_codes: z.record(count).describe('Requests per HTTP status code served at the edge, by code'),
  top_countries: z.array(z.object({ country: z.string().describe('Two-letter country code'), requests: count })).describe('At most 10, most requests first'),
  days: z.array(z.object({ date: z.string(), requests: count, cached_requests: count, page_views: count, uniques: count, threats: count, bytes: count })),
});

const BandwidthOutput = z.object({
  zone: ZoneOut,
  period: PeriodOut,
  totals: z.object({
    bytes: count,
    cached_bytes: count,
    uncached_bytes: count,
    encrypted_bytes: count,
    cache_ratio: cacheRatio,
    human: z.string().describe('bytes in decimal units, e.g. 30.0 MB'),
  }),
  top_countries: z.array(z.object({ country: z.string(), bytes: count })).describe('At most 10, most bytes first'),
  content_types: z.array(z.object({ type: z.string(), bytes: count })).describe('At most 10, most bytes first'),
  days: z.array(z.object({ date: z.string(), bytes: count, cached_bytes: count })),
});

const ThreatsOutput = z.object({
  zone: ZoneOut,
  period: z.object({ since: z.string().describe('ISO 8601 time (UTC)'), until: z.string().describe('ISO 8601 time (UTC)') }),
  total_events: count,
  by_action: z.array(
    z.object({ action: z.string().describe('e.g. block, managed_challenge'), source: z.string().describe('The rule source, e.g. firewallCustom'), count }),
  ),
  top_ips: z.array(z.object({ ip: z.string(), country: z.string(), asn: z.number().int().min(0), count })),
  top_countries: z.array(z.object({ country: z.string(), count })),
  top_paths: z.array(z.object({ path: z.string(), count })),
});

export const cfAnalytics = defineEdgeTool({
  name: 'cf_analytics',
  description: 'Traffic analytics for a zone per day: requests, cache ratio, page views, visitors, threats, status codes and top countries.',
  priceCents: 0,
  input: z.object(PeriodInput),
  qField: 'zone',
  output:
    '{zone, period: {since, until}, totals: {requests, cached_requests, cache_ratio, page_views, threats, bytes}, status_codes: {code: requests}, top_countries: [{country, requests}], days: [{date, requests, cached_requests, page_views, uniques, threats, bytes}]}',
  outputSchema: AnalyticsOutput,
  examples: [{ zone: 'example.com' }, { zone: 'example.com', days: 30 }, { zone: 'example.com', since: '2025-01-01', until: '2025-01-31' }],
  handler: async (input, ctx) => {
    const { zone, p, groups } = await dailyReport(
      ctx,
      input,
      'requests cachedRequests bytes threats pageViews responseStatusMap { edgeResponseStatus requests } countryMap { clientCountryName requests }',
      true,
    );
    const totals = groups.reduce(
      (t, g) => ({
        requests: add(t.requests, g.sum.requests),
        cached_requests: add(t.cached_requests, g.sum.cachedRequests),
        page_views: add(t.page_views, g.sum.pageViews),
        threats: add(t.threats, g.sum.threats),
        bytes: add(t.bytes, g.sum.bytes),
      }),
      { requests: 0, cached_requests: 0, page_views: 0, threats: 0, bytes: 0 },
    );
    const status = mergeMap(
      groups,
      (g) => g.sum.responseStatusMap,
      (s) => String(s.edgeResponseStatus),
      (s) => s.requests,
    );
    const countries = mergeMap(
      groups,
      (g) => g.sum.countryMap,
      (c) => c.clientCountryName,
      (c) => c.requests ?? 0,
    );
    return {
      zone: zoneOut(zone),
      period: p,
      totals: { ...totals, cache_ratio: ratio(totals.cached_requests, totals.requests) },
      status_codes: Object.fromEntries([...status.entries()].sort(([a], [b]) => a.localeCompare(b))),
      top_countries: topN(countries, 10).map(([country, requests]) => ({ country, requests })),
      days: groups.map((g) => ({
        date: g.dimensions.date,
        requests: g.sum.requests ?? 0,
        cached_requests: g.sum.cachedRequests ?? 0,
        page_views: g.sum.pageViews ?? 0,
        uniques: g.uniq?.uniques ?? 0,
        threats: g.sum.threats ?? 0,
        bytes: g.sum.bytes ?? 0,
      })),
    };
  },
});

export const cfBandwidth = defineEdgeTool({
  name: 'cf_bandwidth',
  description: 'Bandwidth served by a zone per day: total, cached and encrypted bytes, top countries and content types.',
  priceCents: 0,
  input: z.object(PeriodInput),
  qField: 'zone',
  output:
    '{zone, period, totals: {bytes, cached_bytes, uncached_bytes, encrypted_bytes, cache_ratio, human}, top_countries: [{country, bytes}], content_types: [{type, bytes}], days: [{date, bytes, cached_bytes}]}',
  outputSchema: BandwidthOutput,
  examples: [{ zone: 'example.com' }, { zone: 'example.com', days: 30 }],
  handler: async (input, ctx) => {
    const { zone, p, groups } = await dailyReport(
      ctx,
      input,
      'bytes cachedBytes encryptedBytes countryMap { clientCountryName bytes } contentTypeMap { edgeResponseContentTypeName bytes }',
      false,
    );
    const bytes = groups.reduce((n, g) => n + (g.sum.bytes ?? 0), 0);
    const cached = groups.reduce((n, g) => n + (g.sum.cachedBytes ?? 0), 0);
    const encrypted = groups.reduce((n, g) => n + (g.sum.encryptedBytes ?? 0), 0);
    const countries = mergeMap(
      groups,
      (g) => g.sum.countryMap,
      (c) => c.clientCountryName,
      (c) => c.bytes ?? 0,
    );
    const types = mergeMap(
      groups,
      (g) => g.sum.contentTypeMap,
      (c) => c.edgeResponseContentTypeName,
      (c) => c.bytes ?? 0,
    );
    return {
      zone: zoneOut(zone),
      period: p,
      totals: {
        bytes,
        cached_bytes: cached,
        uncached_bytes: bytes - cached,
        encrypted_bytes: encrypted,
        cache_ratio: ratio(cached, bytes),
        human: humanBytes(bytes),
      },
      top_countries: topN(countries, 10).map(([country, b]) => ({ country, bytes: b })),
      content_types: topN(types, 10).map(([type, b]) => ({ type, bytes: b })),
      days: groups.map((g) => ({ date: g.dimensions.date, bytes: g.sum.bytes ?? 0, cached_bytes: g.sum.cachedBytes ?? 0 })),
    };
  },
});

interface EventGroup {
  count: number;
  dimensions: Record<string, string | number>;
}

export const cfThreats = defineEdgeTool({
  name: 'cf_threats',
  description: 'Security events for a zone over the last hours: what was blocked or challenged, by which rule source, from which IPs, countries and paths.',
  priceCents: 0,
  input: z.object({
    zone: zoneRef,
    hours: z.number().int().min(1).max(72).default(24).describe('How many hours back to look (plans keep 1 to 3 days of events)'),
    top: z.number().int().min(1).max(50).default(10).describe('How many top IPs, countries and paths to list'),
  }),
  qField: 'zone',
  output:
    '{zone, period: {since, until}, total_events, by_action: [{action, source, count}], top_ips: [{ip, country, asn, count}], top_countries: [{country, count}], top_paths: [{path, count}]}',
  outputSchema: ThreatsOutput,
  examples: [{ zone: 'example.com' }, { zone: 'example.com', hours: 6, top: 20 }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const now = new Date();
    now.setUTCMilliseconds(0);
    const until = now.toISOString().replace('.000Z', 'Z');
    const since = new Date(now.getTime() - input.hours * 3_600_000).toISOString().replace('.000Z', 'Z');
    const query = `query ZoneThreats($zoneTag: string, $filter: FirewallEventsAdaptiveFilter_InputObject) {
  viewer {
    zones(filter: { zoneTag: $zoneTag }) {
      byAction: firewallEventsAdaptiveGroups(limit: 100, filter: $filter, orderBy: [count_DESC]) { count dimensions { action source } }
      byIp: firewallEventsAdaptiveGroups(limit: ${input.top}, filter: $filter, orderBy: [count_DESC]) { count dimensions { clientIP clientCountryName clientAsn } }
      byCountry: firewallEventsAdaptiveGroups(limit: ${input.top}, filter: $filter, orderBy: [count_DESC]) { count dimensions { clientCountryName } }
      byPath: firewallEventsAdaptiveGroups(limit: ${input.top}, filter: $filter, orderBy: [count_DESC]) { count dimensions { clientRequestPath } }
    }
  }
}`;
    await ctx.progress({ stage: 'querying security events' });
    const data = await cf.graphql<{ viewer: { zones: Array<Record<'byAction' | 'byIp' | 'byCountry' | 'byPath', EventGroup[]>> } }>(query, {
      zoneTag: zone.id,
      filter: { datetime_geq: since, datetime_lt: until },
    });
    const z0 = data.viewer.zones[0];
    const byAction = z0?.byAction ?? [];
    return {
      zone: zoneOut(zone),
      period: { since, until },
      total_events: byAction.reduce((n, g) => n + g.count, 0),
      by_action: byAction.map((g) => ({ action: String(g.dimensions.action), source: String(g.dimensions.source), count: g.count })),
      top_ips: (z0?.byIp ?? []).map((g) => ({
        ip: String(g.dimensions.clientIP),
        country: String(g.dimensions.clientCountryName ?? ''),
        asn: Number(g.dimensions.clientAsn ?? 0),
        count: g.count,
      })),
      top_countries: (z0?.byCountry ?? []).map((g) => ({ country: String(g.dimensions.clientCountryName), count: g.count })),
      top_paths: (z0?.byPath ?? []).map((g) => ({ path: String(g.dimensions.clientRequestPath), count: g.count })),
    };
  },
});
