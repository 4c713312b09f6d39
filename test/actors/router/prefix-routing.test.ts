// Routing on prefixes, end to end in simulation: the engine cores report what their prefix caches keep and evict,
// the control plane's index mirrors it, and the cost policy prices a candidate's cached prompt tokens as not
// prefilled, so a conversation's next turn goes where its earlier turns are cached. --explain shows the tokens the
// router expected cached on its choice and what the replica really held; the report counts the prefill saved.
import { describe, expect, it } from 'vitest';
import { normalizeScenario, type Scenario } from '../../../actors/config.ts';
import { simulate } from '../../../actors/sim/simulate.ts';
import type { ControlPlane } from '../../../actors/control-plane.ts';
import { estimateLoad } from '../../../actors/router/estimate.ts';
import { createCostModel } from '../../../actors/gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../../../actors/gpu/profiles.ts';
import { formatTraces } from '../../../actors/router/explain.ts';

/** Two replicas with a prefix cache too small for every conversation at once, and multi-turn traffic. */
function chat(prefix: boolean, policy: 'cost' | 'round-robin' = 'cost'): Scenario {
  return normalizeScenario({
    name: 'prefix-routing',
    seed: 7,
    node: { gpus: 2 },
    placement: { policy: 'exclusive' },
    routing: { policy, prefix },
    models: [
      {
        name: 'llama-3-8b',
        profile: 'llama-3-8b',
        tp: 1,
        replicas: 2,
        batching: {
          policy: 'chunked',
          maxRunning: 64,
          tokenBudget: 2048,
          blockTokens: 16,
          prefixCache: true,
          kvBlocks: 3000,
        },
      },
    ],
    traffic: [
      {
        model: 'llama-3-8b',
        requests: 600,
        lengths: { output: { mean: 60, cv: 0.5, max: 200 } },
        arrival: { process: 'poisson', rate: 4 },
        conversation: {
          systemPrompts: 8,
          systemTokens: 1000,
          shared: 0,
          turns: { mean: 6, max: 12 },
          userTokens: { mean: 150, cv: 0.5 },
          thinkMs: 3000,
        },
      },
    ],
  });
}

describe('routing on prefixes', () => {
  it('sends a conversation back to the replica that caches it: more prefill saved than routing without prefixes', () => {
    const withPrefix = simulate(chat(true));
    const without = simulate(chat(false));
    const rr = simulate(chat(false, 'round-robin'));
    for (const r of [withPrefix, without, rr]) {
      expect(r.invariants.violations).toEqual([]);
      expect(r.requests.total).toBe(600);
    }
    expect(withPrefix.prefix!.requests).toBeGreaterThan(500);
    expect(withPrefix.prefix!.hitRate).toBeGreaterThan(without.prefix!.hitRate);
    expect(withPrefix.prefix!.hitRate).toBeGreaterThan(rr.prefix!.hitRate);
    expect(withPrefix.prefix!.cachedTokens).toBeGreaterThan(without.prefix!.cachedTokens);
  });

  it('mirrors each core cache in the index, and explains expected against found cached tokens', () => {
    let cp: ControlPlane | null = null;
    const r = simulate(chat(true), { keepTraces: true, onStart: (c) => (cp = c) });
    const plane = cp as unknown as ControlPlane;
    const replicas = [...plane.placement.replicas.keys()];
    expect(replicas.length).toBe(2);
    for (const id of replicas) expect(plane.prefix.size(id)).toBeGreaterThan(0);
    // Some request was routed expecting cached tokens, and found them.
    let shown = '';
    for (const rec of plane.collector.records) {
      const traces = plane.explain(rec.id) ?? [];
      const routed = traces.find((t) => t.outcome === 'routed' && t.cachedTokens !== undefined);
      const expected = routed?.candidates.find((c) => c.replica === routed.chosen)?.cachedTokens ?? 0;
      if (!routed || expected === 0 || routed.cachedTokens === 0) continue;
      shown = formatTraces(rec.id, traces);
      break;
    }
    expect(shown).toMatch(/prefix cache: \d+ prompt tokens expected cached, \d+ found when scheduled/);
    expect(r.prefix!.cachedTokens).toBeGreaterThan(0);
  });

  it('prices cached prompt tokens as not prefilled in the estimate', () => {
    const cost = createCostModel(modelProfile('llama-3-8b'), gpuProfile('H100-SXM'), 1);
    const load = {
      id: 'r',
      cost,
      limits: { tokenBudget: 512, maxRunning: 64, blockTokens: 16 },
      stats: {
        waiting: 0,
        running: 8,
        blocksTotal: 10_000,
        prefillTokensAhead: 0,
        decodeTokensAhead: 800,
        waitingByClass: [0],
        waitingTokensByClass: [0],
        runningCommittedBlocks: 100,
        runningContext: 8000,
      },
    };
    const work = { promptTokens: 3000, estOutputTokens: 100, priority: 0 };
    const cold = estimateLoad(load, work);
    const warm = estimateLoad(load, { ...work, cachedTokens: 2880 });
    expect(warm.ttftMs).toBeLessThan(cold.ttftMs / 3);
    expect(warm.cachedTokens).toBe(2880);
    // Never the whole prompt: its last token is computed for the first output token.
    expect(estimateLoad(load, { ...work, cachedTokens: 5000 }).cachedTokens).toBe(2999);
  });
});
