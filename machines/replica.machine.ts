// One model replica: a gang of 1 or 8 GPUs that loads, runs an iteration loop, drains, and fails as a unit.
import { assign, emit, setup } from 'xstate';
import type { OutEvent } from './messages.ts';

/** Context of a replica actor: its GPU gang, epoch, and the step in flight. */
export interface ReplicaContext {
  id: string;
  model: string;
  version: string;
  gpus: readonly number[];
  /** Raised on each failure; every step and message about it carries the epoch. */
  epoch: number;
  /** The epoch the GPUs were assigned under (release uses it). */
  gpuEpoch: number;
  step: number;
  /** Ranks that have not yet reported the step in flight. */
  pendingRanks: number;
  /** True between dispatching a step and hearing it was applied. */
  stepping: boolean;
  loaded: number;
  /** GPUs that reported loaded (a repeated report counts once). */
  loadedGpus: readonly number[];
  released: number;
  /** GPUs that reported released: a fault they report afterwards no longer concerns this replica. */
  releasedGpus: readonly number[];
  failedGpus: readonly number[];
  drainDeadlineMs: number;
  loadMs: number;
  unloadMs: number;
}

/** Input to create a replica actor. */
export interface ReplicaInput {
  id: string;
  model: string;
  version: string;
  gpus: readonly number[];
  epoch: number;
  loadMs: number;
  unloadMs: number;
}

/** Events a replica handles. */
export type ReplicaEvent =
  | { type: 'replica.start' }
  | { type: 'gpu.loaded'; gpu: number; epoch: number }
  | { type: 'work.available' }
  | { type: 'step.completed'; gpu: number; epoch: number; step: number }
  | { type: 'step.empty'; epoch: number }
  | { type: 'work.saturated' }
  | { type: 'work.unsaturated' }
  | { type: 'replica.drain'; deadlineMs: number }
  | { type: 'gpu.failed'; gpu: number; code: string }
  | { type: 'gpu.released'; gpu: number; epoch: number }
  | { type: 'replica.stop' };

/** A replica ends stopped; its output says whether it failed. */
export interface ReplicaOutput {
  id: string;
  failed: boolean;
  epoch: number;
}

/** The replica machine: placing → loading → ready{idle, busy, saturated} → draining → unloading → stopped; failed. */
export const replicaMachine = setup({
  types: {
    context: {} as ReplicaContext,
    input: {} as ReplicaInput,
    events: {} as ReplicaEvent,
    emitted: {} as OutEvent,
    output: {} as ReplicaOutput,
  },
  actions: {
    /** Asks each GPU of the gang to load this replica's weights. */
    assignGpus: () => {},
    /** Plans the next iteration and sends it to every rank; an empty plan answers `step.empty`, a change of
     * saturation (slots or KV full) answers `work.saturated` / `work.unsaturated`. */
    dispatchStep: () => {},
    /** Applies a step every rank reported: tokens, finished sequences, KV blocks. */
    completeStep: () => {},
    /** Forgets the step in flight (its results will carry a dead epoch). */
    abortStep: () => {},
    /** Hands every sequence back to the router: resumed elsewhere or failed, exactly one of the two. */
    interruptAll: () => {},
    /** Asks the gang's healthy GPUs to unload. */
    releaseGpus: () => {},
    tellReady: emit(({ context }) => ({
      type: 'out' as const,
      to: 'placement',
      msg: { type: 'replica.ready', replica: context.id, epoch: context.epoch, gpus: [...context.gpus] },
    })),
    tellFailed: emit(({ context }) => ({
      type: 'out' as const,
      to: 'placement',
      msg: {
        type: 'replica.failed',
        replica: context.id,
        epoch: context.epoch,
        gpus: [...context.gpus],
        failedGpus: [...context.failedGpus],
      },
    })),
    tellStopped: emit(({ context }) => ({
      type: 'out' as const,
      to: 'placement',
      msg: {
        type: 'replica.stopped',
        replica: context.id,
        epoch: context.epoch,
        gpus: [...context.gpus],
        failedGpus: [...context.failedGpus],
      },
    })),
    nextStep: assign({
      step: ({ context }) => context.step + 1,
      pendingRanks: ({ context }) => context.gpus.length,
      stepping: true,
    }),
    countRank: assign({ pendingRanks: ({ context }) => context.pendingRanks - 1 }),
    addFailedGpu: assign({
      failedGpus: ({ context, event }) =>
        event.type === 'gpu.failed' ? [...context.failedGpus, event.gpu] : context.failedGpus,
    }),
    countLoaded: assign({
      loaded: ({ context }) => context.loaded + 1,
      loadedGpus: ({ context, event }) =>
        event.type === 'gpu.loaded' ? [...context.loadedGpus, event.gpu] : context.loadedGpus,
    }),
    countReleased: assign({
      released: ({ context }) => context.released + 1,
      releasedGpus: ({ context, event }) =>
        event.type === 'gpu.released' ? [...context.releasedGpus, event.gpu] : context.releasedGpus,
    }),
  },
  delays: {
    drainDeadline: ({ context }) => context.drainDeadlineMs,
  },
  guards: {
    allLoaded: ({ context, event }) =>
      event.type === 'gpu.loaded' &&
      event.epoch === context.gpuEpoch &&
      !context.loadedGpus.includes(event.gpu) &&
      context.loaded + 1 >= context.gpus.length,
    loadedOne: ({ context, event }) =>
      event.type === 'gpu.loaded' && event.epoch === context.gpuEpoch && !context.loadedGpus.includes(event.gpu),
    rankOfStep: ({ context, event }) =>
      event.type === 'step.completed' &&
      event.epoch === context.epoch &&
      event.step === context.step &&
      context.pendingRanks > 0,
    lastRankOfStep: ({ context, event }) =>
      event.type === 'step.completed' &&
      event.epoch === context.epoch &&
      event.step === context.step &&
      context.pendingRanks === 1,
    currentEmpty: ({ context, event }) => event.type === 'step.empty' && event.epoch === context.epoch,
    isStepping: ({ context }) => context.stepping,
    newFailedGpu: ({ context, event }) =>
      event.type === 'gpu.failed' &&
      context.gpus.includes(event.gpu) &&
      !context.failedGpus.includes(event.gpu) &&
      !context.releasedGpus.includes(event.gpu),
    allAccountedFor: ({ context }) => context.released + context.failedGpus.length >= context.gpus.length,
    ownGpu: ({ context, event }) => event.type === 'gpu.failed' && context.gpus.includes(event.gpu),
    // A release answered twice (a repeated release) counts once; a failed GPU is not also counted released.
    allReleased: ({ context, event }) =>
      event.type === 'gpu.released' &&
      event.epoch === context.gpuEpoch &&
      !context.releasedGpus.includes(event.gpu) &&
      !context.failedGpus.includes(event.gpu) &&
      context.released + 1 + context.failedGpus.length >= context.gpus.length,
    releasedOne: ({ context, event }) =>
      event.type === 'gpu.released' &&
      event.epoch === context.gpuEpoch &&
      !context.releasedGpus.includes(event.gpu) &&
      !context.failedGpus.includes(event.gpu),
    allReleasedAfterFault: ({ context, event }) =>
      event.type === 'gpu.failed' &&
      context.gpus.includes(event.gpu) &&
      !context.failedGpus.includes(event.gpu) &&
      !context.releasedGpus.includes(event.gpu) &&
      context.released + context.failedGpus.length + 1 >= context.gpus.length,
  },
}).createMachine({
  id: 'replica',
  context: ({ input }) => ({
    id: input.id,
    model: input.model,
    version: input.version,
    gpus: input.gpus,
    epoch: input.epoch,
    gpuEpoch: input.epoch,
    step: 0,
    pendingRanks: 0,
    stepping: false,
    loaded: 0,
    loadedGpus: [],
    released: 0,
    releasedGpus: [],
    failedGpus: [],
    drainDeadlineMs: 0,
    loadMs: input.loadMs,
    unloadMs: input.unloadMs,
  }),
  initial: 'placing',
  states: {
    placing: {
      on: {
        'replica.start': 'loading',
        'replica.stop': 'stopped',
        // Nothing was loaded yet: a fault in the earmarked gang just cancels the placement.
        'gpu.failed': { guard: 'ownGpu', target: 'stopped', actions: 'addFailedGpu' },
      },
    },
    loading: {
      tags: ['holdsGpu'],
      entry: 'assignGpus',
      on: {
        'gpu.loaded': [
          { guard: 'allLoaded', target: 'ready', actions: 'countLoaded' },
          { guard: 'loadedOne', actions: 'countLoaded' },
        ],
        'replica.drain': 'unloading',
        'replica.stop': 'unloading',
      },
    },
    ready: {
      tags: ['holdsGpu'],
      entry: 'tellReady',
      initial: 'idle',
      on: {
        'replica.drain': { target: 'draining', actions: assign({ drainDeadlineMs: ({ event }) => event.deadlineMs }) },
        'replica.stop': { target: 'draining', actions: assign({ drainDeadlineMs: 0 }) },
        // The last rank's report applies the step and dispatches the next one in the same transition: one actor
        // event per rank per step, no state re-entry on the hot path.
        'step.completed': [
          { guard: 'lastRankOfStep', actions: ['completeStep', 'nextStep', 'dispatchStep'] },
          { guard: 'rankOfStep', actions: 'countRank' },
        ],
      },
      states: {
        idle: {
          tags: ['accepting'],
          entry: assign({ stepping: false }),
          on: { 'work.available': { target: 'busy', actions: ['nextStep', 'dispatchStep'] } },
        },
        busy: {
          tags: ['accepting', 'stepping'],
          on: {
            'step.empty': { guard: 'currentEmpty', target: 'idle' },
            'work.saturated': 'saturated',
          },
        },
        saturated: {
          tags: ['stepping'],
          on: {
            'step.empty': { guard: 'currentEmpty', target: 'idle' },
            'work.unsaturated': 'busy',
          },
        },
      },
    },
    draining: {
      tags: ['holdsGpu'],
      initial: 'settling',
      after: {
        drainDeadline: { target: 'unloading', actions: ['abortStep', 'interruptAll'] },
      },
      states: {
        settling: {
          always: [{ guard: 'isStepping', target: 'stepping' }, { target: '#replica.unloading' }],
        },
        // Finishes what it holds: steps continue until the batcher is empty (or the deadline passes).
        stepping: {
          tags: ['stepping'],
          on: {
            'step.completed': [
              { guard: 'lastRankOfStep', actions: ['completeStep', 'nextStep', 'dispatchStep'] },
              { guard: 'rankOfStep', actions: 'countRank' },
            ],
            'step.empty': { guard: 'currentEmpty', target: '#replica.unloading' },
          },
        },
      },
    },
    unloading: {
      tags: ['holdsGpu'],
      entry: [assign({ stepping: false, pendingRanks: 0 }), 'releaseGpus'],
      on: {
        'gpu.released': [
          { guard: 'allReleased', target: 'stopped', actions: 'countReleased' },
          { guard: 'releasedOne', actions: 'countReleased' },
        ],
        'gpu.failed': [
          { guard: 'allReleasedAfterFault', target: 'stopped', actions: 'addFailedGpu' },
          { guard: 'newFailedGpu', actions: 'addFailedGpu' },
        ],
      },
    },
    failed: {
      tags: ['holdsGpu', 'failed'],
      // The whole gang fails once: the epoch rises so late results of the dead epoch are dropped.
      entry: [
        'abortStep',
        'interruptAll',
        assign({ epoch: ({ context }) => context.epoch + 1, stepping: false, pendingRanks: 0 }),
        'tellFailed',
        'releaseGpus',
      ],
      always: { guard: 'allAccountedFor', target: 'stopped' },
      on: {
        'gpu.released': { guard: 'releasedOne', actions: 'countReleased' },
        'gpu.failed': { guard: 'newFailedGpu', actions: 'addFailedGpu' },
      },
    },
    stopped: {
      type: 'final',
      entry: 'tellStopped',
    },
  },
  on: {
    'gpu.failed': { guard: 'newFailedGpu', target: '.failed', actions: 'addFailedGpu' },
  },
  output: ({ context }) => ({ id: context.id, failed: context.failedGpus.length > 0, epoch: context.epoch }),
});
