import { z } from 'zod';
import { AppError } from '../../errors.js';
import type { DnsResolver } from './resolver.js';
import { createResolver } from './resolver.js';
import { createGuardedHttp } from './guarded-http.js';
import type { GuardedHttp, ToolContext } from '../types.js';

/**
 * Helpers shared by the web tools (web_search, deploy_verify, discovery_collision, grabr_intel,
 * grabr_wayback). Nothing here reads the configuration or opens a connection on import.
 */

export { httpUrlField } from './guarded-http.js';

/** ctx.http, or (a handler called directly, as unit tests do) a guarded client built the way the runner builds it. */
export function guardedHttpOf(ctx: ToolContext, tool: string): GuardedHttp {
  return ctx.http ?? createGuardedHttp({ config: ctx.config, resolver: dnsOf(ctx), tool, signal: ctx.signal, progress: (p) => ctx.progress(p) });
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

// deploy_verify's and grabr_intel's own connectors take the same per-host slots as ctx.http, so
// every request to one host from this process counts against one WEB_PER_HOST bound.
export { acquireHostSlot, hostLoad as hostSlotLoad } from './guarded-http.js';
