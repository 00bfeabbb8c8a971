import { request } from 'undici';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { runTask } from '../tasks.js';
import { defineTool, type GuardedResponse, type ToolContext } from '../types.js';
import { SecurityHeadersSchema, acquireHostSlot, dnsOf, guardedHttpOf, securityHeaders } from './web-common.js';
import { DmarcSchema, SpfSchema, parseDmarc, parseSpf } from './email-auth.js';
import { probeTls, TlsInfoSchema, type TlsInfo } from './tls-probe.js';
import { normaliseDomain } from './domain-check.js';
import { FINGERPRINTS_VERSION } from './fingerprints.js';
import { vetDestination } from './net-guard.js';
import { parseHttpUrl } from './guarded-http.js';
import { createRobots } from './robots.js';
import { ABSENT_CODES, RECORD_TYPES, UNREACHABLE_CODES, errorCode, type RecordMap, type RecordType } from './resolver.js';

/**
 * grabr_intel: a one-call report on a domain. DNS (A, AAAA, MX, NS, TXT, and TXT of _dmarc) through
 * ctx.dns with records exactly as served; SPF and DMARC parsed from them; the TLS certificate from a
 * handshake pinned to the SSRF guard's vetted addresses; the home page through the guarded client (as
 * GRABR_USER_AGENT, after robots.txt allows it: a disallowed home page is 403 robots_disallowed and is
 * never fetched); its headers, technology fingerprints (fingerprints.ts, versioned) and SEO basics
 * (parsed in the sandbox pool); a robots.txt summary; and RDAP registration data when RDAP_BASE_URL is
 * set. A part that cannot be read is listed in `unavailable` with the reason; the rest still answers.
 */

const TOOL = 'grabr_intel';
const PAGE_MAX_BYTES = 2 * 1024 * 1024;
const ROBOTS_MAX_BYTES = 512 * 1024;
const TLS_TIMEOUT_MS = 8_000;
const RDAP_TIMEOUT_MS = 10_000;
const RDAP_MAX_BYTES = 1024 * 1024;

const Input = z.object({
  domain: z
    .string()
    .trim()
    .min(1)
    .max(2048)
    .describe(
      'The domain to report on, e.g. "example.com". A URL ("https://example.com:8443/") also works: its host is the domain, and its scheme and port are where the web parts are read.',
    )
    .transform((raw, ctx) => {
      const hasScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(raw);
      let origin: string | null = null;
      if (hasScheme) {
        const u = parseHttpUrl(raw);
        if ('error' in u) {
          ctx.addIssue({ code: 'custom', message: u.error === 'not a valid URL' ? 'not a valid domain name or URL' : u.error });
          return z.NEVER;
        }
        origin = u.url.origin;
      }
      const r = normaliseDomain(raw);
      if ('error' in r) {
        ctx.addIssue({ code: 'custom', message: r.error });
        return z.NEVER;
      }
      // A string again (the service parses input at admission and once more in the worker): the bare
      // domain, or the URL's origin; splitDomain reads both.
      return origin ?? r.domain;
    }),
  rdap: z.boolean().default(true).describe('Include registration data from RDAP when the service has RDAP_BASE_URL (default true)'),
});
type Input = z.output<typeof Input>;

const Part = z.enum(['dns', 'email_auth', 'tls', 'http', 'tech', 'seo', 'robots', 'rdap']);

const RobotsSummary = z.object({
  url: z.string(),
  status: z.number().int().nullable(),
  found: z.boolean(),
  homepage_allowed: z.boolean(),
  user_agent: z.string(),
  sitemaps: z.array(z.string()),
  crawl_delay: z.number().nullable(),
  user_agents: z.array(z.string()),
  disallow_rules: z.number().int(),
  allow_rules: z.number().int(),
});

const Http = z.object({
  url: z.string(),
  final_url: z.string(),
  status: z.number().int(),
  redirects: z.array(z.object({ url: z.string(), status: z.number().int(), location: z.string() })),
  server: z.string().nullable(),
  content_type: z.string().nullable(),
  /** Every response header (lower-case names); Set-Cookie reduced to the cookie names. */
  headers: z.record(z.string()),
  security_headers: SecurityHeadersSchema,
});

const Seo = z.object({
  title: z.string().nullable(),
  title_length: z.number().int(),
  description: z.string().nullable(),
  description_length: z.number().int(),
  canonical: z.string().nullable(),
  h1_count: z.number().int(),
  h1: z.array(z.string()),
  robots_meta: z.string().nullable(),
  lang: z.string().nullable(),
  viewport: z.boolean(),
  og_title: z.string().nullable(),
  og_image: z.string().nullable(),
  hreflang: z.array(z.string()),
  issues: z.array(z.string()),
});

const Rdap = z.object({
  found: z.boolean(),
  handle: z.string().nullable(),
  ldh_name: z.string().nullable(),
  registrar: z.string().nullable(),
  status: z.array(z.string()),
  registered: z.string().nullable(),
  expires: z.string().nullable(),
  last_changed: z.string().nullable(),
  nameservers: z.array(z.string()),
});
type Rdap = z.infer<typeof Rdap>;

export const GrabrIntelOutput = z.object({
  domain: z.string(),
  origin: z.string(),
  dns: z.object({
    A: z.array(z.string()),
    AAAA: z.array(z.string()),
    MX: z.array(z.object({ exchange: z.string(), priority: z.number().int() })),
    NS: z.array(z.string()),
    TXT: z.array(z.string()),
    /** TXT records of _dmarc.<domain>. */
    DMARC_TXT: z.array(z.string()),
  }),
  email_auth: z.object({ spf: SpfSchema.nullable(), dmarc: DmarcSchema.nullable() }),
  tls: TlsInfoSchema.nullable(),
  http: Http.nullable(),
  tech: z.array(z.object({ name: z.string(), category: z.string(), version: z.string().nullable(), evidence: z.array(z.string()) })),
  fingerprints_version: z.string(),
  seo: Seo.nullable(),
  robots: RobotsSummary.nullable(),
  rdap: Rdap.nullable(),
  unavailable: z.array(z.object({ part: Part, reason: z.string() })),
});
export type GrabrIntelOutput = z.infer<typeof GrabrIntelOutput>;
type Unavailable = GrabrIntelOutput['unavailable'];

const DNS_ERROR_TEXT: Record<string, string> = {
  ETIMEOUT: 'timed out',
  ESERVFAIL: 'SERVFAIL',
  EREFUSED: 'REFUSED',
  ECONNREFUSED: 'the DNS server refused the connection',
};

export const grabrIntel = defineTool({
  name: TOOL,
  description:
    'One-call domain report: DNS records, SPF and DMARC, TLS certificate, HTTP and security headers, detected technologies, SEO basics, robots.txt and (when configured) RDAP registration data. Honours robots.txt.',
  tier: 'enterprise',
  priceCents: 0,
  family: 'web',
  qField: 'domain',
  progress: true,
  input: Input,
  examples: [{ domain: 'example.com' }, { domain: 'https://www.iana.org/', rdap: false }],
  output:
    '{domain, origin, dns: {A, AAAA, MX: [{exchange, priority}], NS, TXT, DMARC_TXT}, email_auth: {spf, dmarc}, tls: {protocol, issuer, subject, san, valid_from, valid_to, days_left, authorized, error}|null, http: {url, final_url, status, redirects, server, content_type, headers, security_headers}|null, tech: [{name, category, version, evidence}], fingerprints_version, seo: {title, description, canonical, h1_count, robots_meta, lang, issues...}|null, robots: {url, status, found, homepage_allowed, sitemaps, crawl_delay...}|null, rdap: {registrar, status, registered, expires, nameservers...}|null, unavailable: [{part, reason}]}',
  outputSchema: GrabrIntelOutput,
  limits: { timeMs: 10_000, memoryMb: 256 },
  handler: async (input, ctx): Promise<GrabrIntelOutput> => intel(input, ctx),
});

async function intel(input: Input, ctx: ToolContext): Promise<GrabrIntelOutput> {
  const { domain, origin: asked } = splitDomain(input.domain);
  let origin = asked;
  const total = 5;
  let done = 0;
  const step = (stage: string) => ctx.progress({ stage, done: ++done, total, unit: 'parts' });
  const unavailable: Unavailable = [];
  const resolver = dnsOf(ctx);
  let originUrl = new URL(origin);
  const ua = ctx.config.GRABR_USER_AGENT;

  // The web parts' destination is vetted before anything connects: a refused address is the caller's 400.
  let reachable = true;
  try {
    await vetDestination(originUrl, { config: ctx.config, resolver, signal: ctx.signal, tool: TOOL });
  } catch (e) {
    if (e instanceof AppError && (e.code === 'invalid_input' || e.code === 'tool_unavailable')) throw e;
    if (!(e instanceof AppError)) throw e;
    reachable = false;
    for (const part of ['tls', 'http', 'tech', 'seo', 'robots'] as const) unavailable.push({ part, reason: e.message });
  }

  // robots.txt first: a home page it disallows is never fetched.
  const http = guardedHttpOf(ctx, TOOL);
  let robots: GrabrIntelOutput['robots'] = null;
  if (reachable) {
    const readRobots = async (url: string) => {
      const res = await http.fetch(url, { maxBytes: ROBOTS_MAX_BYTES, headers: { 'user-agent': ua, accept: 'text/plain,*/*;q=0.5' } });
      return { status: res.status, text: res.status >= 200 && res.status < 300 ? res.text() : '' };
    };
    let robotsUrl = new URL('/robots.txt', originUrl).href;
    let status: number | null = null;
    let text = '';
    try {
      ({ status, text } = await readRobots(robotsUrl));
    } catch (e) {
      if (e instanceof AppError && (e.code === 'timeout' || e.code === 'invalid_input')) throw e;
      let failure = e;
      // A bare domain whose https port refuses the connection or the handshake: the site may be http only.
      const reason = e instanceof AppError ? e.details['reason'] : undefined;
      if (!/^https?:\/\//i.test(input.domain) && (reason === 'connection_refused' || reason === 'tls_error')) {
        const plain = new URL(`http://${domain}`);
        try {
          await vetDestination(plain, { config: ctx.config, resolver, signal: ctx.signal, tool: TOOL });
          const url = new URL('/robots.txt', plain).href;
          ({ status, text } = await readRobots(url));
          originUrl = plain;
          origin = plain.origin;
          robotsUrl = url;
          failure = null;
        } catch (e2) {
          // Not over http either (or not admitted there): the https failure is the one reported.
          if (e2 instanceof AppError && e2.code === 'timeout') throw e2;
        }
      }
      if (failure) unavailable.push({ part: 'robots', reason: failure instanceof Error ? failure.message : String(failure) });
    }
    const home = new URL('/', originUrl).href;
    const verdict = await runTask(ctx, 'intel_robots', { url: robotsUrl, status, text, userAgent: ua, urls: [home] });
    if (status !== null) {
      robots = {
        url: robotsUrl,
        status,
        found: verdict.found,
        homepage_allowed: verdict.allowed[0]!,
        user_agent: ua,
        sitemaps: verdict.sitemaps,
        crawl_delay: verdict.crawl_delay,
        user_agents: verdict.user_agents,
        disallow_rules: verdict.disallow_rules,
        allow_rules: verdict.allow_rules,
      };
      if (!verdict.allowed[0]) {
        throw new AppError(
          'robots_disallowed',
          `${TOOL}: ${robotsUrl} disallows ${home} for ${ua}${status >= 500 ? ` (robots.txt answered ${status}, which counts as disallowing everything)` : ''}; nothing was fetched there`,
          {
            url: home,
            user_agent: ua,
          },
        );
      }
    }
  }
  await step('robots');

  const [dns, tls, page, rdap] = await Promise.all([
    lookUpDns(domain, ctx, resolver, unavailable).finally(() => step('dns')),
    reachable ? readTls(originUrl, domain, ctx, resolver, unavailable).finally(() => step('tls')) : step('tls').then(() => null),
    reachable ? readHome(originUrl, ctx, http, ua, unavailable).finally(() => step('http')) : step('http').then(() => null),
    readRdap(domain, input.rdap, ctx, unavailable).finally(() => step('rdap')),
  ]);

  let tech: GrabrIntelOutput['tech'] = [];
  let seo: GrabrIntelOutput['seo'] = null;
  let httpPart: GrabrIntelOutput['http'] = null;
  if (page) {
    const analysed = await runTask(ctx, 'intel_page', {
      body: page.body,
      baseUrl: page.final_url,
      headerCharset: page.charset,
      headers: page.headers,
      html:
        page.content_type === 'text/html' ||
        page.content_type === 'application/xhtml+xml' ||
        (page.content_type === null && /^\s*</.test(page.body.subarray(0, 256).toString('latin1'))),
    });
    tech = analysed.tech;
    seo = analysed.seo;
    if (!seo) unavailable.push({ part: 'seo', reason: `the home page is not HTML (${page.content_type ?? 'no content type'})` });
    httpPart = {
      url: page.url,
      final_url: page.final_url,
      status: page.status,
      redirects: page.redirects,
      server: page.headers['server'] ?? null,
      content_type: page.content_type,
      headers: reportedHeaders(page.headers),
      security_headers: securityHeaders(page.headers),
    };
  } else if (reachable) {
    unavailable.push({ part: 'tech', reason: 'the home page could not be read' }, { part: 'seo', reason: 'the home page could not be read' });
  }

  return {
    domain,
    origin,
    dns,
    email_auth: { spf: parseSpf(dns.TXT), dmarc: parseDmarc(dns.DMARC_TXT) },
    tls,
    http: httpPart,
    tech,
    fingerprints_version: FINGERPRINTS_VERSION,
    seo,
    robots,
    rdap,
    unavailable: sortParts(unavailable),
  };
}

/** The domain and the origin the web parts are read from, from the normalised `domain` field. */
export function splitDomain(value: string): { domain: string; origin: string } {
  if (/^https?:\/\//i.test(value)) {
    const url = new URL(value);
    return { domain: url.hostname.replace(/\.$/, ''), origin: url.origin };
  }
  return { domain: value, origin: `https://${value}` };
}

const PART_ORDER = Part.options;
function sortParts(u: Unavailable): Unavailable {
  return u
    .map((x, i) => [x, i] as const)
    .sort((a, b) => PART_ORDER.indexOf(a[0].part) - PART_ORDER.indexOf(b[0].part) || a[1] - b[1])
    .map(([x]) => x);
}

/** Response headers as reported: values verbatim, except Set-Cookie, reduced to the cookies' names. */
function reportedHeaders(headers: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(headers)) {
    out[k] =
      k === 'set-cookie'
        ? v
            .split('\n')
            .map((c) => c.split('=')[0]!.trim())
            .filter(Boolean)
            .join(', ')
        : v;
  }
  return out;
}

async function lookUpDns(domain: string, ctx: ToolContext, resolver: ReturnType<typeof dnsOf>, unavailable: Unavailable): Promise<GrabrIntelOutput['dns']> {
  const queries: Array<[RecordType | 'DMARC_TXT', RecordType, string]> = [
    ...RECORD_TYPES.map((t) => [t, t, domain] as [RecordType, RecordType, string]),
    ['DMARC_TXT', 'TXT', `_dmarc.${domain}`],
  ];
  const outcomes = await Promise.all(
    queries.map(async ([key, type, name]) => {
      try {
        return { key, value: (await resolver.query(type, name, ctx.signal)) as unknown, code: null as string | null };
      } catch (e) {
        return { key, value: null, code: errorCode(e) || 'EUNKNOWN' };
      }
    }),
  );
  if (ctx.signal.aborted) throw new AppError('timeout', `${TOOL} was cancelled while resolving ${domain}`);
  if (outcomes.every((o) => o.code !== null && UNREACHABLE_CODES.has(o.code)))
    throw new AppError('tool_unavailable', 'DNS resolver unreachable', { reason: 'dns_unreachable' });
  const dns: GrabrIntelOutput['dns'] = { A: [], AAAA: [], MX: [], NS: [], TXT: [], DMARC_TXT: [] };
  const failed: string[] = [];
  for (const o of outcomes) {
    if (o.code === null) (dns as unknown as Record<string, unknown>)[o.key] = o.value;
    else if (!ABSENT_CODES.has(o.code)) failed.push(`${o.key === 'DMARC_TXT' ? `TXT _dmarc.${domain}` : o.key}: ${DNS_ERROR_TEXT[o.code] ?? o.code}`);
  }
  (dns.MX as RecordMap['MX']).sort((a, b) => a.priority - b.priority || a.exchange.localeCompare(b.exchange));
  if (failed.length) unavailable.push({ part: 'dns', reason: failed.join('; ') });
  if (failed.some((f) => f.startsWith('TXT'))) unavailable.push({ part: 'email_auth', reason: 'a TXT lookup failed, so SPF or DMARC may be missing' });
  return dns;
}

async function readTls(
  originUrl: URL,
  domain: string,
  ctx: ToolContext,
  resolver: ReturnType<typeof dnsOf>,
  unavailable: Unavailable,
): Promise<TlsInfo | null> {
  // The certificate is read where the site serves https: the origin's port when it is https, else 443.
  const target = new URL(originUrl.protocol === 'https:' ? originUrl.origin : `https://${originUrl.host.replace(/:\d+$/, '')}`);
  try {
    const dest = await vetDestination(target, { config: ctx.config, resolver, signal: ctx.signal, tool: TOOL });
    const release = await acquireHostSlot(target.host, ctx.config.WEB_PER_HOST, ctx.signal);
    try {
      return await probeTls(dest, { servername: domain, timeoutMs: TLS_TIMEOUT_MS, signal: ctx.signal, tool: TOOL });
    } finally {
      release();
    }
  } catch (e) {
    if (e instanceof AppError && e.code === 'timeout') throw e;
    unavailable.push({ part: 'tls', reason: e instanceof Error ? e.message : String(e) });
    return null;
  }
}

const REDIRECTS = new Set([301, 302, 303, 307, 308]);
const MAX_HOPS = 5;

/**
 * The home page as GRABR_USER_AGENT, redirects followed here (at most 5) so that robots.txt is asked
 * before every hop (the shared robots module: a hop into a disallowed path is robots_disallowed and is
 * never requested). The first hop was allowed by the robots.txt read above.
 */
async function readHome(
  originUrl: URL,
  ctx: ToolContext,
  http: ReturnType<typeof guardedHttpOf>,
  ua: string,
  unavailable: Unavailable,
): Promise<GuardedResponse | null> {
  const home = new URL('/', originUrl).href;
  const robots = createRobots(ctx, TOOL);
  const hops: GuardedResponse['redirects'] = [];
  let current = home;
  try {
    for (;;) {
      const res = await http.fetch(current, {
        maxBytes: PAGE_MAX_BYTES,
        headers: { 'user-agent': ua },
        followRedirects: false,
        skipBody: (mime, status) => (status >= 300 && status < 400) || (mime !== null && mime !== 'text/html' && mime !== 'application/xhtml+xml'),
      });
      const location = res.headers['location'];
      if (!REDIRECTS.has(res.status) || !location) return { ...res, url: home, redirects: hops };
      if (hops.length >= MAX_HOPS)
        throw new AppError('fetch_failed', `${TOOL} stopped after ${MAX_HOPS} redirects (last from ${current})`, { reason: 'too_many_redirects' });
      let next: URL;
      try {
        next = new URL(location, current);
      } catch {
        throw new AppError('fetch_failed', `${new URL(current).host} redirected to an invalid URL`, { reason: 'bad_redirect' });
      }
      if (next.protocol !== 'http:' && next.protocol !== 'https:')
        throw new AppError('fetch_failed', `${new URL(current).host} redirected to a non-HTTP URL`, { reason: 'bad_redirect' });
      next.hash = '';
      next.username = '';
      next.password = '';
      hops.push({ url: current, status: res.status, location: next.href });
      await robots.assertAllowed(next.href);
      current = next.href;
    }
  } catch (e) {
    if (e instanceof AppError && (e.code === 'timeout' || e.code === 'invalid_input' || e.code === 'robots_disallowed')) throw e;
    unavailable.push({ part: 'http', reason: e instanceof Error ? e.message : String(e) });
    return null;
  }
}

async function readRdap(domain: string, wanted: boolean, ctx: ToolContext, unavailable: Unavailable): Promise<Rdap | null> {
  const base = ctx.config.RDAP_BASE_URL;
  if (!wanted || !base) return null;
  const url = new URL(`domain/${encodeURIComponent(domain)}`, base.endsWith('/') ? base : `${base}/`);
  const signal = AbortSignal.any([ctx.signal, AbortSignal.timeout(RDAP_TIMEOUT_MS)]);
  try {
    // RDAP_BASE_URL is the operator's choice (like the search upstream), so it is called directly.
    const res = await request(url, { method: 'GET', signal, headers: { accept: 'application/rdap+json, application/json;q=0.9' } });
    if (res.statusCode === 404) {
      res.body.on('error', () => {}).destroy();
      return { found: false, handle: null, ldh_name: null, registrar: null, status: [], registered: null, expires: null, last_changed: null, nameservers: [] };
    }
    if (res.statusCode < 200 || res.statusCode >= 300) {
      res.body.on('error', () => {}).destroy();
      unavailable.push({ part: 'rdap', reason: `RDAP answered ${res.statusCode}` });
      return null;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > RDAP_MAX_BYTES) {
        res.body.on('error', () => {}).destroy();
        unavailable.push({ part: 'rdap', reason: 'the RDAP answer was larger than 1 MiB' });
        return null;
      }
      chunks.push(chunk);
    }
    return parseRdap(JSON.parse(Buffer.concat(chunks).toString('utf8')));
  } catch (e) {
    if (ctx.signal.aborted) throw new AppError('timeout', `${TOOL} was cancelled while RDAP answered`);
    unavailable.push({
      part: 'rdap',
      reason: signal.aborted
        ? `no RDAP answer within ${RDAP_TIMEOUT_MS} ms`
        : e instanceof SyntaxError
          ? 'the RDAP answer was not JSON'
          : `RDAP unreachable (${errorCode(e) || (e as Error).message})`,
    });
    return null;
  }
}

/** The parts of an RDAP domain object (RFC 9083) worth reporting. */
export function parseRdap(body: unknown): Rdap {
  const o = (body && typeof body === 'object' ? body : {}) as Record<string, unknown>;
  const str = (v: unknown) => (typeof v === 'string' ? v : null);
  const events = Array.isArray(o['events']) ? (o['events'] as Array<Record<string, unknown>>) : [];
  const event = (action: string) => str(events.find((e) => e && e['eventAction'] === action)?.['eventDate']);
  const entities = Array.isArray(o['entities']) ? (o['entities'] as Array<Record<string, unknown>>) : [];
  const registrarEntity = entities.find((e) => Array.isArray(e?.['roles']) && (e['roles'] as unknown[]).includes('registrar'));
  let registrar: string | null = null;
  const vcard = registrarEntity?.['vcardArray'];
  if (Array.isArray(vcard) && Array.isArray(vcard[1])) {
    const fn = (vcard[1] as unknown[]).find((p) => Array.isArray(p) && p[0] === 'fn') as unknown[] | undefined;
    registrar = str(fn?.[3]);
  }
  registrar ??= str(registrarEntity?.['handle']);
  const ns = Array.isArray(o['nameservers']) ? (o['nameservers'] as Array<Record<string, unknown>>) : [];
  return {
    found: true,
    handle: str(o['handle']),
    ldh_name: str(o['ldhName']),
    registrar,
    status: Array.isArray(o['status']) ? (o['status'] as unknown[]).filter((s): s is string => typeof s === 'string').slice(0, 30) : [],
    registered: event('registration'),
    expires: event('expiration'),
    last_changed: event('last changed'),
    nameservers: ns
      .map((n) => str(n?.['ldhName']))
      .filter((n): n is string => !!n)
      .map((n) => n.toLowerCase())
      .slice(0, 30),
  };
}
