import tls, { type TLSSocket } from 'node:tls';
import { isIP } from 'node:net';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import type { VettedDestination } from './net-guard.js';

/**
 * What deploy_verify and grabr_intel report about a TLS peer: read from the very socket that was
 * connected (pinned to the SSRF guard's vetted addresses), with verification left to report rather
 * than refuse, so an untrusted certificate is `authorized: false` with the reason, never a failure.
 */

export const TlsInfoSchema = z.object({
  protocol: z.string().nullable(),
  /** Issuer's organisation and common name, e.g. "Let's Encrypt / R11". */
  issuer: z.string().nullable(),
  subject: z.string().nullable(),
  /** Subject alternative names as sent, e.g. ["DNS:example.com", "IP Address:127.0.0.1"]. */
  san: z.array(z.string()),
  valid_from: z.string().nullable(),
  valid_to: z.string().nullable(),
  /** Whole days until valid_to (negative once expired). */
  days_left: z.number().int().nullable(),
  /** The chain verified and the name matched. */
  authorized: z.boolean(),
  /** Why not, as OpenSSL / Node name it (e.g. DEPTH_ZERO_SELF_SIGNED_CERT, ERR_TLS_CERT_ALTNAME_INVALID). */
  error: z.string().nullable(),
});
export type TlsInfo = z.infer<typeof TlsInfoSchema>;

const DAY_MS = 86_400_000;

function dn(part: unknown): string | null {
  if (!part || typeof part !== 'object') return null;
  const o = part as Record<string, string | string[] | undefined>;
  const pick = (k: string) => (Array.isArray(o[k]) ? (o[k] as string[]).join(', ') : (o[k] as string | undefined));
  const bits = [pick('O'), pick('CN')].filter((x): x is string => !!x);
  return bits.length ? bits.join(' / ') : null;
}

/** Reads the peer certificate and verification outcome of a socket that finished its handshake. */
export function tlsInfoOf(socket: TLSSocket, now = Date.now()): TlsInfo {
  const cert = socket.getPeerCertificate();
  const has = cert && Object.keys(cert).length > 0;
  const validTo = has && cert.valid_to ? new Date(cert.valid_to) : null;
  const validFrom = has && cert.valid_from ? new Date(cert.valid_from) : null;
  const err = socket.authorizationError as unknown;
  return {
    protocol: socket.getProtocol() ?? null,
    issuer: has ? dn(cert.issuer) : null,
    subject: has ? dn(cert.subject) : null,
    san: has && cert.subjectaltname ? cert.subjectaltname.split(/,\s*/).filter(Boolean) : [],
    valid_from: validFrom && !Number.isNaN(validFrom.getTime()) ? validFrom.toISOString() : null,
    valid_to: validTo && !Number.isNaN(validTo.getTime()) ? validTo.toISOString() : null,
    days_left: validTo && !Number.isNaN(validTo.getTime()) ? Math.floor((validTo.getTime() - now) / DAY_MS) : null,
    authorized: socket.authorized === true,
    error: socket.authorized ? null : err ? String(err instanceof Error ? ((err as NodeJS.ErrnoException).code ?? err.message) : err) : 'unverified',
  };
}

/**
 * A TLS handshake with a vetted destination, connecting only to its vetted addresses (in order, the
 * first that accepts), reading the certificate and closing. Network failures are `fetch_failed`.
 */
export async function probeTls(dest: VettedDestination, opts: { servername: string; timeoutMs: number; signal: AbortSignal; tool: string }): Promise<TlsInfo> {
  let last: unknown;
  for (const addr of dest.addresses) {
    try {
      return await handshake(addr.address, dest.port, opts);
    } catch (e) {
      if (opts.signal.aborted) throw new AppError('timeout', `${opts.tool} was cancelled`);
      last = e;
    }
  }
  const code = (last as NodeJS.ErrnoException | undefined)?.code ?? (last as Error | undefined)?.message ?? 'no address';
  throw new AppError('fetch_failed', `${opts.tool} could not complete a TLS handshake with ${dest.hostname}:${dest.port} (${code})`, { reason: 'tls_error' });
}

function handshake(address: string, port: number, opts: { servername: string; timeoutMs: number; signal: AbortSignal }): Promise<TlsInfo> {
  return new Promise((resolve, reject) => {
    const socket = tls.connect({
      host: address,
      port,
      ...(isIP(opts.servername) ? {} : { servername: opts.servername }),
      rejectUnauthorized: false,
      ALPNProtocols: ['http/1.1'],
    });
    const done = (fn: () => void) => {
      clearTimeout(timer);
      opts.signal.removeEventListener('abort', onAbort);
      socket.removeAllListeners('error');
      socket.on('error', () => {});
      socket.destroy();
      fn();
    };
    const timer = setTimeout(() => done(() => reject(Object.assign(new Error('timeout'), { code: 'ETIMEDOUT' }))), opts.timeoutMs);
    const onAbort = () => done(() => reject(new Error('aborted')));
    opts.signal.addEventListener('abort', onAbort, { once: true });
    socket.once('secureConnect', () => {
      const info = tlsInfoOf(socket);
      done(() => resolve(info));
    });
    socket.once('error', (e) => done(() => reject(e)));
  });
}
