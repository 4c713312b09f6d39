// A llama.cpp model whose file is missing or not GGUF is refused by `serve` and `simulate` before anything starts,
// with an error naming the field and the file; `generate: tiny` writes the seeded model where it is missing.
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadScenario } from '../../actors/config.ts';
import { runCommand, writeConfig } from './harness.ts';

const config = (file: string, extra = ''): string =>
  writeConfig(`
models:
  - name: tiny
    profile: llama-3-8b
    engine: llama.cpp
    file: ${file}
${extra}`);

describe('engine model files', () => {
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-engine-config-'));

  it('refuses a missing file in serve and simulate, naming models[0].file and the path', async () => {
    const missing = join(dir, 'nowhere.gguf');
    for (const args of [['serve', '--config'], ['simulate']]) {
      const r = await runCommand([...args, config(missing)]);
      expect(r.code).toBe(2);
      expect(r.stderr).toContain(`models[0].file: model file ${missing} does not exist`);
    }
  });

  it('refuses a file that is not GGUF', () => {
    const bogus = join(dir, 'bogus.gguf');
    writeFileSync(bogus, 'not a model at all');
    expect(() => loadScenario(config(bogus))).toThrow(`models[0].file: model file ${bogus} is not a GGUF file`);
  });

  it('writes the seeded tiny model when asked and missing, and sizes the ledger from the engine cache', () => {
    const target = join(dir, 'gen/tiny.gguf');
    const s = loadScenario(config(target, '    generate: tiny\n    contextTokens: 256\n    sequences: 2'));
    expect(existsSync(target)).toBe(true);
    const m = s.models[0]!;
    expect(m.engine).toMatchObject({ kind: 'llama.cpp', file: target, contextTokens: 256, sequences: 2 });
    expect(m.batching).toMatchObject({ maxRunning: 2, maxContext: 255 });
  });

  it('refuses a context that llama.cpp would round (not a multiple of 256)', () => {
    expect(() => loadScenario(config(join(dir, 'x.gguf'), '    contextTokens: 300'))).toThrow(
      /contextTokens: must be a multiple of 256/,
    );
  });

  it('carries the offload settings to the engine and refuses a backend it does not know', () => {
    const target = join(dir, 'gen/tiny.gguf');
    const gpu = loadScenario(config(target, '    generate: tiny\n    gpu: vulkan\n    gpuLayers: 2')).models[0]!;
    expect(gpu.engine).toMatchObject({ gpu: 'vulkan', gpuLayers: 2 });
    const cpu = loadScenario(config(target, '    generate: tiny')).models[0]!;
    expect(cpu.engine).not.toHaveProperty('gpu');
    for (const bad of ['constructor', 'rocm'])
      expect(() => loadScenario(config(target, `    gpu: ${bad}`))).toThrow(/models\[0\]\.gpu/);
  });
});
