/**
 * Worker entry: `npm run start:worker -- --family <family>` (repeat --family, or `all`). Runs the pools of
 * those families against REDIS_URL and DATABASE_URL; scale by running more replicas.
 */
import { parseArgs } from 'node:util';
import { checkServices, configOrDie, die, makeLogger, onStopSignal, runMigrations } from '../src/bootstrap.js';
import { createContainer } from '../src/container.js';
import { FAMILIES, type Family } from '../src/config.js';
import { serveMetrics } from '../src/ops/metrics.js';

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
if (!config.EDGE_TOKEN_KEY && families.includes('edge')) {
  die('EDGE_TOKEN_KEY is required when edge workers run in their own process (the API seals tokens with it); generate one with `openssl rand -hex 32`');
}
const log = makeLogger(config);
await checkServices(config, log);
await runMigrations(config, log);
const container = await createContainer(config, log, { api: false, workerFamilies: families });
// This process's Prometheus metrics on METRICS_PORT (0: none).
const metricsServer = config.METRICS_PORT
  ? await serveMetrics(container.metrics, { port: config.METRICS_PORT, host: config.HOST, token: config.METRICS_TOKEN })
  : null;
if (metricsServer) log.info({ port: config.METRICS_PORT }, 'metrics listening');
log.info({ families }, 'worker process ready');

// Running jobs finish and settle before the process exits; past the grace period, what is left is
// redelivered to another worker once its lock expires.
onStopSignal(log, config.SHUTDOWN_GRACE_MS, async () => {
  metricsServer?.close();
  metricsServer?.closeAllConnections();
  await container.close();
});
