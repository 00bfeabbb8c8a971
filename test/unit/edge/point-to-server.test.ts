import { describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.js';
import { cfPointToServer } from '../../../src/tools/edge/point-to-server.js';
import type { FakeZone } from '../../helpers/fake-cloudflare.js';
import { run, useHarness, type Harness } from './harness.js';

const addressRecords = (z: FakeZone) =>
  z.records
    .filter((r) => ['A', 'AAAA', 'CNAME'].includes(r.type))
    .map((r) => ({ id: r.id, line: `${r.type} ${r.name} ${r.content} proxied=${r.proxied} ttl=${r.ttl}` }))
    .sort((a, b) => a.line.localeCompare(b.line));

describe('cf_point_to_server', () => {
  let h: Harness;
  useHarness((started) => (h = started));

  it('creates apex and www records in one batch, and a second run sends no changes', async () => {
    const input = { zone: 'example.com', ipv4: '203.0.113.10', ipv6: '2001:db8::10' };
    const first = await run(cfPointToServer, input, h.ctx().ctx);
    expect(first.changed).toBe(true);
    expect(h.fake.writes().map((w) => `${w.method} ${w.path}`)).toEqual([`POST /zones/${h.zone.id}/dns_records/batch`]);
    const after = addressRecords(h.zone);
    expect(after.map((r) => r.line)).toEqual([
      'A example.com 203.0.113.10 proxied=true ttl=1',
      'A www.example.com 203.0.113.10 proxied=true ttl=1',
      'AAAA example.com 2001:db8::10 proxied=true ttl=1',
      'AAAA www.example.com 2001:db8::10 proxied=true ttl=1',
    ]);

    h.fake.clearRequests();
    const second = await run(cfPointToServer, input, h.ctx().ctx);
    expect(second.changed).toBe(false);
    expect(h.fake.writes()).toEqual([]);
    expect(addressRecords(h.zone)).toEqual(after);
    expect((second.records as Array<{ id: string }>).map((r) => r.id).sort()).toEqual(after.map((r) => r.id).sort());
  });

  it('replaces conflicting A, AAAA and CNAME records in a single batch request', async () => {
    const oldA = h.fake.addRecord(h.zone, { type: 'A', name: '@', content: '192.0.2.1', proxied: true });
    const extraA = h.fake.addRecord(h.zone, { type: 'A', name: '@', content: '192.0.2.2', proxied: true });
    const oldAAAA = h.fake.addRecord(h.zone, { type: 'AAAA', name: '@', content: '2001:db8::1', proxied: true });
    const wwwCname = h.fake.addRecord(h.zone, { type: 'CNAME', name: 'www', content: 'old-host.example.net', proxied: true });
    const mx = h.fake.addRecord(h.zone, { type: 'MX', name: '@', content: 'mx.example.net', priority: 10 });
    const blog = h.fake.addRecord(h.zone, { type: 'CNAME', name: 'blog', content: 'hosted.example.org' });

    const out = await run(cfPointToServer, { zone: 'example.com', ipv4: '203.0.113.10' }, h.ctx().ctx);
    const writes = h.fake.writes();
    expect(writes).toHaveLength(1);
    const body = writes[0]!.body as { deletes: Array<{ id: string }>; patches: Array<{ id: string; content: string }>; posts: Array<{ name: string }> };
    expect(body.deletes.map((d) => d.id).sort()).toEqual([extraA.id, oldAAAA.id, wwwCname.id].sort());
    expect(body.patches).toEqual([expect.objectContaining({ id: oldA.id, type: 'A', content: '203.0.113.10' })]);
    expect(body.posts).toEqual([expect.objectContaining({ type: 'A', name: 'www.example.com', content: '203.0.113.10' })]);
    expect(out.changes).toMatchObject({ deleted: expect.any(Array), updated: [expect.objectContaining({ id: oldA.id })] });

    expect(addressRecords(h.zone).map((r) => r.line)).toEqual([
      'A example.com 203.0.113.10 proxied=true ttl=1',
      'A www.example.com 203.0.113.10 proxied=true ttl=1',
      'CNAME blog.example.com hosted.example.org proxied=false ttl=1',
    ]);
    expect(h.zone.records.find((r) => r.id === mx.id)).toBeTruthy();
    expect(h.zone.records.find((r) => r.id === blog.id)).toBeTruthy();
  });

  it('switches proxying off with an in-place update, and treats equal IPv6 spellings as the same', async () => {
    h.fake.addRecord(h.zone, { type: 'AAAA', name: '@', content: '2001:db8::10', proxied: true });
    await run(cfPointToServer, { zone: 'example.com', ipv6: '2001:DB8:0:0::10', proxied: false, ttl: 300, include_www: false }, h.ctx().ctx);
    const body = h.fake.writes()[0]!.body as Record<string, unknown[]>;
    expect(Object.keys(body)).toEqual(['patches']);
    expect(addressRecords(h.zone).map((r) => r.line)).toEqual(['AAAA example.com 2001:db8::10 proxied=false ttl=300']);

    h.fake.clearRequests();
    const again = await run(cfPointToServer, { zone: 'example.com', ipv6: '2001:db8::10', proxied: false, ttl: 300, include_www: false }, h.ctx().ctx);
    expect(again.changed).toBe(false);
    expect(h.fake.writes()).toEqual([]);
  });

  it('leaves www alone when include_www is false, and accepts the zone by id', async () => {
    const www = h.fake.addRecord(h.zone, { type: 'CNAME', name: 'www', content: 'shop.example.net' });
    await run(cfPointToServer, { zone: h.zone.id, ipv4: '203.0.113.10', include_www: false }, h.ctx().ctx);
    expect(h.zone.records.find((r) => r.id === www.id)?.content).toBe('shop.example.net');
    expect(addressRecords(h.zone).map((r) => r.line)).toContain('A example.com 203.0.113.10 proxied=true ttl=1');
  });

  it('a sandbox call plans the batch and changes nothing', async () => {
    h.fake.addRecord(h.zone, { type: 'CNAME', name: 'www', content: 'old-host.example.net' });
    const out = await run(cfPointToServer, { zone: 'example.com', ipv4: '203.0.113.10' }, h.ctx({ sandbox: true }).ctx);
    expect(out).toMatchObject({ dry_run: true, requests: [{ method: 'POST', path: `/zones/${h.zone.id}/dns_records/batch` }] });
    expect(h.fake.writes()).toEqual([]);
    expect(h.zone.records.map((r) => r.type)).toEqual(['CNAME']);
  });

  it("a batch Cloudflare refuses leaves the zone as it was and reports Cloudflare's error", async () => {
    h.fake.failNext({ status: 400, method: 'POST', errors: [{ code: 81057, message: 'Record already exists.' }] });
    const e = await run(cfPointToServer, { zone: 'example.com', ipv4: '203.0.113.10' }, h.ctx().ctx).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(AppError);
    expect(e).toMatchObject({ code: 'tool_failed', details: { cloudflare: { status: 400, errors: [{ code: 81057 }] } } });
    expect(h.zone.records).toEqual([]);
  });

  it.each([
    [{ zone: 'example.com' }, 'ipv4'],
    [{ zone: 'example.com', ipv4: '300.1.2.3' }, 'ipv4'],
    [{ zone: 'example.com', ipv6: '2001:db8::zz' }, 'ipv6'],
    [{ zone: 'example.com', ipv4: '203.0.113.10', ttl: 300 }, 'ttl'],
    [{ zone: 'example.com', ipv4: '203.0.113.10', proxied: false, ttl: 30 }, 'ttl'],
    [{ zone: 'not a domain', ipv4: '203.0.113.10' }, 'zone'],
  ])('refuses %j (invalid_input on %s)', async (input, field) => {
    const e = await run(cfPointToServer, input, h.ctx().ctx).catch((x: unknown) => x);
    expect(e).toMatchObject({ code: 'invalid_input' });
    expect((e as AppError).details.issues).toEqual(expect.arrayContaining([expect.objectContaining({ path: [field] })]));
    expect(h.fake.requests).toEqual([]);
  });
});
