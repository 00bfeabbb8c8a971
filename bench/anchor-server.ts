/**
 * The bench's anchor (issue #20): the service's HTTP front with nothing behind it but the queue.
 * Same Fastify, created with the options src/app.ts gives it (logger off, the connection options,
 * BODY_LIMIT, request ids, the project's JSON body parser with its depth cap, the x-request-id
 * header), and one route, `POST /tools/compute`, that checks a bearer header is present (no lookup),
 * then `Queue.add` + `job.waitUntilFinished(QueueEvents)` and answers the job's return value as JSON.
 * Its worker is bench/baseline-worker.ts (a no-op BullMQ Worker) in another process.
 *
 * Env: BENCH_ANCHOR_PORT, BENCH_ANCHOR_QUEUE, BENCH_ANCHOR_PREFIX, REDIS_URL.
 */
import { randomUUID } from 'node:crypto';
import Fastify from 'fastify';
import { Queue, QueueEvents } from 'bullmq';
import { loadConfig } from '../src/config.js';
import { connectionOptions } from '../src/faces/http/plugins/connections.js';
import { installJsonBodyParser } from '../src/faces/http/plugins/json-body.js';
import { connectCommandRedis } from '../src/queue/redis.js';

const config = loadConfig(process.env, { LOG_LEVEL: 'warn' });
const port = Number(process.env.BENCH_ANCHOR_PORT ?? 18_080);
const queueName = process.env.BENCH_ANCHOR_QUEUE ?? 'bench-anchor';
const prefix = process.env.BENCH_ANCHOR_PREFIX ?? 'bench';
const REQUEST_ID_RE = /^[A-Za-z0-9._:-]{8,128}$/;

const app = Fastify({
  logger: false,
  ...connectionOptions(config),
  bodyLimit: config.BODY_LIMIT,
  genReqId: (req) => {
    const given = req.headers['x-request-id'];
    return typeof given === 'string' && REQUEST_ID_RE.test(given) ? given : randomUUID();
  },
});
app.addHook('onSend', async (req, reply) => {
  reply.header('x-request-id', req.id);
});
installJsonBodyParser(app as never, config.MAX_JSON_DEPTH);

// Like the API: BullMQ's Queue on the fail-fast command connection, QueueEvents on its own.
const queue = new Queue(queueName, { connection: connectCommandRedis(config.REDIS_URL), prefix });
const events = new QueueEvents(queueName, { connection: { url: config.REDIS_URL } as never, prefix });
// waitUntilFinished listens for the queue's closing once per job in flight.
queue.setMaxListeners(0);
await events.waitUntilReady();
// The service's retention for jobs without an edge token (src/queue/queues.ts).
const jobOptions = { removeOnComplete: { age: 24 * 3600, count: 50_000 }, removeOnFail: { age: 24 * 3600, count: 50_000 } };

app.get('/health', async () => ({ status: 'ok' }));
app.post('/tools/compute', async (req, reply) => {
  const auth = req.headers.authorization;
  if (typeof auth !== 'string' || !auth.startsWith('Bearer ') || auth.length < 8) {
    return reply.code(401).send({ error: { code: 'unauthorized', message: 'bearer key required' } });
  }
  const job = await queue.add('compute', req.body, jobOptions);
  const result = await job.waitUntilFinished(events);
  return { result };
});

await app.listen({ port, host: '127.0.0.1' });

const stop = async () => {
  await app.close();
  await events.close();
  await queue.close();
  process.exit(0);
};
process.on('SIGTERM', () => void stop());
process.on('SIGINT', () => void stop());
