// Broken copies of the machines make the model checks fail: the checks can tell a good machine from a bad one.
import { describe, expect, it } from 'vitest';
import type { AnyStateMachine } from 'xstate';
import { gpuSpec, replicaSpec } from './alphabets.ts';
import { explore } from './explore.ts';
import {
  gpuWithoutRepair,
  replicaAcceptingWorkWhenFailed,
  replicaCountingReleasedFaults,
  replicaFailingPerFault,
  replicaFailingWithoutInterrupting,
  replicaKeepingEpochOnFailure,
  replicaLeavingDrainOnUnsaturated,
  replicaNeverRepeatingAssignments,
  replicaNeverRepeatingReleases,
  replicaRevivedByWork,
  replicaServingOnAfterCrash,
  replicaSkippingDraining,
} from './mutants.ts';
import { replicaViolations } from './replica-properties.ts';
import { checkTensorParallel, orderDependent } from './tp-composition.ts';

const properties = (r: { violations: readonly { property: string }[] }): string[] =>
  r.violations.map((v) => v.property);
/** The replica machine's own properties broken by a copy of it, explored alone. */
const machineProperties = (machine: AnyStateMachine): string[] => {
  const spec = replicaSpec(machine);
  return properties({ violations: replicaViolations(spec, explore(spec)) });
};
const violation = (r: ReturnType<typeof checkTensorParallel>, property: string) =>
  r.violations.find((v) => v.property === property);

describe('a replica whose drain skips draining', () => {
  it('leaves the draining states and their transitions unreachable, and unloads with work in its core', () => {
    const r = explore(replicaSpec(replicaSkippingDraining()));
    expect(r.unreachableStates).toEqual(['replica.draining', 'replica.draining.settling', 'replica.draining.working']);
    expect(r.unreachableTransitions).toContain('replica.draining#xstate.after.drainDeadline.replica.draining#0');
    expect(machineProperties(replicaSkippingDraining())).toEqual([
      'a replica with work unloads only after work.idle or handing the work back',
    ]);
  });

  it('releases its gang under the work its core holds, and strands that work', () => {
    const r = checkTensorParallel({ gpus: 3, faults: 0, arrivals: 1, replica: replicaSkippingDraining() });
    expect(properties(r)).toEqual(
      expect.arrayContaining(['the gang is released only once the replica holds no work', 'no work is stranded']),
    );
    expect(violation(r, 'no work is stranded')!.path).toEqual(
      expect.arrayContaining(['work arrives', 'drain requested']),
    );
  });
});

describe('a replica that leaves draining when its core has room again, before work.idle', () => {
  it('is caught by the machine check and, once a drain meets saturation, by the composition', () => {
    expect(machineProperties(replicaLeavingDrainOnUnsaturated())).toEqual([
      'a replica with work unloads only after work.idle or handing the work back',
    ]);
    const r = checkTensorParallel({ gpus: 2, faults: 0, arrivals: 3, replica: replicaLeavingDrainOnUnsaturated() });
    expect(properties(r)).toEqual(
      expect.arrayContaining(['the gang is released only once the replica holds no work', 'no work is stranded']),
    );
    expect(violation(r, 'the gang is released only once the replica holds no work')!.detail).toContain(
      'on work.unsaturated',
    );
  });

  it('is not caught when the core never saturates', () => {
    expect(
      checkTensorParallel({ gpus: 2, faults: 0, arrivals: 1, replica: replicaLeavingDrainOnUnsaturated() }).violations,
    ).toEqual([]);
  });
});

describe('a replica that fails without interrupting its sequences', () => {
  it('fails without handing its work back, releasing its gang under it and stranding it', () => {
    expect(machineProperties(replicaFailingWithoutInterrupting())).toEqual(['a failure fails the gang once']);
    const r = checkTensorParallel({
      gpus: 2,
      faults: 1,
      arrivals: 1,
      drain: false,
      replica: replicaFailingWithoutInterrupting(),
    });
    expect(properties(r)).toEqual(
      expect.arrayContaining(['the gang is released only once the replica holds no work', 'no work is stranded']),
    );
  });
});

describe('a replica that fails again for every fault in its gang', () => {
  it('is reported for failing more than once', () => {
    expect(machineProperties(replicaFailingPerFault())).toEqual(['a failure fails the gang once']);
    const r = checkTensorParallel({ gpus: 2, faults: 2, arrivals: 0, drain: false, replica: replicaFailingPerFault() });
    expect(properties(r)).toContain('fails exactly once per fault epoch');
  });
});

describe('a replica that fails without raising its epoch', () => {
  it("names, in its replica.failed, the epoch its failed gang's reports still carry", () => {
    expect(machineProperties(replicaKeepingEpochOnFailure())).toEqual(['a failure fails the gang once']);
    const r = checkTensorParallel({
      gpus: 2,
      faults: 1,
      arrivals: 0,
      drain: false,
      replica: replicaKeepingEpochOnFailure(),
    });
    expect(properties(r)).toEqual(['a failure raises the epoch']);
  });
});

describe('a failed replica that still accepts work', () => {
  it('is handed work after its failure, which no one ever finishes or hands back', () => {
    expect(machineProperties(replicaAcceptingWorkWhenFailed())).toEqual(['a failed replica takes no work']);
    const r = checkTensorParallel({ gpus: 2, faults: 1, arrivals: 1, replica: replicaAcceptingWorkWhenFailed() });
    expect(properties(r)).toEqual(expect.arrayContaining(['no work after failure', 'no work is stranded']));
    expect(violation(r, 'no work after failure')!.path).toEqual([
      'replica.start',
      'gpu.0 faults',
      'gpu.failed from gpu.0 arrives',
      'work arrives',
    ]);
  });
});

describe('a failed replica that a late work.idle sends back to ready', () => {
  it('is revived by the last report of its dead core', () => {
    expect(machineProperties(replicaRevivedByWork())).toEqual([
      'a work event never moves a replica that does not serve',
    ]);
    const r = checkTensorParallel({ gpus: 2, faults: 1, arrivals: 1, drain: false, replica: replicaRevivedByWork() });
    expect(properties(r)).toContain('work events of a dead epoch change nothing');
    expect(violation(r, 'work events of a dead epoch change nothing')!.path.slice(-3)).toEqual([
      'gpu.0 faults',
      'gpu.failed from gpu.0 arrives',
      'seq.progress arrives',
    ]);
  });
});

describe('a replica that keeps serving after the control plane crashed applying its progress', () => {
  it('never fails, though what it holds is unknown', () => {
    expect(machineProperties(replicaServingOnAfterCrash())).toEqual(['a crash in service fails the gang']);
    const r = checkTensorParallel({
      gpus: 2,
      faults: 0,
      arrivals: 1,
      crashes: 1,
      replica: replicaServingOnAfterCrash(),
    });
    expect(properties(r)).toEqual(['fails exactly once per fault epoch']);
    expect(violation(r, 'fails exactly once per fault epoch')!.path).toContain('applying seq.progress throws');
    expect(checkTensorParallel({ gpus: 2, faults: 0, arrivals: 1, crashes: 1 }).violations).toEqual([]);
  });
});

describe('regression: a GPU that faults after it released the replica', () => {
  it('was counted twice, letting placement free a GPU still unloading (the machine before the fix)', () => {
    const r = checkTensorParallel({ gpus: 3, faults: 1, arrivals: 0, replica: replicaCountingReleasedFaults() });
    expect(properties(r)).toEqual(
      expect.arrayContaining(['a GPU belongs to one replica', 'the replica knows its failed GPUs']),
    );
    expect(orderDependent(r).length).toBeGreaterThan(0);
  });

  it('is no longer counted by the replica machine', () => {
    const r = checkTensorParallel({ gpus: 3, faults: 1, arrivals: 0 });
    expect(r.violations).toEqual([]);
    expect(orderDependent(r)).toEqual([]);
  });
});

describe('a replica that never repeats a release', () => {
  it('is caught stuck unloading, holding a GPU, once one release answer is lost', () => {
    const r = checkTensorParallel({
      gpus: 2,
      faults: 0,
      arrivals: 0,
      losses: 1,
      replica: replicaNeverRepeatingReleases(),
    });
    expect(properties(r)).toContain('the replica stops');
    const v = r.violations.find((x) => x.property === 'the replica stops')!;
    expect(v.detail).toContain('unloading');
    expect(v.path).toContain('gpu.released from gpu.1 is lost');
  });

  it('is not caught without a lost message, and the real replica is not caught with one', () => {
    expect(
      checkTensorParallel({ gpus: 2, faults: 0, arrivals: 0, replica: replicaNeverRepeatingReleases() }).violations,
    ).toEqual([]);
    expect(checkTensorParallel({ gpus: 2, faults: 0, arrivals: 0, losses: 1 }).violations).toEqual([]);
  });
});

describe('a replica that never repeats an assignment', () => {
  it('is caught stuck loading once one answer is lost', () => {
    const r = checkTensorParallel({
      gpus: 2,
      faults: 0,
      arrivals: 0,
      drain: false,
      losses: 1,
      replica: replicaNeverRepeatingAssignments(),
    });
    expect(properties(r)).toContain('the replica stops');
    expect(r.violations.find((x) => x.property === 'the replica stops')!.detail).toContain('loading');
    expect(checkTensorParallel({ gpus: 2, faults: 0, arrivals: 0, drain: false, losses: 1 }).violations).toEqual([]);
  });
});

describe('a GPU that can never be repaired', () => {
  it('has dead ends and states it can never leave for free', () => {
    const r = explore(gpuSpec(gpuWithoutRepair()));
    expect(r.deadEnds.length).toBeGreaterThan(0);
    expect(r.trapped.length).toBeGreaterThan(0);
    expect(r.unreachableStates).toEqual(['gpu.repairing']);
  });
});
