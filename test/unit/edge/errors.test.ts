import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.js';
import { CfClient } from '../../../src/tools/edge/cf-client.js';
import { cfCreateDns, cfListDns } from '../../../src/tools/edge/dns.js';
import { cfAnalytics } from '../../../src/tools/edge/insight.js';
import { cfPointToServer } from '../../../src/tools/edge/point-to-server.js';
import { assertRequestsMatchSpec } from '../../helpers/cf-openapi.js';
import { FAKE_TOKEN } from '../../helpers/fake-cloudflare.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { run, useHarness, type Harness } from './harness.js';

async function failure(p: Promise<unknown>): Promise<AppError> {
  const e = await p.then(
    () => {
      throw new Error('expected the call to fail');
    },
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(AppError);
  const err = e as AppError;
  // Whatever went wrong, the token is in neither the message nor the details.
  expect(JSON.stringify({ m: err.message, d: err.details, h: err.headers })).not.toContain(FAKE_TOKEN);
  return err;
}

const createInput = { zone: 'example.com', type: 'A', name: 'app', content: '203.0.113.10' };

describe('Cloudflare error mapping', () => {
  let h: Harness;
  useHarness((started) => (h = started), { checkRequests: false });

  it('refuses to run without a token, naming the header to send', async () => {
    const { ctx } = h.ctx({ edgeToken: undefined });
    const err = await failure(run(cfListDns, { zone: 'example.com' }, ctx));
    expect(err.code).toBe('invalid_input');
    expect(err.message).toBe('Send your Cloudflare API token in the X-Edge-Token header (or edge_token in the body)');
    expect(h.fake.requests).toEqual([]);
  });

  it('401 from Cloudflare -> 403 edge_token_rejected, final', async () => {
    h.fake.failNext({ status: 401, errors: [{ code: 10000, message: 'Authentication error' }] });
    const err = await failure(run(cfListDns, { zone: 'example.com' }, h.ctx().ctx));
    expect(err).toMatchObject({ code: 'edge_token_rejected', status: 403, retryable: false });
    expect(err.details).toEqual({ cloudflare: { status: 401, errors: [{ code: 10000, message: 'Authentication error' }] } });
  });

  it("an invalid token (403, code 9109) -> edge_token_rejected with Cloudflare's message inside", async () => {
    const { ctx } = h.ctx({ edgeToken: 'some-other-token-123' });
    const err = await failure(run(cfListDns, { zone: 'example.com' }, ctx));
    expect(err.code).toBe('edge_token_rejected');
    expect(err.message).toContain('Invalid access token (code 9109)');
    expect(err.message).not.toContain('some-other-token-123');
  });

  it('a malformed token (400, 6003 with 6111 in the chain) -> edge_token_rejected', async () => {
    const { ctx } = h.ctx({ edgeToken: 'not a valid token!' });
    const err = await failure(run(cfListDns, { zone: 'example.com' }, ctx));
    expect(err.code).toBe('edge_token_rejected');
    expect((err.details.cloudflare as { errors: Array<{ code: number }> }).errors.map((e) => e.code)).toEqual([6003, 6111]);
  });

  it('a token without the needed permission (403, code 10000) -> edge_token_rejected', async () => {
    h.fake.failNext({ status: 403, errors: [{ code: 10000, message: 'Authentication error' }], method: 'POST' });
    const err = await failure(run(cfCreateDns, createInput, h.ctx().ctx));
    expect(err.code).toBe('edge_token_rejected');
  });

  it("429 -> rate_limited with Cloudflare's retry-after in the body and the Retry-After header", async () => {
    h.fake.failNext({
      status: 429,
      errors: [{ code: 10429, message: 'Rate limited. Please wait and consider throttling your request speed' }],
      headers: { 'retry-after': '37' },
    });
    const err = await failure(run(cfListDns, { zone: 'example.com' }, h.ctx().ctx));
    expect(err).toMatchObject({ code: 'rate_limited', status: 429, retryable: false, headers: { 'Retry-After': '37' } });
    expect(err.details).toMatchObject({ retry_after: 37, cloudflare: { status: 429, errors: [{ code: 10429 }] } });
  });

  it('429 without retry-after still tells the caller when to come back', async () => {
    h.fake.failNext({ status: 429 });
    const err = await failure(run(cfListDns, { zone: 'example.com' }, h.ctx().ctx));
    expect(err.details.retry_after).toBe(60);
    expect(err.headers['Retry-After']).toBe('60');
  });

  it('400 with Cloudflare error codes -> tool_failed (422) with the codes and messages inside', async () => {
    h.fake.addRecord(h.zone, { type: 'CNAME', name: 'app', content: 'elsewhere.example.net' });
    const err = await failure(run(cfCreateDns, createInput, h.ctx().ctx));
    expect(err).toMatchObject({ code: 'tool_failed', status: 422, retryable: false });
    expect(err.message).toBe('Cloudflare rejected the request: An A, AAAA, or CNAME record with that host already exists. (code 81053)');
    expect(err.details).toEqual({
      cloudflare: { status: 400, errors: [{ code: 81053, message: 'An A, AAAA, or CNAME record with that host already exists.' }] },
    });
  });

  it('5xx on a read -> retryable upstream_error', async () => {
    h.fake.failNext({ status: 503, errors: [{ code: 10013, message: 'Service unavailable' }] });
    const err = await failure(run(cfListDns, { zone: 'example.com' }, h.ctx().ctx));
    expect(err).toMatchObject({ code: 'upstream_error', status: 502, retryable: true });
  });

  it('5xx on a write -> final upstream_error, the write sent once and never retried', async () => {
    h.fake.failNext({ status: 500, errors: [{ code: 10001, message: 'Internal error' }], method: 'POST' });
    const err = await failure(run(cfPointToServer, { zone: 'example.com', ipv4: '203.0.113.10' }, h.ctx().ctx));
    expect(err).toMatchObject({ code: 'upstream_error', retryable: false });
    expect(err.message).toContain('may or may not have been applied');
    expect(h.fake.writes()).toHaveLength(1);
    assertRequestsMatchSpec(h.fake.requests);
  });

  it('a non-JSON error page on a read -> retryable upstream_error', async () => {
    h.fake.failNext({ status: 502, raw: '<html><body>502 Bad Gateway</body></html>' });
    const err = await failure(run(cfListDns, { zone: 'example.com' }, h.ctx().ctx));
    expect(err).toMatchObject({ code: 'upstream_error', retryable: true });
  });

  it('a message that echoes the token has it redacted', async () => {
    h.fake.failNext({ status: 400, errors: [{ code: 1001, message: `Bad token value ${FAKE_TOKEN}` }] });
    const err = await failure(run(cfListDns, { zone: 'example.com' }, h.ctx().ctx));
    expect(err.message).toContain('Bad token value [redacted]');
  });

  it('a GraphQL authorization error -> edge_token_rejected; a GraphQL query error -> tool_failed', async () => {
    const cf = new CfClient(h.ctx().ctx);
    const q =
      'query Q($zoneTag: string) { viewer { zones(filter: { zoneTag: $zoneTag }) { httpRequests1dGroups(limit: 1, filter: { date: "2025-01-01" }) { sum { requests } } } } }';
    const denied = await failure(cf.graphql(q, { zoneTag: 'ffffffffffffffffffffffffffffffff' }));
    expect(denied.code).toBe('edge_token_rejected');
    expect(denied.details).toMatchObject({ cloudflare: { errors: [{ code: 'authz' }] } });
    const broken = await failure(cf.graphql('query { viewer { zones(filter: {zoneTag: "x"}) { ', {}));
    expect(broken.code).toBe('tool_failed');
    expect(broken.message).toContain('error parsing query');
  });

  it('an unreachable Cloudflare -> retryable upstream_error on reads, final on writes', async () => {
    const closed = createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
    const port = (closed.address() as AddressInfo).port;
    await new Promise<void>((r) => closed.close(() => r()));
    const { ctx } = makeToolContext({ edgeToken: FAKE_TOKEN, env: { CF_API_BASE_URL: `http://127.0.0.1:${port}/client/v4` } });
    const read = await failure(run(cfListDns, { zone: '023e105f4ecef8ad9ca31a8372d0c353' }, ctx));
    expect(read).toMatchObject({ code: 'upstream_error', retryable: true });
    expect(read.message).toContain('Could not reach Cloudflare');
    const write = await failure(new CfClient(ctx).write({ method: 'POST', path: '/zones', body: { name: 'example.org' } }));
    expect(write).toMatchObject({ code: 'upstream_error', retryable: false });
  });

  it('a write Cloudflare never answers times out as a final upstream_error', async () => {
    const received: string[] = [];
    const silent: Server = createServer((req) => {
      received.push(`${req.method} ${req.url}`);
    });
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
    try {
      const port = (silent.address() as AddressInfo).port;
      const { ctx } = makeToolContext({ edgeToken: FAKE_TOKEN, env: { CF_API_BASE_URL: `http://127.0.0.1:${port}/client/v4`, CF_TIMEOUT_MS: '500' } });
      const err = await failure(
        new CfClient(ctx).write({ method: 'POST', path: '/zones/023e105f4ecef8ad9ca31a8372d0c353/purge_cache', body: { purge_everything: true } }),
      );
      expect(err).toMatchObject({ code: 'upstream_error', retryable: false });
      expect(err.message).toContain('did not answer within 500 ms');
      expect(received).toHaveLength(1);
    } finally {
      silent.closeAllConnections();
      await new Promise<void>((r) => silent.close(() => r()));
    }
  });

  it('a zone the token cannot see is a tool_failed naming it', async () => {
    const err = await failure(run(cfAnalytics, { zone: 'not-mine.example' }, h.ctx().ctx));
    expect(err.code).toBe('tool_failed');
    expect(err.message).toContain('No zone named not-mine.example');
  });
});
