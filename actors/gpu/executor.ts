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

/** An executor whose steps take no time (still asynchronous): measures switchyard's own overhead. */
export function createZeroCostExecutor(clock: Clock): Executor {
  return createTimedExecutor('zero-cost', clock, () => 0);
}
