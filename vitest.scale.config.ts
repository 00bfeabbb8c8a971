import { defineConfig } from 'vitest/config';

/** `npm run test:scale`: the scaled-out suite (test/scale): a local Redis Cluster, two APIs, two workers per family. */
export default defineConfig({
  test: {
    include: ['test/scale/**/*.test.ts'],
    globalSetup: ['test/helpers/global-setup.ts'],
    testTimeout: 300_000,
    hookTimeout: 240_000,
    pool: 'forks',
    poolOptions: { forks: { maxForks: 1, minForks: 1 } },
    reporters: ['default'],
  },
});
