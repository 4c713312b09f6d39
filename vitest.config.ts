import { defineConfig } from 'vitest/config';

// Browser tests run under their own script (npm run test:browser); npm test stays browser-free.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    exclude: ['test/browser/**', 'node_modules/**'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
  },
});
