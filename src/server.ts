import { buildApp } from './app.js';
import { checkServices, configOrDie, die, makeLogger, runMigrations } from './bootstrap.js';
import { createContainer } from './container.js';
import { FAMILIES } from './config.js';

const config = configOrDie();
if (config.WORKERS === 'off' && !config.EDGE_TOKEN_KEY) {
  die('EDGE_TOKEN_KEY is required with WORKERS=off: the separate edge workers must open the tokens this API seals (`openssl rand -hex 32`)');
}
const log = makeLogger(config);
await checkServices(config);
await runMigrations(config, log);
const container = await createContainer(config, log, {
  api: true,
  workerFamilies: config.WORKERS === 'inline' ? FAMILIES : [],
});
const app = await buildApp(container, { logger: log });
await app.listen({ port: config.PORT, host: config.HOST });
log.info({ port: config.PORT, workers: config.WORKERS }, 'tollgate listening');

let closing = false;
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (closing) return;
    closing = true;
    log.info({ signal }, 'shutting down');
    // Stop taking requests, let running jobs finish and settle, then close connections.
    void app
      .close()
      .then(() => container.close())
      .then(() => process.exit(0), () => process.exit(1));
  });
}
