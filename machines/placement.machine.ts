// The node's GPU mode: which replicas exist on which GPUs, and how it changes without starving either model.
import { assign, setup } from 'xstate';

/** A placement mode of the node. */
export type PlacementMode = 'large' | 'small' | 'mixed' | 'empty';

/** Context of the placement actor: current mode, the mode it is moving to, and residency. */
export interface PlacementContext {
  mode: PlacementMode;
  target: PlacementMode;
  since: number;
  switches: number;
  reservation: boolean;
}

/** Input to create the placement actor. */
export interface PlacementInput {
  mode: PlacementMode;
}

/** Events the placement actor handles: demand signals, replica lifecycle facts and GPU health. */
export type PlacementEvent =
  | { type: 'demand.shifted'; target: PlacementMode; t: number }
  | { type: 'demand.subsided'; t: number }
  | { type: 'reservation.held' }
  | { type: 'replicas.drained' }
  | { type: 'replicas.loaded'; t: number }
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
    /** Tells the replicas standing in the way to drain within their deadline. */
    drainForTarget: () => {},
    /** Creates and loads the target mode's replicas on the freed GPUs. */
    loadTarget: () => {},
    /** Fails the replica holding a failed GPU and re-plans around the loss. */
    handleGpuFailure: () => {},
    /** Re-plans now that a GPU is back. */
    handleGpuRepair: () => {},
  },
  guards: {
    differentMode: ({ context, event }) => event.type === 'demand.shifted' && event.target !== context.mode,
  },
}).createMachine({
  id: 'placement',
  context: ({ input }) => ({ mode: input.mode, target: input.mode, since: 0, switches: 0, reservation: false }),
  initial: 'steady',
  on: {
    'gpu.failed': { actions: 'handleGpuFailure' },
    'gpu.repaired': { actions: 'handleGpuRepair' },
  },
  states: {
    steady: {
      on: {
        'demand.shifted': {
          guard: 'differentMode',
          target: 'reserving',
          actions: assign({ target: ({ event }) => event.target }),
        },
      },
    },
    reserving: {
      entry: [assign({ reservation: true }), 'raiseReservation'],
      on: {
        'reservation.held': 'draining',
        'demand.subsided': { target: 'steady', actions: [assign({ reservation: false, target: ({ context }) => context.mode }), 'releaseReservation'] },
      },
    },
    draining: {
      entry: 'drainForTarget',
      on: {
        'replicas.drained': 'switching',
        'demand.subsided': { target: 'steady', actions: [assign({ reservation: false, target: ({ context }) => context.mode }), 'releaseReservation'] },
      },
    },
    switching: {
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
            'releaseReservation',
          ],
        },
      },
    },
  },
});
