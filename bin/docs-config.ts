// `npm run docs:config`: writes docs/configuration.md from the config schema; `-- --check` only compares and exits 1
// when the file is out of date.
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { configReferenceMarkdown } from '../actors/config-reference.ts';

const file = fileURLToPath(new URL('../docs/configuration.md', import.meta.url));
const text = configReferenceMarkdown();
if (process.argv.includes('--check')) {
  let current = '';
  try {
    current = readFileSync(file, 'utf8');
  } catch {
    // missing: out of date
  }
  if (current !== text) {
    process.stderr.write('docs/configuration.md is out of date: run `npm run docs:config`\n');
    process.exit(1);
  }
  process.stdout.write('docs/configuration.md is up to date\n');
} else {
  writeFileSync(file, text);
  process.stdout.write(`wrote ${file}\n`);
}
