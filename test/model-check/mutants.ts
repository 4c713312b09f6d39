// Deliberately broken copies of the machines: the model checks must report each one.
import { assign, createMachine, type AnyStateMachine } from 'xstate';
import { gpuMachine } from '../../machines/gpu.machine.ts';
import { replicaMachine } from '../../machines/replica.machine.ts';

type StateConfig = {
  on?: Record<string, unknown>;
  entry?: unknown;
  after?: unknown;
  tags?: string[];
  states?: States;
  [k: string]: unknown;
};
type States = Record<string, StateConfig>;

// A copy of a machine with some of its top-level states replaced; named guards, actions and delays are kept.
function withStates(machine: AnyStateMachine, edit: (states: States) => States): AnyStateMachine {
  const config = machine.config as { states: States };
  return createMachine(
    { ...machine.config, states: edit({ ...config.states }) } as never,
    machine.implementations as never,
  );
}

// A copy of a machine with its root-level transitions replaced.
function withRootOn(
  machine: AnyStateMachine,
  edit: (on: Record<string, unknown>) => Record<string, unknown>,
): AnyStateMachine {
  const config = machine.config as { on?: Record<string, unknown> };
  return createMachine({ ...machine.config, on: edit({ ...config.on }) } as never, machine.implementations as never);
}

// The root transition into `failed` as the replica machine declares it.
const failTransition = (): { guard: string; target: string; actions: string[] } => {
  const on = (replicaMachine.config as { on: Record<string, { guard: string; target: string; actions: string[] }> }).on;
  const t = on['gpu.failed'];
  if (!t || !Array.isArray(t.actions))
    throw new Error('the replica has no root gpu.failed transition: update the mutant');
  return t;
};

const state = (states: States, name: string): StateConfig => {
  const s = states[name];
  if (!s) throw new Error(`the machine has no state ${name}: update the mutant`);
  return s;
};

const child = (parent: StateConfig, name: string): StateConfig => {
  const s = parent.states?.[name];
  if (!s) throw new Error(`the state has no child ${name}: update the mutant`);
  return s;
};

/** A replica whose drain and stop go straight from ready to unloading, skipping `draining`. */
export const replicaSkippingDraining = (): AnyStateMachine =>
  withStates(replicaMachine, (states) => {
    const ready = state(states, 'ready');
    return {
      ...states,
      ready: { ...ready, on: { ...ready.on, 'replica.drain': 'unloading', 'replica.stop': 'unloading' } },
    };
  });

/** A replica that fails without handing its sequences back to the router. */
export const replicaFailingWithoutInterrupting = (): AnyStateMachine =>
  withRootOn(replicaMachine, (on) => {
    const t = failTransition();
    return { ...on, 'gpu.failed': { ...t, actions: t.actions.filter((a) => a !== 'interruptAll') } };
  });

/** A replica that fails again (a new epoch, a new `replica.failed`) for every further fault in its gang. */
export const replicaFailingPerFault = (): AnyStateMachine =>
  withStates(replicaMachine, (states) => {
    const failed = state(states, 'failed');
    return {
      ...states,
      failed: {
        ...failed,
        on: { ...failed.on, 'gpu.failed': { ...failTransition(), target: 'failed', reenter: true } },
      },
    };
  });

/** The replica before the model checker's fix: a GPU that faults after releasing is counted a second time. */
export const replicaCountingReleasedFaults = (): AnyStateMachine =>
  replicaMachine.provide({
    guards: {
      newFailedGpu: ({ context, event }) =>
        event.type === 'gpu.failed' && context.gpus.includes(event.gpu) && !context.failedGpus.includes(event.gpu),
    },
  });

/** A replica that never repeats a release: one lost `gpu.release` or `gpu.released` leaves it unloading forever. */
export const replicaNeverRepeatingReleases = (): AnyStateMachine =>
  withStates(replicaMachine, (states) => {
    const { after: _u, ...unloading } = state(states, 'unloading');
    const { after: _f, ...failed } = state(states, 'failed');
    return { ...states, unloading, failed };
  });

/** A replica that never repeats an assignment: one lost `gpu.assign` or `gpu.loaded` leaves it loading forever. */
export const replicaNeverRepeatingAssignments = (): AnyStateMachine =>
  withStates(replicaMachine, (states) => {
    const { after: _l, ...loading } = state(states, 'loading');
    return { ...states, loading };
  });

/** A replica that fails without raising its epoch: reports of the failed gang still carry its current epoch. */
export const replicaKeepingEpochOnFailure = (): AnyStateMachine =>
  replicaMachine.provide({ actions: { raiseEpoch: assign({ busy: false }) } });

/** A replica that leaves draining for unloading when its core reports room again (`work.unsaturated`), before
 * `work.idle`: it mistakes room for an empty core. */
export const replicaLeavingDrainOnUnsaturated = (): AnyStateMachine =>
  withStates(replicaMachine, (states) => {
    const draining = state(states, 'draining');
    const working = child(draining, 'working');
    return {
      ...states,
      draining: {
        ...draining,
        states: {
          ...draining.states,
          working: { ...working, on: { ...working.on, 'work.unsaturated': '#replica.unloading' } },
        },
      },
    };
  });

/** A failed replica that still tells the router it accepts work. */
export const replicaAcceptingWorkWhenFailed = (): AnyStateMachine =>
  withStates(replicaMachine, (states) => {
    const failed = state(states, 'failed');
    return { ...states, failed: { ...failed, tags: [...(failed.tags ?? []), 'accepting'] } };
  });

/** A failed replica that a late `work.idle` (its dead core's last report) sends back to ready. */
export const replicaRevivedByWork = (): AnyStateMachine =>
  withStates(replicaMachine, (states) => {
    const failed = state(states, 'failed');
    return { ...states, failed: { ...failed, on: { ...failed.on, 'work.idle': '#replica.ready' } } };
  });

/** A replica that only reports a crash of its control plane's side, and keeps serving what it can no longer hear. */
export const replicaServingOnAfterCrash = (): AnyStateMachine =>
  withStates(replicaMachine, (states) => {
    const ready = state(states, 'ready');
    const draining = state(states, 'draining');
    const report = { 'step.crashed': { actions: 'crash' } };
    return {
      ...states,
      ready: { ...ready, on: { ...ready.on, ...report } },
      draining: { ...draining, on: { ...draining.on, ...report } },
    };
  });

/** A GPU that can never be repaired once failed. */
export const gpuWithoutRepair = (): AnyStateMachine =>
  withStates(gpuMachine, (states) => {
    const failed = state(states, 'failed');
    const { 'gpu.repair': _repair, ...on } = failed.on ?? {};
    return { ...states, failed: { ...failed, on } };
  });
