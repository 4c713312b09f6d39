// Imports point one way, from the bottom layer up: the checker finds none pointing down-to-up, and catches one that does.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { LAYERS, layerViolations } from './layers.ts';

const root = resolve(import.meta.dirname, '..');

function trackedSources(): Map<string, string> {
  const names = execFileSync('git', ['ls-files', '--cached', '--others', '--exclude-standard', '*.ts'], {
    cwd: root,
    encoding: 'utf8',
  });
  const files = new Map<string, string>();
  for (const f of names.split('\n').filter(Boolean)) {
    try {
      files.set(f, readFileSync(join(root, f), 'utf8'));
    } catch {
      // listed by git but deleted in the working tree
    }
  }
  return files;
}

describe('the import graph', () => {
  it('has no import from a lower layer to a higher one', () => {
    const files = trackedSources();
    expect(files.size).toBeGreaterThan(100);
    expect(layerViolations(files, root)).toEqual([]);
  });

  it('names every top-level source folder in a layer', () => {
    const tops = new Set([...trackedSources().keys()].filter((f) => f.includes('/')).map((f) => f.split('/')[0]!));
    const known = new Set(LAYERS.flat());
    expect([...tops].filter((t) => !known.has(t))).toEqual([]);
  });

  it('catches a wrong-way import a change adds, type-only and dynamic ones included', () => {
    const files = new Map([
      ['transport/codec.ts', `import { startServer } from '../api/server.ts';`],
      ['runtime/clock.ts', `import type { ControlPlane } from '../actors/control-plane.ts';`],
      ['machines/gpu.machine.ts', `const m = await import('../runtime/system.ts');`],
      ['actors/worker/agent.ts', `import { createRouter } from '../router/router.ts';`],
      ['api/server.ts', `import { encode } from '../transport/codec.ts';`],
      ['actors/worker/process.ts', `import { createCostModel } from '../gpu/cost-model.ts';`],
    ]);
    const found = layerViolations(files, '/repo').map((v) => `${v.file}: ${v.specifier}`);
    expect(found).toEqual([
      'transport/codec.ts: ../api/server.ts',
      'runtime/clock.ts: ../actors/control-plane.ts',
      'machines/gpu.machine.ts: ../runtime/system.ts',
      'actors/worker/agent.ts: ../router/router.ts',
    ]);
  });
});
