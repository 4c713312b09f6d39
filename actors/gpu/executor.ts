// Executors run steps on a GPU. The cost-model executor takes the time the roofline predicts, on whatever clock
// it is given: virtual time in the simulator, real time when serving. A real engine would implement the same.
import type { Clock, TimerId, VirtualClock } from '../../runtime/clock.ts';
import type { CostModel, StepShape } from './cost-model.ts';

/** One rank's share of a step. */
export interface StepWork {
  gpu: number;
  replica: string;
  epoch: number;
  step: number;
  shape: StepShape;
  cost: CostModel;
  /** Multiplies the step time: a straggler or co-located interference. */
  slowdown: number;
}

/** Runs steps on GPUs; every implementation passes test/actors/gpu/executor.contract.ts. */
export interface Executor {
  readonly name: string;
  /** Starts a step on a GPU; `done` is called once, asynchronously, when it completes. A GPU runs one step at a time. */
  start(work: StepWork, done: (busyMs: number) => void): void;
  /** Abandons the step running on a GPU: its `done` is never called. */
  abort(gpu: number): void;
  /** Milliseconds each GPU has spent executing steps. */
  busyMs(gpu: number): number;
  /** Executors whose step time is known in advance (virtual time) can be stood in for by the simulator's link
   * shortcut: what a step would take, whether a GPU is executing one, and crediting a step run without a timer. */
  readonly timed?: {
    durationMs(work: StepWork): number;
    running(gpu: number): boolean;
    credit(gpu: number, ms: number): void;
    /**
     * Starts one step on every rank of a gang whose ranks take the same time (the caller checked): one timer for all,
     * and `done` once with the ranks still running it, in start order (an aborted rank leaves the gang). On a virtual
     * clock the timer counts as the one timer per rank it replaces.
     */
    startGang(works: readonly StepWork[], done: (busyMs: number, ranks: number[]) => void): void;
  };
}

/** Creates an executor whose steps take `durationMs(work)` on `clock`. */
export function createTimedExecutor(name: string, clock: Clock, durationMs: (w: StepWork) => number): Executor {
  // What each GPU is running: one timer per step, shared by the ranks of a gang.
  const running = new Map<number, { timer: TimerId; ranks: Set<number> }>();
  const busy = new Map<number, number>();
  const standIn = (clock as Partial<VirtualClock>).standIn;
  const launch = (gpus: readonly number[], ms: number, done: (busyMs: number, ranks: number[]) => void): void => {
    for (const g of gpus) if (running.has(g)) throw new Error(`gpu.${g} is already executing a step`);
    const ranks = new Set(gpus);
    const run = {
      ranks,
      timer: clock.setTimeout(() => {
        const finished = [...ranks];
        for (const g of finished) {
          running.delete(g);
          busy.set(g, (busy.get(g) ?? 0) + ms);
        }
        if (finished.length > 1) standIn?.(finished.length - 1);
        done(ms, finished);
      }, ms),
    };
    for (const g of gpus) running.set(g, run);
  };
  return {
    name,
    start: (work, done) => launch([work.gpu], durationMs(work), (ms) => done(ms)),
    abort: (gpu) => {
      const run = running.get(gpu);
      if (!run) return;
      running.delete(gpu);
      run.ranks.delete(gpu);
      if (run.ranks.size === 0) clock.clearTimeout(run.timer);
    },
    busyMs: (gpu) => busy.get(gpu) ?? 0,
    timed: {
      durationMs,
      running: (gpu) => running.has(gpu),
      credit: (gpu, ms) => {
        busy.set(gpu, (busy.get(gpu) ?? 0) + ms);
      },
      startGang: (works, done) =>
        launch(
          works.map((w) => w.gpu),
          durationMs(works[0]!),
          done,
        ),
    },
  };
}

/** The calibrated cost-model executor: a step takes the roofline time times the GPU's slowdown. */
export function createCostModelExecutor(clock: Clock, scale = 1): Executor {
  return createTimedExecutor('cost-model', clock, (w) => w.cost.stepS(w.shape) * 1000 * w.slowdown * scale);
}

/**
 * An executor whose steps take no time (still asynchronous): measures switchyard's own overhead. Every step started
 * in one turn completes in one timer, in start order (not one timer per step: a worker answering eight replicas would
 * otherwise spend a macrotask, and send a frame, per step).
 */
export function createZeroCostExecutor(clock: Clock): Executor {
  interface Run {
    ranks: number[];
    done: (busyMs: number, ranks: number[]) => void;
  }
  // Steps started since the batch timer was set, in start order; what each GPU runs (an abort forgets it).
  let batch: Run[] = [];
  const running = new Map<number, Run>();
  const runBatch = (): void => {
    const due = batch;
    batch = [];
    for (const run of due) {
      const ranks = run.ranks.filter((g) => running.get(g) === run);
      for (const g of ranks) running.delete(g);
      if (ranks.length > 0) run.done(0, ranks);
    }
  };
  const launch = (gpus: readonly number[], done: Run['done']): void => {
    for (const g of gpus) if (running.has(g)) throw new Error(`gpu.${g} is already executing a step`);
    const run: Run = { ranks: [...gpus], done };
    for (const g of gpus) running.set(g, run);
    if (batch.length === 0) clock.setTimeout(runBatch, 0);
    batch.push(run);
  };
  return {
    name: 'zero-cost',
    start: (work, done) => launch([work.gpu], (ms) => done(ms)),
    abort: (gpu) => void running.delete(gpu),
    busyMs: () => 0,
    timed: {
      durationMs: () => 0,
      running: (gpu) => running.has(gpu),
      credit: () => {},
      startGang: (works, done) =>
        launch(
          works.map((w) => w.gpu),
          done,
        ),
    },
  };
}
