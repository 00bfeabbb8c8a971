import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { z } from 'zod';
import { AccountsRepo } from '../../src/access/accounts.js';
import { openPool, type DatabasePool } from '../../src/db/pool.js';
import { TOOLS } from '../../src/tools/index.js';
import type { AnyTool } from '../../src/tools/types.js';
import { startFakeDns, type FakeDnsServer } from '../helpers/dns-server.js';
import type { FakeCloudflare, FakeZone } from '../helpers/fake-cloudflare.js';
import { startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import { routes, startHttpTarget, type HttpTarget } from '../helpers/http-targets.js';
import { makeToolContext } from '../helpers/tool-context.js';
import { run, useHarness, type Harness } from '../unit/edge/harness.js';

/**
 * Every tool declares the schema of its result, and the results of real calls satisfy it. The tools
 * below had none until their schemas were written from their handlers; each one runs here for real
 * (its declared examples wherever a local stand-in can answer them, plus the other shapes its handler
 * can return) and every result must parse to exactly itself: a field of the wrong type fails, and so
 * does a field the schema does not declare (zod would strip it). Needs Postgres (check_balance reads
 * a real account) and the local fakes of Cloudflare, DNS, an HTTP site and an OpenAI-style upstream.
 */

const TYPED_HERE = [
  'compute',
  'check_balance',
  'page_fetch',
  'domain_check',
  'genius',
  'hints',
  'roast',
  'cf_list_zones',
  'cf_get_zone',
  'cf_create_zone',
  'cf_find_zone',
  'cf_list_dns',
  'cf_get_dns',
  'cf_create_dns',
  'cf_update_dns',
  'cf_delete_dns',
  'cf_bulk_dns',
  'cf_ssl_status',
  'cf_ssl_mode',
  'cf_purge_cache',
  'cf_purge_all',
  'cf_dev_mode',
  'cf_cache_rules',
  'cf_under_attack',
  'cf_block_ip',
  'cf_firewall_rules',
  'cf_threats',
  'cf_analytics',
  'cf_bandwidth',
  'cf_list_page_rules',
  'cf_create_page_rule',
  'cf_update_page_rule',
  'cf_delete_page_rule',
  'cf_list_workers',
  'cf_deploy_worker',
  'cf_delete_worker',
  'cf_point_to_server',
  'cf_setup_email',
];

const tool = (name: string): AnyTool => {
  const t = TOOLS.find((x) => x.name === name);
  if (!t) throw new Error(`no tool ${name}`);
  return t;
};

/** Results checked per tool, and the dry runs among them. */
const checked = new Map<string, number>();
const dryRuns = new Set<string>();

/**
 * The result as a client sees it (JSON) must parse to exactly itself: nothing stripped, nothing
 * coerced. Then each top-level field given a value of another type must fail the schema.
 */
function check(t: Pick<AnyTool, 'name' | 'outputSchema'>, result: unknown): void {
  const schema = t.outputSchema;
  expect(schema, `${t.name} has an outputSchema`).toBeDefined();
  const wire = JSON.parse(JSON.stringify(result)) as unknown;
  const parsed = schema!.safeParse(wire);
  expect(parsed.success ? [] : parsed.error.issues, `${t.name}: result fits its schema`).toEqual([]);
  expect(parsed.data, `${t.name}: the schema declares every field of the result`).toEqual(wire);
  expect(wire).toBeTypeOf('object');
  for (const [key, value] of Object.entries(wire as Record<string, unknown>)) {
    // A null may stand for a string, a number, an object...: one of them, at least, must be refused.
    const wrong = value === null ? [42, 'not-the-right-type', true, {}] : [typeof value === 'string' ? 42 : 'not-the-right-type'];
    const refused = wrong.filter((w) => !schema!.safeParse({ ...(wire as Record<string, unknown>), [key]: w }).success);
    expect(refused.length, `${t.name}: a wrong type in ${key} fails`).toBeGreaterThan(0);
  }
  checked.set(t.name, (checked.get(t.name) ?? 0) + 1);
  if ((wire as { dry_run?: unknown }).dry_run === true) dryRuns.add(t.name);
}

describe('the registry', () => {
  it('has an outputSchema for every tool', () => {
    expect(TOOLS.filter((t) => !t.outputSchema).map((t) => t.name)).toEqual([]);
    for (const name of TYPED_HERE) expect(tool(name).outputSchema, name).toBeInstanceOf(z.ZodType);
  });
});

// ---------------------------------------------------------------------------------------------
// core

describe('core tools', () => {
  let pool: DatabasePool;
  beforeAll(async () => {
    pool = await openPool(inject('databaseUrl'), { maximumPoolSize: 2 });
  });
  afterAll(async () => {
    await pool?.end();
  });

  it('compute: every example, and matrix, unit, complex and boolean results', async () => {
    const t = tool('compute');
    const { ctx } = makeToolContext();
    const inputs = [
      ...t.examples,
      { expression: '[1, 2; 3, 4] * 2' },
      { expression: 'sqrt(-4)' },
      { expression: '3 > 2' },
      { expression: 'x = 3; x ^ 2' },
      { expression: '1 / 0' },
    ];
    for (const input of inputs) check(t, await run(t, input, ctx));
  });

  it('check_balance: the balance of a real account', async () => {
    const t = tool('check_balance');
    const accounts = new AccountsRepo(pool);
    const account = await accounts.createAccount({ plan: 'starter', credits: 1234, name: 'output-schemas' });
    const { ctx } = makeToolContext({ accountId: account.id, balance: () => accounts.balanceView(account.id, null) });
    for (const input of t.examples) {
      const out = await run(t, input, ctx);
      expect(out).toEqual({ credits: 1234, plan: 'starter', used_this_month: 0 });
      check(t, out);
    }
  });
});

// ---------------------------------------------------------------------------------------------
// web

describe('web tools', () => {
  let dns: FakeDnsServer;
  let site: HttpTarget;
  beforeAll(async () => {
    dns = await startFakeDns({
      // The examples' names, answered locally.
      'example.com': {
        A: ['93.184.215.14'],
        AAAA: ['2606:2800:21f:cb07:6820:80da:af6b:8b2c'],
        MX: [{ exchange: 'mx.example.com', priority: 0 }],
        NS: ['a.iana-servers.net'],
        TXT: [['v=spf1 -all']],
      },
      'xn--bcher-kva.de': { A: ['91.204.46.97'], MX: [{ exchange: 'mx01.buecher.de', priority: 10 }] },
      'empty.test': {},
      'broken.test': { rcode: 2 },
    });
    site = await startHttpTarget(
      routes({
        '/': [
          200,
          { 'content-type': 'text/html; charset=utf-8' },
          '<!doctype html><html lang="en"><head><title>Example Domain</title><meta name="description" content="For examples."></head><body><p>This domain is for use in examples. <a href="/more">More</a></p></body></html>',
        ],
        '/rfc': [200, { 'content-type': 'text/html' }, `<title>RFC 9110</title>${'<p>HTTP semantics.</p>'.repeat(200)}`],
        '/plain': [200, { 'content-type': 'text/plain' }, 'just text\n'],
        '/image': [
          200,
          { 'content-type': 'image/png', 'content-length': '4', 'content-disposition': 'inline; filename="a.png"' },
          Buffer.from([0x89, 0x50, 0x4e, 0x47]),
        ],
        '/unknown': [200, {}, Buffer.from([0, 1, 2, 3])],
        '/moved': [301, { location: '/' }, ''],
        '/missing': [404, { 'content-type': 'text/html' }, '<title>Not here</title>'],
      }),
    );
  });
  afterAll(async () => {
    await dns?.close();
    await site?.close();
  });

  it('domain_check: its examples, a name without records and a failing name server', async () => {
    const t = tool('domain_check');
    const { ctx } = makeToolContext({ env: { DNS_SERVERS: dns.address, DNS_TIMEOUT_MS: '2000' } });
    const statuses: string[] = [];
    for (const input of [...t.examples, { domain: 'empty.test' }, { domain: 'no-such-name.test' }, { domain: 'broken.test' }]) {
      const out = await run(t, input, ctx);
      statuses.push(out.status as string);
      check(t, out);
    }
    expect(statuses).toEqual(['ok', 'ok', 'no_records', 'nxdomain', 'error']);
  });

  it("page_fetch: the examples' shapes against a local site, and text, binary, unknown, redirected and cut bodies", async () => {
    const t = tool('page_fetch');
    const { ctx } = makeToolContext({ env: { FETCH_ALLOWED_HOSTS: site.hostPort } });
    // The examples name live sites; the same inputs go to local pages standing in for them.
    const [home, rfc] = t.examples as Array<{ url: string; max_bytes?: number }>;
    const inputs = [
      { ...home, url: site.url('/') },
      { ...rfc, url: site.url('/rfc') },
      { url: site.url('/rfc'), max_bytes: 1024 },
      { url: site.url('/plain') },
      { url: site.url('/image') },
      { url: site.url('/unknown') },
      { url: site.url('/moved') },
      { url: site.url('/missing') },
    ];
    const outs = [];
    for (const input of inputs) {
      const out = await run(t, input, ctx);
      check(t, out);
      outs.push(out);
    }
    expect(outs.map((o) => [o.status, o.truncated, (o.redirects as unknown[]).length])).toEqual([
      [200, false, 0],
      [200, false, 0],
      [200, true, 0],
      [200, false, 0],
      [200, false, 0],
      [200, false, 0],
      [200, false, 1],
      [404, false, 0],
    ]);
  });
});

// ---------------------------------------------------------------------------------------------
// llm (the chat tools, against the OpenAI-style fake)

describe('llm chat tools', () => {
  let fake: FakeOpenAI;
  beforeAll(async () => {
    fake = await startFakeOpenAI();
  });
  afterAll(() => fake?.close());

  it.each(['genius', 'hints', 'roast'])('%s: every example, with and without reported usage', async (name) => {
    const t = tool(name);
    const { ctx } = makeToolContext({ env: { LLM_BASE_URL: fake.baseURL, LLM_MODEL: 'fake-model' } });
    for (const input of t.examples) {
      fake.enqueue({ type: 'tokens', tokens: ['An', ' answer', '.'], usage: { prompt_tokens: 90, completion_tokens: 3, total_tokens: 93 } });
      check(t, await run(t, input, ctx));
    }
    fake.enqueue({ type: 'tokens', tokens: ['Cut', ' short'], finishReason: 'length', omitUsage: true, model: 'fake-model-2025-01-01' });
    const out = await run(t, t.examples[0], ctx);
    expect(out).toMatchObject({ usage: null, finish_reason: 'length' });
    check(t, out);
  });
});

// ---------------------------------------------------------------------------------------------
// edge (Cloudflare), against the fake that speaks Cloudflare's wire format

/** The ids the examples name. */
const ZONE_ID = '023e105f4ecef8ad9ca31a8372d0c353';
const RECORD_ID = '372e67954025e0ba6aaa6d586b9e0b59';
const PAGE_RULE_ID = '023e105f4ecef8ad9ca31a8372d0c353';
const ACCOUNT_ID = '01a7362d577a6c3019a474fd6f485823';

/** Gives the harness's zone and account the examples' ids and fills the zone with what the examples touch. */
function seed(fake: FakeCloudflare, zone: FakeZone): void {
  fake.accounts[0]!.id = ACCOUNT_ID;
  fake.zones.delete(zone.id);
  zone.id = ZONE_ID;
  fake.zones.set(zone.id, zone);
  fake.addZone('shop.example.com');
  fake.addRecord(zone, { type: 'A', name: '@', content: '192.0.2.1', proxied: true }).id = RECORD_ID;
  fake.addRecord(zone, { type: 'CNAME', name: 'www', content: 'example.com', proxied: true });
  fake.addRecord(zone, { type: 'A', name: 'old-app', content: '192.0.2.9', comment: 'retired' });
  fake.addRecord(zone, { type: 'MX', name: '@', content: 'mx.old-host.example', priority: 10, ttl: 3600 });
  fake.addRecord(zone, { type: 'TXT', name: '@', content: 'v=spf1 include:_spf.old-host.example ~all', ttl: 3600 });
  fake.addRecord(zone, { type: 'TXT', name: '_acme-challenge', content: 'token-1' });
  fake.addRecord(zone, { type: 'TXT', name: '_acme-challenge', content: 'token-2' });
  fake.addRecord(zone, { type: 'CAA', name: '@', data: { flags: 0, tag: 'issue', value: 'letsencrypt.org' } });
  fake.addRecord(zone, { type: 'SRV', name: '_sip._tcp', data: { priority: 10, weight: 5, port: 5060, target: 'sip.example.com' } });
  const at = new Date().toISOString();
  zone.pagerules.push({
    id: PAGE_RULE_ID,
    targets: [{ target: 'url', constraint: { operator: 'matches', value: '*example.com/static/*' } }],
    actions: [{ id: 'always_use_https' }],
    priority: 1,
    status: 'active',
    created_on: at,
    modified_on: at,
  });
  const rule = (id: string, action: string, description: string, expression: string, action_parameters?: Record<string, unknown>) => ({
    id,
    version: '1',
    action,
    description,
    expression,
    enabled: true,
    ref: id,
    last_updated: at,
    ...(action_parameters ? { action_parameters } : {}),
  });
  const ruleset = (id: string, phase: string, rules: ReturnType<typeof rule>[]) => ({
    id,
    name: 'default',
    kind: 'zone' as const,
    phase,
    version: '1',
    last_updated: at,
    rules,
  });
  zone.rulesets.set(
    'http_request_firewall_custom',
    ruleset('1b2c3d4e5f60718293a4b5c6d7e8f901', 'http_request_firewall_custom', [
      rule('0a1b2c3d4e5f60718293a4b5c6d7e8f9', 'block', 'Block bad bots', '(http.user_agent contains "BadBot")'),
    ]),
  );
  zone.rulesets.set(
    'http_request_cache_settings',
    ruleset('2b2c3d4e5f60718293a4b5c6d7e8f902', 'http_request_cache_settings', [
      rule('1a1b2c3d4e5f60718293a4b5c6d7e8f9', 'set_cache_settings', 'Bypass admin', '(starts_with(http.request.uri.path, "/admin"))', { cache: false }),
    ]),
  );
  const worker = (id: string) => ({ id, etag: id, handlers: ['fetch'], created_on: at, modified_on: at, modules: [], metadata: {} });
  fake.workers.set(
    ACCOUNT_ID,
    new Map([
      ['hello-api', worker('hello-api')],
      ['old-worker', worker('old-worker')],
    ]),
  );
  const today = new Date();
  for (const back of [2, 1, 0]) {
    const date = new Date(today.getTime() - back * 86_400_000).toISOString().slice(0, 10);
    fake.seedDay(zone, date, {
      requests: 1000,
      cachedRequests: 600,
      bytes: 5_000_000,
      cachedBytes: 3_000_000,
      encryptedBytes: 4_000_000,
      threats: 5,
      pageViews: 400,
      uniques: 120,
      status: { '200': 900, '404': 100 },
      countries: { US: { requests: 700, bytes: 3_500_000, threats: 1 }, DE: { requests: 300, bytes: 1_500_000, threats: 4 } },
      contentTypes: { html: { requests: 500, bytes: 1_000_000 }, js: { requests: 500, bytes: 4_000_000 } },
    });
  }
  const minutesAgo = (m: number) => new Date(Date.now() - m * 60_000).toISOString().replace(/\.\d{3}Z$/, 'Z');
  zone.firewallEvents.push(
    {
      datetime: minutesAgo(5),
      action: 'block',
      source: 'firewallCustom',
      clientIP: '198.51.100.23',
      clientCountryName: 'NL',
      clientAsn: '64500',
      clientRequestPath: '/wp-login.php',
    },
    {
      datetime: minutesAgo(30),
      action: 'managed_challenge',
      source: 'securitylevel',
      clientIP: '203.0.113.9',
      clientCountryName: 'US',
      clientAsn: '64501',
      clientRequestPath: '/',
    },
  );
}

interface EdgeRun {
  tool: string;
  input: Record<string, unknown>;
  sandbox?: boolean;
  /** Run it a second time in the same state (the answer when nothing needs changing). */
  again?: boolean;
  /** Changes the fake's state first. */
  before?: (h: Harness) => void;
}

const edgeTools = TOOLS.filter((t) => t.family === 'edge');
/** Writers whose repeated call is the "already so" answer. */
const IDEMPOTENT = new Set([
  'cf_update_dns',
  'cf_ssl_mode',
  'cf_dev_mode',
  'cf_cache_rules',
  'cf_under_attack',
  'cf_block_ip',
  'cf_firewall_rules',
  'cf_point_to_server',
  'cf_setup_email',
]);

const EDGE_RUNS: EdgeRun[] = [
  // Every example, as a real call, and as a sandbox call for the tools that write.
  ...edgeTools.flatMap((t) =>
    t.examples.flatMap((input) => {
      const again = IDEMPOTENT.has(t.name) && (input as { operation?: string }).operation !== 'delete';
      const real: EdgeRun = { tool: t.name, input: input as Record<string, unknown>, again };
      // cf_create_zone's first example adds example.com, which the fake already has: add it to an account without it.
      if (t.name === 'cf_create_zone' && (input as { name: string }).name === 'example.com') real.before = (h) => h.fake.zones.delete(ZONE_ID);
      return t.sideEffects ? [real, { ...real, sandbox: true, again: false }] : [real];
    }),
  ),
  // The other shapes the handlers return.
  { tool: 'cf_find_zone', input: { host: 'api.nowhere.example.net' } },
  { tool: 'cf_cache_rules', input: { zone: 'example.com' }, before: (h) => h.zone.rulesets.clear() },
  { tool: 'cf_firewall_rules', input: { zone: 'example.com', operation: 'set', name: 'Block bad bots', match: { user_agent_contains: 'BadBot' } } },
  { tool: 'cf_block_ip', input: { ip: '198.51.100.23', zone: 'example.com', mode: 'challenge', notes: 'again' }, again: true },
  { tool: 'cf_ssl_status', input: { zone: 'example.com' }, before: (h) => ((h.zone.universalSsl = false), (h.zone.certificateStatus = 'pending_deployment')) },
  {
    tool: 'cf_dev_mode',
    input: { zone: 'example.com', enabled: false },
    before: (h) => (h.zone.settings.set('development_mode', 'on'), (h.zone.devModeUntil = Date.now() + 3_600_000)),
  },
  { tool: 'cf_setup_email', input: { zone: 'example.com', provider: 'microsoft_365', microsoft_tenant: 'contoso.onmicrosoft.com', dmarc_policy: 'reject' } },
  { tool: 'cf_setup_email', input: { zone: 'example.com', provider: 'proton', proton_verification: 'a'.repeat(40) }, sandbox: true },
  { tool: 'cf_bulk_dns', input: { zone: 'example.com', update: [{ id: RECORD_ID, content: '198.51.100.7' }], delete: [] } },
];

describe('edge tools against the fake Cloudflare', () => {
  let h: Harness;
  useHarness((started) => {
    h = started;
    seed(h.fake, h.zone);
  });

  it.each(EDGE_RUNS.map((r, i) => [`${r.tool}${r.sandbox ? ' (sandbox)' : ''} #${i + 1}`, r] as const))('%s', async (_label, r) => {
    r.before?.(h);
    const t = tool(r.tool);
    const { ctx } = h.ctx({ sandbox: r.sandbox ?? false });
    check(t, await run(t, r.input, ctx));
    if (r.again) check(t, await run(t, r.input, ctx));
  });
});

// ---------------------------------------------------------------------------------------------

describe('the checks themselves', () => {
  it('fail a schema that types a field wrongly, or leaves one out, and a result that adds one', async () => {
    const t = tool('compute');
    const out = await run(t, { expression: '2 + 2' }, makeToolContext().ctx);
    const schema = t.outputSchema as z.AnyZodObject;
    expect(() => check(t, out)).not.toThrow();
    expect(() => check({ name: 'mutant', outputSchema: schema.extend({ value: z.string() }) }, out)).toThrow(/result fits its schema/);
    expect(() => check({ name: 'mutant', outputSchema: schema.extend({ type: z.enum(['Matrix']) }) }, out)).toThrow(/result fits its schema/);
    expect(() => check({ name: 'mutant', outputSchema: schema.omit({ type: true }) }, out)).toThrow(/declares every field/);
    expect(() => check({ name: 'mutant', outputSchema: schema.extend({ result: z.unknown() }) }, out)).toThrow(/a wrong type in result fails/);
    expect(() => check(t, { ...out, extra: true })).toThrow(/declares every field/);
  });

  it('covered every tool given a schema here, and the dry run of every writing edge tool', () => {
    expect(TYPED_HERE.filter((name) => !checked.get(name))).toEqual([]);
    const writers = TOOLS.filter((t) => t.family === 'edge' && t.sideEffects).map((t) => t.name);
    expect(writers.filter((name) => !dryRuns.has(name))).toEqual([]);
  });
});
