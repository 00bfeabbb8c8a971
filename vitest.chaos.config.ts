import { defineConfig } from 'vitest/config';

/** `npm run test:chaos`: the money-under-faults suite (test/chaos), one file, processes of its own. */
export default defineConfig({
  test: {
    include: ['test/chaos/**/*.test.ts'],
    globalSetup: ['test/helpers/global-setup.ts'],
    testTimeout: 300_000,
    hookTimeout: 120_000,
    pool: 'forks',
    poolOptions: { forks: { maxForks: 1, minForks: 1 } },
    reporters: ['default'],
  },
});
