import dgram from 'node:dgram';
import { once } from 'node:events';
import ipaddr from 'ipaddr.js';

/**
 * A tiny authoritative DNS server over UDP on 127.0.0.1, speaking the real wire format (RFC 1035,
 * AAAA from RFC 3596) so node:dns / c-ares query it exactly as they would a real server.
 * Names missing from the zone get NXDOMAIN; a known name without records of the asked type gets
 * NOERROR with an empty answer (NODATA).
 */
export interface FakeZoneEntry {
  A?: string[];
  AAAA?: string[];
  MX?: Array<{ exchange: string; priority: number }>;
  NS?: string[];
  /** Each record is one or more character-strings (a string longer than 255 bytes is split). */
  TXT?: string[][];
  /** Answer every query for this name with this response code (2 = SERVFAIL, 5 = REFUSED). */
  rcode?: number;
  /** Never answer queries for this name (the client times out). */
  silent?: boolean;
}

export type FakeZone = Record<string, FakeZoneEntry>;

export interface FakeDnsServer {
  /** `127.0.0.1:<port>`, ready for DNS_SERVERS. */
  address: string;
  port: number;
  /** Mutable: tests may change answers between queries (DNS rebinding). */
  zone: FakeZone;
  /** Every question received, as `TYPE name`. */
  queries: string[];
  /** Sets (replaces) a name's records; a TXT given as a plain string is one record of one string. */
  set(name: string, entry: Omit<FakeZoneEntry, 'TXT'> & { TXT?: Array<string | string[]> }): void;
  close(): Promise<void>;
}

const TYPE_CODE = { A: 1, NS: 2, MX: 15, TXT: 16, AAAA: 28 } as const;
type RecordType = keyof typeof TYPE_CODE;
const TYPE_NAME = new Map<number, RecordType>(Object.entries(TYPE_CODE).map(([k, v]) => [v, k as RecordType]));
const TTL = 60;

export async function startFakeDns(zone: FakeZone): Promise<FakeDnsServer> {
  const socket = dgram.createSocket('udp4');
  const queries: string[] = [];
  const server: FakeDnsServer = {
    address: '',
    port: 0,
    zone,
    queries,
    set: (name, entry) => {
      const { TXT, ...rest } = entry;
      server.zone[name.toLowerCase().replace(/\.$/, '')] = { ...rest, ...(TXT ? { TXT: TXT.map((t) => (typeof t === 'string' ? [t] : t)) } : {}) };
    },
    close: async () => {
      socket.close();
      await once(socket, 'close');
    },
  };
  socket.on('message', (msg, rinfo) => {
    const reply = answer(msg, server.zone, queries);
    if (reply) socket.send(reply, rinfo.port, rinfo.address);
  });
  socket.bind(0, '127.0.0.1');
  await once(socket, 'listening');
  server.port = socket.address().port;
  server.address = `127.0.0.1:${server.port}`;
  return server;
}

function answer(msg: Buffer, zone: FakeZone, queries: string[]): Buffer | null {
  if (msg.length < 12 || msg.readUInt16BE(4) < 1) return null;
  const id = msg.readUInt16BE(0);
  const flags = msg.readUInt16BE(2);
  const { name, end } = readName(msg, 12);
  const qtype = msg.readUInt16BE(end);
  const question = msg.subarray(12, end + 4);
  const typeName = TYPE_NAME.get(qtype) ?? `TYPE${qtype}`;
  queries.push(`${typeName} ${name}`);

  const entry = zone[name.toLowerCase()];
  if (entry?.silent) return null;
  let rcode = 0;
  const answers: Buffer[] = [];
  if (!entry) rcode = 3;
  else if (entry.rcode !== undefined) rcode = entry.rcode;
  else {
    const type = TYPE_NAME.get(qtype);
    if (type) for (const rdata of rdataFor(entry, type)) answers.push(resourceRecord(question.subarray(0, end - 12), qtype, rdata));
  }

  const header = Buffer.alloc(12);
  header.writeUInt16BE(id, 0);
  // QR=1, opcode copied, AA=1, RD copied, RA=1, rcode.
  header.writeUInt16BE(0x8000 | (flags & 0x7800) | 0x0400 | (flags & 0x0100) | 0x0080 | rcode, 2);
  header.writeUInt16BE(1, 4);
  header.writeUInt16BE(answers.length, 6);
  return Buffer.concat([header, question, ...answers]);
}

function rdataFor(entry: FakeZoneEntry, type: RecordType): Buffer[] {
  switch (type) {
    case 'A':
    case 'AAAA':
      return (entry[type] ?? []).map((ip) => Buffer.from(ipaddr.parse(ip).toByteArray()));
    case 'NS':
      return (entry.NS ?? []).map(encodeName);
    case 'MX':
      return (entry.MX ?? []).map((mx) => {
        const pref = Buffer.alloc(2);
        pref.writeUInt16BE(mx.priority, 0);
        return Buffer.concat([pref, encodeName(mx.exchange)]);
      });
    case 'TXT':
      return (entry.TXT ?? []).map((parts) =>
        Buffer.concat(
          parts.flatMap((p) => {
            const bytes = Buffer.from(p, 'utf8');
            const chunks: Buffer[] = [];
            for (let i = 0; i < bytes.length || i === 0; i += 255) {
              const c = bytes.subarray(i, i + 255);
              chunks.push(Buffer.from([c.length]), c);
            }
            return chunks;
          }),
        ),
      );
  }
}

function resourceRecord(ownerName: Buffer, type: number, rdata: Buffer): Buffer {
  const fixed = Buffer.alloc(10);
  fixed.writeUInt16BE(type, 0);
  fixed.writeUInt16BE(1, 2); // class IN
  fixed.writeUInt32BE(TTL, 4);
  fixed.writeUInt16BE(rdata.length, 8);
  return Buffer.concat([ownerName, fixed, rdata]);
}

function encodeName(name: string): Buffer {
  const labels = name.replace(/\.$/, '').split('.').filter(Boolean);
  return Buffer.concat([...labels.flatMap((l) => [Buffer.from([Buffer.byteLength(l)]), Buffer.from(l)]), Buffer.from([0])]);
}

/** Queries carry uncompressed names, so no pointer handling is needed. */
function readName(msg: Buffer, offset: number): { name: string; end: number } {
  const labels: string[] = [];
  let i = offset;
  while (i < msg.length && msg[i] !== 0) {
    const len = msg[i]!;
    labels.push(msg.toString('latin1', i + 1, i + 1 + len));
    i += 1 + len;
  }
  return { name: labels.join('.'), end: i + 1 };
}
