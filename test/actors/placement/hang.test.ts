// Hangs outside a serving step: a GPU that hangs while its replica loads is found within the bound of a hang while
// serving (not at the first step), and a GPU suspected of hanging is not given to a new replica.
import { describe, expect, it } from 'vitest';
import { normalizeScenario } from '../../../actors/config.ts';
import { poisson, record } from './helpers.ts';

const DETECTION = { heartbeatMs: 500, missedHeartbeats: 3, progressFactor: 10, progressSlackMs: 2000 };

const smallOnly = (replicas: number, faults: unknown[], policy = 'exclusive') =>
  normalizeScenario({
    name: 'hang',
    seed: 5,
    node: { gpu: 'H100-SXM', gpus: 8, repairMs: 5000 },
    placement: { policy },
    detection: DETECTION,
    routing: { ejection: { failures: 1000 } },
    models: [
      {
        name: 'small',
        profile: 'llama-3-8b',
        tp: 1,
        replicas,
        classes: { interactive: { ttftMs: 60_000, tpotMs: 1000, maxQueueMs: 120_000 } },
        resume: { maxResumes: 3, budgetMs: 120_000 },
      },
    ],
    traffic: [poisson('small', 2, 60)],
    faults,
  });

describe('a GPU that hangs outside a serving step', () => {
  it('is found while its replica loads, within the bound of a hang while serving', () => {
    // GPU 3 fails at 5 s and is back at 11 s; its new replica loads for about 13 s; the GPU hangs at 15 s mid-load.
    const run = record(
      smallOnly(8, [
        { at: 5, gpu: 3, kind: 'fault', repairAt: 6 },
        { at: 15, gpu: 3, kind: 'hang', repairAt: 60 },
      ]),
    );
    const origin = run.report.sim.originMs ?? 0;
    const created = run.cp.placement.events.find(
      (e) => e.kind === 'replica.created' && e.replica === 'replica.small@v1#3' && e.t > origin + 6_000,
    );
    expect(created).toBeDefined();
    expect(
      run.cp.placement.events.some(
        (e) =>
          e.kind === 'replica.ready' && e.replica === 'replica.small@v1#3' && e.t > created!.t && e.t < origin + 15_000,
      ),
    ).toBe(false);
    const hang = run.report.failures![1]!;
    expect(hang.kind).toBe('hang');
    expect(hang.detection).not.toBeNull();
    // The bound of a hang while serving, for the shortest step there is: anything found later came from a step.
    const servingBound = run.cp.placement.detectionBounds(0).progress;
    expect(hang.detection!.afterMs).toBeLessThanOrEqual(servingBound);
    expect(hang.detection!.withinBound).toBe(true);
    expect(run.violations).toEqual([]);
  });

  it('is not given to a new replica while it is suspected', () => {
    // Seven replicas on eight GPUs (the small layout packs them onto the healthy GPUs in order): GPU 7 is free when
    // it hangs at 5 s; GPU 2 fails at 5.5 s, before the hang is proven, and the layout then wants a replica on GPU 7.
    const run = record(
      smallOnly(
        7,
        [
          { at: 5, gpu: 7, kind: 'hang', repairAt: 100 },
          { at: 5.5, gpu: 2, kind: 'fault', repairAt: 100 },
        ],
        'switch',
      ),
    );
    const origin = run.report.sim.originMs ?? 0;
    const after = run.cp.placement.events.filter((e) => e.t >= origin + 5_000);
    const placedOn7 = after.filter((e) => e.kind === 'replica.created' && (e.gpus ?? []).includes(7));
    expect(placedOn7).toEqual([]);
    const found7 = run.cp.placement.failures.find((f) => f.gpu === 7);
    expect(found7).toBeDefined();
    expect(found7!.replicas).toEqual([]);
    expect(run.violations).toEqual([]);
  });
});
