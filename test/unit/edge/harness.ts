import { afterEach, beforeEach } from 'vitest';
import { parseOrThrow } from '../../../src/errors.js';
import type { AnyTool, ToolContext } from '../../../src/tools/types.js';
import { assertRequestsMatchSpec } from '../../helpers/cf-openapi.js';
import { FAKE_TOKEN, startFakeCloudflare, type FakeCloudflare, type FakeZone } from '../../helpers/fake-cloudflare.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { FakeDns } from './fake-dns.js';

/** Mail hosts the fake DNS knows; everything else is NXDOMAIN. */
export const KNOWN_HOSTS: Record<string, string[]> = {
  'smtp.google.com': ['142.250.27.26', '2a00:1450:4025:401::1a'],
  'in1-smtp.messagingengine.com': ['103.168.172.191'],
  'in2-smtp.messagingengine.com': ['103.168.172.216'],
  'mail.protonmail.ch': ['185.70.42.128'],
  'mailsec.protonmail.ch': ['185.70.42.129'],
  'mx.zoho.com': ['204.141.33.44'],
  'mx2.zoho.com': ['204.141.32.119'],
  'mx3.zoho.com': ['204.141.42.56'],
  'example-com.mail.protection.outlook.com': ['52.101.68.4'],
  'mx1.mailhost.example': ['192.0.2.25'],
};

export interface Harness {
  fake: FakeCloudflare;
  dns: FakeDns;
  zone: FakeZone;
  ctx(over?: Partial<ToolContext> & { env?: Record<string, string> }): ReturnType<typeof makeToolContext>;
  close(): Promise<void>;
}

export async function startHarness(): Promise<Harness> {
  const fake = await startFakeCloudflare();
  const dns = await new FakeDns(KNOWN_HOSTS).start();
  const zone = fake.addZone('example.com');
  return {
    fake,
    dns,
    zone,
    ctx: (over = {}) => {
      const { env, ...rest } = over;
      return makeToolContext({
        edgeToken: FAKE_TOKEN,
        env: { CF_API_BASE_URL: fake.url, CF_TIMEOUT_MS: '5000', DNS_SERVERS: dns.server, DNS_TIMEOUT_MS: '2000', ...env },
        ...rest,
      });
    },
    close: async () => {
      await fake.close();
      await dns.close();
    },
  };
}

/**
 * Starts a fresh harness before each test (handed to `use`) and closes it after; unless told not to,
 * first checks every request the test sent against Cloudflare's API description.
 */
export function useHarness(use: (h: Harness) => void, { checkRequests = true } = {}): void {
  let h: Harness;
  beforeEach(async () => {
    h = await startHarness();
    use(h);
  });
  afterEach(async () => {
    if (checkRequests) assertRequestsMatchSpec(h.fake.requests);
    await h.close();
  });
}

/** Runs a tool as the worker does: input through its zod schema (invalid_input on failure), then the handler. */
export async function run(tool: AnyTool, input: unknown, ctx: ToolContext): Promise<Record<string, unknown>> {
  const parsed: unknown = parseOrThrow(tool.input, input, `Input for ${tool.name} is invalid`);
  return (await tool.handler(parsed, ctx)) as Record<string, unknown>;
}
