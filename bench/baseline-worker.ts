/** The baseline's and the anchor's worker: a bare BullMQ worker whose processor does nothing. */
import { Worker } from 'bullmq';

const [queue, prefix, concurrency] = process.argv.slice(2);
const worker = new Worker(queue!, async () => ({ ok: true }), {
  connection: { url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', maxRetriesPerRequest: null } as never,
  prefix: prefix!,
  concurrency: Number(concurrency ?? 50),
});
await worker.waitUntilReady();
process.send?.('ready');
process.on('SIGTERM', () => void worker.close().then(() => process.exit(0)));
