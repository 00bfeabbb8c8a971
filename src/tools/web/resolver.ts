import { promises as dns } from 'node:dns';
import { isIP } from 'node:net';
import type { Config } from '../../config.js';
import { AppError } from '../../errors.js';

export const RECORD_TYPES = ['A', 'AAAA', 'MX', 'NS', 'TXT'] as const;
export type RecordType = (typeof RECORD_TYPES)[number];

export interface MxRecord {
  exchange: string;
  priority: number;
}

export interface RecordMap {
  A: string[];
  AAAA: string[];
  MX: MxRecord[];
  NS: string[];
  /** One string per TXT record, its character-strings joined as RFC 7208 reads them. */
  TXT: string[];
}

export interface ResolvedAddress {
  address: string;
  family: 4 | 6;
}

/**
 * A failed lookup, with node:dns's code: ENOTFOUND is NXDOMAIN, ENODATA is "the name exists but has
 * no record of that type"; ETIMEOUT also covers our own deadline.
 */
export class DnsError extends Error {
  constructor(
    readonly code: string,
    readonly hostname: string,
  ) {
    super(`DNS lookup of ${hostname} failed: ${code}`);
    this.name = 'DnsError';
  }
}

/** The name does not exist, or has no record of the asked type. */
export const ABSENT_CODES: ReadonlySet<string> = new Set(['ENOTFOUND', 'ENODATA']);
/** The resolver itself could not be reached or did not answer in time. */
export const UNREACHABLE_CODES: ReadonlySet<string> = new Set(['ETIMEOUT', 'ECONNREFUSED', 'EAI_AGAIN', 'ENETUNREACH', 'EHOSTUNREACH']);

export interface DnsResolver {
  query<T extends RecordType>(type: T, name: string, signal?: AbortSignal): Promise<RecordMap[T]>;
  /** Every A and AAAA address of a name (an IP literal resolves to itself). */
  lookupAddresses(name: string, signal?: AbortSignal): Promise<ResolvedAddress[]>;
}

/**
 * The resolver both web tools share. With DNS_SERVERS set, every query goes to those servers
 * (c-ares); otherwise record queries use the system's configured servers and address lookups use
 * getaddrinfo, so /etc/hosts is honoured just as any other program on the host would see it.
 */
export function createResolver(config: Pick<Config, 'DNS_SERVERS' | 'DNS_TIMEOUT_MS'>): DnsResolver {
  const servers = config.DNS_SERVERS;
  const timeoutMs = config.DNS_TIMEOUT_MS;
  if (servers.length) {
    try {
      new dns.Resolver().setServers(servers);
    } catch {
      throw new AppError('tool_unavailable', 'DNS_SERVERS is not a valid list of ip or ip:port entries');
    }
  }

  const newResolver = () => {
    // Two tries (the second with c-ares' doubled timeout) fit inside the overall deadline.
    const r = new dns.Resolver({ timeout: Math.max(50, Math.ceil(timeoutMs / 3)), tries: 2 });
    if (servers.length) r.setServers(servers);
    return r;
  };

  async function query<T extends RecordType>(type: T, name: string, signal?: AbortSignal): Promise<RecordMap[T]> {
    const r = newResolver();
    const run = async (): Promise<unknown> => {
      switch (type) {
        case 'A':
          return r.resolve4(name);
        case 'AAAA':
          return r.resolve6(name);
        case 'MX':
          return r.resolveMx(name);
        case 'NS':
          return r.resolveNs(name);
        case 'TXT':
          return (await r.resolveTxt(name)).map((chunks) => chunks.join(''));
      }
    };
    return (await withDeadline(run(), name, timeoutMs, signal, () => r.cancel())) as RecordMap[T];
  }

  async function lookupAddresses(name: string, signal?: AbortSignal): Promise<ResolvedAddress[]> {
    const literal = isIP(name);
    if (literal) return [{ address: name, family: literal as 4 | 6 }];

    if (!servers.length) {
      const found = await withDeadline(dns.lookup(name, { all: true, verbatim: true }), name, timeoutMs, signal, () => {});
      return found.map((a) => ({ address: a.address, family: a.family === 6 ? 6 : 4 }));
    }

    const [v4, v6] = await Promise.allSettled([query('A', name, signal), query('AAAA', name, signal)]);
    const addresses: ResolvedAddress[] = [
      ...(v4.status === 'fulfilled' ? v4.value.map((address) => ({ address, family: 4 as const })) : []),
      ...(v6.status === 'fulfilled' ? v6.value.map((address) => ({ address, family: 6 as const })) : []),
    ];
    if (addresses.length) return addresses;
    const errors = [v4, v6].flatMap((s) => (s.status === 'rejected' ? [s.reason as unknown] : []));
    const codes = errors.map(errorCode);
    if (codes.includes('ENOTFOUND')) throw new DnsError('ENOTFOUND', name);
    // Anything that is neither "absent" nor a DnsError (an abort) is more telling than NODATA.
    const telling = errors.find((e) => !ABSENT_CODES.has(errorCode(e)));
    if (telling) throw telling;
    throw new DnsError('ENODATA', name);
  }

  return { query, lookupAddresses };
}

export function errorCode(e: unknown): string {
  return typeof e === 'object' && e !== null && typeof (e as { code?: unknown }).code === 'string' ? (e as { code: string }).code : '';
}

/**
 * Races a lookup against the per-lookup deadline and the caller's signal. c-ares keeps retrying on
 * its own schedule, so on either we cancel its queries too.
 */
function withDeadline<T>(work: Promise<T>, name: string, ms: number, signal: AbortSignal | undefined, cancel: () => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    const finish = () => {
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    };
    const timer = setTimeout(() => {
      if (settled) return;
      finish();
      cancel();
      reject(new DnsError('ETIMEOUT', name));
    }, ms);
    const onAbort = () => {
      if (settled) return;
      finish();
      cancel();
      reject(signal?.reason ?? new Error('aborted'));
    };
    if (signal?.aborted) return onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    work.then(
      (v) => {
        if (settled) return;
        finish();
        resolve(v);
      },
      (e: unknown) => {
        if (settled) return;
        finish();
        const code = errorCode(e);
        reject(new DnsError(code === 'ECANCELLED' ? 'ETIMEOUT' : code || 'EUNKNOWN', name));
      },
    );
  });
}
