// The node's GPU mode: which replicas exist on which GPUs, and how it changes without starving either model.
import { assign, setup } from 'xstate';

/** A placement mode of the node: one TP gang, single-GPU replicas, a fixed split, co-location, or nothing placed. */
export type PlacementMode = 'large' | 'small' | 'mixed' | 'share' | 'empty';

/** Context of the placement actor: current mode, the mode it is moving to, and the timing of the move. */
export interface PlacementContext {
  mode: PlacementMode;
  target: PlacementMode;
  /** When the current mode became resident (all its replicas ready). */
  since: number;
  switches: number;
  reservation: boolean;
  /** When the waiting work that asked for the target first appeared. */
  reservedAt: number;
  /** Absolute time by which the replicas in the target's way must have given up their GPUs. */
  deadlineAt: number;
  /** How long the reservation waits (hysteresis, residency) before draining starts; never past deadlineAt. */
  drainDelayMs: number;
}

/** Input to create the placement actor. */
export interface PlacementInput {
  mode: PlacementMode;
  t?: number;
}

/** Events the placement actor handles: demand signals, replica lifecycle facts and GPU health. */
export type PlacementEvent =
  | {
      type: 'demand.shifted';
      target: PlacementMode;
      t: number;
      reservedAt?: number;
      deadlineAt?: number;
      drainDelayMs?: number;
    }
  | { type: 'demand.subsided'; t: number }
  | { type: 'reservation.held' }
  | { type: 'replicas.drained' }
  | { type: 'replicas.loaded'; t: number }
  | { type: 'mode.forced'; mode: PlacementMode; t: number }
  | { type: 'gpu.failed'; gpu: number }
  | { type: 'gpu.repaired'; gpu: number };

/** The placement actor does not finish. */
export type PlacementOutput = never;

/** The placement machine: steady → reserving → draining → switching → steady. */
export const placementMachine = setup({
  types: {
    context: {} as PlacementContext,
    input: {} as PlacementInput,
    events: {} as PlacementEvent,
  },
  actions: {
    /** Withholds GPUs that free up from new replicas of the current mode. */
    raiseReservation: () => {},
    /** Lets freed GPUs go to any replica again. */
    releaseReservation: () => {},
    /** Tells the replicas standing in the way to drain by the reservation's deadline. */
    drainForTarget: () => {},
    /** Creates and loads the target mode's replicas on the freed GPUs. */
    loadTarget: () => {},
    /** Records that the target mode is resident. */
    completeSwitch: () => {},
    /** Fails the replica holding a failed GPU and re-plans around the loss. */
    handleGpuFailure: () => {},
    /** Re-plans now that a GPU is back. */
    handleGpuRepair: () => {},
  },
  delays: {
    /** Hysteresis and minimum residency, spent inside the deadline window. */
    drainDelay: ({ context }) => context.drainDelayMs,
  },
  guards: {
    differentMode: ({ context, event }) => event.type === 'demand.shifted' && event.target !== context.mode,
  },
}).createMachine({
  id: 'placement',
  context: ({ input }) => ({
    mode: input.mode,
    target: input.mode,
    since: input.t ?? 0,
    switches: 0,
    reservation: false,
    reservedAt: 0,
    deadlineAt: 0,
    drainDelayMs: 0,
  }),
  initial: 'steady',
  on: {
    'gpu.failed': { actions: 'handleGpuFailure' },
    'gpu.repaired': { actions: 'handleGpuRepair' },
    // The target (or the current mode) cannot exist any more, e.g. the gang lost a GPU: settle on what can.
    'mode.forced': {
      target: '.steady',
      actions: [
        assign({
          mode: ({ event }) => event.mode,
          target: ({ event }) => event.mode,
          since: ({ event }) => event.t,
          reservation: false,
        }),
        'releaseReservation',
      ],
    },
  },
  states: {
    steady: {
      tags: ['settled'],
      on: {
        'demand.shifted': {
          guard: 'differentMode',
          target: 'reserving',
          actions: assign({
            target: ({ event }) => event.target,
            reservedAt: ({ event }) => event.reservedAt ?? event.t,
            deadlineAt: ({ event }) => event.deadlineAt ?? event.t,
            drainDelayMs: ({ event }) => event.drainDelayMs ?? 0,
          }),
        },
      },
    },
    reserving: {
      tags: ['reserved'],
      entry: [assign({ reservation: true }), 'raiseReservation'],
      after: { drainDelay: 'draining' },
      on: {
        'reservation.held': 'draining',
        'demand.subsided': {
          target: 'steady',
          actions: [assign({ reservation: false, target: ({ context }) => context.mode }), 'releaseReservation'],
        },
      },
    },
    draining: {
      tags: ['reserved'],
      entry: 'drainForTarget',
      on: {
        'replicas.drained': 'switching',
        'demand.subsided': {
          target: 'steady',
          actions: [assign({ reservation: false, target: ({ context }) => context.mode }), 'releaseReservation'],
        },
      },
    },
    switching: {
      tags: ['reserved'],
      entry: 'loadTarget',
      on: {
        'replicas.loaded': {
          target: 'steady',
          actions: [
            assign({
              mode: ({ context }) => context.target,
              since: ({ event }) => event.t,
              switches: ({ context }) => context.switches + 1,
              reservation: false,
            }),
            'completeSwitch',
            'releaseReservation',
          ],
        },
      },
    },
  },
});
