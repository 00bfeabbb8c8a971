import { buildApp } from './app.js';
import { checkServices, configOrDie, die, makeLogger, onStopSignal, runMigrations, sealingKeysOrDie } from './bootstrap.js';
import { createContainer } from './container.js';
import { ConfigError, FAMILIES } from './config.js';
import { drainOnStopSignal } from './ops/readiness.js';
import { warnUnopenableSealed } from './ops/sealed-check.js';
import { unavailableTools } from './tools/index.js';
import { startTracing } from './tracing.js';

const config = configOrDie();
const log = makeLogger(config);
// Production stops here without EDGE_TOKEN_KEY, PASSPORT_KEY, PUBLIC_BASE_URL (or PUBLIC_HOSTS); elsewhere unset keys
// come from the data dir, so separate workers on this machine (WORKERS=off) share them.
sealingKeysOrDie(config, log, { api: true });
await checkServices(config, log);
await runMigrations(config, log);
// Traces when an OTLP endpoint is set (docs/guides/tracing.md); before the container, whose queues take it.
const stopTracing = await startTracing('tollgate-api', (m) => log.warn(m));
// A configuration that only fails once checked against the world (an x402 facilitator that does not
// support our network, a chain with another id) stops here with one line, like a bad variable.
const container = await createContainer(config, log, {
  api: true,
  workerFamilies: config.WORKERS === 'inline' ? FAMILIES : [],
}).catch((e: unknown) => (e instanceof ConfigError ? die(e.message) : Promise.reject(e)));
// One warning line per key that does not open what earlier starts sealed (a changed EDGE_TOKEN_KEY or PASSPORT_KEY).
await warnUnopenableSealed(container, log);
const app = await buildApp(container, { logger: log });
await app.listen({ port: config.PORT, host: config.HOST });
log.info({ port: config.PORT, workers: config.WORKERS }, 'tollgate listening');
// One line per upstream that is not configured: which tools answer 503 tool_unavailable here, and why.
for (const { need, setting, tools } of unavailableTools(config)) {
  const how = need === 'llm' ? ' (point it at any OpenAI-compatible server: docs/guides/language-models.md)' : '';
  log.info({ setting, tools }, `${tools.length} tools are off: ${setting} is not set${how}`);
}

// GET /readyz says 503 from the first SIGTERM or SIGINT on.
drainOnStopSignal();
// Stop listening and answer every request in flight (inline workers keep running their jobs until
// then), then let the workers finish, settlement flush and connections close.
onStopSignal(
  log,
  config.SHUTDOWN_GRACE_MS,
  async () => {
    await app.close();
    await container.close();
    await stopTracing?.();
  },
  () => app.server.closeAllConnections(),
);
