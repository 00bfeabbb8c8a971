import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // The chaos suite kills and restarts processes and Redis: it runs on its own (npm run test:chaos).
    exclude: ['test/chaos/**', 'test/scale/**', 'node_modules/**'],
    globalSetup: ['test/helpers/global-setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Integration suites share one Postgres database and one Redis; each uses its own accounts and
    // Redis prefix, so files may run side by side. Two forks keep a 2-core machine responsive.
    pool: 'forks',
    poolOptions: { forks: { maxForks: 2, minForks: 1 } },
    reporters: ['default'],
  },
});
