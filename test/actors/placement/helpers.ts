// Small scenarios and a recording simulate() for the placement tests.
import { normalizeScenario, type Scenario } from '../../../actors/config.ts';
import type { ControlPlane } from '../../../actors/control-plane.ts';
import { simulate, type SimReport } from '../../../actors/sim/simulate.ts';
import type { RequestRecord } from '../../../actors/metrics/collector.ts';

/** A traffic entry: Poisson arrivals of conversation-trace lengths. */
export const poisson = (model: string, rate: number, requests: number, start = 0) => ({
  model,
  requests,
  lengths: { trace: 'splitwise_conv', maxTotalTokens: 4096 },
  arrival: { process: 'poisson', rate, start },
});

/** A two-model node: a TP-`tp` large model (profile `large`) and single-GPU small replicas on `gpus` GPUs. */
export function twoModels(o: {
  gpus?: number;
  large?: string;
  tp?: number;
  placement?: Record<string, unknown>;
  detection?: Record<string, unknown>;
  traffic: unknown[];
  faults?: unknown[];
  largeClass?: Record<string, number>;
  smallClass?: Record<string, number>;
  repairMs?: number;
  seed?: number;
}): Scenario {
  const gpus = o.gpus ?? 8;
  return normalizeScenario({
    name: 'test',
    seed: o.seed ?? 1,
    node: { gpu: 'H100-SXM', gpus, repairMs: o.repairMs ?? 5000 },
    placement: {
      policy: 'switch',
      initialMode: 'small',
      drainDeadlineMs: 30_000,
      minResidencyMs: 10_000,
      ...o.placement,
    },
    ...(o.detection ? { detection: o.detection } : {}),
    models: [
      {
        name: 'big',
        profile: o.large ?? 'llama-3-70b',
        tp: o.tp ?? gpus,
        replicas: 1,
        classes: { interactive: { ttftMs: 60_000, tpotMs: 100, maxQueueMs: 1_000_000, ...o.largeClass } },
        resume: { maxResumes: 3, budgetMs: 1_000_000 },
      },
      {
        name: 'small',
        profile: 'llama-3-8b',
        tp: 1,
        replicas: gpus,
        classes: {
          interactive: {
            ttftMs: 60_000,
            tpotMs: 100,
            maxQueueMs: 120_000,
            maxQueued: 50_000,
            maxQueuedTokens: 100_000_000,
            ...o.smallClass,
          },
        },
        resume: { maxResumes: 3, budgetMs: 120_000 },
      },
    ],
    traffic: o.traffic,
    faults: o.faults ?? [],
  });
}

/** A finished run with its control plane's records and what a watcher saw after every placement step. */
export interface Recorded {
  report: SimReport;
  records: readonly RequestRecord[];
  violations: string[];
  cp: ControlPlane;
}

/** Simulates with ownership invariants checked after everything placement does; `setup` may schedule actions. */
export function record(s: Scenario, setup?: (cp: ControlPlane) => void): Recorded {
  let cp: ControlPlane | null = null;
  const violations: string[] = [];
  const report = simulate(s, {
    onStart: (c) => {
      cp = c;
      c.placement.watch(() => violations.push(...c.placement.checkInvariants()));
      setup?.(c);
    },
  });
  const c = cp as unknown as ControlPlane;
  return { report, records: c.collector.records, violations, cp: c };
}

/** Seconds each request of `model` waited before first being scheduled (or until it ended unscheduled). */
export const waitsS = (r: Recorded, model: string): number[] =>
  r.records
    .filter((x) => x.model === model)
    .map((x) => ((x.firstScheduledAt >= 0 ? x.firstScheduledAt : x.finishedAt) - x.receivedAt) / 1000);
