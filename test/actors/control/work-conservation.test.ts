// Work conservation in simulation: the requests a failed replica gives up resume at once on another ready replica
// (with and without a version rollout under way), never on the failing replica, and complete.
import { describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../actors/control-plane.ts';
import { longestStepMs } from '../../../actors/control/invariants.ts';
import { startRollout } from '../../../actors/router/rollout.ts';
import { simulate } from '../../../actors/sim/simulate.ts';
import { runDstSeed } from '../../../actors/sim/dst.ts';
import { afterBoot, poisson, smallScenario } from '../router/sim-helpers.ts';

/** Runs 8 small replicas under `rate` req/s, fails GPU 3 at 20 s, and records every token's time per request. */
function failGpu3(rate: number, rollout: boolean) {
  let cp!: ControlPlane;
  const tokensAt = new Map<string, number[]>();
  const prompts = new Map<string, number>();
  const report = simulate(
    smallScenario({
      replicas: 8,
      versions: rollout ? ['v1', 'v2'] : ['v1'],
      traffic: [poisson(rate * 30, rate)],
      faults: [{ at: 20, gpu: 3, kind: 'fault', repairAt: 60 }],
    }),
    {
      keepTraces: true,
      onStart: (c) => {
        cp = c;
        if (rollout) c.placement.setReplicas('llama', 'v2', 0);
        const submit = c.submit;
        c.submit = (spec, l) => {
          const res = submit(spec, {
            ...l,
            tokens: (id, seq, n, t) => {
              const ts = tokensAt.get(id) ?? [];
              ts.push(t);
              tokensAt.set(id, ts);
              l?.tokens?.(id, seq, n, t);
            },
          });
          prompts.set(res.id, spec.promptTokens);
          return res;
        };
        // The rollout starts 15 s into traffic, so that it is under way when GPU 3 fails at 20 s.
        if (rollout)
          afterBoot(c, () =>
            c.runtime.clock.setTimeout(
              () =>
                startRollout(
                  { clock: c.runtime.clock, placement: c.placement, registry: c.router.registry },
                  { model: 'llama', from: 'v1', to: 'v2' },
                ),
              15_000,
            ),
          );
      },
    },
  );
  return { cp, report, tokensAt, prompts };
}

describe('work conservation', () => {
  for (const rollout of [false, true]) {
    it(`resumes every interrupted request on another replica within a step plus its re-prefill, and completes it${rollout ? ', with a v1 to v2 rollout under way' : ''}`, () => {
      const { cp, report, tokensAt, prompts } = failGpu3(20, rollout);
      const failed = cp.placement.interruptions.filter((i) => i.reason === 'replica_failed');
      expect(failed.length).toBe(1);
      const { t, replica, requests } = failed[0]!;
      expect(requests.length).toBeGreaterThan(0);
      expect(report.requests['replica_failed'] ?? 0).toBe(0);
      expect(report.invariants).toMatchObject({ violations: [], overBudget: 0, withoutOneOutcome: 0 });
      const records = new Map(cp.collector.records.map((r) => [r.id, r]));
      // Every replica runs the same profile and limits (the one it resumed on may have drained away since).
      const any = [...cp.placement.replicas.values()][0]!;
      const stepMs = longestStepMs(any);
      for (const q of requests) {
        const rec = records.get(q.id)!;
        expect(rec.outcome, q.id).toBe('done');
        expect(rec.resumes, q.id).toBe(1);
        // Its resume went to a ready replica other than the one failing.
        const resumed = cp.explain(q.id)!.find((x) => x.kind === 'resume' && x.t === t)!;
        expect(resumed.outcome, q.id).toBe('routed');
        expect(resumed.chosen).not.toBe(replica);
        // Its next token came within one step plus the re-prefill of what the client had (at the token budget).
        const prefillTokens = prompts.get(q.id)! + q.tokens;
        const boundMs = stepMs * (1 + Math.ceil(prefillTokens / any.work.limits.tokenBudget));
        const next = (tokensAt.get(q.id) ?? []).find((x) => x > t);
        expect(next, q.id).toBeDefined();
        expect(next! - t, q.id).toBeLessThanOrEqual(boundMs);
      }
    });
  }

  it('is a promise the DST checks: the old hold (dispatch on replica-ready only) is caught as P10', () => {
    const r = runDstSeed(3, { simSeconds: 60, mutation: 'held-on-ready-only' });
    expect(r.violations.some((v) => v.startsWith('P10'))).toBe(true);
    expect(runDstSeed(3, { simSeconds: 60 }).violations).toEqual([]);
  });
});
