// A core's decode runs on its executor: the steps of one batcher decode run (actors/batcher/decode-run.ts) timed as
// one, on one timer at the last one's end, and completed one by one then, each at its own end, as a timer per step
// would have completed them. A run is only started where the core would hold the report of each of its steps but
// the last (see core.ts), so nothing is heard of its steps before its end either way; anything that changes the core
// cuts it first: the steps ended by then complete (and their report is held), the one in flight goes on alone.
import { MAX_RUN_STEPS } from '../batcher/decode-run.ts';
import type { StepPlan } from '../batcher/types.ts';
import type { CoreSteps } from './continuous-steps.ts';
import type { CoreExecutor, RunTiming, StepResult } from './types.ts';

/** What a core's runs need of the core. */
export interface CoreRunsDeps {
  replica: string;
  executor: CoreExecutor;
  steps: CoreSteps;
  /** The core completes `plan`, which ended at `end` (its totals and the batcher, as for any step). */
  complete(plan: StepPlan, r: StepResult, end: number): void;
  done(r: StepResult): void;
  fail(error: unknown): void;
  partial(ranks: number[]): void;
}

/** A core's decode runs. */
export interface CoreRuns {
  /** Starts `plan`, planned now, with the steps that may follow it in place as one run, ending after the first step
   * that ends `span` or more after `from`; false when it does not (the core runs `plan` alone). */
  start(plan: StepPlan, from: number, span: number): boolean;
  /** The run's last step ended: every step before it completes; the last one is then the core's step in flight. */
  ended(): void;
  /** Cuts the run in flight now (none: nothing happens): the steps ended by now complete and the one after them
   * runs alone. Answers the start of the last step it completed, or -1 when it completed none. */
  cut(now: number): number;
  /** A run is in flight. */
  active(): boolean;
}

const NO_RESULT: StepResult = Object.freeze({ busyMs: 0 });

/** Creates the decode runs of a core. */
export function createCoreRuns(d: CoreRunsDeps): CoreRuns {
  const { executor, steps } = d;
  const timing: RunTiming = {
    ends: new Float64Array(MAX_RUN_STEPS + 1),
    predicted: new Float64Array(MAX_RUN_STEPS + 1),
  };
  let plan: StepPlan | null = null;
  let count = 0;
  // The decode context of the run's first step, and what each next one adds.
  let context = 0;
  let grow = 0;

  /** Completes the run's first `m` steps, each at its end, and plans the step after each in its place; answers the
   * last completed step's start. */
  const apply = (p: StepPlan, m: number): number => {
    let began = -1;
    for (let j = 0; j < m; j++) {
      const end = timing.ends[j]!;
      began = p.dispatchedAt;
      d.complete(p, NO_RESULT, end);
      const next = steps.next(end);
      if (next !== p || p.shape.decodeContext !== context + grow * (j + 1))
        throw new Error(`engine core ${d.replica}: step ${j + 2} of a decode run is not the one its run timed`);
      p.predictedMs = timing.predicted[j + 1]!;
      p.dispatchedAt = end;
    }
    return began;
  };

  return {
    start: (p, from, span) => {
      const left = steps.runLeft(p);
      if (left < 1 || executor.runSteps === undefined) return false;
      const n = Math.min(left + 1, MAX_RUN_STEPS);
      context = p.shape.decodeContext;
      grow = p.decodes;
      const k = executor.runSteps(p, n, grow, from, span, timing, d.done, d.fail, d.partial);
      if (k < 2) return false;
      plan = p;
      count = k;
      return true;
    },
    ended: () => {
      const p = plan!;
      plan = null;
      apply(p, count - 1);
    },
    cut: (now) => {
      // A run that ended exactly now ends in the executor's cut (the core's done runs), and may start another.
      while (plan !== null) {
        const p = plan;
        const m = executor.cut!(now);
        if (plan !== p) continue;
        plan = null;
        return m > 0 ? apply(p, m) : -1;
      }
      return -1;
    },
    active: () => plan !== null,
  };
}
