/**
 * A process that runs only the webhook relay (src/calls/webhooks.ts) of the deployment its environment
 * names, for tests that kill it: `node --import tsx test/helpers/outbox-relay.ts`. It prints
 * `relay ready` once it claims.
 */
import pino from 'pino';
import { loadConfig } from '../../src/config.js';
import { createContainer } from '../../src/container.js';

const config = loadConfig({}, process.env);
const container = await createContainer(config, pino({ level: 'warn' }), { api: false, workerFamilies: [] });
container.webhooks!.start();
process.stdout.write('relay ready\n');
