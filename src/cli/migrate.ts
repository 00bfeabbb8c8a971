import { checkServices, configOrDie, makeLogger, runMigrations } from '../bootstrap.js';

const config = configOrDie();
await checkServices(config);
await runMigrations(config, makeLogger(config));
process.stdout.write(JSON.stringify({ migrated: true }) + '\n');
