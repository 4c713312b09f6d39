// One GPU device: its lifecycle, health, and the replica (and epoch) it belongs to.
import { assign, emit, setup } from 'xstate';
import type { OutEvent } from './messages.ts';

/** Context of a GPU actor: which replica (and epoch) owns it, and what it is doing. */
export interface GpuContext {
  index: number;
  id: string;
  replica: string | null;
  epoch: number;
  loadMs: number;
  unloadMs: number;
  repairMs: number;
  faultCode: string | null;
  /** Where facts about this GPU are reported (the control plane's placement actor). */
  reportTo: string;
}

/** Input to create a GPU actor. */
export interface GpuInput {
  index: number;
  reportTo?: string;
  repairMs?: number;
}

/** Events a GPU handles: commands from its replica/placement and facts from its executor. */
export type GpuEvent =
  | { type: 'gpu.register' }
  | { type: 'gpu.probed' }
  | { type: 'gpu.assign'; replica: string; epoch: number; loadMs: number; unloadMs: number }
  | { type: 'gpu.release'; replica: string; epoch: number }
  | { type: 'gpu.fault'; code: string }
  | { type: 'gpu.repair' }
  /** A real engine's host over this GPU finished loading (its health probe answered): loading ends now. */
  | { type: 'gpu.engineLoaded' };

/** A GPU has no output: it lives as long as its node agent. */
export type GpuOutput = never;

/** The replica an allocated GPU belongs to: assigned on the way in, so its absence is a broken invariant. */
function owner(c: GpuContext): string {
  if (c.replica === null) throw new Error(`gpu.${c.index} is allocated without a replica`);
  return c.replica;
}

/** The GPU machine: offline → probing → free → allocated{loading, serving, unloading} → failed → repairing. */
export const gpuMachine = setup({
  types: {
    context: {} as GpuContext,
    input: {} as GpuInput,
    events: {} as GpuEvent,
    emitted: {} as OutEvent,
  },
  actions: {
    /** Abandons whatever the executor is running for this GPU. */
    abortStep: () => {},
    /** Tells the owning replica its weights are loaded (again, when a repeated assignment asks). */
    reportLoaded: emit(({ context }) => ({
      type: 'out' as const,
      to: owner(context),
      msg: { type: 'gpu.loaded', gpu: context.index, replica: owner(context), epoch: context.epoch },
    })),
    /** Runs the health probe; answered with `gpu.probed`. */
    probe: () => {},
  },
  delays: {
    loadTime: ({ context }) => context.loadMs,
    unloadTime: ({ context }) => context.unloadMs,
    repairTime: ({ context }) => context.repairMs,
  },
  guards: {
    sameAssignment: ({ context, event }) =>
      event.type === 'gpu.assign' && event.replica === context.replica && event.epoch === context.epoch,
    sameOwner: ({ context, event }) =>
      event.type === 'gpu.release' && event.replica === context.replica && event.epoch === context.epoch,
    newerEpoch: ({ context, event }) =>
      event.type === 'gpu.assign' && event.replica === context.replica && event.epoch > context.epoch,
  },
}).createMachine({
  id: 'gpu',
  context: ({ input }) => ({
    index: input.index,
    id: `gpu.${input.index}`,
    replica: null,
    epoch: 0,
    loadMs: 0,
    unloadMs: 0,
    repairMs: input.repairMs ?? 60_000,
    faultCode: null,
    reportTo: input.reportTo ?? 'placement',
  }),
  initial: 'offline',
  on: {
    'gpu.fault': {
      target: '.failed',
      actions: [
        'abortStep',
        assign({ faultCode: ({ event }) => event.code }),
        emit(({ context, event }) => ({
          type: 'out' as const,
          to: context.reportTo,
          msg: {
            type: 'gpu.failed',
            gpu: context.index,
            code: event.code,
            replica: context.replica,
            epoch: context.epoch,
          },
        })),
      ],
    },
  },
  states: {
    offline: {
      on: { 'gpu.register': 'probing' },
    },
    probing: {
      entry: 'probe',
      on: {
        'gpu.probed': {
          target: 'free',
          actions: emit(({ context }) => ({
            type: 'out' as const,
            to: context.reportTo,
            msg: { type: 'gpu.ready', gpu: context.index },
          })),
        },
      },
    },
    free: {
      tags: ['available'],
      entry: assign({ replica: null }),
      on: {
        'gpu.assign': {
          target: 'allocated',
          actions: assign({
            replica: ({ event }) => event.replica,
            epoch: ({ event }) => event.epoch,
            loadMs: ({ event }) => event.loadMs,
            unloadMs: ({ event }) => event.unloadMs,
          }),
        },
        // A repeated release (its first answer was lost on the wire) is answered again: this GPU holds nothing.
        'gpu.release': {
          actions: emit(({ context, event }) => ({
            type: 'out' as const,
            to: event.replica,
            msg: { type: 'gpu.released', gpu: context.index, replica: event.replica, epoch: event.epoch },
          })),
        },
      },
    },
    allocated: {
      tags: ['holdsGpu'],
      initial: 'loading',
      on: {
        'gpu.release': { guard: 'sameOwner', target: '.unloading', actions: 'abortStep' },
        // The same replica under a later epoch: placement re-created it after giving up on the earlier epoch (whose
        // assignment reached this GPU after the GPU was reset, so no release of it will follow). Load for the new one.
        'gpu.assign': {
          guard: 'newerEpoch',
          target: '#gpu.allocated',
          reenter: true,
          actions: [
            'abortStep',
            assign({
              epoch: ({ event }) => event.epoch,
              loadMs: ({ event }) => event.loadMs,
              unloadMs: ({ event }) => event.unloadMs,
            }),
          ],
        },
      },
      states: {
        loading: {
          on: { 'gpu.engineLoaded': { target: 'serving', actions: 'reportLoaded' } },
          after: {
            loadTime: {
              target: 'serving',
              actions: 'reportLoaded',
            },
          },
        },
        // Steps do not pass through the GPU actor: the node agent runs them on the executor while the GPU is
        // here and owned by the step's replica and epoch (a per-step event on eight ranks would dominate the hot path).
        serving: {
          tags: ['serving'],
          on: {
            // A repeated assignment from the same replica and epoch (its `gpu.loaded` was lost) is answered again.
            'gpu.assign': {
              guard: 'sameAssignment',
              actions: 'reportLoaded',
            },
          },
        },
        unloading: {
          // Already unloading: a repeated release must not restart the unload.
          on: { 'gpu.release': {} },
          after: {
            unloadTime: {
              target: '#gpu.free',
              actions: emit(({ context }) => ({
                type: 'out' as const,
                to: owner(context),
                msg: { type: 'gpu.released', gpu: context.index, replica: owner(context), epoch: context.epoch },
              })),
            },
          },
        },
      },
    },
    failed: {
      tags: ['unhealthy'],
      on: {
        'gpu.fault': {},
        'gpu.repair': 'repairing',
      },
    },
    repairing: {
      tags: ['unhealthy'],
      on: { 'gpu.fault': {} },
      after: {
        repairTime: {
          target: 'probing',
          actions: assign({ faultCode: null, replica: null }),
        },
      },
    },
  },
});
