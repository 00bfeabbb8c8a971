/**
 * A worker process with the test-only tools registered: `node --import tsx test/helpers/crash-worker.ts
 * --family core`. Everything else is the production worker entry (workers/index.ts).
 */
import { registerSlowTools } from './slow-tools.js';

registerSlowTools();
await import('../../workers/index.js');
