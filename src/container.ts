import pg from 'pg';
import type { Logger } from 'pino';
import { ConfigError, FAMILIES, type Config, type Family } from './config.js';
import { openPool, type DatabasePool } from './db/pool.js';
import { AccountsRepo } from './access/accounts.js';
import { connectCommandRedis, connectRedis, type Redis } from './queue/redis.js';
import { JobQueues } from './queue/queues.js';
import { CompletionDispatcher } from './queue/dispatcher.js';
import { JobRecords } from './queue/job-records.js';
import { resultRefs } from './queue/result-refs.js';
import { jobSeal } from './queue/job-seal.js';
import { decodeFailure } from './queue/failure.js';
import { WorkerPool, dropJobInput } from './calls/worker-pool.js';
import { JobEventLog, eventLogTtl } from './queue/job-events.js';
import { CreditReservations } from './money/holds.js';
import { Reconciler } from './money/reconciler.js';
import { Settler } from './money/settlement.js';
import { ResultsStore } from './money/results.js';
import { EdgeTokenSealer } from './access/edge-token.js';
import { ToolRunner } from './calls/runner.js';
import { SandboxPool } from './sandbox/pool.js';
import { isolatedModules } from './tools/index.js';
import { KeyAuthenticator } from './access/auth.js';
import { CallService } from './calls/admission.js';
import { RateLimiter } from './access/rate-limit.js';
import { Idempotency } from './calls/idempotency.js';
import { PayPerCall } from './calls/pay-per-call.js';
import { DEFERRED_WARNING, createSettler } from './pay/x402/settler.js';
import { SettlerStartupError } from './pay/x402/settle-types.js';
import { PaymentReconciler, settlementLookup } from './pay/x402/reconcile.js';
import { InFlightSlots, slotOwner } from './access/in-flight.js';
import { Metrics } from './ops/metrics.js';
import { workerCounts } from './queue/heartbeat.js';
import { Webhooks } from './calls/webhooks.js';
import { Alerts } from './calls/alerts.js';
import { IntentReconciler, IntentStore, IntentWriter, deploymentOf } from './calls/intents.js';
import { createUsageExporter, type UsageExporter } from './pay/export/index.js';

export interface Container {
  config: Config;
  log: Logger;
  pool: DatabasePool;
  redis: Redis;
  accounts: AccountsRepo;
  credits: CreditReservations;
  sealer: EdgeTokenSealer;
  queues: JobQueues;
  records: JobRecords;
  runner: ToolRunner;
  settler: Settler;
  /** Stored answers of keyed calls (job_results): GET /jobs, redeliveries, pruning. */
  results: ResultsStore;
  slots: InFlightSlots;
  /** Repairs Redis's money state after crashes (holds, avail, sub-key months, in-flight slots). */
  reconciler: Reconciler;
  /** Marks jobs Redis lost as lost (src/calls/intents.ts). */
  intents: IntentReconciler;
  /** This process's Prometheus registry and metrics (src/ops/metrics.ts). */
  metrics: Metrics;
  /** Present in processes that serve HTTP. */
  api?: {
    dispatcher: CompletionDispatcher;
    auth: KeyAuthenticator;
    calls: CallService;
    limiter: RateLimiter;
    idempotency: Idempotency;
    payPerCall?: PayPerCall;
    /** Completes or releases x402 payments a crash left reserved (src/pay/x402/reconcile.ts). */
    payments?: PaymentReconciler;
    /** Sends the ledger to the configured billing systems, one replica at a time (src/pay/export). */
    exporter?: UsageExporter;
  };
  workers?: WorkerPool;
  /** Callback-Url checks, signing secrets, and the delivery queue (its worker runs where tool workers do). */
  webhooks?: Webhooks;
  /** Spend alerts (PUT /alerts), checked after every settlement batch that charged. */
  alerts?: Alerts;
  close(): Promise<void>;
}

export interface ContainerOptions {
  api: boolean;
  /** Families whose worker pools run in this process. */
  workerFamilies: readonly Family[];
}

/** Wires every service for one process. Tests build one per suite with a fresh Redis prefix. */
export async function createContainer(config: Config, log: Logger, opts: ContainerOptions): Promise<Container> {
  const pool = await openPool(config.DATABASE_URL, { maximumPoolSize: 10 });
  // The API's command connection fails fast (no offline queue, bounded retries and time): a call that
  // cannot reserve or enqueue is answered 503 at once, and nothing it sent can run later. A process
  // running only workers keeps BullMQ's patient settings, so a job in hand settles once Redis is back.
  const redis = opts.api ? connectCommandRedis(config.REDIS_URL) : connectRedis(config.REDIS_URL);
  let lastRedisError = 0;
  redis.on('error', (err: Error) => {
    if (Date.now() - lastRedisError < 5_000) return;
    lastRedisError = Date.now();
    log.warn({ err: err.message }, 'redis connection error');
  });
  const accounts = new AccountsRepo(pool);
  const credits = new CreditReservations(redis, config.REDIS_PREFIX, accounts);
  const sealer = new EdgeTokenSealer(config);
  const queues = new JobQueues(redis, config);
  const records = new JobRecords(redis, config.REDIS_PREFIX);
  const settlePool = new pg.Pool({ connectionString: config.DATABASE_URL, max: 2 });
  settlePool.on('error', (err) => log.warn({ err: err.message }, 'settlement connection error'));
  const metrics = new Metrics();
  const settler = new Settler(settlePool, credits, log, config.SETTLE_BATCH_MS, config.SETTLE_BATCH_MAX, config.RESULT_MAX_BYTES, metrics);
  // Sensitive tools' answers are sealed in Redis and job_results; these open them for their readers.
  const seal = jobSeal(config);
  const results = new ResultsStore(pool, { days: config.JOB_RESULT_DAYS, redis, prefix: config.REDIS_PREFIX, log, seal });
  // Large answers are held once (job_results, or an x402 call's job record), BullMQ keeps a reference to them.
  const refs = resultRefs(results, records, seal);
  queues.refs = records.refs = refs;
  // Threads for CPU work on caller input (src/sandbox/pool.ts). A process running workers starts one
  // with its isolated tools' modules loaded, so the first call does not wait for them; the rest start on use.
  const sandbox = new SandboxPool(config, log, { preload: isolatedModules(opts.workerFamilies) });
  const runner = new ToolRunner({ config, log, accounts, credits, settler, results, sealer, sandbox, redis });
  const closers: Array<() => Promise<unknown>> = [];
  const slots = new InFlightSlots(redis, config, (ids) => queues.liveJobs(ids));
  const reconciler = new Reconciler({
    redis,
    pool,
    prefix: config.REDIS_PREFIX,
    log,
    credits,
    slots,
    liveJobs: (ids) => queues.liveJobs(ids),
    intervalSeconds: config.RECONCILE_SECONDS,
  });
  const intents = new IntentReconciler({
    pool,
    redis,
    prefix: config.REDIS_PREFIX,
    log,
    records,
    credits,
    slots,
    graceMs: config.INTENT_GRACE_MS,
    intervalSeconds: config.RECONCILE_SECONDS,
    days: config.JOB_RESULT_DAYS,
  });

  const c: Container = {
    config,
    log,
    pool,
    redis,
    accounts,
    credits,
    sealer,
    queues,
    records,
    runner,
    settler,
    results,
    slots,
    reconciler,
    intents,
    metrics,
    close: async () => {
      for (const close of closers.reverse()) await close().catch((err) => log.warn({ err }, 'error while closing'));
      metrics.close();
    },
  };
  closers.push(
    () => pool.end(),
    () => settlePool.end(),
    async () => redis.quit(),
  );
  // Closed after the workers (closers run in reverse), so their last jobs still have threads.
  closers.push(() => sandbox.close());
  closers.push(() => queues.close());
  // Settlement writes the outbox row of every job that ended with a Callback-Url, in its own statement.
  const webhooks = new Webhooks({ config, log, pool, redis, sealer, results });
  settler.outbox = webhooks.outbox;
  settler.onEnded = (entries) => webhooks.ended(entries);
  c.webhooks = webhooks;
  closers.push(() => webhooks.close());
  // Every committed charge has its account's spend thresholds checked, once across replicas.
  const alerts = new Alerts({ pool, webhooks, log });
  settler.onCharged = (entries) => alerts.check(entries);
  c.alerts = alerts;

  if (opts.workerFamilies.length) {
    // The event log keeps progress for SSE replay (GET /jobs/{id}/events, src/queue/job-events.ts).
    const events = new JobEventLog(redis, config.REDIS_PREFIX, refs, eventLogTtl(config.JOB_REDIS_RETENTION_SECONDS));
    const workers = new WorkerPool({ config, log, runner, records, events, slots, metrics, refs }, opts.workerFamilies);
    await workers.start();
    c.workers = workers;
    // Workers close first (finish their jobs), then the settler drains, then connections.
    closers.push(() => settler.drain());
    closers.push(() => workers.close());
    // Stored answers older than JOB_RESULT_DAYS go, pruned by one replica at a time.
    results.startPruning();
    closers.push(() => results.stop());
    webhooks.start();
  }

  if (opts.api || opts.workerFamilies.length) {
    // Every process with the API or workers runs it; a Redis lock lets one pass run at a time.
    reconciler.start();
    closers.push(() => reconciler.stop());
    // Lost jobs are looked for the same way, and at once when Redis comes back without its data.
    intents.start();
    closers.push(() => intents.stop());
  }

  if (opts.api) {
    // Queues are opened now, while Redis is known to be up: a Queue first opened during an outage
    // would wait for the reconnect and add its job then, behind the caller's back.
    await Promise.all([...FAMILIES.map((f) => queues.queue(f).waitUntilReady()), queues.flowProducer().waitUntilReady()]);
    // Queue depths and live workers are the deployment's, read at scrape time by the processes serving the API.
    metrics.watchDeployment(
      (f) => queues.queue(f).getJobCounts('waiting', 'active', 'delayed', 'failed', 'completed'),
      async () => (await workerCounts(redis, config.REDIS_PREFIX)).counts,
    );
    // A job that failed outside its worker's hands (stalled too often: its process died twice)
    // gives back its hold and its slot here.
    const dispatcher = new CompletionDispatcher(
      config,
      log,
      async (jobId) => {
        const job = await queues.getJob(jobId);
        if (!job) return;
        const owner = slotOwner(job.data);
        if (owner) await slots.release(owner, [jobId]);
        if (job.data.accountId && job.data.priceCents > 0) await credits.release(job.data.accountId, [jobId]);
        // Its failure is stored like any other (a job settled before it stalled keeps its completed outcome).
        if (job.data.accountId && !job.data.payer) {
          const d = job.data;
          await settler.settle({
            jobId,
            accountId: d.accountId!,
            keyId: d.keyId,
            tool: d.tool,
            status: 'failed',
            amount: 0,
            costCents: 0,
            result: decodeFailure(job.failedReason).toJSON(),
            sandbox: d.sandbox,
            agentName: d.agentName,
            usage: null,
            createdAt: job.timestamp,
            holdId: null,
            ...(d.callbackUrl ? { callbackUrl: d.callbackUrl } : {}),
          });
        }
        // A failed job keeps its error, not the caller's input (as the worker does for the failures it handles).
        await dropJobInput(job, log);
      },
      refs,
    );
    await dispatcher.start();
    const auth = new KeyAuthenticator(accounts, config.KEY_CACHE_SECONDS * 1000, config.REDIS_PREFIX);
    const sub = connectRedis(config.REDIS_URL);
    await auth.listen(sub, log);
    closers.push(async () => sub.quit());
    closers.push(() => dispatcher.close());
    // Every key's job is recorded before it is queued: its own small pool, so intents never wait behind settlement.
    const intentPool = new pg.Pool({ connectionString: config.DATABASE_URL, max: 2 });
    intentPool.on('error', (err) => log.warn({ err: err.message }, 'intent connection error'));
    closers.push(() => intentPool.end());
    const intentStore = new IntentStore(pool);
    const intentsIo = { writer: new IntentWriter(intentPool, deploymentOf(config.REDIS_PREFIX)), store: intentStore };
    const calls = new CallService({ config, queues, dispatcher, credits, sealer, records, slots, results, intents: intentsIo });
    // Large answers are kept by reference or for the Redis retention only (src/calls/idempotency.ts).
    const idempotency = new Idempotency(redis, config.REDIS_PREFIX, undefined, {
      inlineBytes: config.JOB_RESULT_INLINE_BYTES,
      largeTtlSeconds: config.JOB_REDIS_RETENTION_SECONDS,
    });
    // A key Redis may have forgotten (it lost its data in the last day) is looked up in the intents.
    idempotency.durable = { mayHaveLost: () => intents.mayHaveLostClaims(), byIdempotencyKey: (idem) => intentStore.byIdempotencyKey(idem) };
    c.api = { dispatcher, auth, calls, limiter: new RateLimiter(redis, config), idempotency };
    // The usage export runs in API processes when a target is configured; every replica waits for its
    // lock and one exports. A bad target setting stops start-up here, before anything listens.
    const exporter = createUsageExporter(config, { db: pool, log, registry: metrics.registry });
    if (exporter) {
      exporter.start();
      closers.push(() => exporter.stop());
      c.api.exporter = exporter;
    }
    if (config.X402_ENABLED) {
      const settler = await createSettler(config);
      try {
        await settler.start();
      } catch (e) {
        if (e instanceof SettlerStartupError) throw new ConfigError(`x402: ${e.message}`);
        throw e;
      }
      if (settler.mode === 'deferred') log.warn(DEFERRED_WARNING);
      const x402 = { config, db: pool, settler, log };
      c.api.payPerCall = new PayPerCall({ x402, pool, idempotency, log });
      const lookup = await settlementLookup(config, settler);
      const payments = new PaymentReconciler({ ...x402, lookup, redis, prefix: config.REDIS_PREFIX, intervalSeconds: config.RECONCILE_SECONDS });
      c.api.payments = payments;
      payments.start();
      closers.push(() => payments.stop());
    }
  }
  return c;
}

export function allFamilies(): readonly Family[] {
  return FAMILIES;
}
