import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { request } from 'undici';
import { AppError } from '../../../src/errors.js';
import { classifyAddress, PinnedAgent, vetDestination, type AddressClass } from '../../../src/tools/web/net-guard.js';
import { createResolver } from '../../../src/tools/web/resolver.js';
import { startFakeDns, type FakeDnsServer } from '../../helpers/dns-server.js';
import { startHttpTarget, type HttpTarget } from '../../helpers/http-targets.js';

describe('classifyAddress', () => {
  const blocked: Array<[string, AddressClass]> = [
    ['0.0.0.0', 'unspecified'],
    ['0.1.2.3', 'unspecified'],
    ['::', 'unspecified'],
    ['127.0.0.1', 'loopback'],
    ['127.255.255.254', 'loopback'],
    ['::1', 'loopback'],
    ['10.0.0.1', 'private'],
    ['172.16.0.1', 'private'],
    ['172.31.255.255', 'private'],
    ['192.168.1.1', 'private'],
    ['fc00::1', 'private'],
    ['fd12:3456:789a::1', 'private'],
    ['fec0::1', 'private'],
    ['169.254.0.1', 'link_local'],
    ['fe80::1', 'link_local'],
    ['febf::1', 'link_local'],
    ['100.64.0.1', 'carrier_grade_nat'],
    ['100.127.255.254', 'carrier_grade_nat'],
    ['224.0.0.1', 'multicast'],
    ['239.255.255.250', 'multicast'],
    ['ff02::1', 'multicast'],
    ['255.255.255.255', 'broadcast'],
    ['240.0.0.1', 'reserved'],
    ['192.0.0.8', 'reserved'],
    ['100::1', 'reserved'],
    ['2001::1', 'reserved'],
    ['4000::1', 'reserved'],
    ['192.0.2.10', 'documentation'],
    ['198.51.100.7', 'documentation'],
    ['203.0.113.99', 'documentation'],
    ['2001:db8::1', 'documentation'],
    ['198.18.0.1', 'benchmarking'],
    ['198.19.255.255', 'benchmarking'],
    ['2001:2::1', 'benchmarking'],
    ['169.254.169.254', 'cloud_metadata'],
    ['169.254.170.2', 'cloud_metadata'],
    ['100.100.100.200', 'cloud_metadata'],
    ['192.0.0.192', 'cloud_metadata'],
    ['fd00:ec2::254', 'cloud_metadata'],
    // IPv6 forms that embed a blocked IPv4 address.
    ['::ffff:127.0.0.1', 'loopback'],
    ['::ffff:7f00:1', 'loopback'],
    ['::ffff:10.0.0.1', 'private'],
    ['::ffff:169.254.169.254', 'cloud_metadata'],
    ['64:ff9b::a9fe:a9fe', 'cloud_metadata'],
    ['64:ff9b::7f00:1', 'loopback'],
    ['64:ff9b:1::c0a8:1', 'private'],
    ['2002:7f00:1::1', 'loopback'],
    ['2002:a9fe:a9fe::', 'cloud_metadata'],
    ['::127.0.0.1', 'loopback'],
    ['::ffff:0:127.0.0.1', 'loopback'],
  ];

  it.each(blocked)('refuses %s as %s', (ip, cls) => {
    const v = classifyAddress(ip);
    expect(v.allowed).toBe(false);
    if (!v.allowed) expect(v.addressClass).toBe(cls);
  });

  it.each([
    '93.184.216.34',
    '8.8.8.8',
    '1.1.1.1',
    '172.32.0.1',
    '100.128.0.1',
    '2606:2800:220:1:248:1893:25c8:1946',
    '::ffff:93.184.216.34',
    '64:ff9b::5db8:d822',
    '2002:5db8:d822::1',
  ])('allows public %s', (ip) => {
    expect(classifyAddress(ip).allowed).toBe(true);
  });

  it('names the embedded address and the embedding', () => {
    const v = classifyAddress('::ffff:127.0.0.1');
    expect(!v.allowed && v.detail).toBe('127.0.0.1 embedded in ::ffff:7f00:1 (IPv4-mapped)');
  });

  it('refuses public IPv4 inside deprecated or local-only IPv6 forms', () => {
    expect(classifyAddress('::8.8.8.8')).toMatchObject({ allowed: false, addressClass: 'reserved' });
    expect(classifyAddress('64:ff9b:1::808:808')).toMatchObject({ allowed: false, addressClass: 'reserved' });
  });
});

describe('vetDestination', () => {
  let dns: FakeDnsServer;
  beforeAll(async () => {
    dns = await startFakeDns({
      'mixed.test': { A: ['93.184.216.34', '10.1.1.1'] },
      'public.test': { A: ['93.184.216.34'], AAAA: ['2606:2800:220:1::1'] },
    });
  });
  afterAll(() => dns.close());

  const deps = (allowed: string[] = []) => ({
    config: { FETCH_ALLOWED_HOSTS: allowed },
    resolver: createResolver({ DNS_SERVERS: [dns.address], DNS_TIMEOUT_MS: 2000 }),
    tool: 'page_fetch',
  });

  it('refuses a name if any of its addresses is blocked', async () => {
    const err = await vetDestination(new URL('http://mixed.test/'), deps()).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AppError);
    expect(err).toMatchObject({
      code: 'invalid_input',
      // What the name resolves to is not echoed, nor its class (issue 26).
      message: 'page_fetch refused mixed.test: the destination is not allowed (not a public address)',
      details: { reason: 'blocked_address' },
    });
  });

  it('returns every checked address of an allowed name (v4 and v6), with no connection made', async () => {
    const dest = await vetDestination(new URL('https://public.test/x'), deps());
    expect(dest).toMatchObject({ hostPort: 'public.test:443', hostname: 'public.test', port: 443, exempt: false });
    expect(dest.addresses).toEqual([
      { address: '93.184.216.34', family: 4 },
      { address: '2606:2800:220:1::1', family: 6 },
    ]);
  });

  it('exempts exactly the listed host:port', async () => {
    await expect(vetDestination(new URL('http://mixed.test:8080/'), deps(['mixed.test:8080']))).resolves.toMatchObject({ exempt: true });
    await expect(vetDestination(new URL('http://mixed.test:8081/'), deps(['mixed.test:8080']))).rejects.toMatchObject({
      details: { reason: 'blocked_address' },
    });
    await expect(vetDestination(new URL('http://mixed.test/'), deps(['mixed.test:8080']))).rejects.toMatchObject({
      details: { reason: 'blocked_address' },
    });
  });

  it('refuses non-http schemes', async () => {
    await expect(vetDestination(new URL('ftp://public.test/'), deps())).rejects.toMatchObject({
      code: 'invalid_input',
      details: { reason: 'unsupported_scheme' },
    });
  });
});

describe('PinnedAgent', () => {
  let target: HttpTarget;
  beforeAll(async () => {
    target = await startHttpTarget((_req, res) => res.end('hello'));
  });
  afterAll(() => target.close());

  it('refuses to connect anywhere the guard has not vetted', async () => {
    const agent = new PinnedAgent({ connectTimeoutMs: 2000 });
    try {
      await expect(request(target.url(), { dispatcher: agent.dispatcher })).rejects.toThrow(/not vetted by the SSRF guard/);
      expect(target.requests).toHaveLength(0);
    } finally {
      await agent.close();
    }
  });

  it('connects to the pinned address of a vetted name without asking DNS again', async () => {
    const agent = new PinnedAgent({ connectTimeoutMs: 2000 });
    try {
      // No resolver knows this name: the only way to reach the target is through the pin.
      agent.pin({
        hostPort: `pinned.invalid:${target.port}`,
        hostname: 'pinned.invalid',
        port: target.port,
        addresses: [{ address: '127.0.0.1', family: 4 }],
        exempt: true,
      });
      const res = await request(`http://pinned.invalid:${target.port}/`, { dispatcher: agent.dispatcher });
      expect(await res.body.text()).toBe('hello');
      expect(target.requests[0]?.headers.host).toBe(`pinned.invalid:${target.port}`);
    } finally {
      await agent.close();
    }
  });
});
