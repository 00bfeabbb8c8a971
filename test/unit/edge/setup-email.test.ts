import { createSocket } from 'node:dgram';
import { describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.js';
import { cfSetupEmail, mergeSpf } from '../../../src/tools/edge/setup-email.js';
import type { FakeZone } from '../../helpers/fake-cloudflare.js';
import { run, useHarness, type Harness } from './harness.js';

describe('mergeSpf', () => {
  it.each([
    [null, ['_spf.google.com'], 'v=spf1 include:_spf.google.com ~all'],
    ['v=spf1 mx -all', ['_spf.google.com'], 'v=spf1 mx include:_spf.google.com -all'],
    ['v=spf1 include:_SPF.google.com ~all', ['_spf.google.com'], 'v=spf1 include:_SPF.google.com ~all'],
    ['v=spf1 +include:_spf.google.com ~all', ['_spf.google.com'], 'v=spf1 +include:_spf.google.com ~all'],
    ['v=spf1 a redirect=_spf.example.net', ['spf.messagingengine.com'], 'v=spf1 a include:spf.messagingengine.com redirect=_spf.example.net'],
    ['v=spf1 ip4:192.0.2.0/24', ['spf.protection.outlook.com'], 'v=spf1 ip4:192.0.2.0/24 include:spf.protection.outlook.com'],
    ['"v=spf1 include:a.example ?all"', ['b.example', 'a.example', 'b.example'], 'v=spf1 include:a.example include:b.example ?all'],
  ])('%s + %j -> %s', (existing, includes, expected) => {
    expect(mergeSpf(existing, includes).content).toBe(expected);
  });
});

const lines = (z: FakeZone, filter: (t: string, n: string) => boolean = () => true) =>
  z.records
    .filter((r) => filter(r.type, r.name))
    .map((r) => `${r.type} ${r.name}${r.priority !== undefined ? ` ${r.priority}` : ''} ${r.content}`)
    .sort();

describe('cf_setup_email', () => {
  let h: Harness;
  useHarness((started) => (h = started));

  it('Fastmail: merges into the existing SPF record, replaces MX, adds DKIM CNAMEs and DMARC in one batch; a second run changes nothing', async () => {
    h.fake.addRecord(h.zone, { type: 'MX', name: '@', content: 'mx.old-host.example', priority: 10 });
    const spf = h.fake.addRecord(h.zone, { type: 'TXT', name: '@', content: 'v=spf1 ip4:192.0.2.10 include:_spf.old-host.example -all' });
    h.fake.addRecord(h.zone, { type: 'TXT', name: '@', content: 'google-site-verification=abc123' });
    const input = { zone: 'example.com', provider: 'fastmail', dmarc_policy: 'quarantine', dmarc_rua: 'dmarc@example.com' };

    const out = await run(cfSetupEmail, input, h.ctx().ctx);
    expect(out.changed).toBe(true);
    expect(out.warnings).toEqual([]);
    expect(h.fake.writes()).toHaveLength(1);
    expect(h.fake.writes()[0]!.path).toBe(`/zones/${h.zone.id}/dns_records/batch`);
    expect(lines(h.zone)).toEqual([
      'CNAME fm1._domainkey.example.com fm1.example.com.dkim.fmhosted.com',
      'CNAME fm2._domainkey.example.com fm2.example.com.dkim.fmhosted.com',
      'CNAME fm3._domainkey.example.com fm3.example.com.dkim.fmhosted.com',
      'MX example.com 10 in1-smtp.messagingengine.com',
      'MX example.com 20 in2-smtp.messagingengine.com',
      'TXT _dmarc.example.com v=DMARC1; p=quarantine; rua=mailto:dmarc@example.com',
      'TXT example.com google-site-verification=abc123',
      'TXT example.com v=spf1 ip4:192.0.2.10 include:_spf.old-host.example include:spf.messagingengine.com -all',
    ]);
    // The SPF record was changed in place, not duplicated.
    expect(h.zone.records.find((r) => r.id === spf.id)?.content).toContain('include:spf.messagingengine.com');

    h.fake.clearRequests();
    const again = await run(cfSetupEmail, input, h.ctx().ctx);
    expect(again.changed).toBe(false);
    expect(h.fake.writes()).toEqual([]);
  });

  it('folds several existing SPF records into one and says so', async () => {
    h.fake.addRecord(h.zone, { type: 'TXT', name: '@', content: 'v=spf1 include:a.example ~all' });
    h.fake.addRecord(h.zone, { type: 'TXT', name: '@', content: 'v=spf1 include:b.example ip4:192.0.2.1 -all' });
    const out = await run(cfSetupEmail, { zone: 'example.com', provider: 'google_workspace' }, h.ctx().ctx);
    const spf = lines(h.zone, (t, n) => t === 'TXT' && n === 'example.com');
    expect(spf).toEqual(['TXT example.com v=spf1 include:a.example include:b.example ip4:192.0.2.1 include:_spf.google.com ~all']);
    expect((out.warnings as string[]).join(' ')).toContain('Found 2 SPF records');
  });

  it('keeps an existing DMARC policy unless asked to change it, and keeps other MX with replace_mx false', async () => {
    h.fake.addRecord(h.zone, { type: 'TXT', name: '_dmarc', content: 'v=DMARC1; p=reject; rua=mailto:sec@example.com' });
    h.fake.addRecord(h.zone, { type: 'MX', name: '@', content: 'backup-mx.example.net', priority: 90 });
    await run(cfSetupEmail, { zone: 'example.com', provider: 'google_workspace', replace_mx: false }, h.ctx().ctx);
    expect(lines(h.zone, (t) => t === 'MX')).toEqual(['MX example.com 1 smtp.google.com', 'MX example.com 90 backup-mx.example.net']);
    expect(lines(h.zone, (_t, n) => n === '_dmarc.example.com')).toEqual(['TXT _dmarc.example.com v=DMARC1; p=reject; rua=mailto:sec@example.com']);
  });

  it('replaces a DKIM TXT that sits where a provider needs a CNAME', async () => {
    h.fake.addRecord(h.zone, { type: 'TXT', name: 'fm1._domainkey', content: 'v=DKIM1; k=rsa; p=OLDKEY' });
    await run(cfSetupEmail, { zone: 'example.com', provider: 'fastmail' }, h.ctx().ctx);
    expect(lines(h.zone, (_t, n) => n === 'fm1._domainkey.example.com')).toEqual(['CNAME fm1._domainkey.example.com fm1.example.com.dkim.fmhosted.com']);
  });

  it('Microsoft 365: derives the MX host, adds autodiscover and the tenant DKIM selectors', async () => {
    const out = await run(cfSetupEmail, { zone: 'example.com', provider: 'microsoft_365', microsoft_tenant: 'contoso.onmicrosoft.com' }, h.ctx().ctx);
    expect(lines(h.zone, (t) => t !== 'TXT')).toEqual([
      'CNAME autodiscover.example.com autodiscover.outlook.com',
      'CNAME selector1._domainkey.example.com selector1-example-com._domainkey.contoso.onmicrosoft.com',
      'CNAME selector2._domainkey.example.com selector2-example-com._domainkey.contoso.onmicrosoft.com',
      'MX example.com 0 example-com.mail.protection.outlook.com',
    ]);
    expect(out.records).toMatchObject({ spf: 'v=spf1 include:spf.protection.outlook.com ~all' });
    expect((out.next_steps as string[])[0]).toContain('derived as example-com.mail.protection.outlook.com');
  });

  it('Proton with verification and DKIM targets; Zoho EU; Google with a DKIM key', async () => {
    await run(
      cfSetupEmail,
      {
        zone: 'example.com',
        provider: 'proton',
        proton_verification: 'a1b2c3d4e5f6a7b8c9d0e1f2',
        proton_dkim_targets: [
          'protonmail.domainkey.dabc.domains.proton.ch',
          'protonmail2.domainkey.dabc.domains.proton.ch',
          'protonmail3.domainkey.dabc.domains.proton.ch',
        ],
      },
      h.ctx().ctx,
    );
    expect(lines(h.zone, (t, n) => t === 'TXT' && n === 'example.com')).toEqual([
      'TXT example.com protonmail-verification=a1b2c3d4e5f6a7b8c9d0e1f2',
      'TXT example.com v=spf1 include:_spf.protonmail.ch ~all',
    ]);
    expect(lines(h.zone, (t) => t === 'CNAME').map((l) => l.split(' ')[1])).toEqual([
      'protonmail._domainkey.example.com',
      'protonmail2._domainkey.example.com',
      'protonmail3._domainkey.example.com',
    ]);

    const zoho = h.fake.addZone('example.eu');
    await run(cfSetupEmail, { zone: 'example.eu', provider: 'zoho', zoho_region: 'eu' }, h.ctx().ctx);
    expect(lines(zoho, (t) => t === 'MX')).toEqual(['MX example.eu 10 mx.zoho.eu', 'MX example.eu 20 mx2.zoho.eu', 'MX example.eu 50 mx3.zoho.eu']);
    expect(lines(zoho, (t, n) => t === 'TXT' && n === 'example.eu')).toEqual(['TXT example.eu v=spf1 include:zohomail.eu ~all']);

    const g = h.fake.addZone('example.org');
    await run(
      cfSetupEmail,
      {
        zone: 'example.org',
        provider: 'google_workspace',
        dkim: { selector: 'google', value: 'v=DKIM1; k=rsa; p=MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA' },
      },
      h.ctx().ctx,
    );
    expect(lines(g, (_t, n) => n === 'google._domainkey.example.org')).toEqual([
      'TXT google._domainkey.example.org v=DKIM1; k=rsa; p=MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA',
    ]);
  });

  it('warns when a given mail host does not resolve, and still does the job', async () => {
    const out = await run(
      cfSetupEmail,
      {
        zone: 'example.com',
        provider: 'custom',
        mx_hosts: [
          { host: 'mx1.mailhost.example', priority: 10 },
          { host: 'mx2.nowhere-mail.example', priority: 20 },
        ],
        spf_include: ['spf.mailhost.example'],
      },
      h.ctx().ctx,
    );
    expect(out.warnings).toEqual([expect.stringContaining('Mail host mx2.nowhere-mail.example does not resolve')]);
    expect(lines(h.zone, (t) => t === 'MX')).toEqual(['MX example.com 10 mx1.mailhost.example', 'MX example.com 20 mx2.nowhere-mail.example']);
    expect(h.dns.queries).toContain('mx2.nowhere-mail.example');
  });

  it('a DNS server that cannot be reached never fails the tool: it says the hosts could not be checked', async () => {
    const sock = createSocket('udp4');
    await new Promise<void>((r) => sock.bind(0, '127.0.0.1', r));
    const unused = sock.address().port;
    await new Promise<void>((r) => sock.close(() => r()));
    const out = await run(
      cfSetupEmail,
      { zone: 'example.com', provider: 'google_workspace' },
      h.ctx({ env: { DNS_SERVERS: `127.0.0.1:${unused}`, DNS_TIMEOUT_MS: '300' } }).ctx,
    );
    expect(out.changed).toBe(true);
    expect(out.warnings).toEqual([expect.stringContaining('Could not check whether mail host smtp.google.com resolves')]);
  });

  it.each([
    ['192.0.2.25', 'is an IP address'],
    ['2001:db8::25', 'is an IP address'],
    ['', 'is empty'],
    ['mailserver', 'is a single label'],
    ['mx!.example.com', 'has an invalid label'],
    ['mail server.example.com', 'has characters a host name cannot have'],
    ['-mx.example.com', 'has an invalid label'],
  ])('refuses MX host %j (%s) with invalid_input before calling Cloudflare', async (host, reason) => {
    const e = await run(cfSetupEmail, { zone: 'example.com', provider: 'custom', mx_hosts: [{ host, priority: 10 }] }, h.ctx().ctx).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(AppError);
    expect(e).toMatchObject({ code: 'invalid_input' });
    expect((e as AppError).details.issues).toEqual([expect.objectContaining({ path: ['mx_hosts', 0, 'host'], message: expect.stringContaining(reason) })]);
    expect(h.fake.requests).toEqual([]);
  });

  it('refuses an IP as the Microsoft MX host, and provider fields given to another provider', async () => {
    const ip = await run(cfSetupEmail, { zone: 'example.com', provider: 'microsoft_365', microsoft_mx_host: '52.101.68.4' }, h.ctx().ctx).catch(
      (x: unknown) => x,
    );
    expect(ip).toMatchObject({ code: 'invalid_input', details: { issues: [expect.objectContaining({ path: ['microsoft_mx_host'] })] } });
    const wrong = await run(cfSetupEmail, { zone: 'example.com', provider: 'fastmail', proton_verification: 'a1b2c3d4e5f6a7b8c9d0e1f2' }, h.ctx().ctx).catch(
      (x: unknown) => x,
    );
    expect(wrong).toMatchObject({ code: 'invalid_input', details: { issues: [expect.objectContaining({ path: ['proton_verification'] })] } });
    const noMx = await run(cfSetupEmail, { zone: 'example.com', provider: 'custom' }, h.ctx().ctx).catch((x: unknown) => x);
    expect(noMx).toMatchObject({ code: 'invalid_input' });
  });

  it('as a sandbox call returns the batch it would send and writes nothing', async () => {
    h.fake.addRecord(h.zone, { type: 'TXT', name: '@', content: 'v=spf1 include:_spf.old-host.example ~all' });
    const out = await run(cfSetupEmail, { zone: 'example.com', provider: 'google_workspace' }, h.ctx({ sandbox: true }).ctx);
    expect(out).toMatchObject({ dry_run: true, requests: [{ method: 'POST', path: `/zones/${h.zone.id}/dns_records/batch` }] });
    const body = (out.requests as Array<{ body: { patches: Array<{ content: string }>; posts: unknown[] } }>)[0]!.body;
    expect(body.patches[0]!.content).toBe('v=spf1 include:_spf.old-host.example include:_spf.google.com ~all');
    expect(h.fake.writes()).toEqual([]);
  });
});
