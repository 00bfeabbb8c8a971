import { z } from 'zod';
import { AppError } from '../../errors.js';
import type { DnsResolver } from './resolver.js';
import { createResolver } from './resolver.js';
import { createGuardedHttp } from './guarded-http.js';
import type { GuardedHttp, ToolContext } from '../types.js';

/**
 * Helpers shared by web group A's tools (web_search, deploy_verify, discovery_collision, grabr_intel,
 * grabr_wayback). Nothing here reads the configuration or opens a connection on import.
 */

/** An http(s) URL field; a bare host such as "example.com" becomes https://example.com/. Fragments are dropped. */
export function httpUrlField(description: string) {
  return z
    .string()
    .trim()
    .min(1)
    .max(2048)
    .describe(description)
    .transform((raw, ctx) => {
      const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(raw) ? raw : `https://${raw}`;
      let url: URL;
      try {
        url = new URL(withScheme);
      } catch {
        ctx.addIssue({ code: 'custom', message: 'not a valid URL' });
        return z.NEVER;
      }
      if (url.protocol !== 'http:' && url.protocol !== 'https:') {
        ctx.addIssue({ code: 'custom', message: `only http and https URLs are supported, not ${url.protocol.replace(/:$/, '')}` });
        return z.NEVER;
      }
      if (url.username || url.password) {
        ctx.addIssue({ code: 'custom', message: 'URLs with embedded credentials are not accepted' });
        return z.NEVER;
      }
      url.hash = '';
      return url.href;
    });
}

/** ctx.http, or (a handler called directly, as unit tests do) a guarded client built the way the runner builds it. */
export function guardedHttpOf(ctx: ToolContext, tool: string): GuardedHttp {
  return (
    ctx.http ??
    createGuardedHttp({ config: ctx.config, resolver: dnsOf(ctx), tool, signal: ctx.signal, progress: (p) => ctx.progress(p) })
  );
}

export function dnsOf(ctx: ToolContext): DnsResolver {
  return ctx.dns ?? createResolver(ctx.config);
}

/** The cancellation a handler reports when the job's signal fired while it waited. */
export function throwIfAborted(signal: AbortSignal, tool: string): void {
  if (signal.aborted) throw new AppError('timeout', `${tool} was cancelled`);
}

/** Waits `ms`, or less when the signal fires (then throws the cancellation). */
export function sleep(ms: number, signal: AbortSignal, tool: string): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(new AppError('timeout', `${tool} was cancelled`));
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(new AppError('timeout', `${tool} was cancelled`));
    };
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

/** Security headers deploy_verify and grabr_intel report: their values as sent, or null when absent. */
export const SECURITY_HEADERS = [
  'strict-transport-security',
  'content-security-policy',
  'x-content-type-options',
  'x-frame-options',
  'referrer-policy',
  'permissions-policy',
  'cross-origin-opener-policy',
] as const;

export const SecurityHeadersSchema = z.object(
  Object.fromEntries(SECURITY_HEADERS.map((h) => [h, z.string().nullable()])) as Record<(typeof SECURITY_HEADERS)[number], z.ZodNullable<z.ZodString>>,
);
export type SecurityHeaders = z.infer<typeof SecurityHeadersSchema>;

export function securityHeaders(headers: Record<string, string>): SecurityHeaders {
  return Object.fromEntries(SECURITY_HEADERS.map((h) => [h, headers[h] ?? null])) as SecurityHeaders;
}

// At most `limit` connections at once to one host from this process, for group A's own connectors
// (deploy_verify, grabr_intel's TLS probe), which do not go through ctx.http and its limiter.
const slots = new Map<string, { running: number; waiting: Array<() => void> }>();

/** Waits for one of the host's WEB_PER_HOST slots; call the returned function to give it back. */
export async function acquireHostSlot(host: string, limit: number, signal: AbortSignal): Promise<() => void> {
  const key = host.toLowerCase();
  let q = slots.get(key);
  if (!q) {
    q = { running: 0, waiting: [] };
    slots.set(key, q);
  }
  const entry = q;
  if (entry.running >= limit) {
    await new Promise<void>((resolve, reject) => {
      const go = () => {
        signal.removeEventListener('abort', onAbort);
        resolve();
      };
      const onAbort = () => {
        const i = entry.waiting.indexOf(go);
        if (i >= 0) entry.waiting.splice(i, 1);
        reject(signal.reason);
      };
      entry.waiting.push(go);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  } else entry.running += 1;
  let released = false;
  return () => {
    if (released) return;
    released = true;
    const next = entry.waiting.shift();
    if (next) next();
    else {
      entry.running -= 1;
      if (entry.running === 0) slots.delete(key);
    }
  };
}

/** Connections held or awaited for a host (tests). */
export function hostSlotLoad(host: string): number {
  const q = slots.get(host.toLowerCase());
  return q ? q.running + q.waiting.length : 0;
}
