// Event alphabets with small payload domains, one per machine, for the explorer (current and stale epochs, two GPUs, ...).
import type { AnyMachineSnapshot, AnyStateMachine, AnyEventObject } from 'xstate';
import { batchMachine } from '../../machines/batch.machine.ts';
import { gpuMachine } from '../../machines/gpu.machine.ts';
import { nodeAgentMachine } from '../../machines/node-agent.machine.ts';
import { placementMachine } from '../../machines/placement.machine.ts';
import { replicaMachine } from '../../machines/replica.machine.ts';
import { requestMachine } from '../../machines/request.machine.ts';
import type { ExploreSpec } from './explore.ts';

type Ctx = Record<string, unknown>;
const num = (s: AnyMachineSnapshot, k: string): number => (s.context as Ctx)[k] as number;
const str = (s: AnyMachineSnapshot, k: string): string | null => (s.context as Ctx)[k] as string | null;

/** The replica on a gang of two GPUs: GPU 7 stands for a GPU of another gang; GPU epochs are current or stale. Work
 * events carry no epoch (the control plane drops a report of a dead epoch before the machine hears it), so they are
 * tried in every state, a failed or stopped replica's included. */
export function replicaSpec(machine: AnyStateMachine = replicaMachine): ExploreSpec {
  return {
    machine,
    input: { id: 'replica.m@v#0', model: 'm', version: 'v', gpus: [0, 1], epoch: 3, loadMs: 10, unloadMs: 10 },
    // The epoch rises on a failure and only labels what the replica tells; no guard reads it (the GPU epoch is the
    // one compared). Left out, it keeps finite the space of a broken copy that fails, and is revived, without end.
    ignore: ['epoch'],
    events: (s) => {
      const gpuEpochs = [num(s, 'gpuEpoch'), num(s, 'gpuEpoch') - 1];
      const out: AnyEventObject[] = [
        { type: 'replica.start' },
        { type: 'replica.stop' },
        { type: 'replica.drain', deadlineMs: 50 },
        { type: 'work.available' },
        { type: 'work.idle' },
        { type: 'work.saturated' },
        { type: 'work.unsaturated' },
        { type: 'step.crashed', error: new Error('applying progress of the core threw') },
      ];
      for (const gpu of [0, 1])
        for (const epoch of gpuEpochs)
          out.push({ type: 'gpu.loaded', gpu, epoch }, { type: 'gpu.released', gpu, epoch });
      for (const gpu of [0, 1, 7]) out.push({ type: 'gpu.failed', gpu, code: 'xid_79' });
      return out;
    },
  };
}

/** One GPU: two replicas that may own it (one re-created under a later epoch), current or stale epochs. */
export function gpuSpec(machine: AnyStateMachine = gpuMachine): ExploreSpec {
  return {
    machine,
    input: { index: 0, repairMs: 100 },
    home: (s) => s.matches('free'),
    events: (s) => {
      const owner = str(s, 'replica') ?? 'replica.a';
      const out: AnyEventObject[] = [
        { type: 'gpu.register' },
        { type: 'gpu.probed' },
        { type: 'gpu.assign', replica: 'replica.a', epoch: 1, loadMs: 10, unloadMs: 10 },
        { type: 'gpu.assign', replica: 'replica.b', epoch: 2, loadMs: 10, unloadMs: 10 },
        // replica.a re-created under a later epoch (its epoch-1 assignment outlived the replica).
        { type: 'gpu.assign', replica: 'replica.a', epoch: 3, loadMs: 10, unloadMs: 10 },
        { type: 'gpu.fault', code: 'xid_79' },
        { type: 'gpu.repair' },
        { type: 'gpu.engineLoaded' },
      ];
      for (const replica of [owner, 'replica.other'])
        for (const epoch of [num(s, 'epoch'), num(s, 'epoch') - 1]) out.push({ type: 'gpu.release', replica, epoch });
      return out;
    },
  };
}

/** A batch of at most two members, 100 tokens and 1000 bytes: small and large members close it by each bound. */
export function batchSpec(machine: AnyStateMachine = batchMachine): ExploreSpec {
  return {
    machine,
    input: { id: 'batch.0', key: 'k', maxSize: 2, maxTokens: 100, maxMemoryBytes: 1000, maxDelayMs: 5 },
    events: () => [
      { type: 'batch.add', tokens: 10, memoryBytes: 10 },
      { type: 'batch.add', tokens: 100, memoryBytes: 10 },
      { type: 'batch.add', tokens: 10, memoryBytes: 1000 },
      { type: 'batch.add', tokens: 200, memoryBytes: 10 },
      { type: 'batch.flush' },
      { type: 'batch.started' },
      { type: 'batch.completed' },
      { type: 'batch.failed', code: 'replica_failed' },
      { type: 'batch.abort' },
    ],
  };
}

/** One request with one resume allowed; every event at t = 0, deadlines current or stale. */
export function requestSpec(machine: AnyStateMachine = requestMachine): ExploreSpec {
  return {
    machine,
    input: {
      id: 'req.1',
      model: 'm',
      priority: 'p',
      receivedAt: 0,
      queueBudgetMs: 100,
      resumeBudgetMs: 50,
      maxResumes: 1,
    },
    // Timestamps and counters only feed reports; the deadline guard compares with the event, derived from context.
    ignore: ['queuedAt', 'scheduledAt', 'firstTokenAt', 'finishedAt', 'preemptions', 'tokens', 'message', 'deadlineAt'],
    events: (s) => {
      const deadlineAt = num(s, 'deadlineAt');
      const out: AnyEventObject[] = [
        { type: 'request.admitted', replica: 'replica.a', t: 0 },
        { type: 'request.rejected', code: 'overloaded', message: 'queue full', t: 0 },
        { type: 'request.scheduled', replica: 'replica.a', t: 0 },
        { type: 'request.firstToken', t: 0 },
        { type: 'request.preempted', t: 0 },
        { type: 'request.interrupted', code: 'replica_failed', message: 'gpu fault', tokens: 3, t: 0 },
        { type: 'request.requeued', replica: 'replica.b', t: 0 },
        { type: 'request.finished', tokens: 5, t: 0 },
        { type: 'request.failed', code: 'replica_failed', message: 'gpu fault', tokens: 3, t: 0 },
        { type: 'request.cancel', t: 0 },
      ];
      if (Number.isFinite(deadlineAt))
        for (const at of [deadlineAt, deadlineAt - 1]) out.push({ type: 'request.deadline', at });
      return out;
    },
  };
}

/** The placement actor: every demand target, a forced mode, one GPU failing and coming back. */
export function placementSpec(machine: AnyStateMachine = placementMachine): ExploreSpec {
  return {
    machine,
    input: { mode: 'small' },
    ignore: ['switches', 'since'],
    home: (s) => s.matches('steady'),
    events: () => [
      ...(['large', 'small', 'mixed', 'share', 'empty'] as const).map((target) => ({
        type: 'demand.shifted',
        target,
        t: 0,
      })),
      { type: 'demand.shifted', target: 'large', t: 0, reservedAt: 0, deadlineAt: 100, drainDelayMs: 20 },
      ...(['large', 'small'] as const).map((mode) => ({ type: 'mode.forced', mode, t: 0 })),
      { type: 'demand.subsided', t: 0 },
      { type: 'reservation.held' },
      { type: 'replicas.drained' },
      { type: 'replicas.loaded', t: 0 },
      { type: 'gpu.failed', gpu: 0 },
      { type: 'gpu.repaired', gpu: 0 },
    ],
  };
}

/** A node agent's link: opens, registers, serves, drops and reconnects. */
export function nodeAgentSpec(machine: AnyStateMachine = nodeAgentMachine): ExploreSpec {
  return {
    machine,
    input: { node: 'node' },
    // Reconnect attempts only lengthen the back-off delay.
    ignore: ['attempt'],
    home: (s) => s.hasTag('serving'),
    events: () => [
      { type: 'link.opened' },
      { type: 'node.registered', epoch: 1 },
      { type: 'gpus.ready' },
      { type: 'link.closed' },
    ],
  };
}

/** Every machine in `machines/` with its alphabet. */
export const machineSpecs: Record<string, () => ExploreSpec> = {
  replica: () => replicaSpec(),
  gpu: () => gpuSpec(),
  batch: () => batchSpec(),
  request: () => requestSpec(),
  placement: () => placementSpec(),
  'node-agent': () => nodeAgentSpec(),
};
