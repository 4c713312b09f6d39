// Admission while held counts the work ahead: a burst for a model that is not loaded is admitted only as far as
// the load time plus the held work ahead fits each request's budget; the rest is refused at once.
import { describe, expect, it } from 'vitest';
import { normalizeScenario } from '../../../actors/config.ts';
import type { ControlPlane } from '../../../actors/control-plane.ts';
import { simulate } from '../../../actors/sim/simulate.ts';
import { admittedToExpire } from '../../../actors/sim/dst.ts';

describe('admission of held requests', () => {
  it('refuses a 10,000-request burst for the 70B model at once beyond what its budget allows, in small mode at 20 req/s', () => {
    let cp!: ControlPlane;
    const report = simulate(
      normalizeScenario({
        name: 'burst-70b',
        seed: 5,
        node: { gpu: 'H100-SXM', gpus: 8 },
        placement: { policy: 'switch', initialMode: 'small' },
        models: [
          {
            name: 'llama-3-70b',
            profile: 'llama-3-70b',
            tp: 8,
            replicas: 1,
            classes: { interactive: { maxQueueMs: 60_000 } },
          },
          { name: 'llama-3-8b', profile: 'llama-3-8b', tp: 1, replicas: 8 },
        ],
        traffic: [
          {
            model: 'llama-3-8b',
            requests: 1200,
            lengths: { trace: 'splitwise_conv', maxTotalTokens: 4096 },
            arrival: { process: 'poisson', rate: 20 },
          },
          {
            model: 'llama-3-70b',
            requests: 10_000,
            lengths: { trace: 'splitwise_conv', maxTotalTokens: 4096 },
            arrival: { process: 'burst', rate: 1, start: 10 },
          },
        ],
        sim: { checkInvariants: true },
      }),
      { keepTraces: true, onStart: (c) => (cp = c) },
    );
    expect(report.invariants).toMatchObject({ violations: [], overBudget: 0, withoutOneOutcome: 0 });
    const big = cp.collector.records.filter((r) => r.model === 'llama-3-70b');
    const refused = big.filter((r) => r.outcome === 'rejected');
    const admitted = big.filter((r) => r.outcome !== 'rejected');
    // Refused at once, as overloaded; only a few hundred admitted (4,096 were before the work ahead was counted).
    expect(refused.length).toBeGreaterThan(9_000);
    expect(refused.every((r) => r.code === 'overloaded' && r.finishedAt === r.receivedAt)).toBe(true);
    expect(admitted.length).toBeLessThan(500);
    // P11: no admitted request expired unscheduled while its admission said it would be scheduled in time; those
    // that expired unscheduled were first queued on the replica and handed back when placement drained it.
    expect(admittedToExpire(cp, [])).toEqual([]);
    for (const r of admitted.filter((x) => x.code === 'expired' && x.firstScheduledAt < 0))
      expect(
        cp.explain(r.id)!.some((x) => x.kind === 'resume' && x.outcome === 'routed'),
        r.id,
      ).toBe(true);
  });
});
