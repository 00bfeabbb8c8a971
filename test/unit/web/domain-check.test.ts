import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.js';
import { domainCheck, DomainCheckInput } from '../../../src/tools/web/domain-check.js';
import { startFakeDns, type FakeDnsServer } from '../../helpers/dns-server.js';
import { closedPort } from '../../helpers/http-targets.js';
import { makeToolContext } from '../../helpers/tool-context.js';

let dns: FakeDnsServer;

beforeAll(async () => {
  dns = await startFakeDns({
    'example.test': {
      A: ['93.184.216.34', '93.184.216.35'],
      AAAA: ['2606:2800:220:1:248:1893:25c8:1946'],
      // Served out of priority order on purpose.
      MX: [
        { exchange: 'backup.mail.example.test', priority: 20 },
        { exchange: 'mail.example.test', priority: 10 },
        { exchange: 'last.mail.example.test', priority: 30 },
      ],
      NS: ['ns1.example.test', 'ns2.example.test'],
      TXT: [['v=spf1 include:_spf.example.test -all'], ['google-site-verification=', 'abc123']],
    },
    'mailonly.test': { MX: [{ exchange: 'mx.mailonly.test', priority: 5 }] },
    'empty.test': {},
    'broken.test': { rcode: 2 },
    'xn--bcher-kva.test': { A: ['93.184.216.40'] },
    'slow.test': { silent: true },
  });
});

afterAll(() => dns.close());

async function check(domain: string, env: Record<string, string> = {}) {
  const tc = makeToolContext({ env: { DNS_SERVERS: dns.address, ...env } });
  const result = await domainCheck.handler(DomainCheckInput.parse({ domain }), tc.ctx);
  return { result, progress: tc.progress };
}

describe('domain_check against a DNS server', () => {
  it('returns every record type of a resolving name, MX by priority', async () => {
    const { result } = await check('example.test');
    expect(result).toEqual({
      domain: 'example.test',
      resolves: true,
      status: 'ok',
      records: {
        A: ['93.184.216.34', '93.184.216.35'],
        AAAA: ['2606:2800:220:1:248:1893:25c8:1946'],
        MX: [
          { exchange: 'mail.example.test', priority: 10 },
          { exchange: 'backup.mail.example.test', priority: 20 },
          { exchange: 'last.mail.example.test', priority: 30 },
        ],
        NS: ['ns1.example.test', 'ns2.example.test'],
        TXT: ['v=spf1 include:_spf.example.test -all', 'google-site-verification=abc123'],
      },
      errors: {},
    });
    for (const type of ['A', 'AAAA', 'MX', 'NS', 'TXT']) expect(dns.queries).toContain(`${type} example.test`);
  });

  it('reports a name that does not exist as nxdomain', async () => {
    const { result } = await check('missing.test');
    expect(result).toMatchObject({ domain: 'missing.test', resolves: false, status: 'nxdomain', errors: {} });
    expect(result.records).toEqual({ A: [], AAAA: [], MX: [], NS: [], TXT: [] });
  });

  it('distinguishes a name with only some records (NODATA is not an error)', async () => {
    const { result } = await check('mailonly.test');
    expect(result).toMatchObject({ resolves: false, status: 'ok', errors: {} });
    expect(result.records.MX).toEqual([{ exchange: 'mx.mailonly.test', priority: 5 }]);
  });

  it('reports an existing name without any of the records as no_records', async () => {
    const { result } = await check('empty.test');
    expect(result).toMatchObject({ resolves: false, status: 'no_records', errors: {} });
  });

  it('reports server failures per record type', async () => {
    const { result } = await check('broken.test');
    expect(result.status).toBe('error');
    expect(Object.keys(result.errors).sort()).toEqual(['A', 'AAAA', 'MX', 'NS', 'TXT']);
    expect(result.errors.MX).toMatch(/SERVFAIL/);
  });

  it('looks up internationalised names in punycode', async () => {
    const { result } = await check('Bücher.test.');
    expect(result).toMatchObject({ domain: 'xn--bcher-kva.test', resolves: true, records: { A: ['93.184.216.40'] } });
  });

  it('reports progress for each of the five lookups', async () => {
    const { progress } = await check('example.test');
    expect(progress[0]).toEqual({ stage: 'resolving', done: 0, total: 5, unit: 'lookups' });
    expect(progress.map((p) => p.done)).toEqual([0, 1, 2, 3, 4, 5]);
    expect(progress.every((p) => p.stage === 'resolving' && p.total === 5 && p.unit === 'lookups')).toBe(true);
  });

  it('answers tool_unavailable when the resolver refuses connections', async () => {
    const port = await closedPort();
    const err = await check('example.test', { DNS_SERVERS: `127.0.0.1:${port}` }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AppError);
    expect(err).toMatchObject({ code: 'tool_unavailable', message: 'DNS resolver unreachable', status: 503 });
  });

  it('answers tool_unavailable when every lookup times out', async () => {
    const err = await check('slow.test', { DNS_TIMEOUT_MS: '200' }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'tool_unavailable', message: 'DNS resolver unreachable' });
  });
});

describe('domain_check input', () => {
  it.each([
    ['example.com', 'example.com'],
    ['EXAMPLE.com.', 'example.com'],
    ['bücher.de', 'xn--bcher-kva.de'],
    ['https://www.Example.com/path?q=1', 'www.example.com'],
    ['_dmarc.example.com', '_dmarc.example.com'],
  ])('accepts %s as %s', (raw, domain) => {
    expect(DomainCheckInput.parse({ domain: raw })).toEqual({ domain });
  });

  it.each(['', '127.0.0.1', '[::1]', '1.2.3', 'exa mple.com', '-bad.example', 'bad-.example', `${'a'.repeat(64)}.com`, 'a..b', 'example.com/path'])(
    'rejects %j',
    (raw) => {
      expect(DomainCheckInput.safeParse({ domain: raw }).success).toBe(false);
    },
  );

  it('parses its own examples', () => {
    for (const ex of domainCheck.examples) expect(DomainCheckInput.safeParse(ex).success).toBe(true);
  });
});
