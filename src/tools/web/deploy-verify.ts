import type { Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { performance } from 'node:perf_hooks';
import { request } from 'undici';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool, type ToolContext } from '../types.js';
import { SecurityHeadersSchema, acquireHostSlot, dnsOf, httpUrlField, securityHeaders, sleep } from './web-common.js';
import { TlsInfoSchema, tlsInfoOf, type TlsInfo } from './tls-probe.js';
import { decodeText, discard, explainFetchError, flatHeaders, MAX_REDIRECTS, readCapped } from './guarded-http.js';
import { PinnedAgent, vetDestination } from './net-guard.js';

/**
 * deploy_verify: is a deployment up and answering as expected? One GET (redirects followed, each
 * hop vetted again by the SSRF guard and pinned to the vetted addresses) with every phase timed on
 * the socket itself, the TLS certificate read from that same socket (an untrusted one is reported,
 * `authorized: false` with the reason, not refused), the security headers, and the caller's checks.
 * With `attempts` > 1 it polls until every check passes (a fresh deploy coming up), reporting
 * progress after each attempt. A target that gives no HTTP answer is a failed attempt; when the last
 * attempt got none, the call is 502 fetch_failed (uncharged) with every attempt's outcome. A refused
 * destination (private address, bad scheme, a redirect to one) is 400 and nothing connects to it.
 */

const TOOL = 'deploy_verify';
const BODY_CAP = 1024 * 1024;
const REDIRECT_STATUSES = new Set([301, 302, 303, 307, 308]);

const Input = z.object({
  url: httpUrlField('The deployment to check, e.g. "https://example.com/healthz"'),
  expect_status: z
    .union([z.number().int().min(100).max(599), z.array(z.number().int().min(100).max(599)).min(1).max(20)])
    .optional()
    .describe('Status code(s) the final response must have (default: any 2xx or 3xx)'),
  expect_text: z
    .string()
    .min(1)
    .max(1000)
    .optional()
    .describe('Text the body must contain (a plain substring, case-sensitive; never a regex). The first 1 MiB is searched.'),
  expect_headers: z
    .record(
      z
        .string()
        .min(1)
        .max(100)
        .regex(/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/, 'a header name'),
      z.string().max(1000),
    )
    .refine((h) => Object.keys(h).length <= 20, 'at most 20 headers')
    .optional()
    .describe('Headers the response must carry: name -> substring its value must contain (case-insensitive; "" only requires the header)'),
  max_ms: z.number().int().min(1).max(120_000).optional().describe('The whole request (redirects included) must finish within this many milliseconds'),
  min_tls_days: z
    .number()
    .int()
    .min(0)
    .max(3650)
    .optional()
    .describe('The certificate must stay valid at least this many more days (the URL must end on https)'),
  follow_redirects: z.boolean().default(true).describe('Follow up to 5 redirects, each vetted again (default true)'),
  attempts: z.number().int().min(1).max(10).default(1).describe('Try up to this many times until every check passes (1-10)'),
  interval_ms: z.number().int().min(0).max(30_000).default(2000).describe('Wait between attempts (default 2000 ms)'),
  timeout_ms: z.number().int().min(500).max(60_000).default(10_000).describe('Deadline of one attempt (default 10,000 ms)'),
});
type Input = z.output<typeof Input>;

const Check = z.object({ name: z.string(), pass: z.boolean(), detail: z.string() });
type Check = z.infer<typeof Check>;

const Timings = z.object({
  /** Resolving and vetting the final hop's host. */
  dns: z.number().nullable(),
  /** TCP connect of the final hop. */
  connect: z.number().nullable(),
  /** TLS handshake of the final hop (null over http). */
  tls: z.number().nullable(),
  /** From the request being sent to the response headers arriving (final hop). */
  ttfb: z.number().nullable(),
  /** The whole attempt: every hop, and the body read. */
  total: z.number(),
});

export const DeployVerifyOutput = z.object({
  ok: z.boolean(),
  url: z.string(),
  final_url: z.string().nullable(),
  status: z.number().int().nullable(),
  redirects: z.array(z.object({ url: z.string(), status: z.number().int(), location: z.string() })),
  timings_ms: Timings,
  tls: TlsInfoSchema.nullable(),
  security_headers: SecurityHeadersSchema.nullable(),
  checks: z.array(Check),
  /** Why the answer could not be followed (too many redirects, a redirect to an invalid or non-HTTP URL). */
  error: z.object({ reason: z.string(), message: z.string() }).nullable(),
  attempts: z.array(
    z.object({ attempt: z.number().int(), ok: z.boolean(), status: z.number().int().nullable(), total_ms: z.number(), error: z.string().nullable() }),
  ),
});
export type DeployVerifyOutput = z.infer<typeof DeployVerifyOutput>;

interface HopTimes {
  dns: number | null;
  connect: number | null;
  tls: number | null;
  ttfb: number | null;
}

interface AttemptResult {
  final_url: string | null;
  status: number | null;
  redirects: DeployVerifyOutput['redirects'];
  hop: HopTimes;
  total: number;
  tls: TlsInfo | null;
  headers: Record<string, string> | null;
  body: string | null;
  error: { reason: string; message: string } | null;
}

const ms = (v: number) => Math.round(v * 10) / 10;

export const deployVerify = defineTool({
  name: TOOL,
  description:
    'Verify a deployment: status, redirects, per-phase timings (dns, connect, tls, ttfb, total), the TLS certificate (issuer, SANs, days left, trusted or why not), security headers, and your expected status/text/headers/latency checks, polling until they pass.',
  tier: 'free',
  priceCents: 0,
  family: 'web',
  qField: 'url',
  progress: true,
  input: Input,
  examples: [
    { url: 'https://example.com/' },
    {
      url: 'https://example.com/',
      expect_status: 200,
      expect_text: 'Example Domain',
      expect_headers: { 'content-type': 'text/html' },
      max_ms: 5000,
      min_tls_days: 7,
    },
    { url: 'https://example.com/', attempts: 3, interval_ms: 1000 },
  ],
  output:
    '{ok, url, final_url, status, redirects: [{url, status, location}], timings_ms: {dns, connect, tls, ttfb, total}, tls: {protocol, issuer, subject, san, valid_from, valid_to, days_left, authorized, error}|null, security_headers: {<name>: value|null}|null, checks: [{name, pass, detail}], error: {reason, message}|null, attempts: [{attempt, ok, status, total_ms, error}]}',
  outputSchema: DeployVerifyOutput,
  handler: async (input, ctx): Promise<DeployVerifyOutput> => {
    const history: DeployVerifyOutput['attempts'] = [];
    let last: { r: AttemptResult; checks: Check[]; ok: boolean } | null = null;
    for (let attempt = 1; attempt <= input.attempts; attempt++) {
      if (attempt > 1) await sleep(input.interval_ms, ctx.signal, TOOL);
      const r = await runAttempt(input, ctx);
      const checks = evaluate(input, r);
      const ok = r.error === null && checks.every((c) => c.pass);
      history.push({ attempt, ok, status: r.status, total_ms: ms(r.total), error: r.error?.message ?? null });
      last = { r, checks, ok };
      await ctx.progress({
        stage: 'checking',
        done: attempt,
        total: input.attempts,
        unit: 'attempts',
        message: ok
          ? 'all checks pass'
          : r.error
            ? r.error.message
            : `${checks
                .filter((c) => !c.pass)
                .map((c) => c.name)
                .join(', ')} failed`,
      });
      if (ok) break;
    }
    const { r, checks, ok } = last!;
    if (r.error && r.status === null) {
      // No HTTP answer at all (refused, reset, timeout, unknown name, failed handshake): fetch_failed like
      // every web tool whose target cannot be read, uncharged, with each attempt's outcome.
      throw new AppError('fetch_failed', `${TOOL} got no answer from ${new URL(r.final_url ?? input.url).host}: ${r.error.message}`, {
        reason: r.error.reason,
        attempts: history,
      });
    }
    return {
      ok,
      url: input.url,
      final_url: r.final_url,
      status: r.status,
      redirects: r.redirects,
      timings_ms: { dns: nul(r.hop.dns), connect: nul(r.hop.connect), tls: nul(r.hop.tls), ttfb: nul(r.hop.ttfb), total: ms(r.total) },
      tls: r.tls,
      security_headers: r.headers ? securityHeaders(r.headers) : null,
      checks,
      error: r.error,
      attempts: history,
    };
  },
});

const nul = (v: number | null) => (v === null ? null : ms(v));

/** The checks an attempt is judged by: reachability, status, TLS trust, then the caller's. */
export function evaluate(input: Pick<Input, 'expect_status' | 'expect_text' | 'expect_headers' | 'max_ms' | 'min_tls_days'>, r: AttemptResult): Check[] {
  const checks: Check[] = [];
  if (r.error) checks.push({ name: 'reachable', pass: false, detail: r.error.message });
  const statuses = input.expect_status === undefined ? null : Array.isArray(input.expect_status) ? input.expect_status : [input.expect_status];
  if (r.status !== null || statuses) {
    const pass = r.status !== null && (statuses ? statuses.includes(r.status) : r.status >= 200 && r.status < 400);
    checks.push({ name: 'status', pass, detail: `got ${r.status ?? 'no response'}, expected ${statuses ? statuses.join(' or ') : '2xx or 3xx'}` });
  }
  if (r.final_url?.startsWith('https:') && r.tls) {
    checks.push({
      name: 'tls_trusted',
      pass: r.tls.authorized,
      detail: r.tls.authorized ? 'the certificate chain verifies and matches the host' : `untrusted: ${r.tls.error ?? 'unverified'}`,
    });
  }
  if (input.expect_text !== undefined) {
    const pass = r.body !== null && r.body.includes(input.expect_text);
    checks.push({
      name: 'expect_text',
      pass,
      detail: pass ? 'the body contains the text' : r.body === null ? 'no body was read' : 'the text is not in the first 1 MiB of the body',
    });
  }
  for (const [name, want] of Object.entries(input.expect_headers ?? {})) {
    const got = r.headers?.[name.toLowerCase()];
    const pass = got !== undefined && got.toLowerCase().includes(want.toLowerCase());
    checks.push({
      name: `expect_headers:${name.toLowerCase()}`,
      pass,
      detail: got === undefined ? 'missing' : pass ? `present: ${clip(got)}` : `is ${clip(got)}, expected it to contain ${clip(want)}`,
    });
  }
  if (input.max_ms !== undefined) {
    const pass = r.error === null && r.total <= input.max_ms;
    checks.push({ name: 'max_ms', pass, detail: `took ${Math.round(r.total)} ms, limit ${input.max_ms} ms` });
  }
  if (input.min_tls_days !== undefined) {
    const days = r.tls?.days_left ?? null;
    const pass = days !== null && days >= input.min_tls_days;
    checks.push({
      name: 'min_tls_days',
      pass,
      detail: days === null ? 'no TLS certificate (the final URL is not https)' : `${days} days left, at least ${input.min_tls_days} required`,
    });
  }
  return checks;
}

const clip = (s: string) => (s.length > 120 ? `${s.slice(0, 117)}...` : s);

async function runAttempt(input: Input, ctx: ToolContext): Promise<AttemptResult> {
  const started = performance.now();
  const deadline = AbortSignal.timeout(input.timeout_ms);
  const signal = AbortSignal.any([ctx.signal, deadline]);
  const resolver = dnsOf(ctx);
  const redirects: AttemptResult['redirects'] = [];
  let current = new URL(input.url);
  let hop: HopTimes = { dns: null, connect: null, tls: null, ttfb: null };
  let tls: TlsInfo | null = null;
  const result = (over: Partial<AttemptResult>): AttemptResult => ({
    final_url: current.href,
    status: null,
    redirects,
    hop,
    total: performance.now() - started,
    tls,
    headers: null,
    body: null,
    error: null,
    ...over,
  });

  for (;;) {
    hop = { dns: null, connect: null, tls: null, ttfb: null };
    tls = null;
    let release: (() => void) | undefined;
    let socketStart = 0;
    let connected = 0;
    let secured = 0;
    const agent = new PinnedAgent({
      connectTimeoutMs: input.timeout_ms,
      rejectUnauthorized: false,
      onSocket: (socket: Socket) => {
        socketStart = performance.now();
        socket.once('connect', () => {
          connected = performance.now();
          hop.connect = connected - socketStart;
        });
        socket.once('secureConnect', () => {
          secured = performance.now();
          hop.tls = secured - (connected || socketStart);
          tls = tlsInfoOf(socket as TLSSocket);
        });
      },
    });
    try {
      const t0 = performance.now();
      let dest;
      try {
        dest = await vetDestination(current, { config: ctx.config, resolver, signal, tool: TOOL });
      } catch (e) {
        // A refused destination is the caller's mistake (400); a name that does not resolve is a failed attempt.
        if (e instanceof AppError && (e.code === 'invalid_input' || e.code === 'tool_unavailable')) throw e;
        if (e instanceof AppError) return result({ error: { reason: String(e.details['reason'] ?? 'dns_error'), message: e.message } });
        throw e;
      }
      hop.dns = performance.now() - t0;
      agent.pin(dest);
      let sent = 0;
      // Politeness as ctx.http has it: at most WEB_PER_HOST requests at once per host from this process.
      release = await acquireHostSlot(current.host, ctx.config.WEB_PER_HOST, signal);
      const res = await request(current, {
        method: 'GET',
        dispatcher: agent.dispatcher,
        signal,
        headers: {
          'user-agent': `Mozilla/5.0 (compatible; TollgateDeployVerify/0.1${ctx.config.PUBLIC_BASE_URL ? `; +${ctx.config.PUBLIC_BASE_URL}` : ''})`,
          accept: 'text/html,application/json;q=0.9,*/*;q=0.8',
          'accept-encoding': 'gzip, deflate, br',
        },
      }).finally(() => {
        sent = secured || connected;
      });
      hop.ttfb = performance.now() - (sent || t0);
      const headers = flatHeaders(res.headers);
      const location = headers['location'];
      if (input.follow_redirects && REDIRECT_STATUSES.has(res.statusCode) && location) {
        discard(res.body);
        if (redirects.length >= MAX_REDIRECTS) {
          return result({
            status: res.statusCode,
            headers,
            error: { reason: 'too_many_redirects', message: `stopped after ${MAX_REDIRECTS} redirects (last from ${current.href})` },
          });
        }
        let next: URL;
        try {
          next = new URL(location, current);
        } catch {
          return result({ status: res.statusCode, headers, error: { reason: 'bad_redirect', message: `${current.host} redirected to an invalid URL` } });
        }
        if (next.protocol !== 'http:' && next.protocol !== 'https:') {
          return result({ status: res.statusCode, headers, error: { reason: 'bad_redirect', message: `${current.host} redirected to a non-HTTP URL` } });
        }
        next.username = '';
        next.password = '';
        next.hash = '';
        redirects.push({ url: current.href, status: res.statusCode, location: next.href });
        current = next;
        continue;
      }
      const declared = Number(headers['content-length']);
      const read = await readCapped(res, headers, BODY_CAP, undefined, Number.isFinite(declared) ? declared : undefined);
      const charset = /charset\s*=\s*"?([^";\s]+)/i.exec(headers['content-type'] ?? '')?.[1] ?? null;
      return result({ status: res.statusCode, headers, body: decodeText(read.body, charset) });
    } catch (e) {
      if (e instanceof AppError && e.code === 'invalid_input') throw e;
      const explained = explainFetchError(e, {
        tool: TOOL,
        failCode: 'fetch_failed',
        outer: ctx.signal,
        deadline,
        host: current.host,
        timeoutMs: input.timeout_ms,
      });
      if (explained instanceof AppError && explained.code === 'timeout') throw explained;
      if (explained instanceof AppError)
        return result({ error: { reason: String(explained.details['reason'] ?? 'fetch_failed'), message: explained.message } });
      throw explained;
    } finally {
      release?.();
      await agent.close().catch(() => {});
    }
  }
}
