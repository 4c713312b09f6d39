// Deliberately broken copies of the machines: the model checks must report each one.
import { createMachine, type AnyStateMachine } from 'xstate';
import { gpuMachine } from '../../machines/gpu.machine.ts';
import { replicaMachine } from '../../machines/replica.machine.ts';

type StateConfig = { on?: Record<string, unknown>; entry?: unknown; [k: string]: unknown };
type States = Record<string, StateConfig>;

// A copy of a machine with some of its top-level states replaced; named guards, actions and delays are kept.
function withStates(machine: AnyStateMachine, edit: (states: States) => States): AnyStateMachine {
  const config = machine.config as { states: States };
  return createMachine(
    { ...machine.config, states: edit({ ...config.states }) } as never,
    machine.implementations as never,
  );
}

const state = (states: States, name: string): StateConfig => {
  const s = states[name];
  if (!s) throw new Error(`the machine has no state ${name}: update the mutant`);
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
  withStates(replicaMachine, (states) => {
    const failed = state(states, 'failed');
    const entry = (failed.entry as unknown[]).filter((a) => a !== 'interruptAll');
    return { ...states, failed: { ...failed, entry } };
  });

/** A replica that fails again (a new epoch, a new `replica.failed`) for every further fault in its gang. */
export const replicaFailingPerFault = (): AnyStateMachine =>
  withStates(replicaMachine, (states) => {
    const failed = state(states, 'failed');
    return {
      ...states,
      failed: {
        ...failed,
        on: {
          ...failed.on,
          'gpu.failed': { guard: 'newFailedGpu', target: 'failed', reenter: true, actions: 'addFailedGpu' },
        },
      },
    };
  });

/** The replica before the model checker's fix: a GPU that faults after releasing is counted a second time. */
export const replicaCountingReleasedFaults = (): AnyStateMachine =>
  replicaMachine.provide({
    guards: {
      newFailedGpu: ({ context, event }) =>
        event.type === 'gpu.failed' && context.gpus.includes(event.gpu) && !context.failedGpus.includes(event.gpu),
      allReleasedAfterFault: ({ context, event }) =>
        event.type === 'gpu.failed' &&
        context.gpus.includes(event.gpu) &&
        !context.failedGpus.includes(event.gpu) &&
        context.released + context.failedGpus.length + 1 >= context.gpus.length,
    },
  });

/** A GPU that can never be repaired once failed. */
export const gpuWithoutRepair = (): AnyStateMachine =>
  withStates(gpuMachine, (states) => {
    const failed = state(states, 'failed');
    const { 'gpu.repair': _repair, ...on } = failed.on ?? {};
    return { ...states, failed: { ...failed, on } };
  });
