import { buildApp } from './app.js';
import { checkServices, configOrDie, die, makeLogger, onStopSignal, runMigrations } from './bootstrap.js';
import { createContainer } from './container.js';
import { ConfigError, FAMILIES } from './config.js';

const config = configOrDie();
if (config.WORKERS === 'off' && !config.EDGE_TOKEN_KEY) {
  die('EDGE_TOKEN_KEY is required with WORKERS=off: the separate edge workers must open the tokens this API seals (`openssl rand -hex 32`)');
}
const log = makeLogger(config);
await checkServices(config, log);
await runMigrations(config, log);
// A configuration that only fails once checked against the world (an x402 facilitator that does not
// support our network, a chain with another id) stops here with one line, like a bad variable.
const container = await createContainer(config, log, {
  api: true,
  workerFamilies: config.WORKERS === 'inline' ? FAMILIES : [],
}).catch((e: unknown) => (e instanceof ConfigError ? die(e.message) : Promise.reject(e)));
const app = await buildApp(container, { logger: log });
await app.listen({ port: config.PORT, host: config.HOST });
log.info({ port: config.PORT, workers: config.WORKERS }, 'tollgate listening');

// Stop listening and answer every request in flight (inline workers keep running their jobs until
// then), then let the workers finish, settlement flush and connections close.
onStopSignal(
  log,
  config.SHUTDOWN_GRACE_MS,
  async () => {
    await app.close();
    await container.close();
  },
  () => app.server.closeAllConnections(),
);
