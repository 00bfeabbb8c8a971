import { describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.js';
import { cfCacheRules, cfDevMode, cfPurgeCache } from '../../../src/tools/edge/cache.js';
import { cfBulkDns, cfCreateDns, cfDeleteDns, cfListDns, cfUpdateDns } from '../../../src/tools/edge/dns.js';
import { cfAnalytics } from '../../../src/tools/edge/insight.js';
import { cfCreatePageRule } from '../../../src/tools/edge/page-rules.js';
import { cfBlockIp, cfFirewallRules, cfUnderAttack } from '../../../src/tools/edge/security.js';
import { cfSslMode } from '../../../src/tools/edge/ssl.js';
import { cfDeployWorker } from '../../../src/tools/edge/workers.js';
import { cfCreateZone, cfFindZone, cfListZones } from '../../../src/tools/edge/zones.js';
import { run, useHarness, type Harness } from './harness.js';

async function refused(p: Promise<unknown>, code: string, field?: string): Promise<AppError> {
  const e = await p.then(
    () => {
      throw new Error('expected a refusal');
    },
    (x: unknown) => x,
  );
  expect(e).toBeInstanceOf(AppError);
  expect((e as AppError).code).toBe(code);
  if (field) expect(JSON.stringify((e as AppError).details.issues)).toContain(`"${field}"`);
  return e as AppError;
}

let h: Harness;
useHarness((started) => (h = started));

describe('zones', () => {
  it('lists across pages, reporting each page, and stops at the limit', async () => {
    for (let i = 0; i < 119; i++) h.fake.addZone(`site-${String(i).padStart(3, '0')}.example`);
    const { ctx, progress } = h.ctx();
    const all = await run(cfListZones, {}, ctx);
    expect(all).toMatchObject({ count: 120, total: 120, truncated: false });
    expect(progress.filter((p) => p.stage === 'listing zones').map((p) => `${p.done}/${p.total}`)).toEqual(['1/3', '2/3', '3/3']);
    const some = await run(cfListZones, { limit: 60 }, h.ctx().ctx);
    expect(some).toMatchObject({ count: 60, truncated: true });
    const filtered = await run(cfListZones, { name: 'site-11' }, h.ctx().ctx);
    expect(filtered.count).toBe(9);
  });

  it('finds the longest matching zone and says when none holds the host', async () => {
    h.fake.addZone('shop.example.com');
    expect(await run(cfFindZone, { host: 'https://api.shop.example.com/v1' }, h.ctx().ctx)).toMatchObject({
      found: true,
      zone: { name: 'shop.example.com' },
      record_name: 'api',
      checked: ['api.shop.example.com', 'shop.example.com'],
    });
    expect(await run(cfFindZone, { host: 'www.example.com' }, h.ctx().ctx)).toMatchObject({ zone: { name: 'example.com' }, record_name: 'www' });
    expect(await run(cfFindZone, { host: 'example.com' }, h.ctx().ctx)).toMatchObject({ record_name: '@' });
    expect(await run(cfFindZone, { host: 'a.b.unknown.org' }, h.ctx().ctx)).toMatchObject({
      found: false,
      zone: null,
      checked: ['a.b.unknown.org', 'b.unknown.org', 'unknown.org'],
    });
  });

  it('asks for account_id when the token sees several accounts', async () => {
    h.fake.accounts.push({ id: 'ffeeddccbbaa99887766554433221100', name: 'Side Project' });
    const e = await refused(run(cfCreateZone, { name: 'new-site.org' }, h.ctx().ctx), 'invalid_input', 'account_id');
    expect(e.message).toContain('ffeeddccbbaa99887766554433221100 (Side Project)');
    const ok = await run(cfCreateZone, { name: 'new-site.org', account_id: 'ffeeddccbbaa99887766554433221100' }, h.ctx().ctx);
    expect(ok.zone).toMatchObject({ account: { id: 'ffeeddccbbaa99887766554433221100' } });
  });
});

describe('DNS records', () => {
  it('pages through large zones', async () => {
    for (let i = 0; i < 250; i++) h.fake.addRecord(h.zone, { type: 'A', name: `host${i}`, content: `192.0.2.${i % 250}` });
    const { ctx, progress } = h.ctx();
    const out = await run(cfListDns, { zone: 'example.com', type: 'A' }, ctx);
    expect(out).toMatchObject({ count: 250, total: 250 });
    expect(progress.filter((p) => p.stage === 'listing DNS records')).toHaveLength(3);
  });

  it.each([
    [{ type: 'A', name: 'x', content: '2001:db8::1' }, 'content'],
    [{ type: 'AAAA', name: 'x', content: '192.0.2.1' }, 'content'],
    [{ type: 'MX', name: '@', content: 'mx.example.net' }, 'priority'],
    [{ type: 'CNAME', name: 'x', content: '192.0.2.1' }, 'content'],
    [{ type: 'TXT', name: 'x', content: 'hello', proxied: true }, 'proxied'],
    [{ type: 'A', name: 'x', content: '192.0.2.1', proxied: true, ttl: 300 }, 'ttl'],
    [{ type: 'A', name: 'x', content: '192.0.2.1', ttl: 30 }, 'ttl'],
    [{ type: 'CAA', name: '@' }, 'caa'],
    [{ type: 'SRV', name: 'sip', srv: { priority: 10, weight: 5, port: 5060, target: 'sip.example.com' } }, 'name'],
    [{ type: 'PTR', name: 'x', content: 'a.example.com' }, 'type'],
  ])('refuses %j (invalid_input on %s)', async (rec, field) => {
    await refused(run(cfCreateDns, { zone: 'example.com', ...rec }, h.ctx().ctx), 'invalid_input', field);
    expect(h.fake.requests).toEqual([]);
  });

  it('creates CAA and SRV records with their data', async () => {
    const caa = await run(cfCreateDns, { zone: 'example.com', type: 'CAA', name: '@', caa: { tag: 'issue', value: 'letsencrypt.org' } }, h.ctx().ctx);
    expect(caa.record).toMatchObject({ type: 'CAA', data: { flags: 0, tag: 'issue', value: 'letsencrypt.org' } });
    const srv = await run(
      cfCreateDns,
      { zone: 'example.com', type: 'SRV', name: '_sip._tcp', srv: { priority: 10, weight: 5, port: 5060, target: 'sip.example.com' } },
      h.ctx().ctx,
    );
    expect(srv.record).toMatchObject({ type: 'SRV', name: '_sip._tcp.example.com', data: { port: 5060 } });
  });

  it('an update that changes nothing sends nothing; one that would break the record is refused', async () => {
    const r = h.fake.addRecord(h.zone, { type: 'A', name: 'app', content: '192.0.2.1', ttl: 300 });
    expect(await run(cfUpdateDns, { zone: 'example.com', record_id: r.id, content: '192.0.2.1' }, h.ctx().ctx)).toMatchObject({ changed: false });
    await refused(run(cfUpdateDns, { zone: 'example.com', record_id: r.id, content: '2001:db8::1' }, h.ctx().ctx), 'invalid_input', 'content');
    const proxied = await run(cfUpdateDns, { zone: 'example.com', record_id: r.id, proxied: true }, h.ctx().ctx);
    expect(proxied.record).toMatchObject({ proxied: true, ttl: 1 });
    expect(h.fake.writes()).toHaveLength(1);
  });

  it('deletes by name only when that is unambiguous, or all of them when asked', async () => {
    h.fake.addRecord(h.zone, { type: 'TXT', name: '_acme-challenge', content: 'token-1' });
    h.fake.addRecord(h.zone, { type: 'TXT', name: '_acme-challenge', content: 'token-2' });
    const e = await refused(run(cfDeleteDns, { zone: 'example.com', name: '_acme-challenge' }, h.ctx().ctx), 'invalid_input', 'all_matching');
    expect(e.message).toContain('2 records match');
    const out = await run(cfDeleteDns, { zone: 'example.com', name: '_acme-challenge', all_matching: true }, h.ctx().ctx);
    expect(out.deleted).toHaveLength(2);
    expect(h.fake.writes().map((w) => w.path)).toEqual([`/zones/${h.zone.id}/dns_records/batch`]);
    await refused(run(cfDeleteDns, { zone: 'example.com', name: 'nothing-here' }, h.ctx().ctx), 'tool_failed');
  });

  it('bulk changes refuse unknown record ids before sending anything', async () => {
    await refused(run(cfBulkDns, { zone: 'example.com', delete: ['0123456789abcdef0123456789abcdef'] }, h.ctx().ctx), 'invalid_input');
    expect(h.fake.writes()).toEqual([]);
  });
});

describe('cache and firewall rules', () => {
  it('cache rules: creates the entry point when missing, is idempotent, updates and deletes one rule without touching others', async () => {
    const set = {
      zone: 'example.com',
      operation: 'set',
      name: 'Cache static assets',
      match: { extensions: ['css', 'js'] },
      edge_ttl_seconds: 86400,
      browser_ttl_seconds: 3600,
    };
    const first = await run(cfCacheRules, set, h.ctx().ctx);
    expect(first).toMatchObject({ changed: true, created: true });
    expect(h.fake.writes().map((w) => `${w.method} ${w.path}`)).toEqual([`PUT /zones/${h.zone.id}/rulesets/phases/http_request_cache_settings/entrypoint`]);
    const rs = h.zone.rulesets.get('http_request_cache_settings')!;
    expect(rs.rules[0]).toMatchObject({
      expression: 'http.request.uri.path.extension in {"css" "js"}',
      action_parameters: { cache: true, edge_ttl: { mode: 'override_origin', default: 86400 }, browser_ttl: { mode: 'override_origin', default: 3600 } },
    });

    h.fake.clearRequests();
    expect(await run(cfCacheRules, set, h.ctx().ctx)).toMatchObject({ changed: false });
    expect(h.fake.writes()).toEqual([]);

    await run(cfCacheRules, { zone: 'example.com', operation: 'set', name: 'Bypass admin', match: { path_prefix: '/admin' }, cache: false }, h.ctx().ctx);
    await run(cfCacheRules, { ...set, edge_ttl_seconds: 600 }, h.ctx().ctx);
    expect(h.fake.writes().map((w) => w.method)).toEqual(['POST', 'PATCH']);
    expect(rs.rules.map((r) => [r.description, (r.action_parameters?.edge_ttl as { default?: number } | undefined)?.default ?? null])).toEqual([
      ['Cache static assets', 600],
      ['Bypass admin', null],
    ]);

    const del = await run(cfCacheRules, { zone: 'example.com', operation: 'delete', name: 'cache static assets' }, h.ctx().ctx);
    expect(del).toMatchObject({ deleted: true });
    expect(rs.rules.map((r) => r.description)).toEqual(['Bypass admin']);
    expect((await run(cfCacheRules, { zone: 'example.com' }, h.ctx().ctx)).rules).toHaveLength(1);
    await refused(run(cfCacheRules, { zone: 'example.com', operation: 'delete', name: 'nope' }, h.ctx().ctx), 'tool_failed');
    await refused(run(cfCacheRules, { zone: 'example.com', operation: 'set', name: 'x' }, h.ctx().ctx), 'invalid_input', 'match');
  });

  it('firewall rules: list on a zone without rules, set with skip, change the action, delete', async () => {
    expect(await run(cfFirewallRules, { zone: 'example.com' }, h.ctx().ctx)).toMatchObject({ rules: [] });
    await run(
      cfFirewallRules,
      { zone: 'example.com', operation: 'set', name: 'Allow office', match: { ips: ['198.51.100.0/24'] }, action: 'skip' },
      h.ctx().ctx,
    );
    await run(cfFirewallRules, { zone: 'example.com', operation: 'set', name: 'Geo block', match: { countries: ['KP'], path_prefix: '/login' } }, h.ctx().ctx);
    const rs = h.zone.rulesets.get('http_request_firewall_custom')!;
    expect(rs.rules.map((r) => [r.description, r.action, r.expression, r.action_parameters ?? null])).toEqual([
      ['Allow office', 'skip', 'ip.src in {198.51.100.0/24}', { ruleset: 'current' }],
      ['Geo block', 'block', '(starts_with(http.request.uri.path, "/login")) and (ip.src.country in {"KP"})', null],
    ]);
    await run(
      cfFirewallRules,
      { zone: 'example.com', operation: 'set', name: 'Geo block', match: { countries: ['KP'], path_prefix: '/login' }, action: 'managed_challenge' },
      h.ctx().ctx,
    );
    expect(rs.rules[1]!.action).toBe('managed_challenge');
    await run(cfFirewallRules, { zone: 'example.com', operation: 'delete', rule_id: rs.rules[0]!.id }, h.ctx().ctx);
    expect(rs.rules.map((r) => r.description)).toEqual(['Geo block']);
  });
});

describe('security settings', () => {
  it('block_ip is idempotent, changes the mode in place, and handles ranges and account scope', async () => {
    await run(cfBlockIp, { ip: '198.51.100.23', zone: 'example.com' }, h.ctx().ctx);
    h.fake.clearRequests();
    expect(await run(cfBlockIp, { ip: '198.51.100.23', zone: 'example.com' }, h.ctx().ctx)).toMatchObject({ changed: false });
    expect(h.fake.writes()).toEqual([]);
    await run(cfBlockIp, { ip: '198.51.100.23', zone: 'example.com', mode: 'managed_challenge' }, h.ctx().ctx);
    expect(h.fake.writes().map((w) => w.method)).toEqual(['PATCH']);
    expect(h.zone.accessRules).toEqual([expect.objectContaining({ mode: 'managed_challenge' })]);

    const range = await run(cfBlockIp, { ip: '203.0.113.77/24' }, h.ctx().ctx);
    expect(range).toMatchObject({ scope: 'account', rule: { target: 'ip_range', value: '203.0.113.0/24' } });
    const v6 = await run(cfBlockIp, { ip: '2001:DB8::1', zone: 'example.com' }, h.ctx().ctx);
    expect(v6.rule).toMatchObject({ target: 'ip6', value: '2001:db8::1' });
    await refused(run(cfBlockIp, { ip: '10.0.0.0/8', zone: 'example.com' }, h.ctx().ctx), 'invalid_input', 'ip');
    await refused(run(cfBlockIp, { ip: 'example.com' }, h.ctx().ctx), 'invalid_input', 'ip');
  });

  it('reads dev mode and under-attack state without writing, and restores the chosen level', async () => {
    expect(await run(cfDevMode, { zone: 'example.com' }, h.ctx().ctx)).toMatchObject({ enabled: false, changed: false });
    expect(await run(cfUnderAttack, { zone: 'example.com' }, h.ctx().ctx)).toMatchObject({ under_attack: false, changed: false });
    expect(h.fake.writes()).toEqual([]);
    await run(cfUnderAttack, { zone: 'example.com', enabled: true }, h.ctx().ctx);
    const off = await run(cfUnderAttack, { zone: 'example.com', enabled: false, restore_level: 'high' }, h.ctx().ctx);
    expect(off).toMatchObject({ under_attack: false, security_level: 'high', previous_level: 'under_attack' });
  });

  it('ssl_mode sends nothing when the mode is already set and warns about flexible', async () => {
    expect(await run(cfSslMode, { zone: 'example.com', mode: 'full' }, h.ctx().ctx)).toMatchObject({ changed: false });
    expect(h.fake.writes()).toEqual([]);
    const flex = await run(cfSslMode, { zone: 'example.com', mode: 'flexible' }, h.ctx().ctx);
    expect((flex.warnings as string[])[0]).toContain('unencrypted');
  });
});

describe('other inputs', () => {
  it('analytics takes an explicit period and refuses a reversed one', async () => {
    h.fake.seedDay(h.zone, '2025-01-02', { requests: 10 });
    h.fake.seedDay(h.zone, '2025-02-01', { requests: 99 });
    const out = await run(cfAnalytics, { zone: 'example.com', since: '2025-01-01', until: '2025-01-31' }, h.ctx().ctx);
    expect(out).toMatchObject({ period: { since: '2025-01-01', until: '2025-01-31' }, totals: { requests: 10 } });
    await refused(run(cfAnalytics, { zone: 'example.com', since: '2025-02-01', until: '2025-01-01' }, h.ctx().ctx), 'invalid_input', 'since');
  });

  it('refuses purge input that is empty or not URLs, page rules that mix redirects with settings, and non-module workers', async () => {
    await refused(run(cfPurgeCache, { zone: 'example.com' }, h.ctx().ctx), 'invalid_input', 'files');
    await refused(run(cfPurgeCache, { zone: 'example.com', files: ['/css/site.css'] }, h.ctx().ctx), 'invalid_input');
    await refused(
      run(
        cfCreatePageRule,
        { zone: 'example.com', url: 'example.com/*', actions: [{ id: 'forward_url', url: 'https://www.example.com/$1' }, { id: 'always_use_https' }] },
        h.ctx().ctx,
      ),
      'invalid_input',
      'actions',
    );
    await refused(run(cfCreatePageRule, { zone: 'example.com', url: 'not a url', actions: [{ id: 'always_use_https' }] }, h.ctx().ctx), 'invalid_input', 'url');
    await refused(
      run(cfDeployWorker, { name: 'old-style', script: "addEventListener('fetch', (e) => e.respondWith(new Response('hi')))" }, h.ctx().ctx),
      'invalid_input',
      'script',
    );
    await refused(run(cfDeployWorker, { name: 'Bad Name', script: 'export default {}' }, h.ctx().ctx), 'invalid_input', 'name');
    expect(h.fake.requests).toEqual([]);
  });

  it('deploys with today as the default compatibility date', async () => {
    const out = await run(cfDeployWorker, { name: 'today', script: 'export default { fetch() { return new Response("ok"); } };' }, h.ctx().ctx);
    expect(out.worker).toMatchObject({ compatibility_date: new Date().toISOString().slice(0, 10) });
  });
});
