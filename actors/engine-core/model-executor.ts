// The cost model as a core's executor: a step on a tensor-parallel replica takes as long as its slowest rank, each
// rank the roofline time times the replica's and its own slowdown, on one clock timer per step, or per decode run:
// its steps timed one after another as a timer per step would time them, on one timer at the last one's end.
import type { Clock, TimerId } from '../../runtime/clock.ts';
import type { CostModel, StepShape } from '../gpu/cost-model.ts';
import type { StepPlan } from '../batcher/types.ts';
import type { CoreExecutor, RunTiming, StepResult } from './types.ts';

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

/** Times the steps of a decode run from `start` (see CoreExecutor.runSteps) into `t`; answers how many. Each step's
 * time is its slowest rank's: base × each slowdown, of which the largest is base × the largest (rounding is
 * monotonic), added to the step's start as a timer would add it. */
function timeRun(
  cost: CostModel,
  scale: number,
  plan: StepPlan,
  r: { count: number; grow: number; from: number; span: number; most: number },
  t: RunTiming,
  start: number,
  shape: StepShape,
): number {
  shape.prefill = plan.shape.prefill;
  shape.decodeBatch = plan.shape.decodeBatch;
  const context = plan.shape.decodeContext;
  let end = start;
  let k = 0;
  while (k < r.count) {
    shape.decodeContext = context + r.grow * k;
    const base = cost.stepS(shape) * scale;
    const ms = base * r.most;
    if (!(ms > 0)) break;
    end += ms;
    t.ends[k] = end;
    t.predicted[k] = base;
    k++;
    if (end - r.from >= r.span) break;
  }
  return k;
}

/** A timer at `end` on `clock` (exactly there on a clock that takes absolute times). */
const timeAt = (clock: Clock, end: number, fn: () => void): TimerId =>
  clock.at ? clock.at(end, fn) : clock.setTimeout(fn, end - clock.now());

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
  let onFail: ((error: unknown) => void) | null = null;
  // Reused: the core reads a result before the next step starts.
  const result: StepResult = { busyMs: 0 };
  // A decode run in flight: its steps' timing, how many, and each rank's slowdown when it started (a rank stalled
  // then runs no run); null when none.
  let run: RunTiming | null = null;
  let runSteps = 0;
  let runMost = 0;
  const slow = new Float64Array(gpus.length);
  const scratch: StepShape = { prefill: [], decodeBatch: 0, decodeContext: 0 };

  /** Credits every rank with its time in the run's first `m` steps, in order, as their ends would have. */
  const creditRun = (t: RunTiming, from: number, m: number): void => {
    for (let j = from; j < m; j++) {
      const base = t.predicted[j]!;
      for (let i = 0; i < gpus.length; i++) o.credit(gpus[i]!, base * slow[i]!);
    }
  };
  /** A rank changed since the run started: the core should have cut it first. */
  const changed = (): boolean => {
    for (let i = 0; i < gpus.length; i++) {
      const r = o.rank(gpus[i]!);
      if (stalled(r) || r.slowdown !== slow[i]) return true;
    }
    return false;
  };
  /** The run's last step has ended: every step credited, then done. */
  const finishRun = (): void => {
    timer = null;
    const t = run!;
    const done = onDone!;
    const fail = onFail!;
    const n = runSteps;
    run = null;
    running = false;
    onDone = onPartial = null;
    onFail = null;
    if (changed()) {
      fail(new Error(`a rank of gpus ${gpus.join(',')} changed during a decode run that was not cut`));
      return;
    }
    creditRun(t, 0, n);
    result.busyMs = t.predicted[n - 1]! * runMost;
    done(result);
  };

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
    runSteps: (plan, count, grow, from, span, t, done, fail, partial) => {
      if (running) throw new Error(`a step is already running on gpus ${gpus.join(',')}`);
      let most = 0;
      for (let i = 0; i < gpus.length; i++) {
        const r = o.rank(gpus[i]!);
        if (stalled(r)) return 0;
        slow[i] = r.slowdown;
        if (r.slowdown > most) most = r.slowdown;
      }
      const k = timeRun(cost, scale, plan, { count, grow, from, span, most }, t, clock.now(), scratch);
      if (k < 2) return 0;
      run = t;
      runSteps = k;
      runMost = most;
      running = true;
      onDone = done;
      onFail = fail;
      onPartial = partial ?? null;
      timer = timeAt(clock, t.ends[k - 1]!, finishRun);
      return k;
    },
    cut: (now) => {
      const t = run;
      if (t === null) return 0;
      const n = runSteps;
      let m = 0;
      while (m < n && t.ends[m]! <= now) m++;
      // All ended (the last exactly now): the run ends now. A rank changed already: the core cut too late, and the
      // run fails as at its end.
      if (m === n || changed()) {
        if (timer !== null) clock.clearTimeout(timer);
        finishRun();
        return m === n ? n : 0;
      }
      creditRun(t, 0, m);
      // The step in flight goes on alone, as run() from the previous end would have set it up.
      const base = t.predicted[m]!;
      for (let i = 0; i < gpus.length; i++) rankMs[i] = base * slow[i]!;
      run = null;
      onFail = null;
      if (timer !== null) clock.clearTimeout(timer);
      timer = timeAt(clock, t.ends[m]!, finish);
      return m;
    },
    stop: () => {
      if (timer !== null) clock.clearTimeout(timer);
      timer = null;
      running = false;
      run = null;
      onDone = onPartial = onFail = null;
    },
  };
}
