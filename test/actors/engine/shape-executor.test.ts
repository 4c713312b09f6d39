// The executor contract against a real engine: an in-process llama.cpp engine on the tiny model, running every step's
// shape as one batch (actors/engine/shape-executor.ts).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEngineShapeExecutor, shapeBatches } from '../../../actors/engine/shape-executor.ts';
import { loadLlamaEngine } from '../../../actors/engine/llama-engine.ts';
import type { Engine } from '../../../actors/engine/engine.ts';
import { createCostModel } from '../../../actors/gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../../../actors/gpu/profiles.ts';
import { executorContract } from '../gpu/executor.contract.ts';
import { tinyModelFixture } from './fixtures.ts';

let fixture: Awaited<ReturnType<typeof tinyModelFixture>>;
let engine: Engine;
const load = { contextTokens: 512, sequences: 6, threads: 1 };

beforeAll(async () => {
  fixture = await tinyModelFixture();
  engine = await loadLlamaEngine(fixture.file, load);
}, 120_000);
afterAll(async () => {
  await engine?.unload();
  await fixture?.cleanup();
});

executorContract('an in-process llama.cpp engine running each step shape', () => {
  const ex = createEngineShapeExecutor(() => engine);
  return { executor: ex, settle: () => ex.drained() };
});

describe('the engine shape executor', () => {
  const cost = createCostModel(modelProfile('llama-3-8b'), gpuProfile('H100-SXM'), 1);
  const work = { gpu: 1, replica: 'r', epoch: 1, step: 1, cost, slowdown: 1 };

  it('runs exactly the shape: the decodes over their context, the chunks after their cached tokens', () => {
    const shape = { prefill: [{ tokens: 5, cached: 3 }], decodeBatch: 2, decodeContext: 9 };
    const { setup, step, seqs } = shapeBatches({ ...work, shape });
    expect(step.items.map((i) => (i.kind === 'decode' ? 'decode' : i.tokens.length))).toEqual(['decode', 'decode', 5]);
    // Contexts 5 and 4 once each decode adds its token; the chunk's 3 cached tokens.
    expect(setup.map((p) => (p.items[0]!.kind === 'prefill' ? p.items[0]!.tokens.length : 0))).toEqual([4, 3, 3]);
    expect(seqs).toEqual(['shape.1.d0', 'shape.1.d1', 'shape.1.p0']);
  });

  it('frees every filler sequence after its step', async () => {
    const ex = createEngineShapeExecutor(() => engine);
    let ms = -1;
    const shape = { prefill: [{ tokens: 16, cached: 8 }], decodeBatch: 3, decodeContext: 60 };
    ex.start({ ...work, shape }, (m) => (ms = m));
    await ex.drained();
    expect(ms).toBeGreaterThan(0);
    expect(ex.busyMs(1)).toBe(ms);
    expect(engine.capacity().freeSequences).toBe(load.sequences);
  });
});
