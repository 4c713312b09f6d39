import { describe, expect, it } from 'vitest';
import { poisson, record, twoModels } from './helpers.ts';
import type { ControlPlane } from '../../../actors/control-plane.ts';

// One GPU of eight fails three times while the large model streams, once per detection path.
const scenario = () =>
  twoModels({
    seed: 9,
    placement: { initialMode: 'large' },
    detection: { heartbeatMs: 500, missedHeartbeats: 3, progressFactor: 10, progressSlackMs: 3000 },
    largeClass: { maxQueueMs: 60_000 },
    // Small-model work only while the large model is down after the first fault.
    traffic: [poisson('big', 1, 160), poisson('small', 3, 30, 15)],
    faults: [
      { at: 10, gpu: 3, kind: 'fault', repairAt: 30 },
      { at: 60, gpu: 5, kind: 'hang', repairAt: 75 },
      { at: 110, gpu: 6, kind: 'crash', repairAt: 125 },
    ],
  });

/** Checks every client stream: tokens arrive in order without gaps or repeats, and exactly one terminal event. */
function watchStreams(cp: ControlPlane, problems: string[]): void {
  const next = new Map<string, number>();
  const ended = new Map<string, number>();
  const submit = cp.submit;
  cp.submit = (spec, listener) =>
    submit(spec, {
      tokens: (id, seq, n) => {
        if (seq !== (next.get(id) ?? 0)) problems.push(`${id}: token ${seq} after ${next.get(id) ?? 0}`);
        next.set(id, seq + n);
      },
      terminal: (id, o) => {
        ended.set(id, (ended.get(id) ?? 0) + 1);
        if (ended.get(id)! > 1) problems.push(`${id}: second terminal event ${o.outcome}`);
        if (o.outcome === 'done' && o.tokens !== next.get(id))
          problems.push(`${id}: done with ${o.tokens} tokens, streamed ${next.get(id)}`);
      },
      ...listener,
    });
}

describe('one GPU of eight failing while the large model streams', () => {
  const problems: string[] = [];
  const run = record(scenario(), (cp) => watchStreams(cp, problems));
  const faults = run.report.failures!;

  it('detects each fault by its path within the configured bound', () => {
    expect(faults.map((f) => f.detection?.path)).toEqual(['reported', 'progress', 'heartbeat']);
    for (const f of faults) expect(f.detection!.afterMs).toBeLessThanOrEqual(f.detection!.boundMs);
  });

  it('fails the gang as a unit and resumes or fails each interrupted request, exactly one of the two', () => {
    for (const f of faults) {
      expect(f.replicas).toEqual(['replica.big@v1#0']);
      expect(f.requests.length).toBeGreaterThan(0);
      for (const q of f.requests) expect(['resumed', 'replica_failed']).toContain(q.outcome);
    }
    const outcomes = faults.flatMap((f) => f.requests.map((q) => q.outcome));
    expect(outcomes).toContain('resumed');
    expect(problems).toEqual([]);
    expect(run.report.invariants.withoutOneOutcome).toBe(0);
    expect(run.violations).toEqual([]);
  });

  it('reports the large model unavailable with the reason, gives the seven healthy GPUs to small replicas, and brings the large model back after repair', () => {
    for (const f of faults) {
      expect(f.unavailable).toBe('big needs 8 healthy GPUs, 7 available');
      expect(f.smallOnHealthyMs).not.toBeNull();
      expect(f.smallOnHealthyMs!).toBeLessThan(20_000);
      expect(f.largeBackAfterRepairMs).not.toBeNull();
    }
    const refused = run.records.filter((r) => r.model === 'big' && r.code === 'model_unavailable');
    expect(refused.length).toBe(faults.reduce((s, f) => s + f.rejectedUnavailable, 0));
    expect(refused.length).toBeGreaterThan(0);
  });

  it('gives an identical report for the same seed', () => {
    const again = record(scenario());
    expect(JSON.stringify(again.report)).toBe(JSON.stringify(run.report));
  });
});

describe('waiting for a repair instead of refusing', () => {
  it('holds new large-model requests within their budget while the gang cannot be placed, and serves them after the repair', () => {
    const run = record(
      twoModels({
        seed: 3,
        placement: { initialMode: 'large', waitForRepairMs: 30_000 },
        largeClass: { maxQueueMs: 90_000 },
        traffic: [poisson('big', 0.5, 30)],
        faults: [{ at: 10, gpu: 1, kind: 'fault', repairAt: 20 }],
      }),
    );
    const big = run.records.filter((r) => r.model === 'big');
    expect(big.some((r) => r.code === 'model_unavailable')).toBe(false);
    // Requests that arrived during the outage were held, then served once the gang was back.
    const back = run.report.failures![0]!;
    const outage = big.filter(
      (r) => r.receivedAt - run.report.sim.originMs! > 10_500 && r.receivedAt - run.report.sim.originMs! < 20_000,
    );
    expect(outage.length).toBeGreaterThan(0);
    for (const r of outage) expect(r.outcome).toBe('done');
    expect(back.largeBackAfterRepairMs).not.toBeNull();
    expect(run.violations).toEqual([]);
  });
});
