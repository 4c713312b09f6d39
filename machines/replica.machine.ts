// One model replica: a gang of 1 or 8 GPUs that loads, serves, drains, and fails as a unit. Its step loop runs in its
// engine core beside the engine (actors/engine-core/); the machine hears the lifecycle and changes of its work (work
// handed to an idle replica, the core idle again, saturated or not), never each step.
import { assign, emit, setup } from 'xstate';
import type { OutEvent } from './messages.ts';

/** Context of a replica actor: its GPU gang, epoch, and whether its core holds work. */
export interface ReplicaContext {
  id: string;
  model: string;
  version: string;
  gpus: readonly number[];
  /** Raised on each failure; every step and message about it carries the epoch. */
  epoch: number;
  /** The epoch the GPUs were assigned under (release uses it). */
  gpuEpoch: number;
  /** True from work handed to the replica until its core reports it holds none (a drain waits for this). */
  busy: boolean;
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
  /** Work was handed to the replica's core. */
  | { type: 'work.available' }
  /** The core reported it holds no work. */
  | { type: 'work.idle' }
  | { type: 'work.saturated' }
  | { type: 'work.unsaturated' }
  | { type: 'replica.drain'; deadlineMs: number }
  | { type: 'gpu.failed'; gpu: number; code: string }
  | { type: 'gpu.released'; gpu: number; epoch: number }
  | { type: 'replica.stop' }
  /** The replica's handling of its core's progress threw `error`: what it holds is unknown, so a serving replica
   * fails as a unit, as when it loses a GPU (see actors/replica.ts). */
  | { type: 'step.crashed'; error: unknown };

/** A replica ends stopped; its output says whether it failed. */
export interface ReplicaOutput {
  id: string;
  failed: boolean;
  epoch: number;
}

/** Tags of replica states: what cuts across them, so no caller tests a state's name. */
export type ReplicaTag =
  /** Placed, loading or ready: the replica is or will be serving (not leaving). */
  | 'live'
  /** Loading its weights onto its GPUs. */
  | 'loading'
  /** Ready: the one readiness predicate for routing, placement and status pages. */
  | 'ready'
  /** Ready with room for new work (not saturated). */
  | 'accepting'
  /** Its core holds work (waiting or running). */
  | 'working'
  /** Runs steps on its GPUs: ready, or draining what it holds. */
  | 'serving'
  /** Owns its GPUs (from loading until every GPU is released or failed). */
  | 'holdsGpu'
  /** Lost a GPU: the gang is being released. */
  | 'failed';

/** A serving replica whose handling of its work threw fails as a unit, as on a GPU fault: every request it holds is
 * resumed elsewhere or failed, the epoch raised, and its GPUs released (none has failed). */
const failOnCrash = {
  target: '#replica.failed',
  actions: ['crash', 'interruptAll', 'raiseEpoch', 'tellFailed'],
} as const;

/** The replica machine: placing → loading → ready{idle, busy, saturated} → draining → unloading → stopped; failed. */
export const replicaMachine = setup({
  types: {
    context: {} as ReplicaContext,
    input: {} as ReplicaInput,
    events: {} as ReplicaEvent,
    emitted: {} as OutEvent,
    output: {} as ReplicaOutput,
    tags: {} as ReplicaTag,
  },
  actions: {
    /** Asks each GPU of the gang that has not reported loaded to load this replica's weights. */
    assignGpus: () => {},
    /** Hands every sequence back to the router: resumed elsewhere or failed, exactly one of the two. */
    interruptAll: () => {},
    /** Asks each GPU of the gang that is neither released nor failed to unload. */
    releaseGpus: () => {},
    /** Reports a step loop's failure (`step.crashed`) as a fault the replica contains; rethrows a broken invariant,
     * which it cannot (the actor then errors). */
    crash: () => {},
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
    raiseEpoch: assign({ epoch: ({ context }) => context.epoch + 1, busy: false }),
    markBusy: assign({ busy: true }),
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
    /** How long a loading replica waits for its GPUs' `gpu.loaded` before repeating their assignments (the factory
     * provides the real period; an assignment or its answer can be lost in a partition). */
    assignRetry: ({ context }) => Math.max(2_000, context.loadMs),
    /** How long an unloading or failed replica waits for `gpu.released` before repeating the releases. */
    releaseRetry: 2_000,
  },
  guards: {
    allLoaded: ({ context }) => context.loaded >= context.gpus.length,
    loadedOne: ({ context, event }) =>
      event.type === 'gpu.loaded' && event.epoch === context.gpuEpoch && !context.loadedGpus.includes(event.gpu),
    isBusy: ({ context }) => context.busy,
    newFailedGpu: ({ context, event }) =>
      event.type === 'gpu.failed' &&
      context.gpus.includes(event.gpu) &&
      !context.failedGpus.includes(event.gpu) &&
      !context.releasedGpus.includes(event.gpu),
    allAccountedFor: ({ context }) => context.released + context.failedGpus.length >= context.gpus.length,
    ownGpu: ({ context, event }) => event.type === 'gpu.failed' && context.gpus.includes(event.gpu),
    // A release answered twice (a repeated release) counts once; a failed GPU is not also counted released.
    releasedOne: ({ context, event }) =>
      event.type === 'gpu.released' &&
      event.epoch === context.gpuEpoch &&
      !context.releasedGpus.includes(event.gpu) &&
      !context.failedGpus.includes(event.gpu),
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
    busy: false,
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
      tags: ['live'],
      on: {
        'replica.start': 'loading',
        'replica.stop': 'stopped',
        // Nothing was loaded yet: a fault in the earmarked gang just cancels the placement.
        'gpu.failed': { guard: 'ownGpu', target: 'stopped', actions: 'addFailedGpu' },
      },
    },
    loading: {
      tags: ['live', 'loading', 'holdsGpu'],
      entry: 'assignGpus',
      // Assignments (or their answers) can be lost in a partition: repeat them, to the GPUs still silent, until
      // every GPU has reported loaded.
      after: { assignRetry: { target: 'loading', reenter: true } },
      always: { guard: 'allLoaded', target: 'ready' },
      on: {
        'gpu.loaded': { guard: 'loadedOne', actions: 'countLoaded' },
        'replica.drain': 'unloading',
        'replica.stop': 'unloading',
      },
    },
    ready: {
      tags: ['live', 'ready', 'serving', 'holdsGpu'],
      entry: 'tellReady',
      initial: 'idle',
      on: {
        'replica.drain': { target: 'draining', actions: assign({ drainDeadlineMs: ({ event }) => event.deadlineMs }) },
        'replica.stop': { target: 'draining', actions: assign({ drainDeadlineMs: 0 }) },
        'step.crashed': failOnCrash,
      },
      states: {
        idle: {
          tags: ['accepting'],
          entry: assign({ busy: false }),
          on: { 'work.available': { target: 'busy', actions: 'markBusy' }, 'work.saturated': 'saturated' },
        },
        busy: {
          tags: ['accepting', 'working'],
          on: { 'work.idle': 'idle', 'work.saturated': 'saturated' },
        },
        saturated: {
          tags: ['working'],
          entry: 'markBusy',
          on: { 'work.idle': 'idle', 'work.unsaturated': 'busy' },
        },
      },
    },
    draining: {
      tags: ['serving', 'holdsGpu'],
      initial: 'settling',
      after: {
        drainDeadline: { target: 'unloading', actions: 'interruptAll' },
      },
      on: { 'step.crashed': failOnCrash },
      states: {
        settling: {
          always: [{ guard: 'isBusy', target: 'working' }, { target: '#replica.unloading' }],
        },
        // Finishes what it holds: its core steps on until it reports no work (or the deadline passes).
        working: {
          tags: ['working'],
          on: { 'work.idle': '#replica.unloading' },
        },
      },
    },
    unloading: {
      tags: ['holdsGpu'],
      entry: [assign({ busy: false }), 'releaseGpus'],
      // Releases (or their answers) can be lost in a partition: repeat them until every GPU is accounted for.
      after: { releaseRetry: { target: 'unloading', reenter: true } },
      always: { guard: 'allAccountedFor', target: 'stopped' },
      on: {
        'gpu.released': { guard: 'releasedOne', actions: 'countReleased' },
        'gpu.failed': { guard: 'newFailedGpu', actions: 'addFailedGpu' },
      },
    },
    // Entered once per failure (the transition into it aborts, interrupts, raises the epoch and tells placement);
    // re-entered only to repeat the releases.
    failed: {
      tags: ['holdsGpu', 'failed'],
      entry: 'releaseGpus',
      after: { releaseRetry: { target: 'failed', reenter: true } },
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
    // A replica that holds no work (loading, leaving) only reports it.
    'step.crashed': { actions: 'crash' },
    // The whole gang fails once: the epoch rises so late results of the dead epoch are dropped.
    'gpu.failed': {
      guard: 'newFailedGpu',
      target: '.failed',
      actions: ['addFailedGpu', 'interruptAll', 'raiseEpoch', 'tellFailed'],
    },
  },
  output: ({ context }) => ({ id: context.id, failed: context.failedGpus.length > 0, epoch: context.epoch }),
});
