/**
 * page_fetch must refuse every destination the SSRF guard blocks, however it is spelled or reached.
 * Refusals happen before any connection, so no traffic leaves loopback.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.js';
import type { AddressClass } from '../../../src/tools/web/net-guard.js';
import { pageFetch, PageFetchInput } from '../../../src/tools/web/page-fetch.js';
import { startFakeDns, type FakeDnsServer } from '../../helpers/dns-server.js';
import { routes, startHttpTarget, type HttpTarget } from '../../helpers/http-targets.js';
import { makeToolContext } from '../../helpers/tool-context.js';

let allowed: HttpTarget;
let other: HttpTarget;
let dns: FakeDnsServer;

beforeAll(async () => {
  other = await startHttpTarget((_req, res) => res.end('internal admin panel'));
  dns = await startFakeDns({
    'intranet.test': { A: ['10.0.0.5'] },
    'metadata.test': { A: ['169.254.169.254'] },
    'cgnat.test': { A: ['100.64.1.1'] },
    'v6loop.test': { AAAA: ['::1'] },
    'mapped.test': { AAAA: ['::ffff:127.0.0.1'] },
    'loop.test': { A: ['127.0.0.1'] },
  });
  allowed = await startHttpTarget(
    routes({
      '/to-other-port': [302, { location: `http://127.0.0.1:${other.port}/admin` }, ''],
      '/to-metadata': [302, { location: 'http://169.254.169.254/latest/meta-data/iam/security-credentials/' }, ''],
      '/to-mapped': [307, { location: `http://[::ffff:127.0.0.1]:${other.port}/` }, ''],
      '/to-decimal': [301, { location: `http://2130706433:${other.port}/` }, ''],
      '/to-localhost': [302, { location: `http://localhost:${other.port}/` }, ''],
      '/to-intranet-name': [302, { location: 'http://intranet.test/wiki' }, ''],
      '/hop': [302, { location: '/to-other-port' }, ''],
    }),
  );
});

afterAll(async () => {
  await allowed.close();
  await other.close();
  await dns.close();
});

async function refusal(url: string, env: Record<string, string> = {}): Promise<AppError> {
  const tc = makeToolContext({ env: { FETCH_ALLOWED_HOSTS: allowed.hostPort, DNS_SERVERS: dns.address, ...env } });
  const err = await pageFetch.handler(PageFetchInput.parse({ url }), tc.ctx).then(
    () => null,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(AppError);
  return err as AppError;
}

function expectBlocked(err: AppError, cls: AddressClass) {
  expect(err.code).toBe('invalid_input');
  expect(err.status).toBe(400);
  expect(err.details).toEqual({ reason: 'blocked_address', address_class: cls });
  expect(err.message).toMatch(/^page_fetch refused \S+: .+ address \(.+\)$/);
}

/** A name's refusal names the host as given, never the address it resolved to or that address's class. */
function expectBlockedName(err: AppError, url: string) {
  expect(err.code).toBe('invalid_input');
  expect(err.details).toEqual({ reason: 'blocked_address' });
  expect(err.message).toBe(`page_fetch refused ${new URL(url).hostname}: the destination is not allowed (not a public address)`);
}

describe('page_fetch refuses blocked addresses given literally', () => {
  const table: Array<[string, AddressClass]> = [
    ['http://127.0.0.1/', 'loopback'],
    ['http://127.8.9.10:8080/x', 'loopback'],
    ['http://[::1]/', 'loopback'],
    ['http://10.0.0.1/', 'private'],
    ['http://172.16.5.4/', 'private'],
    ['http://192.168.0.1/router', 'private'],
    ['http://[fd00::1]/', 'private'],
    ['http://169.254.10.10/', 'link_local'],
    ['http://[fe80::1]/', 'link_local'],
    ['http://100.64.0.1/', 'carrier_grade_nat'],
    ['http://224.0.0.251/', 'multicast'],
    ['http://[ff02::1]/', 'multicast'],
    ['http://0.0.0.0/', 'unspecified'],
    ['http://[::]/', 'unspecified'],
    ['http://255.255.255.255/', 'broadcast'],
    ['http://240.1.2.3/', 'reserved'],
    ['http://192.0.2.1/', 'documentation'],
    ['http://[2001:db8::1]/', 'documentation'],
    ['http://198.18.0.1/', 'benchmarking'],
    ['http://169.254.169.254/latest/meta-data/', 'cloud_metadata'],
    ['http://[fd00:ec2::254]/latest/meta-data/', 'cloud_metadata'],
    ['http://100.100.100.200/latest/meta-data/', 'cloud_metadata'],
    ['https://169.254.169.254/', 'cloud_metadata'],
    // IPv6 forms that embed a blocked IPv4 address.
    ['http://[::ffff:127.0.0.1]/', 'loopback'],
    ['http://[::ffff:7f00:1]/', 'loopback'],
    ['http://[::ffff:169.254.169.254]/', 'cloud_metadata'],
    ['http://[64:ff9b::169.254.169.254]/', 'cloud_metadata'],
    ['http://[2002:c0a8:101::1]/', 'private'],
    // Numeric spellings the URL parser turns into dotted quads.
    ['http://2130706433/', 'loopback'],
    ['http://0x7f.0.0.1/', 'loopback'],
    ['http://0x7f000001/', 'loopback'],
    ['http://017700000001/', 'loopback'],
    ['http://127.1/', 'loopback'],
    ['http://0/', 'unspecified'],
    ['http://2852039166/', 'cloud_metadata'],
  ];

  it.each(table)('%s -> %s', async (url, cls) => {
    expectBlocked(await refusal(url), cls);
  });

  it('says what was refused and why', async () => {
    expect((await refusal('http://169.254.169.254/')).message).toBe('page_fetch refused 169.254.169.254: cloud metadata address (169.254.169.254)');
    expect((await refusal('http://[::ffff:127.0.0.1]/')).message).toBe(
      'page_fetch refused [::ffff:7f00:1]: loopback address (127.0.0.1 embedded in ::ffff:7f00:1 (IPv4-mapped))',
    );
  });
});

describe('page_fetch refuses names that resolve to blocked addresses', () => {
  it.each([
    ['http://intranet.test/', 'private'],
    ['http://metadata.test/latest/meta-data/', 'cloud_metadata'],
    ['http://cgnat.test/', 'carrier_grade_nat'],
    ['http://v6loop.test/', 'loopback'],
    ['http://mapped.test/', 'loopback'],
    ['https://loop.test/', 'loopback'],
  ] as Array<[string, AddressClass]>)('%s (%s) is refused without saying what it resolves to', async (url) => {
    expectBlockedName(await refusal(url), url);
  });

  it('refuses localhost through the system resolver', async () => {
    expectBlockedName(await refusal(`http://localhost:${other.port}/`, { DNS_SERVERS: '' }), `http://localhost:${other.port}/`);
    expect(other.requests).toHaveLength(0);
  });
});

describe('page_fetch checks every redirect hop', () => {
  it.each([
    ['/to-other-port', 'loopback'],
    ['/to-metadata', 'cloud_metadata'],
    ['/to-mapped', 'loopback'],
    ['/to-decimal', 'loopback'],
    ['/to-localhost', 'loopback'],
    ['/to-intranet-name', 'private'],
    ['/hop', 'loopback'],
  ] as Array<[string, AddressClass]>)('refuses the redirect %s -> %s', async (path, cls) => {
    const before = allowed.requests.length;
    const err = await refusal(allowed.url(path), { DNS_SERVERS: path === '/to-localhost' ? '' : dns.address });
    // A hop to a name is refused without its address or class; a hop to an address literal says both.
    if (path === '/to-localhost' || path === '/to-intranet-name') expect(err.details).toEqual({ reason: 'blocked_address' });
    else expectBlocked(err, cls);
    expect(allowed.requests.length).toBeGreaterThan(before);
    expect(other.requests).toHaveLength(0);
  });
});

describe('FETCH_ALLOWED_HOSTS exempts exactly one host and port', () => {
  it('allows the listed host:port', async () => {
    const tc = makeToolContext({ env: { FETCH_ALLOWED_HOSTS: allowed.hostPort } });
    const result = await pageFetch.handler(PageFetchInput.parse({ url: allowed.url('/nothing-here') }), tc.ctx);
    expect(result).toMatchObject({ status: 404, text: 'not found' });
  });

  it('matches an IPv6 host:port in brackets', async () => {
    const v6 = await startHttpTarget((_req, res) => res.end('v6 intranet'), { host: '::1' });
    try {
      const tc = makeToolContext({ env: { FETCH_ALLOWED_HOSTS: v6.hostPort } });
      const result = await pageFetch.handler(PageFetchInput.parse({ url: v6.url('/') }), tc.ctx);
      expect(result).toMatchObject({ status: 200, text: 'v6 intranet' });
      expectBlocked(await refusal(`http://[::1]:${v6.port + (v6.port === 65535 ? -1 : 1)}/`, { FETCH_ALLOWED_HOSTS: v6.hostPort }), 'loopback');
    } finally {
      await v6.close();
    }
  });

  it.each([
    ['the same address on another port', () => `http://127.0.0.1:${other.port}/`],
    ['another spelling of the same address', () => `http://[::ffff:127.0.0.1]:${allowed.port}/`],
    ['a name for the same address', () => `http://loop.test:${allowed.port}/`],
    ['the same host on the default port', () => `http://127.0.0.1/`],
  ])('refuses %s', async (_what, url) => {
    const before = allowed.requests.length;
    const err = await refusal(url());
    if (url().includes('loop.test')) expectBlockedName(err, url());
    else expectBlocked(err, 'loopback');
    expect(allowed.requests.length).toBe(before);
    expect(other.requests).toHaveLength(0);
  });
});

describe('connections are pinned to the checked address', () => {
  it('ignores a DNS answer that changes after the check (rebinding)', async () => {
    const good = await startHttpTarget((_req, res) => res.end('checked server'));
    // Same port on another loopback address: where a second DNS lookup would lead.
    const evil = await startHttpTarget((_req, res) => res.end('rebound server'), { host: '127.0.0.2', port: good.port });
    let answers = 0;
    dns.zone['rebind.test'] = {
      get A() {
        answers += 1;
        return answers === 1 ? ['127.0.0.1'] : ['127.0.0.2'];
      },
    };
    try {
      const tc = makeToolContext({ env: { FETCH_ALLOWED_HOSTS: `rebind.test:${good.port}`, DNS_SERVERS: dns.address } });
      const result = await pageFetch.handler(PageFetchInput.parse({ url: `http://rebind.test:${good.port}/` }), tc.ctx);
      expect(result).toMatchObject({ status: 200, text: 'checked server' });
      expect(answers).toBe(1);
      expect(evil.requests).toHaveLength(0);
    } finally {
      await good.close();
      await evil.close();
    }
  });
});
