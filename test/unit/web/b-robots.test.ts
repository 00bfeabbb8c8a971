import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.js';
import { createRobots, grabrFetch } from '../../../src/tools/web/robots.js';
import { robotsCheckTask } from '../../../src/tools/web/robots-task.js';
import { startFixtureSite, type FixtureSite } from '../../helpers/fixture-site.js';
import { makeToolContext } from '../../helpers/tool-context.js';

let site: FixtureSite;
let down: FixtureSite;
let none: FixtureSite;

beforeAll(async () => {
  [site, down, none] = await Promise.all([startFixtureSite(), startFixtureSite(), startFixtureSite()]);
  site.route('/robots.txt', {
    headers: { 'content-type': 'text/plain' },
    body: [
      'User-agent: *',
      'Disallow: /',
      '',
      'User-agent: TollgateGrabr',
      'Disallow: /private',
      'Allow: /private/open',
      'Disallow: /*.pdf$',
      '',
      'Sitemap: https://example.com/sitemap.xml',
    ].join('\n'),
  });
  site.route('/ok', { body: 'fine' });
  site.route('/hop', { status: 302, headers: { location: '/private/secret' } });
  site.route('/private/secret', { body: 'secret' });
  down.route('/robots.txt', { status: 503, body: 'later' });
  down.route('/page', { body: 'page' });
  none.route('/page', { body: 'page' });
});
afterAll(async () => {
  await Promise.all([site, down, none].map((s) => s?.close()));
});

const ctxFor = (...sites: FixtureSite[]) => makeToolContext({ env: { FETCH_ALLOWED_HOSTS: sites.map((s) => s.hostPort).join(',') } }).ctx;

describe('robots.txt (robots.ts)', () => {
  it('applies the group of GRABR_USER_AGENT: longest match wins, Allow on ties, $ anchors; one robots.txt fetch per call', async () => {
    const ctx = ctxFor(site);
    const robots = createRobots(ctx, 'test');
    const urls = ['/ok', '/private/x', '/private/open/y', '/doc.pdf', '/doc.pdf?x=1'].map((p) => site.url(p));
    expect(await robots.allowedMany(urls)).toEqual([true, false, true, false, true]);
    await robots.assertAllowed(site.url('/ok'));
    expect(await robots.sitemaps(site.url('/'))).toEqual(['https://example.com/sitemap.xml']);
    expect(site.requestsFor('/robots.txt')).toHaveLength(1);
    expect(site.requestsFor('/robots.txt')[0]!.headers['user-agent']).toBe(ctx.config.GRABR_USER_AGENT);
  });

  it('a disallowed path is robots_disallowed (403) and is never requested, not even through a redirect', async () => {
    const ctx = ctxFor(site);
    const robots = createRobots(ctx, 'test');
    const err = await grabrFetch(ctx, robots, site.url('/private/secret')).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).code).toBe('robots_disallowed');
    expect((err as AppError).status).toBe(403);
    const viaHop = await grabrFetch(ctx, robots, site.url('/hop')).catch((e: unknown) => e);
    expect((viaHop as AppError).code).toBe('robots_disallowed');
    expect(site.requestsFor('/hop')).toHaveLength(1);
    expect(site.requestsFor('/private/secret')).toHaveLength(0);
  });

  it('grabrFetch sends GRABR_USER_AGENT and follows allowed redirects itself', async () => {
    site.route('/hop-ok', { status: 301, headers: { location: '/ok' } });
    const ctx = ctxFor(site);
    const res = await grabrFetch(ctx, createRobots(ctx, 'test'), site.url('/hop-ok'));
    expect(res.status).toBe(200);
    expect(res.final_url).toBe(site.url('/ok'));
    expect(res.redirects).toEqual([{ url: site.url('/hop-ok'), status: 301, location: site.url('/ok') }]);
    expect(res.text()).toBe('fine');
    expect(site.requestsFor('/ok').at(-1)!.headers['user-agent']).toBe(ctx.config.GRABR_USER_AGENT);
  });

  it('a robots.txt that 404s allows everything; one that answers 5xx disallows everything (RFC 9309)', async () => {
    const ctx = ctxFor(down, none);
    const robots = createRobots(ctx, 'test');
    expect(await robots.allowedMany([none.url('/page'), down.url('/page')])).toEqual([true, false]);
    expect(await robots.sitemaps(none.url('/'))).toEqual([]);
    expect(down.requestsFor('/page')).toHaveLength(0);
  });

  it('an origin whose robots.txt cannot be fetched fails every check of that call at once (one attempt)', async () => {
    const { closedPort } = await import('../../helpers/http-targets.js');
    const port = await closedPort();
    const ctx = makeToolContext({ env: { FETCH_ALLOWED_HOSTS: `127.0.0.1:${port}` } }).ctx;
    const robots = createRobots(ctx, 'test');
    const a = await robots.assertAllowed(`http://127.0.0.1:${port}/a`).catch((e: unknown) => e);
    const b = await robots.assertAllowed(`http://127.0.0.1:${port}/b`).catch((e: unknown) => e);
    expect((a as AppError).code).toBe('fetch_failed');
    expect(b).toBe(a);
  });

  it('the pool task: rules for another origin say nothing; a hostile wildcard file stays bounded', () => {
    expect(
      robotsCheckTask({ robotsUrl: 'https://a.test/robots.txt', text: 'User-agent: *\nDisallow: /', userAgent: 'X', urls: ['https://b.test/x'] }).allowed,
    ).toEqual([true]);
    const hostile = 'User-agent: *\n' + Array.from({ length: 2000 }, () => `Disallow: /${'*a'.repeat(50)}$`).join('\n');
    const t0 = Date.now();
    const r = robotsCheckTask({ robotsUrl: 'https://a.test/robots.txt', text: hostile, userAgent: 'X', urls: [`https://a.test/${'a'.repeat(300)}b`] });
    expect(r.allowed).toEqual([true]);
    expect(Date.now() - t0).toBeLessThan(5_000);
  });
});
