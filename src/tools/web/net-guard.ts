/**
 * SSRF guard for tools that reach out to URLs users give them. A destination is judged on the
 * addresses its name resolves to (never on the name), and the connection is then pinned to exactly
 * those addresses, so a DNS answer that changes between check and connect (rebinding) cannot
 * redirect it. Every connection the pinned agent makes must have been vetted first.
 */
import type { LookupAddress, LookupOptions } from 'node:dns';
import { isIP, type Socket } from 'node:net';
import ipaddr from 'ipaddr.js';
import { Agent, buildConnector } from 'undici';
import type { Config } from '../../config.js';
import { AppError } from '../../errors.js';
import { ABSENT_CODES, UNREACHABLE_CODES, errorCode, type DnsResolver, type ResolvedAddress } from './resolver.js';

export type AddressClass =
  | 'unspecified'
  | 'loopback'
  | 'private'
  | 'link_local'
  | 'carrier_grade_nat'
  | 'multicast'
  | 'broadcast'
  | 'reserved'
  | 'documentation'
  | 'benchmarking'
  | 'cloud_metadata';

const CLASS_LABEL: Record<AddressClass, string> = {
  unspecified: 'unspecified',
  loopback: 'loopback',
  private: 'private',
  link_local: 'link-local',
  carrier_grade_nat: 'carrier-grade NAT',
  multicast: 'multicast',
  broadcast: 'broadcast',
  reserved: 'reserved',
  documentation: 'documentation',
  benchmarking: 'benchmarking',
  cloud_metadata: 'cloud metadata',
};

export type AddressVerdict =
  | { allowed: true; address: string }
  | { allowed: false; address: string; addressClass: AddressClass /** e.g. "127.0.0.1 embedded in ::ffff:7f00:1 (IPv4-mapped)" */; detail: string };

type Rule = [range: [ipaddr.IPv4, number] | [ipaddr.IPv6, number], cls: AddressClass];

// First match wins, so the single metadata addresses come before the ranges that contain them.
const V4_RULES: Rule[] = (
  [
    ['169.254.169.254/32', 'cloud_metadata'], // AWS, GCP, Azure, OCI, DigitalOcean, OpenStack
    ['169.254.170.2/32', 'cloud_metadata'], // AWS ECS task metadata
    ['169.254.170.23/32', 'cloud_metadata'], // AWS EKS Pod Identity agent
    ['100.100.100.200/32', 'cloud_metadata'], // Alibaba Cloud
    ['192.0.0.192/32', 'cloud_metadata'], // Oracle Cloud (legacy)
    ['0.0.0.0/8', 'unspecified'],
    ['10.0.0.0/8', 'private'],
    ['100.64.0.0/10', 'carrier_grade_nat'],
    ['127.0.0.0/8', 'loopback'],
    ['169.254.0.0/16', 'link_local'],
    ['172.16.0.0/12', 'private'],
    ['192.0.0.0/24', 'reserved'], // IETF protocol assignments
    ['192.0.2.0/24', 'documentation'],
    ['192.88.99.0/24', 'reserved'], // deprecated 6to4 relay anycast
    ['192.168.0.0/16', 'private'],
    ['198.18.0.0/15', 'benchmarking'],
    ['198.51.100.0/24', 'documentation'],
    ['203.0.113.0/24', 'documentation'],
    ['224.0.0.0/4', 'multicast'],
    ['255.255.255.255/32', 'broadcast'],
    ['240.0.0.0/4', 'reserved'],
  ] as const
).map(([cidr, cls]) => [ipaddr.parseCIDR(cidr), cls] as Rule);

const V6_RULES: Rule[] = (
  [
    ['fd00:ec2::254/128', 'cloud_metadata'], // AWS instance metadata over IPv6
    ['fd00:ec2::23/128', 'cloud_metadata'], // AWS EKS Pod Identity agent over IPv6
    ['::/128', 'unspecified'],
    ['::1/128', 'loopback'],
    ['fc00::/7', 'private'],
    ['fe80::/10', 'link_local'],
    ['fec0::/10', 'private'], // deprecated site-local
    ['ff00::/8', 'multicast'],
    ['100::/64', 'reserved'], // discard-only
    ['2001:db8::/32', 'documentation'],
    ['3fff::/20', 'documentation'],
    ['2001:2::/48', 'benchmarking'],
    ['2001::/23', 'reserved'], // IETF protocol assignments: Teredo, ORCHID, AMT...
    ['5f00::/16', 'reserved'], // SRv6 segment identifiers
  ] as const
).map(([cidr, cls]) => [ipaddr.parseCIDR(cidr), cls] as Rule);

const GLOBAL_UNICAST_V6 = ipaddr.parseCIDR('2000::/3') as [ipaddr.IPv6, number];

/**
 * IPv6 forms that carry an IPv4 address: [prefix, where the v4 sits, whether a public embedded
 * address is reachable this way]. Mapped, NAT64 and 6to4 addresses really do lead to the embedded
 * host, so they are judged by it; the deprecated or local-only forms are refused regardless.
 */
const V6_EMBEDDING: Array<{ range: [ipaddr.IPv6, number]; at: number; kind: string; publicOk: boolean }> = [
  { range: ipaddr.parseCIDR('::ffff:0:0/96') as [ipaddr.IPv6, number], at: 12, kind: 'IPv4-mapped', publicOk: true },
  { range: ipaddr.parseCIDR('64:ff9b::/96') as [ipaddr.IPv6, number], at: 12, kind: 'NAT64', publicOk: true },
  { range: ipaddr.parseCIDR('64:ff9b:1::/48') as [ipaddr.IPv6, number], at: 12, kind: 'local-use NAT64', publicOk: false },
  { range: ipaddr.parseCIDR('2002::/16') as [ipaddr.IPv6, number], at: 2, kind: '6to4', publicOk: true },
  { range: ipaddr.parseCIDR('::ffff:0:0:0/96') as [ipaddr.IPv6, number], at: 12, kind: 'IPv4-translated', publicOk: false },
  // IPv4-compatible (deprecated); :: and ::1 are matched by the plain rules first.
  { range: ipaddr.parseCIDR('::/96') as [ipaddr.IPv6, number], at: 12, kind: 'IPv4-compatible', publicOk: false },
];

function classifyV4(addr: ipaddr.IPv4): AddressClass | null {
  for (const [range, cls] of V4_RULES) if (addr.match(range as [ipaddr.IPv4, number])) return cls;
  return null;
}

/** Whether a connection to this IP (v4 or v6 text form) may be made, and if not, why. */
export function classifyAddress(ip: string): AddressVerdict {
  let text = ip.replace(/^\[|\]$/g, '').replace(/%.*$/, '');
  // ipaddr.js reads any dotted tail as IPv4-mapped ("::8.8.8.8" becomes ::ffff:808:808); the WHATWG
  // parser keeps the bits where they are, as the socket will.
  if (text.includes(':') && text.includes('.')) {
    try {
      text = new URL(`http://[${text}]/`).hostname.slice(1, -1);
    } catch {
      // Left as is: ipaddr.isValid rejects it below.
    }
  }
  if (!ipaddr.isValid(text)) return { allowed: false, address: ip, addressClass: 'reserved', detail: `${ip} is not an IP address` };
  const parsed = ipaddr.parse(text);
  const address = parsed.toString();
  if (parsed.kind() === 'ipv4') {
    const cls = classifyV4(parsed as ipaddr.IPv4);
    return cls ? { allowed: false, address, addressClass: cls, detail: address } : { allowed: true, address };
  }

  const v6 = parsed as ipaddr.IPv6;
  for (const [range, cls] of V6_RULES.slice(0, 4)) {
    if (v6.match(range as [ipaddr.IPv6, number])) return { allowed: false, address, addressClass: cls, detail: address };
  }
  for (const e of V6_EMBEDDING) {
    if (!v6.match(e.range)) continue;
    const bytes = v6.toByteArray();
    const v4 = new ipaddr.IPv4(bytes.slice(e.at, e.at + 4));
    const detail = `${v4.toString()} embedded in ${address} (${e.kind})`;
    const cls = classifyV4(v4);
    if (cls) return { allowed: false, address, addressClass: cls, detail };
    return e.publicOk ? { allowed: true, address } : { allowed: false, address, addressClass: 'reserved', detail };
  }
  for (const [range, cls] of V6_RULES.slice(4)) {
    if (v6.match(range as [ipaddr.IPv6, number])) return { allowed: false, address, addressClass: cls, detail: address };
  }
  // Only 2000::/3 is allocated for global unicast; everything else is unassigned or special.
  if (!v6.match(GLOBAL_UNICAST_V6)) return { allowed: false, address, addressClass: 'reserved', detail: address };
  return { allowed: true, address };
}

export interface VettedDestination {
  /** `host:port` as FETCH_ALLOWED_HOSTS spells it (IPv6 in brackets). */
  hostPort: string;
  /** Host without brackets, as the connector sees it. */
  hostname: string;
  port: number;
  addresses: ResolvedAddress[];
  /** Listed in FETCH_ALLOWED_HOSTS: connected to without judging its addresses. */
  exempt: boolean;
}

export interface GuardDeps {
  config: Pick<Config, 'FETCH_ALLOWED_HOSTS'>;
  resolver: DnsResolver;
  signal?: AbortSignal;
  /** Named in refusal messages. */
  tool: string;
}

export function defaultPort(url: URL): number {
  return url.port ? Number(url.port) : url.protocol === 'https:' ? 443 : 80;
}

/**
 * Resolves a URL's host and checks every address it resolves to. Throws the refusal AppError for a
 * blocked destination, and AppErrors for names that do not resolve or a resolver that is down.
 */
export async function vetDestination(url: URL, deps: GuardDeps): Promise<VettedDestination> {
  const { tool } = deps;
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new AppError('invalid_input', `${tool} only fetches http and https URLs, not ${url.protocol.replace(/:$/, '')}`, {
      reason: 'unsupported_scheme',
    });
  }
  const port = defaultPort(url);
  const hostPort = `${url.hostname}:${port}`;
  const hostname = url.hostname.replace(/^\[|\]$/g, '');
  const exempt = deps.config.FETCH_ALLOWED_HOSTS.includes(hostPort);

  let addresses: ResolvedAddress[];
  try {
    addresses = await deps.resolver.lookupAddresses(hostname, deps.signal);
  } catch (e) {
    const code = errorCode(e);
    if (ABSENT_CODES.has(code)) {
      throw new AppError('tool_failed', `${tool} could not resolve ${url.hostname}: no such domain`, { reason: 'dns_not_found' });
    }
    if (UNREACHABLE_CODES.has(code)) throw new AppError('tool_unavailable', 'DNS resolver unreachable', { reason: 'dns_unreachable' });
    if (code) throw new AppError('tool_failed', `${tool} could not resolve ${url.hostname} (${code})`, { reason: 'dns_error' });
    throw e;
  }

  if (!exempt) {
    const literal = isIP(hostname) !== 0;
    for (const { address } of addresses) {
      const verdict = classifyAddress(address);
      if (!verdict.allowed) {
        // An address the caller wrote is theirs to see, with its class. What a name resolves to is
        // not: naming it (or its class) would let a caller map internal DNS through the refusals.
        if (!literal)
          throw new AppError('invalid_input', `${tool} refused ${url.hostname}: the destination is not allowed (not a public address)`, {
            reason: 'blocked_address',
          });
        throw new AppError('invalid_input', `${tool} refused ${url.hostname}: ${CLASS_LABEL[verdict.addressClass]} address (${verdict.detail})`, {
          reason: 'blocked_address',
          address_class: verdict.addressClass,
        });
      }
    }
  }
  return { hostPort, hostname, port, addresses, exempt };
}

const IPV4_ADDRESS = /\b(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?\b/g;
const IPV6_ADDRESS = /\[?(?:[0-9a-f]{0,4}:){2,7}[0-9a-f]{0,4}(?:%\w+)?\]?(?::\d{1,5})?/gi;

/**
 * `message` (a connection error's, e.g. "connect ECONNREFUSED 203.0.113.5:443") without the IP
 * addresses in it: what a name resolved to is never shown to a caller.
 */
export function withoutAddresses(message: string): string {
  return message.replace(IPV4_ADDRESS, '(address withheld)').replace(IPV6_ADDRESS, (m) => (/[0-9a-f]/i.test(m) ? '(address withheld)' : m));
}

/**
 * An undici dispatcher that only connects to vetted destinations, and only to the addresses the
 * guard approved for them: its lookup never asks DNS again.
 */
export class PinnedAgent {
  readonly dispatcher: Agent;
  private readonly pins = new Map<string, ResolvedAddress[]>();
  private readonly connectors = new Map<string, buildConnector.connector>();

  /**
   * `rejectUnauthorized: false` connects to TLS peers whose certificate does not verify (the socket's
   * `authorized` and `authorizationError` still say so), for tools that report on certificates rather
   * than read through them. `onSocket` sees each new socket before it connects (deploy_verify times the
   * phases and reads the peer certificate from it). Neither changes which addresses are reached.
   */
  constructor(opts: { connectTimeoutMs: number; rejectUnauthorized?: boolean; onSocket?: (socket: Socket, key: string) => void }) {
    const connect: buildConnector.connector = (options, callback) => {
      const port = Number(options.port) || (options.protocol === 'https:' ? 443 : 80);
      const key = `${options.hostname}:${port}`;
      if (!this.pins.has(key)) {
        callback(new Error(`connection to ${key} was not vetted by the SSRF guard`), null);
        return;
      }
      let connector = this.connectors.get(key);
      if (!connector) {
        connector = buildConnector({
          timeout: opts.connectTimeoutMs,
          lookup: this.lookupFor(key),
          ...(opts.rejectUnauthorized === false ? { rejectUnauthorized: false } : {}),
        });
        this.connectors.set(key, connector);
      }
      const socket = connector(options, callback) as unknown as Socket | undefined;
      if (socket && opts.onSocket) opts.onSocket(socket, key);
    };
    this.dispatcher = new Agent({ connect });
  }

  pin(dest: VettedDestination): void {
    this.pins.set(`${dest.hostname}:${dest.port}`, dest.addresses);
  }

  async close(): Promise<void> {
    await this.dispatcher.destroy();
  }

  private lookupFor(key: string) {
    return (
      _hostname: string,
      options: LookupOptions,
      callback: (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void,
    ): void => {
      const wanted = options.family === 4 || options.family === 'IPv4' ? 4 : options.family === 6 || options.family === 'IPv6' ? 6 : 0;
      const list = (this.pins.get(key) ?? []).filter((a) => !wanted || a.family === wanted);
      if (!list.length) {
        const err: NodeJS.ErrnoException = new Error(`no vetted address for ${key}`);
        err.code = 'ENOTFOUND';
        callback(err, '', 0);
        return;
      }
      if (options.all)
        callback(
          null,
          list.map((a) => ({ address: a.address, family: a.family })),
        );
      else callback(null, list[0]!.address, list[0]!.family);
    };
  }
}
