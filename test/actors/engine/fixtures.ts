// Shared test fixtures: the generated tiny model written once per test file into a temporary directory.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensureTinyModel } from '../../../actors/engine/tiny-model.ts';

/** A temporary directory holding the seed-1 tiny model; call cleanup() when done. */
export async function tinyModelFixture(): Promise<{ dir: string; file: string; cleanup: () => Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), 'switchyard-engine-'));
  const { path } = await ensureTinyModel(join(dir, 'tiny.gguf'), { seed: 1 });
  return { dir, file: path, cleanup: () => rm(dir, { recursive: true, force: true }) };
}
