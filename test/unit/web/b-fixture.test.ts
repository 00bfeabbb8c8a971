import { describe, expect, it } from 'vitest';
import { gunzipSync, gzipSync } from 'node:zlib';
import https from 'node:https';
import { startFixtureSite } from '../../helpers/fixture-site.js';

function get(url: string): Promise<{ status: number; body: Buffer }> {
  return new Promise((resolve, reject) => {
    https
      .get(url, { rejectUnauthorized: false }, (r) => {
        const chunks: Buffer[] = [];
        r.on('data', (d: Buffer) => chunks.push(d));
        r.on('end', () => resolve({ status: r.statusCode ?? 0, body: Buffer.concat(chunks) }));
      })
      .on('error', reject);
  });
}

describe('fixture site', () => {
  it('serves HTTPS with a self-signed certificate, Buffer bodies, a request log and 404 for unrouted paths', async () => {
    const site = await startFixtureSite({ https: true });
    try {
      site.route('/a', { body: gzipSync('hello'), headers: { 'content-encoding': 'gzip', 'content-type': 'text/plain' } });
      const a = await get(site.url('/a?x=1'));
      expect(gunzipSync(a.body).toString()).toBe('hello');
      const missing = await get(site.url('/nope'));
      expect(missing.status).toBe(404);
      expect(site.requestsFor('/a')).toHaveLength(1);
      expect(site.requests.map((r) => r.path)).toEqual(['/a?x=1', '/nope']);
      expect(site.hostPort).toBe(`127.0.0.1:${site.port}`);
    } finally {
      await site.close();
    }
  });
});
