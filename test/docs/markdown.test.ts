// The manual's form: every Markdown table in README.md and docs/ is whole (a header, a separator of as many
// columns, every row as wide, no blank line cutting it), no table cell runs past 300 characters, README.md stays a
// front page (at most 250 lines), the project speaks of itself only, and the configuration reference is the schema's.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { configReferenceMarkdown } from '../../actors/config-reference.ts';
import { ROOT } from '../e2e/harness.ts';

const files = [
  'README.md',
  ...readdirSync(join(ROOT, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
];
const read = (f: string): string => readFileSync(join(ROOT, f), 'utf8');

/** A table row's cells: split on pipes that are not escaped; the outer pipes open and close the row. */
export function cells(line: string): string[] {
  const parts = line.trim().split(/(?<!\\)\|/);
  return parts.slice(1, parts.length - 1);
}

/** Every problem with the tables of one Markdown text: `line: what`. */
export function tableProblems(text: string): string[] {
  const out: string[] = [];
  const lines = text.split('\n');
  let fenced = false;
  for (let i = 0; i < lines.length; i++) {
    if (/^\s*```/.test(lines[i]!)) fenced = !fenced;
    if (fenced || !lines[i]!.trimStart().startsWith('|')) continue;
    const start = i;
    const block: string[] = [];
    while (i < lines.length && lines[i]!.trimStart().startsWith('|')) block.push(lines[i++]!);
    const width = cells(block[0]!).length;
    if (block.length < 2 || !/^\|(\s*:?-+:?\s*\|)+\s*$/.test(block[1]!.trim())) {
      out.push(`${start + 1}: a table without its header and separator (a blank line may have cut a table)`);
      continue;
    }
    if (cells(block[1]!).length !== width) out.push(`${start + 2}: the separator has not ${width} columns`);
    block.forEach((row, j) => {
      const c = cells(row);
      if (c.length !== width) out.push(`${start + j + 1}: ${c.length} cells, the header has ${width}`);
      c.forEach((cell) => {
        if (cell.trim().length > 300) out.push(`${start + j + 1}: a cell of ${cell.trim().length} characters`);
      });
    });
  }
  return out;
}

describe('the manual', () => {
  it('finds a cut table, a ragged row and an overlong cell (the check itself)', () => {
    expect(tableProblems('| a | b |\n|---|---|\n| 1 | 2 |\n')).toEqual([]);
    expect(tableProblems('| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n')).toHaveLength(1);
    expect(tableProblems('| a | b |\n|---|---|\n| 1 | 2 | 3 |\n')).toHaveLength(1);
    expect(tableProblems(`| a |\n|---|\n| ${'x'.repeat(301)} |\n`)).toHaveLength(1);
    expect(tableProblems('```\n| not | a table\n```\n')).toEqual([]);
    expect(cells('| `a \\| b` | c |')).toHaveLength(2);
  });

  it('has whole tables with cells of at most 300 characters in README.md and docs/', () => {
    const problems = files.flatMap((f) => tableProblems(read(f)).map((p) => `${f}:${p}`));
    expect(problems).toEqual([]);
  });

  it('keeps README.md a front page of at most 250 lines', () => {
    expect(read('README.md').split('\n').length).toBeLessThanOrEqual(250);
  });

  it('speaks of itself only: "session", "helper" and "the lead" only in the product’s own meanings', () => {
    // An inspection session, a WebSocket or TLS session, a garbage collector's helper threads.
    const own = /(inspection|inspector|WebSocket|TLS|client) sessions?|session\.ts|helper threads?/gi;
    const hits: string[] = [];
    for (const f of files)
      read(f)
        .split('\n')
        .forEach((line, i) => {
          if (/session|helper|the lead/i.test(line.replace(own, ''))) hits.push(`${f}:${i + 1}: ${line.trim()}`);
        });
    expect(hits).toEqual([]);
  });

  it('has the configuration reference the schema writes (npm run docs:config)', () => {
    expect(read('docs/configuration.md')).toBe(configReferenceMarkdown());
  });
});
