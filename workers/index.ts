/**
 * Worker entry: `npm run start:worker -- --family <family>` (repeat --family, or `all`). Runs the pools of
 * those families against REDIS_URL and DATABASE_URL; scale by running more replicas.
 */
import { parseArgs } from 'node:util';
import { checkServices, configOrDie, die, makeLogger, onStopSignal, runMigrations, sealingKeysOrDie } from '../src/bootstrap.js';
import { createContainer } from '../src/container.js';
import { FAMILIES, type Family } from '../src/config.js';
import { serveMetrics } from '../src/ops/metrics.js';
import { drainOnStopSignal, readinessProbe } from '../src/ops/readiness.js';
import { warnUnopenableSealed } from '../src/ops/sealed-check.js';
import { startTracing } from '../src/tracing.js';

const { values } = parseArgs({ options: { family: { type: 'string', multiple: true } }, allowPositionals: false });
const asked = values.family ?? [];
if (!asked.length) die(`pass --family <${FAMILIES.join('|')}|all> (repeatable)`);
const families: Family[] = asked.includes('all') ? [...FAMILIES] : [];
for (const f of asked) {
  if (f === 'all') continue;
  if (!(FAMILIES as readonly string[]).includes(f)) die(`unknown family '${f}'; families are ${FAMILIES.join(', ')}`);
  families.push(f as Family);
}

const config = configOrDie();
const log = makeLogger(config);
// Production stops here without EDGE_TOKEN_KEY and PASSPORT_KEY; elsewhere unset keys come from the data dir, as the API's do.
sealingKeysOrDie(config, log, { api: false });
await checkServices(config, log);
await runMigrations(config, log);
// Traces when an OTLP endpoint is set (docs/guides/tracing.md): each job continues its caller's trace.
const stopTracing = await startTracing('tollgate-worker', (m) => log.warn(m));
const container = await createContainer(config, log, { api: false, workerFamilies: families });
// One warning line per key that does not open what earlier starts sealed (a changed EDGE_TOKEN_KEY or PASSPORT_KEY).
await warnUnopenableSealed(container, log);
// This process's Prometheus metrics and its probes (GET /livez, GET /readyz) on METRICS_PORT (0: none).
const metricsServer = config.METRICS_PORT
  ? await serveMetrics(container.metrics, {
      port: config.METRICS_PORT,
      host: config.HOST,
      token: config.METRICS_TOKEN,
      ready: readinessProbe(container),
    })
  : null;
if (metricsServer) log.info({ port: config.METRICS_PORT }, 'metrics listening');
log.info({ families }, 'worker process ready');

// Running jobs finish and settle before the process exits; past the grace period, what is left is
// redelivered to another worker once its lock expires. Meanwhile /readyz says draining (503) and
// /livez 200: the METRICS_PORT listener closes last.
drainOnStopSignal();
onStopSignal(log, config.SHUTDOWN_GRACE_MS, async () => {
  await container.close();
  await stopTracing?.();
  metricsServer?.close();
  metricsServer?.closeAllConnections();
});
