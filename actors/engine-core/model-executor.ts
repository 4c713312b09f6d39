// The cost model as a core's executor: a step on a tensor-parallel replica takes as long as its slowest rank, each
// rank the roofline time times the replica's and its own slowdown, on one clock timer per step.
import type { Clock, TimerId } from '../../runtime/clock.ts';
import type { CostModel } from '../gpu/cost-model.ts';
import type { StepPlan } from '../batcher/types.ts';
import type { CoreExecutor, StepResult } from './types.ts';

/** A rank as the executor reads it when a step starts and when it ends. */
export interface ModelRank {
  /** It runs nothing (a hang): a step it is part of never completes. */
  hung: boolean;
  /** Multiplies its step time (a straggler). */
  slowdown: number;
  /** It serves this replica; a rank that does not runs none of its steps. */
  serving: boolean;
}

/** What a cost-model executor is made of. */
export interface ModelExecutorOptions {
  clock: Clock;
  cost: CostModel;
  /** The replica's ranks, in order. */
  gpus: readonly number[];
  rank(g: number): ModelRank;
  /** Slows every step of the replica (co-location interference); 1 when absent. */
  slowdown?: number;
  /** Credits a rank with the time it spent on a step it finished. */
  credit(g: number, busyMs: number): void;
}

const stalled = (r: ModelRank): boolean => r.hung || !r.serving;

/** Creates the cost-model executor of one replica. */
export function createModelExecutor(o: ModelExecutorOptions): CoreExecutor {
  const { clock, cost, gpus } = o;
  const scale = 1000 * (o.slowdown ?? 1);
  // The step in flight: each rank's time (-1: stalled when the step started, so it never runs it) and its callbacks.
  const rankMs = new Float64Array(gpus.length);
  let running = false;
  let timer: TimerId | null = null;
  let onDone: ((r: StepResult) => void) | null = null;
  let onPartial: ((ranks: number[]) => void) | null = null;
  // Reused: the core reads a result before the next step starts.
  const result: StepResult = { busyMs: 0 };

  /** The slowest rank that was running has finished: the step is done, or, when a rank stalled, only partly. */
  const finish = (): void => {
    timer = null;
    const done = onDone!;
    const partial = onPartial;
    let finished: number[] | null = null;
    let slowest = 0;
    for (let i = 0; i < gpus.length; i++) {
      const g = gpus[i]!;
      const ms = rankMs[i]!;
      if (ms < 0 || stalled(o.rank(g))) {
        // Ranks before this one finished: the step is partial from here on.
        finished ??= gpus.slice(0, i).filter((_, j) => rankMs[j]! >= 0);
        continue;
      }
      o.credit(g, ms);
      finished?.push(g);
      if (ms > slowest) slowest = ms;
    }
    if (finished === null) {
      running = false;
      onDone = onPartial = null;
      result.busyMs = slowest;
      done(result);
    } else if (finished.length > 0) {
      // The step stays in flight: the stalled rank never finishes it (the control plane fails the replica).
      partial?.(finished);
    }
  };

  return {
    predictMs: (plan: StepPlan) => cost.stepS(plan.shape) * scale,
    run: (plan, _batch, done, _fail, partial) => {
      if (running) throw new Error(`a step is already running on gpus ${gpus.join(',')}`);
      const base = cost.stepS(plan.shape) * scale;
      let slowest = -1;
      for (let i = 0; i < gpus.length; i++) {
        const r = o.rank(gpus[i]!);
        const ms = stalled(r) ? -1 : base * r.slowdown;
        rankMs[i] = ms;
        if (ms > slowest) slowest = ms;
      }
      running = true;
      onDone = done;
      onPartial = partial ?? null;
      // Every rank stalled: nothing finishes, and nothing is said.
      if (slowest >= 0) timer = clock.setTimeout(finish, slowest);
    },
    stop: () => {
      if (timer !== null) clock.clearTimeout(timer);
      timer = null;
      running = false;
      onDone = onPartial = null;
    },
  };
}
