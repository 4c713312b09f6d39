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

describe('a gang of ranks on one timer', () => {
  const shape = { prefill: [], decodeBatch: 8, decodeContext: 8000 };
  const cost = createCostModel(modelProfile('llama-3-70b'), gpuProfile('H100-SXM'), 8);
  const works = [0, 1, 2, 3].map((gpu) => ({ gpu, replica: 'r', epoch: 1, step: 1, shape, cost, slowdown: 1 }));

  it('finishes every rank at the time each would take alone, counted as one event per rank', () => {
    const alone = createVirtualClock();
    const each = createCostModelExecutor(alone);
    const times: number[] = [];
    for (const w of works) each.start(w, () => times.push(alone.now()));
    const perRank = alone.run();

    const clock = createVirtualClock();
    const ex = createCostModelExecutor(clock);
    const done: { at: number; ranks: number[] }[] = [];
    ex.timed!.startGang(works, (_ms, ranks) => done.push({ at: clock.now(), ranks }));
    expect(works.every((w) => ex.timed!.running(w.gpu))).toBe(true);
    expect(clock.run()).toBe(perRank);
    expect(done).toEqual([{ at: times[0], ranks: [0, 1, 2, 3] }]);
    for (const w of works) expect(ex.busyMs(w.gpu)).toBe(each.busyMs(w.gpu));
  });

  it('leaves out an aborted rank, and runs nothing once every rank is aborted', () => {
    const clock = createVirtualClock();
    const ex = createCostModelExecutor(clock);
    const done: number[][] = [];
    ex.timed!.startGang(works, (_ms, ranks) => done.push(ranks));
    ex.abort(2);
    expect(ex.timed!.running(2)).toBe(false);
    expect(clock.run()).toBe(3);
    expect(done).toEqual([[0, 1, 3]]);
    expect(ex.busyMs(2)).toBe(0);

    ex.timed!.startGang(works.slice(0, 2), (_ms, ranks) => done.push(ranks));
    ex.abort(0);
    ex.abort(1);
    expect(clock.run()).toBe(0);
    expect(done).toHaveLength(1);
  });

  it('refuses a rank that is already running a step', () => {
    const clock = createVirtualClock();
    const ex = createCostModelExecutor(clock);
    ex.start(works[1]!, () => {});
    expect(() => ex.timed!.startGang(works, () => {})).toThrow(/gpu.1 is already executing/);
  });
});

describe('zero-cost executor', () => {
  const cost = createCostModel(modelProfile('llama-3-8b'), gpuProfile('H100-SXM'), 1);
  const shape = { prefill: [], decodeBatch: 4, decodeContext: 400 };
  const work = (gpu: number, step = 1) => ({ gpu, replica: `r${gpu}`, epoch: 1, step, shape, cost, slowdown: 1 });

  it('completes the steps started in one turn on one timer, in start order', () => {
    const clock = createVirtualClock();
    const ex = createZeroCostExecutor(clock);
    const done: number[] = [];
    for (const g of [3, 0, 5]) ex.start(work(g), () => done.push(g));
    expect(clock.pending()).toBe(1);
    expect(clock.run()).toBe(1);
    expect(done).toEqual([3, 0, 5]);
  });

  it('never completes a step aborted before its turn, even when its GPU starts another one', () => {
    const clock = createVirtualClock();
    const ex = createZeroCostExecutor(clock);
    const done: string[] = [];
    ex.start(work(0, 1), () => done.push('0/1'));
    ex.start(work(1, 1), () => done.push('1/1'));
    ex.abort(0);
    ex.start(work(0, 2), () => done.push('0/2'));
    clock.run();
    expect(done).toEqual(['1/1', '0/2']);
    expect(ex.timed!.running(0)).toBe(false);
  });
});
