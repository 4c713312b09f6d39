import { describe, expect, it } from 'vitest';
import { createCostModelExecutor, createZeroCostExecutor } from '../../../actors/gpu/executor.ts';
import { createVirtualClock, createWallClock } from '../../../runtime/clock.ts';
import { createCostModel } from '../../../actors/gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../../../actors/gpu/profiles.ts';
import { executorContract } from './executor.contract.ts';

executorContract('cost model in virtual time', () => {
  const clock = createVirtualClock();
  return { executor: createCostModelExecutor(clock), settle: async () => void clock.run() };
});

executorContract('zero cost in virtual time', () => {
  const clock = createVirtualClock();
  return { executor: createZeroCostExecutor(clock), settle: async () => void clock.run() };
});

executorContract('cost model in real time (scaled down)', () => {
  const clock = createWallClock();
  return { executor: createCostModelExecutor(clock, 0.01), settle: () => new Promise((r) => setTimeout(r, 30)) };
});

describe('cost-model executor', () => {
  it('takes the roofline time of the step times the GPU slowdown', () => {
    const clock = createVirtualClock();
    const ex = createCostModelExecutor(clock);
    const cost = createCostModel(modelProfile('llama-3-8b'), gpuProfile('H100-SXM'), 1);
    const shape = { prefill: [{ tokens: 512, cached: 0 }], decodeBatch: 8, decodeContext: 8000 };
    let at = -1;
    ex.start({ gpu: 0, replica: 'r', epoch: 1, step: 1, shape, cost, slowdown: 2 }, () => (at = clock.now()));
    clock.run();
    expect(at).toBeCloseTo(cost.stepS(shape) * 2000, 6);
    expect(ex.busyMs(0)).toBeCloseTo(at, 6);
  });
});
