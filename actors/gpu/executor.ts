// Executors run steps on a GPU. The cost-model executor takes the time the roofline predicts, on whatever clock
// it is given: virtual time in the simulator, real time when serving. A real engine would implement the same.
import type { Clock, TimerId } from '../../runtime/clock.ts';
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
  };
}

/** Creates an executor whose steps take `durationMs(work)` on `clock`. */
export function createTimedExecutor(name: string, clock: Clock, durationMs: (w: StepWork) => number): Executor {
  const running = new Map<number, TimerId>();
  const busy = new Map<number, number>();
  return {
    name,
    start: (work, done) => {
      if (running.has(work.gpu)) throw new Error(`gpu.${work.gpu} is already executing a step`);
      const ms = durationMs(work);
      const timer = clock.setTimeout(() => {
        running.delete(work.gpu);
        busy.set(work.gpu, (busy.get(work.gpu) ?? 0) + ms);
        done(ms);
      }, ms);
      running.set(work.gpu, timer);
    },
    abort: (gpu) => {
      const t = running.get(gpu);
      if (t !== undefined) clock.clearTimeout(t);
      running.delete(gpu);
    },
    busyMs: (gpu) => busy.get(gpu) ?? 0,
    timed: {
      durationMs,
      running: (gpu) => running.has(gpu),
      credit: (gpu, ms) => {
        busy.set(gpu, (busy.get(gpu) ?? 0) + ms);
      },
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
