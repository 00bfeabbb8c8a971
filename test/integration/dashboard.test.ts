import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser } from 'playwright-core';
import { launchChromium } from '../helpers/browser.js';
import { startHarness, json, type Harness } from '../helpers/harness.js';
import { FAMILIES } from '../../src/config.js';

const TOKEN = 'dashboard-test-token-3f9a1c';
const QUEUES = FAMILIES.map((f) => `tools-${f}`);

const basic = (user: string, password: string) => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;

describe('queue dashboard at /admin/queues with ADMIN_TOKEN', () => {
  let h: Harness;
  let base: string;
  let browser: Browser;

  beforeAll(async () => {
    h = await startHarness({ ADMIN_TOKEN: TOKEN }, { workers: [] });
    await h.app.listen({ port: 0, host: '127.0.0.1' });
    base = `http://127.0.0.1:${(h.app.server.address() as AddressInfo).port}`;
    browser = await launchChromium();
  });

  afterAll(async () => {
    await browser?.close();
    await h?.close();
  });

  it('a browser logged in with the token (basic auth) sees every family queue', async () => {
    const context = await browser.newContext({ httpCredentials: { username: 'operator', password: TOKEN } });
    try {
      const page = await context.newPage();
      const failed: string[] = [];
      page.on('response', (r) => {
        if (r.status() >= 400) failed.push(`${r.status()} ${r.url()}`);
      });
      const res = await page.goto(`${base}/admin/queues`);
      expect(res?.status()).toBe(200);
      // The names come from the board's API, rendered by its scripts: both needed the token too.
      await page.waitForFunction((names) => names.every((n) => document.body.innerText.includes(n)), QUEUES, { timeout: 20_000 });
      const text = await page.evaluate(() => document.body.innerText);
      for (const q of QUEUES) expect(text).toContain(q);
      expect(failed).toEqual([]);
    } finally {
      await context.close();
    }
  });

  it('a browser without credentials gets 401 with a basic-auth challenge', async () => {
    const context = await browser.newContext();
    try {
      const page = await context.newPage();
      // Headless, with no credentials to offer, Chromium gives up the navigation on the challenge
      // (net::ERR_INVALID_AUTH_CREDENTIALS); the answer it got is the 401.
      const answered = page.waitForResponse((r) => new URL(r.url()).pathname === '/admin/queues');
      const navigation = await page.goto(`${base}/admin/queues`).then(
        () => 'loaded',
        (e: Error) => e.message,
      );
      expect(navigation).toMatch(/ERR_INVALID_AUTH_CREDENTIALS/);
      const res = await answered;
      expect(res.status()).toBe(401);
      expect(await res.headerValue('www-authenticate')).toBe('Basic realm="tollgate-admin"');
    } finally {
      await context.close();
    }
  });

  it('a browser with a wrong token gets 401', async () => {
    const context = await browser.newContext({ httpCredentials: { username: 'operator', password: `${TOKEN}x` } });
    try {
      const page = await context.newPage();
      const res = await page.goto(`${base}/admin/queues`);
      expect(res?.status()).toBe(401);
    } finally {
      await context.close();
    }
  });

  it('the board API and static assets need the token too; bearer and basic with any user name work', async () => {
    const api = `/admin/queues/api/queues`;
    expect((await h.request({ url: api })).statusCode).toBe(401);
    expect((await h.request({ url: api, headers: { authorization: `Bearer ${TOKEN}x` } })).statusCode).toBe(401);
    expect((await h.request({ url: api, headers: { authorization: basic('x', 'nope') } })).statusCode).toBe(401);
    expect((await h.request({ url: api, headers: { authorization: `Basic ${Buffer.from(TOKEN).toString('base64')}` } })).statusCode).toBe(401);
    const denied = await h.request({ url: api });
    expect(denied.headers['www-authenticate']).toBe('Basic realm="tollgate-admin"');
    expect(json(denied).error.code).toBe('unauthorized');

    const ok = await h.request({ url: api, headers: { authorization: `Bearer ${TOKEN}` } });
    expect(ok.statusCode).toBe(200);
    // Not an API-key route: no rate limit applies.
    expect(ok.headers['x-ratelimit-limit']).toBeUndefined();
    const body = json<{ queues: Array<{ name: string; readOnlyMode: boolean }> }>(ok);
    expect(body.queues.map((q) => q.name).sort()).toEqual([...QUEUES].sort());
    expect(body.queues.every((q) => q.readOnlyMode)).toBe(true);
    expect((await h.request({ url: api, headers: { authorization: basic('anyone', TOKEN) } })).statusCode).toBe(200);

    // A static asset under the prefix: the page's own script.
    const page = await h.request({ url: '/admin/queues', headers: { authorization: `Bearer ${TOKEN}` } });
    const script = /src="((?:[^"]*\/)?static\/js\/main[^"]*\.js)"/.exec(page.body)?.[1];
    expect(script).toBeDefined();
    const path = new URL(script!, `${base}/admin/queues/`).pathname;
    expect(path.startsWith('/admin/queues/static/')).toBe(true);
    expect((await h.request({ url: path })).statusCode).toBe(401);
    expect((await h.request({ url: path, headers: { authorization: `Bearer ${TOKEN}` } })).statusCode).toBe(200);
  });

  it('read-only: the board refuses to retry jobs', async () => {
    const res = await h.request({ method: 'PUT', url: '/admin/queues/api/queues/tools-core/retry/failed', headers: { authorization: `Bearer ${TOKEN}` } });
    expect(res.statusCode).toBe(405);
    // And without the token it never gets that far.
    expect((await h.request({ method: 'PUT', url: '/admin/queues/api/queues/tools-core/retry/failed' })).statusCode).toBe(401);
  });
});

describe('queue dashboard without ADMIN_TOKEN', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({}, { workers: [] });
  });
  afterAll(async () => {
    await h?.close();
  });

  it('/admin/queues is 404 like any unknown route', async () => {
    for (const url of ['/admin/queues', '/admin/queues/', '/admin/queues/api/queues']) {
      const res = await h.request({ url, headers: { authorization: basic('operator', 'anything') } });
      expect(res.statusCode).toBe(404);
      expect(json(res).error.code).toBe('not_found');
    }
  });
});
