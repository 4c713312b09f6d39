// Executors run a step's shape on a GPU, one step at a time per GPU. Serving and simulation run each replica's steps
// in its engine core (actors/engine-core/); this interface is for timing shapes by themselves on a real engine
// (actors/engine/shape-executor.ts, what calibration measures), and its implementations pass one contract suite.
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
}
