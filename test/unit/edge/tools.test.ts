import { describe, expect, it } from 'vitest';
import { edgeTools } from '../../../src/tools/edge/index.js';
import type { AnyTool } from '../../../src/tools/types.js';
import { assertRequestsMatchSpec } from '../../helpers/cf-openapi.js';
import { FAKE_TOKEN, type FakeCloudflare, type FakeRecord, type FakeZone } from '../../helpers/fake-cloudflare.js';
import { run, useHarness, type Harness } from './harness.js';

/** The spec's edge-network table, in cents. */
const PRICES: Record<string, number> = {
  cf_analytics: 0,
  cf_bandwidth: 0,
  cf_block_ip: 2,
  cf_bulk_dns: 5,
  cf_cache_rules: 0,
  cf_create_dns: 2,
  cf_create_page_rule: 3,
  cf_create_zone: 3,
  cf_delete_dns: 2,
  cf_delete_page_rule: 2,
  cf_delete_worker: 2,
  cf_deploy_worker: 5,
  cf_dev_mode: 0,
  cf_find_zone: 0,
  cf_firewall_rules: 0,
  cf_get_zone: 0,
  cf_list_dns: 0,
  cf_list_page_rules: 0,
  cf_list_workers: 0,
  cf_list_zones: 0,
  cf_point_to_server: 3,
  cf_purge_all: 2,
  cf_purge_cache: 2,
  cf_setup_email: 3,
  cf_ssl_mode: 2,
  cf_ssl_status: 0,
  cf_threats: 0,
  cf_under_attack: 0,
  cf_update_dns: 2,
  cf_update_page_rule: 2,
  cf_get_dns: 0,
};

const tool = (name: string): AnyTool => {
  const t = edgeTools.find((x) => x.name === name);
  if (!t) throw new Error(`no tool ${name}`);
  return t;
};

interface Fixture {
  zone: FakeZone;
  apexA: FakeRecord;
  wwwCname: FakeRecord;
  mx: FakeRecord;
  verification: FakeRecord;
  pageRuleId: string;
}

const day = (offset: number) => new Date(Date.now() - offset * 86_400_000).toISOString().slice(0, 10);

function seed(fake: FakeCloudflare, zone: FakeZone): Fixture {
  fake.addZone('shop.example.com');
  const apexA = fake.addRecord(zone, { type: 'A', name: 'example.com', content: '192.0.2.1', proxied: true });
  const wwwCname = fake.addRecord(zone, { type: 'CNAME', name: 'www', content: 'example.com', proxied: true });
  const mx = fake.addRecord(zone, { type: 'MX', name: '@', content: 'mx.old-host.example', priority: 10, ttl: 3600 });
  fake.addRecord(zone, { type: 'TXT', name: '@', content: 'v=spf1 include:_spf.old-host.example ~all', ttl: 3600 });
  const verification = fake.addRecord(zone, { type: 'TXT', name: '@', content: 'google-site-verification=abc123', ttl: 3600 });
  zone.pagerules.push({
    id: 'aa11bb22cc33dd44ee55ff6677889900',
    targets: [{ target: 'url', constraint: { operator: 'matches', value: '*example.com/static/*' } }],
    actions: [{ id: 'cache_level', value: 'cache_everything' }],
    priority: 1,
    status: 'active',
    created_on: new Date().toISOString(),
    modified_on: new Date().toISOString(),
  });
  const rule = (id: string, action: string, description: string, expression: string, action_parameters?: Record<string, unknown>) => ({
    id,
    version: '1',
    action,
    description,
    expression,
    enabled: true,
    ref: id,
    last_updated: new Date().toISOString(),
    ...(action_parameters ? { action_parameters } : {}),
  });
  zone.rulesets.set('http_request_firewall_custom', {
    id: '1b2c3d4e5f60718293a4b5c6d7e8f901',
    name: 'default',
    kind: 'zone',
    phase: 'http_request_firewall_custom',
    version: '3',
    last_updated: new Date().toISOString(),
    rules: [rule('0a1b2c3d4e5f60718293a4b5c6d7e8f9', 'block', 'Block bad bots', '(http.user_agent contains "BadBot")')],
  });
  zone.rulesets.set('http_request_cache_settings', {
    id: '2b2c3d4e5f60718293a4b5c6d7e8f902',
    name: 'default',
    kind: 'zone',
    phase: 'http_request_cache_settings',
    version: '2',
    last_updated: new Date().toISOString(),
    rules: [
      rule('1a1b2c3d4e5f60718293a4b5c6d7e8f9', 'set_cache_settings', 'Cache static', '(http.request.uri.path.extension in {"css" "js"})', { cache: true }),
    ],
  });
  fake.workers.set(
    fake.accounts[0]!.id,
    new Map([['hello-api', { id: 'hello-api', etag: 'e1', handlers: ['fetch'], created_on: day(5), modified_on: day(1), modules: [], metadata: {} }]]),
  );
  for (const [i, d] of [day(2), day(1), day(0)].entries()) {
    fake.seedDay(zone, d, {
      requests: 1000 * (i + 1),
      cachedRequests: 600 * (i + 1),
      bytes: 5_000_000 * (i + 1),
      cachedBytes: 3_000_000 * (i + 1),
      encryptedBytes: 4_000_000 * (i + 1),
      threats: 5,
      pageViews: 400,
      uniques: 120,
      status: { '200': 900 * (i + 1), '404': 100 * (i + 1) },
      countries: {
        US: { requests: 700 * (i + 1), bytes: 3_500_000 * (i + 1), threats: 1 },
        DE: { requests: 300 * (i + 1), bytes: 1_500_000 * (i + 1), threats: 4 },
      },
      contentTypes: { html: { requests: 500, bytes: 1_000_000 }, js: { requests: 500, bytes: 4_000_000 * (i + 1) } },
    });
  }
  const recent = (min: number) => new Date(Date.now() - min * 60_000).toISOString().replace(/\.\d{3}Z$/, 'Z');
  zone.firewallEvents.push(
    {
      datetime: recent(5),
      action: 'block',
      source: 'firewallCustom',
      clientIP: '198.51.100.23',
      clientCountryName: 'NL',
      clientAsn: '64500',
      clientRequestPath: '/wp-login.php',
    },
    {
      datetime: recent(15),
      action: 'block',
      source: 'firewallCustom',
      clientIP: '198.51.100.23',
      clientCountryName: 'NL',
      clientAsn: '64500',
      clientRequestPath: '/wp-login.php',
    },
    {
      datetime: recent(30),
      action: 'managed_challenge',
      source: 'securitylevel',
      clientIP: '203.0.113.9',
      clientCountryName: 'US',
      clientAsn: '64501',
      clientRequestPath: '/',
    },
  );
  return { zone, apexA, wwwCname, mx, verification, pageRuleId: 'aa11bb22cc33dd44ee55ff6677889900' };
}

interface Case {
  name: string;
  input: (f: Fixture) => Record<string, unknown>;
  /** Write requests the call sends (0 for reads). */
  writes: number;
  check: (out: Record<string, any>, f: Fixture, fake: FakeCloudflare) => void;
}

const CASES: Case[] = [
  {
    name: 'cf_list_zones',
    input: () => ({}),
    writes: 0,
    check: (o) => expect(o.zones.map((z: any) => z.name).sort()).toEqual(['example.com', 'shop.example.com']),
  },
  {
    name: 'cf_get_zone',
    input: () => ({ zone: 'example.com' }),
    writes: 0,
    check: (o) => expect(o.settings).toMatchObject({ ssl: 'full', security_level: 'medium' }),
  },
  {
    name: 'cf_create_zone',
    input: () => ({ name: 'new-site.org' }),
    writes: 1,
    check: (o) => {
      expect(o.zone).toMatchObject({ name: 'new-site.org', status: 'pending' });
      expect(o.next_step).toContain('ada.ns.cloudflare.com');
    },
  },
  {
    name: 'cf_find_zone',
    input: () => ({ host: 'api.shop.example.com' }),
    writes: 0,
    check: (o) => expect(o).toMatchObject({ found: true, zone: { name: 'shop.example.com' }, record_name: 'api' }),
  },
  { name: 'cf_list_dns', input: () => ({ zone: 'example.com' }), writes: 0, check: (o) => expect(o.count).toBe(5) },
  {
    name: 'cf_get_dns',
    input: () => ({ zone: 'example.com', name: 'www' }),
    writes: 0,
    check: (o) => expect(o.records).toEqual([expect.objectContaining({ type: 'CNAME', name: 'www.example.com', content: 'example.com' })]),
  },
  {
    name: 'cf_create_dns',
    input: () => ({ zone: 'example.com', type: 'A', name: 'app', content: '203.0.113.10', proxied: true }),
    writes: 1,
    check: (o, f) => {
      expect(o.record).toMatchObject({ name: 'app.example.com', content: '203.0.113.10', proxied: true });
      expect(f.zone.records.some((r) => r.name === 'app.example.com')).toBe(true);
    },
  },
  {
    name: 'cf_update_dns',
    input: (f) => ({ zone: 'example.com', record_id: f.apexA.id, content: '198.51.100.7' }),
    writes: 1,
    check: (o) => expect(o).toMatchObject({ changed: true, record: { content: '198.51.100.7', proxied: true } }),
  },
  {
    name: 'cf_delete_dns',
    input: () => ({ zone: 'example.com', name: 'www', type: 'CNAME' }),
    writes: 1,
    check: (o, f) => {
      expect(o.deleted).toHaveLength(1);
      expect(f.zone.records.some((r) => r.name === 'www.example.com')).toBe(false);
    },
  },
  {
    name: 'cf_bulk_dns',
    input: (f) => ({
      zone: 'example.com',
      create: [
        { type: 'A', name: 'app1', content: '203.0.113.11' },
        { type: 'AAAA', name: 'app1', content: '2001:db8::11' },
      ],
      update: [{ id: f.mx.id, priority: 5 }],
      delete: [f.verification.id],
    }),
    writes: 1,
    check: (o, f) => {
      expect(o.created).toHaveLength(2);
      expect(o.updated).toEqual([expect.objectContaining({ id: f.mx.id, priority: 5 })]);
      expect(o.deleted).toEqual([f.verification.id]);
    },
  },
  {
    name: 'cf_ssl_status',
    input: () => ({ zone: 'example.com' }),
    writes: 0,
    check: (o) => expect(o).toMatchObject({ mode: 'full', universal_ssl: true, certificates: [expect.objectContaining({ status: 'active' })] }),
  },
  {
    name: 'cf_ssl_mode',
    input: () => ({ zone: 'example.com', mode: 'strict', always_use_https: true }),
    writes: 2,
    check: (o, f) => {
      expect(o).toMatchObject({ mode: 'strict', previous_mode: 'full', changed: true });
      expect(f.zone.settings.get('ssl')).toBe('strict');
      expect(f.zone.settings.get('always_use_https')).toBe('on');
    },
  },
  {
    name: 'cf_purge_cache',
    input: () => ({ zone: 'example.com', files: Array.from({ length: 35 }, (_, i) => `https://example.com/a/${i}.css`), tags: ['product-1'] }),
    writes: 3,
    check: (o, f) => {
      expect(o).toMatchObject({ purged: { files: 35, tags: 1 }, requests: 3 });
      expect(f.zone.purges.map((p) => Object.keys(p)[0])).toEqual(['files', 'files', 'tags']);
    },
  },
  {
    name: 'cf_purge_all',
    input: () => ({ zone: 'example.com' }),
    writes: 1,
    check: (o, f) => (expect(o.purged_everything).toBe(true), expect(f.zone.purges).toEqual([{ purge_everything: true }])),
  },
  {
    name: 'cf_dev_mode',
    input: () => ({ zone: 'example.com', enabled: true }),
    writes: 1,
    check: (o) => {
      expect(o).toMatchObject({ enabled: true, changed: true });
      expect(o.time_remaining_seconds).toBeGreaterThan(3 * 3600 - 60);
    },
  },
  {
    name: 'cf_cache_rules',
    input: () => ({ zone: 'example.com', operation: 'set', name: 'Bypass admin', match: { path_prefix: '/admin' }, cache: false }),
    writes: 1,
    check: (o, f) => {
      expect(o).toMatchObject({ changed: true, created: true, rule: { description: 'Bypass admin', action: 'set_cache_settings' } });
      expect(f.zone.rulesets.get('http_request_cache_settings')!.rules.map((r) => r.description)).toEqual(['Cache static', 'Bypass admin']);
    },
  },
  {
    name: 'cf_under_attack',
    input: () => ({ zone: 'example.com', enabled: true }),
    writes: 1,
    check: (o, f) => (
      expect(o).toMatchObject({ under_attack: true, previous_level: 'medium' }), expect(f.zone.settings.get('security_level')).toBe('under_attack')
    ),
  },
  {
    name: 'cf_block_ip',
    input: () => ({ ip: '198.51.100.23', zone: 'example.com' }),
    writes: 1,
    check: (o, f) => {
      expect(o).toMatchObject({ scope: 'zone', changed: true, rule: { mode: 'block', target: 'ip', value: '198.51.100.23' } });
      expect(f.zone.accessRules).toHaveLength(1);
    },
  },
  {
    name: 'cf_firewall_rules',
    input: () => ({
      zone: 'example.com',
      operation: 'set',
      name: 'Challenge admin',
      expression: '(starts_with(http.request.uri.path, "/admin") and ip.src.country ne "DE")',
      action: 'managed_challenge',
    }),
    writes: 1,
    check: (o, f) => {
      expect(o).toMatchObject({ changed: true, created: true, rule: { action: 'managed_challenge' } });
      expect(f.zone.rulesets.get('http_request_firewall_custom')!.rules.map((r) => r.description)).toEqual(['Block bad bots', 'Challenge admin']);
    },
  },
  {
    name: 'cf_threats',
    input: () => ({ zone: 'example.com', hours: 24 }),
    writes: 0,
    check: (o) => {
      expect(o.total_events).toBe(3);
      expect(o.top_ips[0]).toMatchObject({ ip: '198.51.100.23', count: 2, country: 'NL' });
      expect(o.top_paths[0]).toMatchObject({ path: '/wp-login.php', count: 2 });
    },
  },
  {
    name: 'cf_analytics',
    input: () => ({ zone: 'example.com', days: 3 }),
    writes: 0,
    check: (o) => {
      expect(o.totals).toMatchObject({ requests: 6000, cached_requests: 3600, cache_ratio: 0.6, threats: 15, page_views: 1200 });
      expect(o.status_codes).toEqual({ '200': 5400, '404': 600 });
      expect(o.top_countries[0]).toEqual({ country: 'US', requests: 4200 });
      expect(o.days).toHaveLength(3);
    },
  },
  {
    name: 'cf_bandwidth',
    input: () => ({ zone: 'example.com', days: 3 }),
    writes: 0,
    check: (o) => {
      expect(o.totals).toMatchObject({ bytes: 30_000_000, cached_bytes: 18_000_000, uncached_bytes: 12_000_000, human: '30.0 MB' });
      expect(o.content_types[0]).toEqual({ type: 'js', bytes: 24_000_000 });
    },
  },
  {
    name: 'cf_list_page_rules',
    input: () => ({ zone: 'example.com' }),
    writes: 0,
    check: (o) => expect(o.page_rules[0]).toMatchObject({ url: '*example.com/static/*', status: 'active' }),
  },
  {
    name: 'cf_create_page_rule',
    input: () => ({ zone: 'example.com', url: 'example.com/*', actions: [{ id: 'forward_url', url: 'https://www.example.com/$1', status_code: 301 }] }),
    writes: 1,
    check: (o) =>
      expect(o.page_rule).toMatchObject({
        url: 'example.com/*',
        status: 'active',
        actions: [{ id: 'forward_url', value: { url: 'https://www.example.com/$1', status_code: 301 } }],
      }),
  },
  {
    name: 'cf_update_page_rule',
    input: (f) => ({ zone: 'example.com', page_rule_id: f.pageRuleId, status: 'disabled', actions: [{ id: 'cache_level', value: 'bypass' }] }),
    writes: 1,
    check: (o) => expect(o.page_rule).toMatchObject({ status: 'disabled', actions: [{ id: 'cache_level', value: 'bypass' }] }),
  },
  {
    name: 'cf_delete_page_rule',
    input: (f) => ({ zone: 'example.com', page_rule_id: f.pageRuleId }),
    writes: 1,
    check: (o, f) => (expect(o.deleted).toBe(f.pageRuleId), expect(f.zone.pagerules).toHaveLength(0)),
  },
  { name: 'cf_list_workers', input: () => ({}), writes: 0, check: (o) => expect(o.workers.map((w: any) => w.name)).toEqual(['hello-api']) },
  {
    name: 'cf_deploy_worker',
    input: () => ({
      name: 'greeter',
      script: 'export default { fetch(req, env) { return new Response(`Hi ${env.REGION}`); } };',
      compatibility_date: '2024-09-23',
      vars: { REGION: 'eu' },
    }),
    writes: 1,
    check: (o, _f, fake) => {
      expect(o).toMatchObject({ deployed: true, worker: { name: 'greeter', handlers: ['fetch'], compatibility_date: '2024-09-23' } });
      const stored = fake.workers.get(fake.accounts[0]!.id)!.get('greeter')!;
      expect(stored.metadata).toEqual({
        main_module: 'worker.js',
        compatibility_date: '2024-09-23',
        bindings: [{ type: 'plain_text', name: 'REGION', text: 'eu' }],
      });
      expect(stored.modules).toEqual([expect.objectContaining({ name: 'worker.js', type: 'application/javascript+module' })]);
    },
  },
  {
    name: 'cf_delete_worker',
    input: () => ({ name: 'hello-api' }),
    writes: 1,
    check: (o, _f, fake) => (expect(o.deleted).toBe('hello-api'), expect(fake.workers.get(fake.accounts[0]!.id)!.size).toBe(0)),
  },
  {
    name: 'cf_point_to_server',
    input: () => ({ zone: 'example.com', ipv4: '203.0.113.10' }),
    writes: 1,
    check: (o, f) => {
      expect(o.changed).toBe(true);
      const addr = f.zone.records.filter((r) => ['A', 'AAAA', 'CNAME'].includes(r.type)).map((r) => `${r.type} ${r.name} ${r.content}`);
      expect(addr.sort()).toEqual(['A example.com 203.0.113.10', 'A www.example.com 203.0.113.10']);
    },
  },
  {
    name: 'cf_setup_email',
    input: () => ({ zone: 'example.com', provider: 'google_workspace' }),
    writes: 1,
    check: (o, f) => {
      expect(o.warnings).toEqual([]);
      expect(o.records.spf).toBe('v=spf1 include:_spf.old-host.example include:_spf.google.com ~all');
      const mx = f.zone.records.filter((r) => r.type === 'MX').map((r) => `${r.priority} ${r.content}`);
      expect(mx).toEqual(['1 smtp.google.com']);
      expect(f.zone.records.filter((r) => r.type === 'TXT' && r.content.startsWith('v=spf1'))).toHaveLength(1);
      expect(f.zone.records.find((r) => r.name === '_dmarc.example.com')?.content).toBe('v=DMARC1; p=none');
    },
  },
];

describe('edge tool family', () => {
  it('has exactly the 31 tools of the spec at their prices, tier pro, family edge, needing the token', () => {
    expect(edgeTools.map((t) => t.name).sort()).toEqual(Object.keys(PRICES).sort());
    for (const t of edgeTools) {
      expect({ name: t.name, price: t.priceCents, tier: t.tier, family: t.family, token: t.needsEdgeToken }).toEqual({
        name: t.name,
        price: PRICES[t.name],
        tier: 'pro',
        family: 'edge',
        token: true,
      });
    }
    expect(CASES.map((c) => c.name).sort()).toEqual(Object.keys(PRICES).sort());
  });

  it.each(edgeTools.map((t) => [t.name, t] as const))('%s: examples parse, every field is described, qField exists', (_n, t) => {
    expect(t.examples.length).toBeGreaterThan(0);
    for (const ex of t.examples) expect(t.input.safeParse(ex).error?.issues ?? []).toEqual([]);
    const shape = (t.input as any)._def.schema?._def?.schema?.shape ?? (t.input as any)._def.schema?.shape ?? (t.input as any).shape;
    expect(shape, 'object schema').toBeTruthy();
    for (const [k, v] of Object.entries(shape as Record<string, { description?: string }>)) expect(v.description, `${t.name}.${k}`).toBeTruthy();
    expect(Object.keys(shape)).toContain(t.qField);
  });

  it('marks exactly the tools that can change things as side-effecting', () => {
    const writers = CASES.filter((c) => c.writes > 0).map((c) => c.name);
    for (const t of edgeTools) expect(Boolean(t.sideEffects), t.name).toBe(writers.includes(t.name));
  });
});

describe.each(CASES)('$name against the fake Cloudflare', (c) => {
  let h: Harness;
  let f: Fixture;
  useHarness(
    (started) => {
      h = started;
      f = seed(h.fake, h.zone);
    },
    { checkRequests: false },
  );

  it('does its job with requests that fit the API description, and never returns the token', async () => {
    const { ctx, progress } = h.ctx();
    const out = await run(tool(c.name), c.input(f), ctx);
    c.check(out as Record<string, any>, f, h.fake);
    expect(h.fake.writes()).toHaveLength(c.writes);
    expect(assertRequestsMatchSpec(h.fake.requests)).toBeGreaterThan(0);
    for (const r of h.fake.requests) expect(r.headers.authorization).toBe(`Bearer ${FAKE_TOKEN}`);
    expect(JSON.stringify(out)).not.toContain(FAKE_TOKEN);
    expect(JSON.stringify(progress)).not.toContain(FAKE_TOKEN);
  });

  if (c.writes > 0) {
    it('as a sandbox call, sends no writes and returns exactly the requests the real call sends', async () => {
      const dry = await run(tool(c.name), c.input(f), h.ctx({ sandbox: true }).ctx);
      expect(h.fake.writes()).toEqual([]);
      expect(dry.dry_run).toBe(true);
      const planned = dry.requests as Array<{ method: string; path: string; body?: any }>;
      expect(planned).toHaveLength(c.writes);

      await run(tool(c.name), c.input(f), h.ctx().ctx);
      const sent = h.fake.writes().map((r) => {
        const qs = new URLSearchParams(r.query).toString();
        const body = r.multipart
          ? {
              content_type: 'multipart/form-data',
              parts: r.multipart.map((p) => ({
                name: p.name,
                ...(p.name === 'metadata' ? {} : { filename: p.filename }),
                content_type: p.type,
                content: p.name === 'metadata' ? JSON.parse(p.text) : p.text,
              })),
            }
          : r.body;
        return { method: r.method, path: qs ? `${r.path}?${qs}` : r.path, ...(body !== undefined ? { body } : {}) };
      });
      // Multipart metadata travels as a file part; its content type is what the dry run shows.
      expect(sent.map((s) => ({ ...s, body: stripFilename(s.body) }))).toEqual(planned.map((p) => ({ ...p, body: stripFilename(p.body) })));
      expect(assertRequestsMatchSpec(h.fake.requests)).toBeGreaterThan(0);
    });
  }
});

function stripFilename(body: any): any {
  if (!body || body.content_type !== 'multipart/form-data') return body;
  return { ...body, parts: body.parts.map(({ filename: _f, ...p }: any) => p) };
}
