// The engine core's shapes: the core itself, the executor it drives, and how it is made.
import type { TokenLogprob } from '../../machines/core-messages.ts';
import type { Clock } from '../../runtime/clock.ts';
import type { ContinuousLimits, StepPlan } from '../batcher/types.ts';
import type { ClosedBatch, StatelessLimits } from '../batcher/stateless.ts';
import type { CoreReport, ReplicaLoad, SubmitItem, SubmitSeq } from '../../machines/core-messages.ts';

export type { CoreReport, ReplicaLoad, SeqEvent, SubmitItem, SubmitSeq } from '../../machines/core-messages.ts';

/** What an executor says of a finished step: its time, and for a real engine what it sampled per sequence. */
export interface StepResult {
  busyMs: number;
  sampled?: readonly {
    seq: string;
    token: number;
    text: string;
    finish?: 'eos' | 'stop' | 'length';
    logprob?: TokenLogprob;
  }[];
}

/** Where an executor puts the timing of a decode run's steps (see CoreExecutor.runSteps). */
export interface RunTiming {
  readonly ends: Float64Array;
  readonly predicted: Float64Array;
}

/** Runs one step at a time for a core: a cost model on a clock, or a real engine. */
export interface CoreExecutor {
  /** The time the step is predicted to take (ms), for load reports and estimate error. */
  predictMs(plan: StepPlan): number;
  /** Starts a step; `done` is called once, asynchronously, unless the core is stopped first. `fail` when the engine
   * could not run it (the replica then fails as a unit). `partial`: some ranks finished the step while another has
   * not (a hung rank), and `done` will not come. */
  run(
    plan: StepPlan,
    batch: ClosedBatch | null,
    done: (r: StepResult) => void,
    fail: (error: unknown) => void,
    partial?: (ranks: number[]) => void,
  ): void;
  /** Times up to `count` steps of a decode run back to back on one timer: `plan` from now, each next step the same
   * with `grow` more tokens of decode context. It stops after the first step that ends `span` or more after `from`.
   * Fills `t.ends` (each step's end on the clock, as `run` step after step would have it) and `t.predicted` (each
   * step's predictMs); returns the steps it runs, or 0 (it runs nothing: `run` the plan instead) when fewer than two
   * would run, a step would take no time or a rank is stalled. `done` comes once, at the last step's end, every rank
   * credited with each step's time, unless the run is cut or stopped first. Ranks must not change during a run
   * without a cut first (the run then fails). */
  runSteps?(
    plan: StepPlan,
    count: number,
    grow: number,
    from: number,
    span: number,
    t: RunTiming,
    done: (r: StepResult) => void,
    fail: (error: unknown) => void,
    partial?: (ranks: number[]) => void,
  ): number;
  /** Cuts the run in flight at `now`: returns how many of its steps ended by then (credited, as their ends came).
   * The step after them goes on alone, as `run` would have run it from the end of the one before (its `done`, or
   * `partial` when a rank stalled, at its end). When the last one ended exactly now, the run's `done` comes before
   * this returns. */
  cut?(now: number): number;
  /** A sequence left the core (cancelled, preempted, finished): a real engine frees its cells. */
  release?(seq: string): void;
  /** The core is stopped: abandon the step in flight. */
  stop(): void;
}

/** How a core is made. */
export interface EngineCoreOptions {
  replica: string;
  epoch: number;
  /** The control plane's `model@version`: every sequence's owner (step invariants check it). */
  owner: string;
  clock: Clock;
  /** Continuous batching with these limits, or (when `stateless` is given) dynamic batching. */
  limits: ContinuousLimits;
  stateless?: StatelessLimits;
  executor: CoreExecutor;
  /** Called after every step, and after a submit or cancel changed what the control plane must hear. */
  report(r: CoreReport): void;
  /** Decode runs: while the running set only decodes and nothing else happens, reports are held back for at most this
   * long (ms) since the last one, and the next covers every step since (see core.ts). 0 or absent: a report after
   * every step. A virtual clock's option: on a wall clock it would hold clients' tokens back. */
  decodeRunMs?: number;
  /** Checks the batcher's invariants after every step (simulation and tests). */
  checkInvariants?: boolean;
  /** The loop threw: the core stops and the replica fails as a unit. */
  crashed(error: unknown): void;
}

/** One replica's step loop, beside its engine: scheduler and executor, plan → execute → apply → report. */
export interface EngineCore {
  readonly replica: string;
  readonly epoch: number;
  submit(seqs: readonly SubmitSeq[]): void;
  submitItems(items: readonly SubmitItem[]): void;
  /** Cancels sequences or items (cancelled, expired on the control plane): they leave at once, with no event. */
  cancel(ids: readonly string[]): void;
  load(): ReplicaLoad;
  /** A step runs now. */
  busy(): boolean;
  /** Sends the report held back by a decode run now, if any (its node calls it before a device of the replica
   * changes, so the control plane hears the steps done before that change first). */
  flush(): void;
  /** Stops the loop for good (the replica is released or failed); everything it held is dropped. */
  stop(): void;
}
