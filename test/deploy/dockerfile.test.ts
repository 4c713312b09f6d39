// The image runs the CLI: every top-level folder the CLI's import graph reaches from bin/switchyard.ts (static
// imports, re-exports and dynamic import() of relative paths) must be copied by deploy/Dockerfile, and every package
// it imports must be a production dependency (the image installs with --omit=dev).
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import { REPO_ROOT } from '../../deploy/render.ts';
import { importsOf } from '../layers.ts';

/** Top-level folders the Dockerfile copies into the image (`COPY <folder> ./<folder>`). */
function copiedFolders(dockerfile: string): Set<string> {
  const out = new Set<string>();
  for (const line of dockerfile.split('\n')) {
    const m = /^COPY\s+(?:--\S+\s+)*(\S+)\s+\S+\s*$/.exec(line.trim());
    if (m && !m[1]!.includes('*')) out.add(m[1]!.replace(/^\.\//, '').replace(/\/$/, ''));
  }
  return out;
}

/** Every project file reachable from `entry` by relative imports; type-only imports are left out (tsx drops them). */
function reachable(entry: string, root: string): Set<string> {
  const seen = new Set<string>();
  const todo = [entry];
  while (todo.length > 0) {
    const file = todo.pop()!;
    if (seen.has(file)) continue;
    seen.add(file);
    const source = readFileSync(join(root, file), 'utf8');
    for (const { specifier, line } of importsOf(source, file)) {
      const text = source.split('\n')[line - 1] ?? '';
      if (/^\s*import\s+type\s/.test(text) || /^\s*export\s+type\s/.test(text)) continue;
      const target = relative(root, resolve(join(root, dirname(file)), specifier))
        .split(/[\\/]/)
        .join('/');
      if (existsSync(join(root, target))) todo.push(target);
    }
  }
  return seen;
}

/** The top-level folders of the files the CLI reaches. */
function foldersReached(root: string): Set<string> {
  return new Set([...reachable('bin/switchyard.ts', root)].map((f) => f.split('/')[0]!));
}

/** The npm packages the CLI's files import (bare specifiers; node: built-ins left out). */
function packagesReached(root: string): Set<string> {
  const out = new Set<string>();
  for (const file of reachable('bin/switchyard.ts', root)) {
    const { importedFiles } = ts.preProcessFile(readFileSync(join(root, file), 'utf8'), true, true);
    for (const { fileName } of importedFiles) {
      if (fileName.startsWith('.') || fileName.startsWith('node:')) continue;
      const parts = fileName.split('/');
      out.add(fileName.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0]!);
    }
  }
  return out;
}

describe('the image', () => {
  const dockerfile = readFileSync(join(REPO_ROOT, 'deploy', 'Dockerfile'), 'utf8');

  it('copies every top-level folder the CLI imports, directly or through dynamic import()', () => {
    const reached = foldersReached(REPO_ROOT);
    expect(reached.has('bin')).toBe(true);
    expect(reached.has('api')).toBe(true);
    expect(reached.has('runtime')).toBe(true);
    const copied = copiedFolders(dockerfile);
    expect([...reached].filter((f) => !copied.has(f)).sort()).toEqual([]);
  });

  it('and the check catches a folder left out of the Dockerfile', () => {
    const copied = copiedFolders(dockerfile.replace(/^COPY runtime .*$/m, ''));
    expect([...foldersReached(REPO_ROOT)].filter((f) => !copied.has(f))).toEqual(['runtime']);
  });

  it('installs every package the CLI imports: each is a production dependency', () => {
    const pkg = JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as {
      dependencies: Record<string, string>;
    };
    const production = new Set(Object.keys(pkg.dependencies));
    const reached = packagesReached(REPO_ROOT);
    expect(reached.has('xstate')).toBe(true);
    expect([...reached].filter((p) => !production.has(p)).sort()).toEqual([]);
  });
});
