import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { createCostModel } from '../../../actors/gpu/cost-model.ts';
import { GPU_PROFILES, MODEL_PROFILES } from '../../../actors/gpu/profiles.ts';
import { rooflineBound, type WorkItem } from '../../../actors/batcher/roofline.ts';
import { createContinuousBatcher, type BatchPolicy } from '../../../actors/batcher/continuous.ts';
import { createSequence } from '../../../actors/batcher/sequence.ts';

const small = createCostModel(MODEL_PROFILES['llama-3-8b']!, GPU_PROFILES['H100-SXM']!, 1);
const large = createCostModel(MODEL_PROFILES['llama-3-70b']!, GPU_PROFILES['H100-SXM']!, 8);

/** Serves `work` with the batcher, every step timed by the cost model; returns the seconds taken. */
function serve(
  policy: BatchPolicy,
  maxRunning: number,
  tokenBudget: number,
  work: readonly WorkItem[],
  cost = small,
): number {
  const b = createContinuousBatcher({
    policy,
    maxRunning,
    tokenBudget,
    blockTokens: 16,
    blocksTotal: 4000,
    maxContext: 8192,
    watermarkBlocks: 0,
  });
  const noop = (): void => {};
  work.forEach((w, i) =>
    b.enqueue(
      createSequence({
        id: `s${i}`,
        priority: 0,
        order: i,
        promptTokens: w.prompt,
        outputTokens: w.output,
        maxTokens: w.output,
        receivedAt: 0,
        listener: { scheduled: noop, preempted: noop, tokens: noop, finished: noop },
      }),
    ),
  );
  let t = 0;
  for (let p = b.plan(t); p; p = b.plan(t)) {
    t += cost.stepS(p.shape);
    b.complete(p, t);
  }
  return t;
}

describe('roofline bound', () => {
  it('equals the cost model’s step time for work that fits one step', () => {
    for (const cost of [small, large]) {
      const bound = rooflineBound(cost, { maxRunning: 8, tokenBudget: 2048 }, [{ prompt: 700, output: 1 }]);
      expect(bound.steps).toBe(1);
      expect(bound.seconds).toBeCloseTo(cost.prefillS(700, 0), 9);
    }
  });

  it('counts at least one step per token of the longest output', () => {
    const bound = rooflineBound(small, { maxRunning: 256, tokenBudget: 8192 }, [{ prompt: 10, output: 300 }]);
    expect(bound.steps).toBe(300);
    expect(bound.seconds).toBeGreaterThan(300 * small.params.cpuOverheadS);
  });

  it('is never beaten by the batcher, under any policy and limits', () => {
    fc.assert(
      fc.property(
        fc.constantFrom<BatchPolicy>('chunked', 'prefill-first', 'static'),
        fc.integer({ min: 1, max: 32 }),
        fc.integer({ min: 16, max: 2048 }),
        fc.array(fc.record({ prompt: fc.integer({ min: 1, max: 3000 }), output: fc.integer({ min: 1, max: 200 }) }), {
          minLength: 1,
          maxLength: 30,
        }),
        (policy, maxRunning, tokenBudget, work) => {
          const bound = rooflineBound(small, { maxRunning, tokenBudget, wholePrompts: policy !== 'chunked' }, work);
          expect(serve(policy, maxRunning, tokenBudget, work)).toBeGreaterThanOrEqual(bound.seconds * (1 - 1e-9));
        },
      ),
      { numRuns: 60, seed: 5 },
    );
  });

  it('is tight for a full continuous batch of equal requests', () => {
    const work = Array.from({ length: 64 }, () => ({ prompt: 512, output: 128 }));
    const bound = rooflineBound(small, { maxRunning: 64, tokenBudget: 4096 }, work);
    expect(bound.seconds / serve('chunked', 64, 4096, work)).toBeGreaterThan(0.8);
  });
});
