import { createSocket, type Socket } from 'node:dgram';
import { isIPv4 } from 'node:net';
import ipaddr from 'ipaddr.js';

/**
 * A tiny authoritative DNS server on 127.0.0.1 (UDP) for deterministic lookups in tests: names in
 * `hosts` answer their A/AAAA addresses, every other name is NXDOMAIN.
 */
export class FakeDns {
  private socket!: Socket;
  port = 0;
  readonly queries: string[] = [];

  constructor(private readonly hosts: Record<string, string[]>) {}

  get server(): string {
    return `127.0.0.1:${this.port}`;
  }

  async start(): Promise<this> {
    this.socket = createSocket('udp4');
    this.socket.on('message', (msg, rinfo) => {
      const reply = this.answer(msg);
      if (reply) this.socket.send(reply, rinfo.port, rinfo.address);
    });
    await new Promise<void>((resolve) => this.socket.bind(0, '127.0.0.1', resolve));
    this.port = this.socket.address().port;
    return this;
  }

  async close(): Promise<void> {
    await new Promise<void>((resolve) => this.socket.close(() => resolve()));
  }

  private answer(msg: Buffer): Buffer | null {
    if (msg.length < 12) return null;
    let off = 12;
    const labels: string[] = [];
    while (off < msg.length && msg[off] !== 0) {
      const len = msg[off]!;
      labels.push(msg.subarray(off + 1, off + 1 + len).toString('ascii'));
      off += len + 1;
    }
    off += 1;
    const qtype = msg.readUInt16BE(off);
    const question = msg.subarray(12, off + 4);
    const name = labels.join('.').toLowerCase();
    this.queries.push(name);
    const known = this.hosts[name];
    const addrs = (known ?? []).filter((a) => (qtype === 1 ? isIPv4(a) : qtype === 28 ? !isIPv4(a) : false));
    const header = Buffer.alloc(12);
    header.writeUInt16BE(msg.readUInt16BE(0), 0);
    header.writeUInt16BE(0x8180 | (known ? 0 : 3), 2);
    header.writeUInt16BE(1, 4);
    header.writeUInt16BE(addrs.length, 6);
    const answers = addrs.map((a) => {
      const rdata = Buffer.from(ipaddr.parse(a).toByteArray());
      const rr = Buffer.alloc(12);
      rr.writeUInt16BE(0xc00c, 0);
      rr.writeUInt16BE(qtype, 2);
      rr.writeUInt16BE(1, 4);
      rr.writeUInt32BE(60, 6);
      rr.writeUInt16BE(rdata.length, 10);
      return Buffer.concat([rr, rdata]);
    });
    return Buffer.concat([header, question, ...answers]);
  }
}
