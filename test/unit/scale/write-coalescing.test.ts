import { afterEach, describe, expect, it } from 'vitest';
import type { Socket } from 'node:net';
import { inject } from 'vitest';
import { connectCommandRedis, connectRedis, type Redis } from '../../../src/queue/redis.js';

/**
 * src/queue/redis.ts corks a connection's socket at the first command of a pass of the event loop and
 * uncorks it when the pass ends (setImmediate): the pass's commands leave in one write, in order. Checked on the
 * socket itself (how many writes reached it), and again after the connection was killed and reopened.
 */
const opened: Redis[] = [];
afterEach(() => {
  for (const r of opened.splice(0)) r.disconnect();
});

function socketOf(r: Redis): Socket {
  return (r as unknown as { stream: Socket }).stream;
}

/** Counts the writes the socket hands to the system (one `_writev` or `_write` per flush). */
function countFlushes(socket: Socket): { flushes: number; chunks: number } {
  const seen = { flushes: 0, chunks: 0 };
  const s = socket as unknown as { _writev: (chunks: unknown[], cb: () => void) => void; _write: (c: unknown, e: string, cb: () => void) => void };
  const writev = s._writev.bind(socket);
  const write = s._write.bind(socket);
  s._writev = (chunks, cb) => {
    seen.flushes++;
    seen.chunks += chunks.length;
    writev(chunks, cb);
  };
  s._write = (c, e, cb) => {
    seen.flushes++;
    seen.chunks++;
    write(c, e, cb);
  };
  return seen;
}

async function ready(r: Redis): Promise<Redis> {
  opened.push(r);
  if (r.status !== 'ready') await new Promise((res) => r.once('ready', res));
  return r;
}

describe('commands of one event-loop pass leave in one write', () => {
  for (const [name, open] of [
    ['worker connection', () => connectRedis(inject('redisUrl'))],
    ['fail-fast command connection', () => connectCommandRedis(inject('redisUrl'))],
  ] as const) {
    it(`${name}: 50 commands in a turn, one flush, answers in order`, async () => {
      const r = await ready(open());
      const seen = countFlushes(socketOf(r));
      const key = `wc:${Math.random()}`;
      const replies = await Promise.all(Array.from({ length: 50 }, (_, i) => r.rpush(key, String(i))));
      expect(replies).toEqual(Array.from({ length: 50 }, (_, i) => i + 1));
      expect(seen.flushes).toBe(1);
      expect(seen.chunks).toBe(50);
      expect(await r.lrange(key, 0, -1)).toEqual(Array.from({ length: 50 }, (_, i) => String(i)));
      // Awaited one by one: one flush each, nothing held back.
      for (let i = 0; i < 3; i++) await r.get(key + ':none');
      expect(seen.flushes).toBe(5);
      await r.del(key);
    });
  }

  it('a reconnected connection (new socket) is coalesced too and loses nothing', async () => {
    const r = await ready(connectRedis(inject('redisUrl')));
    const first = socketOf(r);
    const id = await r.client('ID');
    const admin = await ready(connectRedis(inject('redisUrl')));
    await admin.client('KILL', 'ID', String(id));
    await new Promise((res) => r.once('ready', res));
    expect(socketOf(r)).not.toBe(first);
    const seen = countFlushes(socketOf(r));
    const out = await Promise.all(Array.from({ length: 20 }, (_, i) => r.echo(`m${i}`)));
    expect(out).toEqual(Array.from({ length: 20 }, (_, i) => `m${i}`));
    expect(seen.flushes).toBe(1);
  });
});
