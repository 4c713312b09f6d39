import { describe, expect, it } from 'vitest';
import { loadMsOf, UNLOAD_MS } from '../../../actors/placement/layout.ts';
import { poisson, record, twoModels } from './helpers.ts';

describe('placement under the switch policy (simulation)', () => {
  it('never splits the large model and never gives a GPU to two replicas, through switches, a failure and a repair', () => {
    const r = record(
      twoModels({
        traffic: [
          poisson('small', 6, 120),
          poisson('big', 0.5, 15, 5),
          poisson('big', 0.5, 10, 45),
          poisson('small', 6, 120, 60),
        ],
        faults: [{ at: 50, gpu: 2, kind: 'fault', repairAt: 55 }],
      }),
    );
    expect(r.violations).toEqual([]);
    expect(r.report.invariants.violations).toEqual([]);
    expect(r.report.invariants.withoutOneOutcome).toBe(0);
    const created = r.report.placement.filter((e) => e.kind === 'replica.created');
    // The gang is created whole (eight GPUs, one replica) every time; small replicas take one GPU each.
    for (const e of created) expect(e.gpus!.length).toBe(e.model === 'big' ? 8 : 1);
    expect(created.filter((e) => e.model === 'big').length).toBeGreaterThanOrEqual(2);
    expect(r.report.placement.filter((e) => e.kind === 'mode.switched').length).toBeGreaterThanOrEqual(2);
  });

  it('releases a reservation when the work that raised it goes away, leaving the small replicas serving', () => {
    const s = twoModels({
      placement: { minResidencyMs: 120_000, drainDeadlineMs: 120_000 },
      traffic: [poisson('small', 4, 160), poisson('big', 1, 1, 2)],
    });
    const r = record(s, (cp) => {
      const submit = cp.submit;
      cp.submit = (spec, listener) => {
        const res = submit(spec, listener);
        // The client gives up on its large-model request five seconds later.
        if (spec.model === 'big') cp.runtime.clock.setTimeout(() => cp.cancel(res.id), 5000);
        return res;
      };
    });
    const kinds = r.report.placement.map((e) => e.kind);
    expect(kinds).toContain('reservation.raised');
    expect(kinds).toContain('reservation.released');
    expect(kinds).not.toContain('drain.started');
    expect(r.report.placement.some((e) => e.kind === 'replica.created' && e.model === 'big')).toBe(false);
    expect(r.cp.placement.mode()).toMatchObject({ state: 'steady', mode: 'small', switches: 0 });
    expect(r.report.models['small']!.requests).toEqual({ done: 160 });
    expect(r.report.models['big']!.requests).toEqual({ cancelled: 1 });
  });

  it('keeps switches per minute within the thrash bound while demand oscillates faster than a switch', () => {
    // Ten-second phases of only-large and only-small traffic, for two minutes.
    const traffic: unknown[] = [];
    for (let p = 0; p < 12; p++)
      traffic.push(p % 2 === 0 ? poisson('big', 1, 8, p * 10) : poisson('small', 8, 70, p * 10));
    const s = twoModels({ traffic });
    const r = record(s);
    const switched = r.report.placement.filter((e) => e.kind === 'mode.switched').map((e) => e.t);
    const minutes = r.report.sim.simulatedSeconds / 60;
    // A switch takes at least an unload and a load; a mode then serves at least min(residency, deadline) before
    // fresh work can drain it. Phase changes come every 10 s (6/min); switching follows at most this rate.
    const minLoad = Math.min(...s.models.map((m) => loadMsOf(s, m)));
    const boundPerMin =
      60_000 / (Math.min(s.placement.minResidencyMs, s.placement.drainDeadlineMs) + UNLOAD_MS + minLoad);
    expect(switched.length / minutes).toBeLessThanOrEqual(boundPerMin);
    for (let i = 1; i < switched.length; i++)
      expect(switched[i]! - switched[i - 1]!).toBeGreaterThanOrEqual(UNLOAD_MS + minLoad);
    expect(switched.length).toBeGreaterThanOrEqual(2);
    expect(r.violations).toEqual([]);
  });
});
