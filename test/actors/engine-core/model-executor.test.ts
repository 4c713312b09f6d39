// The cost model as an engine core's executor: a tensor-parallel step takes its slowest rank's time on one timer, a
// stalled rank turns the step into a partial report, and busy time is credited per finished rank.
import { describe, expect, it } from 'vitest';
import { createVirtualClock } from '../../../runtime/clock.ts';
import { createCostModel } from '../../../actors/gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../../../actors/gpu/profiles.ts';
import { createModelExecutor, type ModelRank } from '../../../actors/engine-core/model-executor.ts';
import type { StepPlan } from '../../../actors/batcher/types.ts';
import type { StepResult } from '../../../actors/engine-core/types.ts';

const cost = createCostModel(modelProfile('llama-3-70b'), gpuProfile('H100-SXM'), 2);

/** A decode step of 8 sequences, 512 tokens of context each. */
const plan = (): StepPlan => ({
  entries: [],
  shape: { prefill: [], decodeBatch: 8, decodeContext: 4096 },
  tokens: 8,
  prefillTokens: 0,
  decodes: 8,
  blocksUsed: 0,
  predictedMs: 0,
  dispatchedAt: 0,
});
const baseMs = cost.stepS(plan().shape) * 1000;

function setup(ranks: ModelRank[], slowdown?: number) {
  const clock = createVirtualClock();
  const credits: [number, number][] = [];
  const exec = createModelExecutor({
    clock,
    cost,
    gpus: ranks.map((_, i) => 10 + i),
    rank: (g) => ranks[g - 10]!,
    ...(slowdown === undefined ? {} : { slowdown }),
    credit: (g, ms) => credits.push([g, ms]),
  });
  const done: { at: number; r: StepResult }[] = [];
  const partial: { at: number; ranks: number[] }[] = [];
  const fails: unknown[] = [];
  const run = (p = plan()): void =>
    exec.run(
      p,
      null,
      (r) => done.push({ at: clock.now(), r: { ...r } }),
      (e) => fails.push(e),
      (rs) => partial.push({ at: clock.now(), ranks: rs }),
    );
  return { clock, exec, credits, done, partial, fails, run };
}

const ok = (slowdown = 1): ModelRank => ({ hung: false, slowdown, serving: true });

describe('model executor', () => {
  it('predicts the roofline time times the replica slowdown, not a rank straggle', () => {
    const t = setup([ok(), ok(3)], 1.5);
    expect(t.exec.predictMs(plan())).toBeCloseTo(baseMs * 1.5, 9);
  });

  it('completes a step at its slowest rank on one timer and credits each rank its own time', () => {
    const t = setup([ok(), ok(2)], 1.5);
    t.run();
    expect(t.clock.pending()).toBe(1);
    t.clock.run();
    expect(t.done).toHaveLength(1);
    expect(t.done[0]!.at).toBeCloseTo(baseMs * 3, 9);
    expect(t.done[0]!.r.busyMs).toBeCloseTo(baseMs * 3, 9);
    expect(t.credits.map(([g]) => g)).toEqual([10, 11]);
    expect(t.credits[0]![1]).toBeCloseTo(baseMs * 1.5, 9);
    expect(t.credits[1]![1]).toBeCloseTo(baseMs * 3, 9);
    expect(t.partial).toEqual([]);
  });

  describe('a stalled rank', () => {
    it('turns the step into a partial report of the ranks that finished, and never completes it', () => {
      const t = setup([ok(), { hung: true, slowdown: 1, serving: true }, ok(2)]);
      t.run();
      t.clock.run();
      expect(t.done).toEqual([]);
      expect(t.partial).toHaveLength(1);
      expect(t.partial[0]!.ranks).toEqual([10, 12]);
      expect(t.partial[0]!.at).toBeCloseTo(baseMs * 2, 9);
      expect(t.credits.map(([g]) => g)).toEqual([10, 12]);
      // The step is still in flight: another cannot start.
      expect(() => t.run()).toThrow(/already running/);
    });

    it('counts a rank that no longer serves as stalled', () => {
      const t = setup([{ hung: false, slowdown: 1, serving: false }, ok()]);
      t.run();
      t.clock.run();
      expect(t.done).toEqual([]);
      expect(t.partial.map((p) => p.ranks)).toEqual([[11]]);
    });

    it('stalls the step when a rank hangs while it runs', () => {
      const ranks = [ok(), ok()];
      const t = setup(ranks);
      t.run();
      ranks[0] = { hung: true, slowdown: 1, serving: true };
      t.clock.run();
      expect(t.done).toEqual([]);
      expect(t.partial.map((p) => p.ranks)).toEqual([[11]]);
      expect(t.credits.map(([g]) => g)).toEqual([11]);
    });

    it('says nothing when every rank is stalled', () => {
      const hung = { hung: true, slowdown: 1, serving: true };
      const t = setup([hung, hung]);
      t.run();
      expect(t.clock.pending()).toBe(0);
      t.clock.run();
      expect(t.done).toEqual([]);
      expect(t.partial).toEqual([]);
      expect(t.credits).toEqual([]);
    });
  });

  it('refuses a second step while one runs', () => {
    const t = setup([ok()]);
    t.run();
    expect(() => t.run()).toThrow(/already running/);
  });

  it('abandons the step in flight when stopped, and runs another after', () => {
    const t = setup([ok()]);
    t.run();
    t.exec.stop();
    expect(t.clock.pending()).toBe(0);
    t.clock.run();
    expect(t.done).toEqual([]);
    t.exec.stop();
    t.run();
    t.clock.run();
    expect(t.done).toHaveLength(1);
    expect(t.credits).toHaveLength(1);
  });
});
