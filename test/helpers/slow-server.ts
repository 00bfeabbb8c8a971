/**
 * The service with the test-only tools registered: `node --import tsx test/helpers/slow-server.ts`.
 * Everything else is the production entry (src/server.ts), as `npm start` runs it.
 */
import { registerSlowTools } from './slow-tools.js';

registerSlowTools();
await import('../../src/server.js');
