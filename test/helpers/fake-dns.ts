import dgram from 'node:dgram';
import { once } from 'node:events';
import dnsPacket from 'dns-packet';

/**
 * A DNS server fake for web group A's tests, built on dns-packet: UDP on 127.0.0.1, answering the
 * records a test sets (A, AAAA, MX, NS, TXT, CNAME). Use it with DNS_SERVERS=<fake.address>.
 * A name the test never set answers NXDOMAIN; a set name without records of the asked type answers
 * NOERROR with no answers (NODATA). Every question is logged as "TYPE name".
 */

export interface FakeDnsRecords {
  A?: string[];
  AAAA?: string[];
  MX?: Array<{ exchange: string; priority: number }>;
  NS?: string[];
  /** One string per TXT record; a record longer than 255 bytes is split into character-strings as servers do. */
  TXT?: string[];
  CNAME?: string;
  /** Answer every question for this name with this rcode (SERVFAIL, REFUSED...). */
  rcode?: 'SERVFAIL' | 'REFUSED' | 'NXDOMAIN';
}

export interface FakeDns {
  /** 127.0.0.1:<port>, for DNS_SERVERS. */
  address: string;
  port: number;
  /** Sets (replaces) a name's records. Names are case-insensitive, without the trailing dot. */
  set(name: string, records: FakeDnsRecords): void;
  queries: string[];
  close(): Promise<void>;
}

const RCODE = { NOERROR: 0, NXDOMAIN: 3, SERVFAIL: 2, REFUSED: 5 } as const;

function txtChunks(s: string): Buffer[] {
  const bytes = Buffer.from(s, 'utf8');
  const out: Buffer[] = [];
  for (let i = 0; i < bytes.length || i === 0; i += 255) out.push(bytes.subarray(i, i + 255));
  return out;
}

export async function startDnsFake(initial: Record<string, FakeDnsRecords> = {}): Promise<FakeDns> {
  const zone = new Map<string, FakeDnsRecords>(Object.entries(initial).map(([k, v]) => [k.toLowerCase().replace(/\.$/, ''), v]));
  const queries: string[] = [];
  const socket = dgram.createSocket('udp4');
  socket.on('message', (msg, rinfo) => {
    let query: dnsPacket.Packet;
    try {
      query = dnsPacket.decode(msg);
    } catch {
      return;
    }
    const q = query.questions?.[0];
    if (!q) return;
    const name = q.name.toLowerCase().replace(/\.$/, '');
    queries.push(`${q.type} ${name}`);
    const entry = zone.get(name);
    const answers: dnsPacket.Answer[] = [];
    let rcode: number = RCODE.NOERROR;
    if (!entry) rcode = RCODE.NXDOMAIN;
    else if (entry.rcode) rcode = RCODE[entry.rcode];
    else {
      const base = { name: q.name, ttl: 60, class: 'IN' as const };
      if (entry.CNAME && q.type !== 'CNAME') answers.push({ ...base, type: 'CNAME', data: entry.CNAME });
      switch (q.type) {
        case 'A':
          for (const ip of entry.A ?? []) answers.push({ ...base, type: 'A', data: ip });
          break;
        case 'AAAA':
          for (const ip of entry.AAAA ?? []) answers.push({ ...base, type: 'AAAA', data: ip });
          break;
        case 'MX':
          for (const mx of entry.MX ?? []) answers.push({ ...base, type: 'MX', data: { preference: mx.priority, exchange: mx.exchange } });
          break;
        case 'NS':
          for (const ns of entry.NS ?? []) answers.push({ ...base, type: 'NS', data: ns });
          break;
        case 'TXT':
          for (const t of entry.TXT ?? []) answers.push({ ...base, type: 'TXT', data: txtChunks(t) });
          break;
        default:
          break;
      }
    }
    const reply = dnsPacket.encode({
      type: 'response',
      id: query.id ?? 0,
      // Authoritative, recursion desired copied, recursion available, and the rcode in the low bits.
      flags: dnsPacket.AUTHORITATIVE_ANSWER | ((query.flags ?? 0) & dnsPacket.RECURSION_DESIRED) | dnsPacket.RECURSION_AVAILABLE | rcode,
      questions: [q],
      answers,
    });
    socket.send(reply, rinfo.port, rinfo.address);
  });
  socket.bind(0, '127.0.0.1');
  await once(socket, 'listening');
  const port = socket.address().port;
  return {
    address: `127.0.0.1:${port}`,
    port,
    set: (name, records) => zone.set(name.toLowerCase().replace(/\.$/, ''), records),
    queries,
    close: async () => {
      socket.close();
      await once(socket, 'close');
    },
  };
}
