// The contract every executor implementation passes (one shared suite, as hono's router conformance tests do).
import { describe, expect, it } from 'vitest';
import type { Executor, StepWork } from '../../../actors/gpu/executor.ts';
import { createCostModel } from '../../../actors/gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../../../actors/gpu/profiles.ts';

/** A harness the contract drives: an executor plus a way to let its clock run. */
export interface ExecutorHarness {
  executor: Executor;
  /** Lets time pass until every started step that can finish has finished. */
  settle(): Promise<void>;
}

const cost = createCostModel(modelProfile('llama-3-8b'), gpuProfile('H100-SXM'), 1);
const work = (gpu: number, step: number, decodeBatch = 4): StepWork => ({
  gpu,
  replica: 'replica.m@v1#0',
  epoch: 1,
  step,
  shape: { prefill: [], decodeBatch, decodeContext: decodeBatch * 100 },
  cost,
  slowdown: 1,
});

/** Runs the executor contract against implementations made by `make`. */
export function executorContract(name: string, make: () => ExecutorHarness): void {
  describe(`executor contract: ${name}`, () => {
    it('completes a started step exactly once, asynchronously', async () => {
      const h = make();
      let calls = 0;
      h.executor.start(work(0, 1), () => calls++);
      expect(calls).toBe(0);
      await h.settle();
      expect(calls).toBe(1);
      await h.settle();
      expect(calls).toBe(1);
    });

    it('never completes an aborted step', async () => {
      const h = make();
      let calls = 0;
      h.executor.start(work(0, 1), () => calls++);
      h.executor.abort(0);
      await h.settle();
      expect(calls).toBe(0);
    });

    it('runs steps on different GPUs independently', async () => {
      const h = make();
      const done: number[] = [];
      for (let g = 0; g < 8; g++) h.executor.start(work(g, 1), () => done.push(g));
      h.executor.abort(3);
      await h.settle();
      expect(done.sort()).toEqual([0, 1, 2, 4, 5, 6, 7]);
    });

    it('refuses a second step on a GPU that is still executing', () => {
      const h = make();
      h.executor.start(work(0, 1), () => {});
      expect(() => h.executor.start(work(0, 2), () => {})).toThrow(/already executing/);
    });

    it('accounts busy time per GPU', async () => {
      const h = make();
      h.executor.start(work(2, 1), () => {});
      await h.settle();
      expect(h.executor.busyMs(2)).toBeGreaterThanOrEqual(0);
      expect(h.executor.busyMs(5)).toBe(0);
    });
  });
}
