// ESLint: the rules this project checks instead of remembering (function length, the determinism boundary, TypeScript).
import tseslint from 'typescript-eslint';

const determinism = {
  'no-restricted-properties': [
    'error',
    { object: 'Date', property: 'now', message: 'read time from the runtime clock (runtime/clock.ts)' },
    { object: 'Math', property: 'random', message: 'draw from the seeded rng (runtime/rng.ts)' },
  ],
  'no-restricted-globals': [
    'error',
    { name: 'setTimeout', message: 'schedule on the runtime clock (runtime/clock.ts)' },
    { name: 'setInterval', message: 'schedule on the runtime clock (runtime/clock.ts)' },
    { name: 'setImmediate', message: 'schedule on the runtime clock (runtime/clock.ts)' },
  ],
  'no-restricted-syntax': [
    'error',
    { selector: "NewExpression[callee.name='Date'][arguments.length=0]", message: 'read time from the runtime clock' },
  ],
};

export default tseslint.config(
  { ignores: ['node_modules/**', 'inspector/public/**', 'docs/**', '**/*.d.ts'] },
  {
    files: ['**/*.ts'],
    extends: [tseslint.configs.base],
    rules: {
      ...determinism,
      'max-lines-per-function': ['error', { max: 150, skipBlankLines: true, skipComments: true, IIFEs: true }],
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' },
      ],
      '@typescript-eslint/consistent-type-imports': ['error', { fixStyle: 'inline-type-imports' }],
      'no-var': 'error',
      'prefer-const': 'error',
      eqeqeq: ['error', 'always', { null: 'ignore' }],
    },
  },
  {
    // The runtime's clock and rng are the determinism boundary: the only code that may touch wall time and timers.
    files: ['runtime/clock.ts', 'runtime/rng.ts'],
    rules: { 'no-restricted-properties': 'off', 'no-restricted-globals': 'off', 'no-restricted-syntax': 'off' },
  },
  {
    // Tests, benchmarks and the CLI measure and wait on the wall clock; they are outside what a seed reproduces.
    files: ['test/**', 'bench/**'],
    rules: {
      'max-lines-per-function': 'off',
      'no-restricted-properties': 'off',
      'no-restricted-globals': 'off',
      'no-restricted-syntax': 'off',
    },
  },
);
