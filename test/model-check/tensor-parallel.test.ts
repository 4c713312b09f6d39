// One tensor-parallel-8 replica with its eight GPU actors and its engine core: every interleaving of loads, ranks
// finishing their shares of the core's steps, the core's progress, up to two faults and a drain, checked for single
// failure, exactly-once outcomes, dropped reports of a dead epoch, GPU fates and order-independent outcomes.
import { describe, expect, it } from 'vitest';
import { checkTensorParallel, orderDependent, type TpReport } from './tp-composition.ts';

const describeViolations = (r: TpReport): string[] =>
  r.violations.map((v) => `${v.property}: ${v.detail}\n    ${v.path.join(' → ')}`);

describe('tensor-parallel replica with eight GPUs', () => {
  let report: TpReport | undefined;
  const run = (): TpReport => {
    if (!report) {
      const t = performance.now();
      report = checkTensorParallel({ gpus: 8, faults: 2, arrivals: 3 });
      console.log(
        `TP-8 model check: ${report.states} states explored, ${report.transitions} transitions, ${report.quiescent} at rest, ` +
          `${report.scenarios} fault/drain scenarios, ${report.cachedTransitions} distinct machine transitions, ${Math.round(performance.now() - t)} ms`,
      );
    }
    return report;
  };

  it(
    'explores every interleaving of two faults and a drain and prints the states explored',
    { timeout: 180_000 },
    () => {
      const r = run();
      expect(r.states).toBeGreaterThan(10_000);
      expect(r.replicaStates).toEqual([
        'draining.working',
        'failed',
        'loading',
        'ready.busy',
        'ready.idle',
        'ready.saturated',
        'stopped',
        'unloading',
      ]);
    },
  );

  it('breaks no property in any interleaving', { timeout: 180_000 }, () => {
    expect(describeViolations(run())).toEqual([]);
  });

  it('ends each scenario the same way whatever the order of the messages', { timeout: 180_000 }, () => {
    const r = run();
    expect(orderDependent(r)).toEqual([]);
    // No fault while the GPUs were held, one, and two: each happens, drained or not, with work or without.
    const keys = [...r.outcomes.keys()].map((k) => JSON.parse(k) as { ownedFaults: number; arrived: number });
    for (const ownedFaults of [0, 1, 2]) expect(keys.some((k) => k.ownedFaults === ownedFaults)).toBe(true);
    for (const arrived of [0, 3]) expect(keys.some((k) => k.arrived === arrived)).toBe(true);
    for (const [k, set] of r.outcomes) {
      const s = JSON.parse(k) as { ownedFaults: number; laterFaults: number };
      const outcome = JSON.parse([...set][0]!) as {
        replica: string;
        failed: boolean;
        failedGpus: number;
        gpusFailed: number;
        gpusFree: number;
      };
      expect(outcome).toEqual({
        replica: 'stopped',
        failed: s.ownedFaults > 0,
        failedGpus: s.ownedFaults,
        gpusFailed: s.ownedFaults + s.laterFaults,
        gpusFree: 8 - s.ownedFaults - s.laterFaults,
      });
    }
  });
});

describe('the abstractions of the check', () => {
  it('find the same outcomes as per-GPU FIFO command links with every report delivered', () => {
    const abstract = checkTensorParallel({ gpus: 3, faults: 2, arrivals: 1 });
    const full = checkTensorParallel({ gpus: 3, faults: 2, arrivals: 1, downlink: 'fifo', pruneDeadReports: false });
    console.log(
      `TP-3 cross-check: ${abstract.states} states with eager commands and dead reports dropped, ${full.states} without`,
    );
    expect(describeViolations(abstract)).toEqual([]);
    expect(describeViolations(full)).toEqual([]);
    const outcomes = (r: TpReport) => new Map([...r.outcomes].map(([k, v]) => [k, [...v].sort()]));
    expect(outcomes(abstract)).toEqual(outcomes(full));
    expect(full.states).toBeGreaterThan(abstract.states);
    // Without the pruning, progress of a dead epoch (or for a replica no longer serving) does reach the control
    // plane, which drops it; the machine would ignore its work events too.
    expect(full.staleResultsDelivered).toBeGreaterThan(0);
    expect(abstract.deadReportsDropped).toBeGreaterThan(0);
  });
});

describe('a tensor-parallel replica whose GPU commands or their answers are lost', () => {
  it('repeats them until every GPU has answered, in every interleaving of a loss, a retry, a fault and a drain', () => {
    const r = checkTensorParallel({ gpus: 3, faults: 1, arrivals: 1, losses: 1, retries: 1 });
    console.log(
      `TP-3 with a lost message: ${r.states} states, ${r.lossesExplored} losses, ${r.retriesExplored} retries`,
    );
    expect(describeViolations(r)).toEqual([]);
    expect(orderDependent(r)).toEqual([]);
    expect(r.lossesExplored).toBeGreaterThan(0);
    expect(r.retriesExplored).toBeGreaterThan(0);
    for (const [k, set] of r.outcomes) {
      const s = JSON.parse(k) as { ownedFaults: number };
      expect(JSON.parse([...set][0]!)).toMatchObject({ replica: 'stopped', failed: s.ownedFaults > 0 });
    }
  });

  it('also recovers a lost assignment or release on per-GPU FIFO command links', () => {
    const r = checkTensorParallel({
      gpus: 2,
      faults: 1,
      arrivals: 1,
      losses: 1,
      retries: 1,
      downlink: 'fifo',
      pruneDeadReports: false,
    });
    expect(describeViolations(r)).toEqual([]);
    expect(orderDependent(r)).toEqual([]);
  });
});

describe("a tensor-parallel replica whose control plane crashes applying its core's progress", () => {
  it('fails as a unit once, whatever else happens, and ends each scenario the same way', () => {
    const r = checkTensorParallel({ gpus: 3, faults: 1, arrivals: 3, crashes: 1 });
    console.log(`TP-3 with a crash: ${r.states} states, ${r.scenarios} scenarios`);
    expect(describeViolations(r)).toEqual([]);
    expect(orderDependent(r)).toEqual([]);
    // Crashes happen, with and without a fault; a crash alone loses no GPU: each ends free, the replica stopped.
    const crashed = [...r.outcomes].filter(([k]) => (JSON.parse(k) as { crashes: number }).crashes === 1);
    const alone = crashed.filter(([k]) => {
      const s = JSON.parse(k) as { ownedFaults: number; laterFaults: number };
      return s.ownedFaults + s.laterFaults === 0;
    });
    expect(alone.length).toBeGreaterThan(0);
    expect(crashed.length).toBeGreaterThan(alone.length);
    for (const [, set] of alone)
      expect([...set].map((o) => JSON.parse(o) as unknown)).toEqual([
        { replica: 'stopped', failed: false, failedGpus: 0, gpusFailed: 0, gpusFree: 3 },
      ]);
  });
});
