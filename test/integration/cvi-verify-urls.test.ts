import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { routes, startHttpTarget, type HttpTarget } from '../helpers/http-targets.js';

/** cvi_verify's urls: read through the guarded client before the check, which runs in the pool. */

let h: Harness;
let site: HttpTarget;
let other: HttpTarget;

beforeAll(async () => {
  site = await startHttpTarget(
    routes({
      '/report': [
        200,
        { 'content-type': 'text/html; charset=utf-8' },
        '<html><head><title>Report</title></head><body><main><p>In 2023 Acme had 340 employees.</p><p>Revenue rose 12% in 2023.</p></main></body></html>',
      ],
      '/notes.txt': [200, { 'content-type': 'text/plain' }, 'Acme sells only inside Europe.'],
      '/gone': [404, { 'content-type': 'text/html' }, '<p>no</p>'],
    }),
  );
  other = await startHttpTarget((_req, res) => res.end('internal'));
  h = await startHarness({ FETCH_ALLOWED_HOSTS: site.hostPort }, { workers: ['text'] });
});
afterAll(async () => {
  await h?.close();
  await site?.close();
  await other?.close();
});

describe('cvi_verify with urls', () => {
  it('checks claims against the pages it read, each source named by its URL', async () => {
    const acct = await h.account('pro', 0);
    const res = await h.call(
      'cvi_verify',
      { claims: ['Acme had 340 employees in 2023.', 'Revenue rose 15% in 2023.'], urls: [site.url('/report'), site.url('/notes.txt')] },
      acct.apiKey,
    );
    expect(res.statusCode, res.body).toBe(200);
    const out = json(res).result;
    expect(out.sources).toEqual([site.url('/report'), site.url('/notes.txt')]);
    expect(out.results[0]).toMatchObject({ verdict: 'supported' });
    expect(out.results[0].evidence[0].source).toBe(site.url('/report'));
    expect(out.results[1]).toMatchObject({ verdict: 'conflict' });
  });

  it('text mode: claims before ---, sources after, plus urls', async () => {
    const acct = await h.account('pro', 0);
    const res = await h.call(
      'cvi_verify',
      { text: 'Acme had 340 employees in 2023.\n---\nAcme was founded in 1990.', urls: [site.url('/report')] },
      acct.apiKey,
    );
    expect(res.statusCode, res.body).toBe(200);
    expect(json(res).result.sources).toEqual(['source 1', site.url('/report')]);
    expect(json(res).result.results[0].verdict).toBe('supported');
  });

  it('a private address is refused before any connection; a 404 page is fetch_failed; neither is charged', async () => {
    const acct = await h.account('pro', 0);
    const refused = await h.call('cvi_verify', { claims: ['x is y.'], urls: [other.url('/')] }, acct.apiKey);
    expect(refused.statusCode).toBe(400);
    expect(json(refused).error.reason).toBe('blocked_address');
    expect(other.requests.length).toBe(0);
    const gone = await h.call('cvi_verify', { claims: ['x is y.'], urls: [site.url('/gone')] }, acct.apiKey);
    expect(gone.statusCode).toBe(502);
    expect(json(gone).error.code).toBe('fetch_failed');
    expect(await h.ledgerCharges(acct.accountId)).toBe(0);
  });

  it('bad urls are 400 at admission', async () => {
    const acct = await h.account('pro', 0);
    const res = await h.call('cvi_verify', { claims: ['x'], urls: ['ftp://example.com/a'] }, acct.apiKey);
    expect(res.statusCode).toBe(400);
    const many = await h.call('cvi_verify', { claims: ['x'], urls: Array.from({ length: 6 }, (_, i) => `https://e${i}.example/`) }, acct.apiKey);
    expect(many.statusCode).toBe(400);
  });
});
