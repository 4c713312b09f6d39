import { defineConfig } from 'vitest/config';

// Browser tests: real headless Chromium (Debian's /usr/bin/chromium) driven by playwright-core. `npm run test:browser`.
export default defineConfig({
  test: {
    include: ['test/browser/**/*.test.ts'],
    testTimeout: 120_000,
    hookTimeout: 120_000,
    pool: 'forks',
    fileParallelism: false,
  },
});
