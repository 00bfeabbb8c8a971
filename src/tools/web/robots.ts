import { AppError } from '../../errors.js';
import { runTask } from '../tasks.js';
import type { GuardedResponse, ToolContext } from '../types.js';

/**
 * robots.txt for the grabr_* tools. Every grabr_* request goes through `grabrFetch`, which asks this
 * module first: a path that robots.txt disallows for config.GRABR_USER_AGENT is never requested and
 * the tool (or the batch item) fails with `robots_disallowed` (403).
 *
 * Per RFC 9309: robots.txt is fetched once per origin per call (cached for the call only, failures too), through
 * ctx.http (SSRF guard, redirects followed and re-vetted, at most ROBOTS_MAX_BYTES read);
 * an answer in 4xx (404...) means everything is allowed; 5xx means nothing is (the site is
 * "unreachable", RFC 9309 §2.3.1.4); a network failure fails the request like any fetch would.
 * Rules are parsed and matched by robots-parser in the sandbox pool (robots-task.ts).
 */

/** robots.txt is read up to 500 KiB, as RFC 9309 §2.5 allows (and Google does). */
export const ROBOTS_MAX_BYTES = 500 * 1024;
const MAX_REDIRECTS = 5;

type RobotsFile = { robotsUrl: string; policy: 'allow_all' | 'disallow_all' | 'rules'; text: string };

export interface Robots {
  /** Throws robots_disallowed unless GRABR_USER_AGENT may fetch `url`. */
  assertAllowed(url: string): Promise<void>;
  /** Whether each URL may be fetched (one robots.txt fetch per origin, one pool task per origin). */
  allowedMany(urls: string[]): Promise<boolean[]>;
  /** The Sitemap: lines of the robots.txt of `url`'s origin (empty when there is none). */
  sitemaps(url: string): Promise<string[]>;
}

/** The per-call robots.txt view of a tool (create one per handler call). */
export function createRobots(ctx: ToolContext, tool: string): Robots {
  const files = new Map<string, Promise<RobotsFile>>();
  const decisions = new Map<string, boolean>();

  const fileFor = (origin: string): Promise<RobotsFile> => {
    let f = files.get(origin);
    if (!f) {
      f = loadRobots(ctx, origin);
      files.set(origin, f);
      // A failure (the site unreachable, a refused address) is this call's answer for the origin too:
      // fifty URLs of a dead host cost one timeout, not fifty. Marked handled; each asker rethrows it.
      f.catch(() => {});
    }
    return f;
  };

  const allowedMany = async (urls: string[]): Promise<boolean[]> => {
    const out: boolean[] = new Array<boolean>(urls.length);
    const byOrigin = new Map<string, number[]>();
    urls.forEach((u, i) => {
      const known = decisions.get(u);
      if (known !== undefined) {
        out[i] = known;
        return;
      }
      const origin = new URL(u).origin;
      const list = byOrigin.get(origin) ?? [];
      list.push(i);
      byOrigin.set(origin, list);
    });
    for (const [origin, idx] of byOrigin) {
      const file = await fileFor(origin);
      if (file.policy !== 'rules') {
        for (const i of idx) out[i] = file.policy === 'allow_all';
      } else {
        const r = await runTask(ctx, 'robots_check', {
          robotsUrl: file.robotsUrl,
          text: file.text,
          userAgent: ctx.config.GRABR_USER_AGENT,
          urls: idx.map((i) => urls[i]!),
        });
        idx.forEach((i, k) => (out[i] = r.allowed[k]!));
      }
      for (const i of idx) decisions.set(urls[i]!, out[i]!);
    }
    return out;
  };

  return {
    allowedMany,
    assertAllowed: async (url) => {
      const [ok] = await allowedMany([url]);
      if (!ok) {
        const u = new URL(url);
        throw new AppError(
          'robots_disallowed',
          `${tool}: ${u.origin}/robots.txt disallows ${u.pathname}${u.search} for ${ctx.config.GRABR_USER_AGENT}; it was not fetched`,
          { url, user_agent: ctx.config.GRABR_USER_AGENT },
        );
      }
    },
    sitemaps: async (url) => {
      const file = await fileFor(new URL(url).origin);
      if (file.policy !== 'rules') return [];
      const r = await runTask(ctx, 'robots_check', { robotsUrl: file.robotsUrl, text: file.text, userAgent: ctx.config.GRABR_USER_AGENT, urls: [] });
      return r.sitemaps;
    },
  };
}

async function loadRobots(ctx: ToolContext, origin: string): Promise<RobotsFile> {
  const http = requireHttp(ctx);
  const robotsUrl = `${origin}/robots.txt`;
  const res = await http.fetch(robotsUrl, {
    headers: grabrHeaders(ctx, 'text/plain,*/*;q=0.5'),
    maxBytes: ROBOTS_MAX_BYTES,
    followRedirects: true,
  });
  if (res.status >= 500) return { robotsUrl, policy: 'disallow_all', text: '' };
  if (res.status >= 400) return { robotsUrl, policy: 'allow_all', text: '' };
  if (res.status >= 300) return { robotsUrl, policy: 'allow_all', text: '' }; // more than 5 redirects never gets here
  return { robotsUrl, policy: 'rules', text: res.text() };
}

export function requireHttp(ctx: ToolContext): NonNullable<ToolContext['http']> {
  if (!ctx.http) throw new AppError('tool_unavailable', 'this tool needs the guarded HTTP client, which this context lacks');
  return ctx.http;
}

/** Headers of every grabr_* request: GRABR_USER_AGENT overrides the client's default agent. */
export function grabrHeaders(ctx: ToolContext, accept?: string): Record<string, string> {
  return { 'user-agent': ctx.config.GRABR_USER_AGENT, ...(accept ? { accept } : {}) };
}

export interface GrabrFetchOptions {
  maxBytes?: number;
  accept?: string;
  skipBody?: (contentType: string | null, status: number) => boolean;
}

/**
 * A GET of a grabr_* tool: robots.txt is asked before every hop (redirects are followed here, at
 * most 5, so a redirect into a disallowed path is not requested either), then ctx.http fetches it
 * as GRABR_USER_AGENT. The response's `redirects` lists the hops.
 */
export async function grabrFetch(ctx: ToolContext, robots: Robots, url: string, opts: GrabrFetchOptions = {}): Promise<GuardedResponse> {
  const http = requireHttp(ctx);
  const hops: GuardedResponse['redirects'] = [];
  let current = url;
  for (;;) {
    await robots.assertAllowed(current);
    const res = await http.fetch(current, {
      headers: grabrHeaders(ctx, opts.accept),
      followRedirects: false,
      ...(opts.maxBytes !== undefined ? { maxBytes: opts.maxBytes } : {}),
      skipBody: (type, status) => (status >= 300 && status < 400) || (opts.skipBody?.(type, status) ?? false),
    });
    const location = res.headers['location'];
    if (res.status >= 300 && res.status < 400 && [301, 302, 303, 307, 308].includes(res.status) && location) {
      if (hops.length >= MAX_REDIRECTS) {
        throw new AppError('fetch_failed', `stopped after ${MAX_REDIRECTS} redirects (last from ${current})`, { reason: 'too_many_redirects' });
      }
      let next: URL;
      try {
        next = new URL(location, current);
      } catch {
        throw new AppError('fetch_failed', `${new URL(current).host} redirected to an invalid URL`, { reason: 'bad_redirect' });
      }
      if (next.protocol !== 'http:' && next.protocol !== 'https:') {
        throw new AppError('fetch_failed', `${new URL(current).host} redirected to a non-HTTP URL`, { reason: 'bad_redirect' });
      }
      next.hash = '';
      next.username = '';
      next.password = '';
      hops.push({ url: current, status: res.status, location: next.href });
      current = next.href;
      continue;
    }
    return { ...res, url, redirects: hops };
  }
}

/** A page answer the tool cannot use: 404/410 are not_found, other 4xx/5xx fetch_failed (uncharged). */
export function assertPageOk(res: GuardedResponse): void {
  if (res.status < 400) return;
  const where = res.final_url;
  if (res.status === 404 || res.status === 410) throw new AppError('not_found', `${where} answered ${res.status}`, { url: where, status: res.status });
  throw new AppError('fetch_failed', `${where} answered HTTP ${res.status}`, { url: where, status: res.status, reason: 'http_status' });
}
