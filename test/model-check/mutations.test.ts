// Broken copies of the machines make the model checks fail: the checks can tell a good machine from a bad one.
import { describe, expect, it } from 'vitest';
import { gpuSpec, replicaSpec } from './alphabets.ts';
import { explore } from './explore.ts';
import {
  gpuWithoutRepair,
  replicaCountingReleasedFaults,
  replicaFailingPerFault,
  replicaFailingWithoutInterrupting,
  replicaNeverRepeatingAssignments,
  replicaNeverRepeatingReleases,
  replicaSkippingDraining,
} from './mutants.ts';
import { checkTensorParallel, orderDependent } from './tp-composition.ts';

const properties = (r: ReturnType<typeof checkTensorParallel>): string[] => r.violations.map((v) => v.property);

describe('a replica whose drain skips draining', () => {
  it('leaves the draining states and their transitions unreachable', () => {
    const r = explore(replicaSpec(replicaSkippingDraining()));
    expect(r.unreachableStates).toEqual(['replica.draining', 'replica.draining.settling', 'replica.draining.stepping']);
    expect(r.unreachableTransitions).toContain('replica.draining#xstate.after.drainDeadline.replica.draining#0');
  });

  it('strands the work of the step in flight', () => {
    const r = checkTensorParallel({ gpus: 3, faults: 0, arrivals: 1, replica: replicaSkippingDraining() });
    expect(properties(r)).toContain('no work is stranded');
    const v = r.violations.find((x) => x.property === 'no work is stranded')!;
    expect(v.path).toEqual(expect.arrayContaining(['work arrives', 'drain requested']));
  });
});

describe('a replica that fails without interrupting its sequences', () => {
  it('strands their work', () => {
    const r = checkTensorParallel({
      gpus: 2,
      faults: 1,
      arrivals: 1,
      drain: false,
      replica: replicaFailingWithoutInterrupting(),
    });
    expect(properties(r)).toContain('no work is stranded');
  });
});

describe('a replica that fails again for every fault in its gang', () => {
  it('is reported for failing more than once', () => {
    const r = checkTensorParallel({ gpus: 2, faults: 2, arrivals: 0, drain: false, replica: replicaFailingPerFault() });
    expect(properties(r)).toContain('fails exactly once per fault epoch');
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
