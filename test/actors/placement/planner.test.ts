import { describe, expect, it } from 'vitest';
import { normalizeScenario } from '../../../actors/config.ts';
import { candidatesOf, plan, scoreModels } from '../../../actors/placement/planner.ts';
import type { RequestRecord } from '../../../actors/metrics/collector.ts';
import { poisson } from './helpers.ts';
import { formatPlan } from '../../../bin/plan-command.ts';

const base = (o: { gpus?: number; interference?: number; traffic?: unknown[]; variants?: unknown[] } = {}) =>
  normalizeScenario({
    name: 'tiny',
    node: { gpu: 'H100-SXM', gpus: o.gpus ?? 2 },
    placement: { policy: 'switch', interference: o.interference ?? 1.3 },
    planner: { attainment: 0.9, residenciesMs: [0, 10_000], variants: o.variants ?? [] },
    models: [
      {
        name: 'big',
        profile: 'llama-3-70b-fp8',
        tp: 2,
        classes: { interactive: { ttftMs: 2000, tpotMs: 40, maxQueueMs: 60_000 } },
      },
      {
        name: 'small',
        profile: 'llama-3-8b',
        tp: 1,
        replicas: 2,
        classes: { interactive: { ttftMs: 2000, tpotMs: 40, maxQueueMs: 60_000 } },
      },
    ],
    traffic: o.traffic ?? [poisson('big', 1, 20), poisson('small', 2, 40)],
  });

const rec = (over: Partial<RequestRecord>): RequestRecord => ({
  id: 'r',
  model: 'small',
  priority: 'interactive',
  outcome: 'done',
  code: null,
  receivedAt: 0,
  firstScheduledAt: 10,
  firstTokenAt: 100,
  finishedAt: 1100,
  tokens: 101,
  budgetMs: 60_000,
  resumes: 0,
  preemptions: 0,
  ...over,
});

describe('capacity planner', () => {
  it('lists all-large, all-small, switch per residency, share and each configured variant', () => {
    const names = candidatesOf(
      base({ gpus: 8, variants: [{ name: 'fp8-tp4', model: 'big', profile: 'llama-3-70b-fp8', tp: 4 }] }),
    ).map((c) => c.name);
    expect(names).toEqual(['all-large', 'all-small', 'switch r=0s', 'switch r=10s', 'share', 'variant fp8-tp4']);
    const v = candidatesOf(
      base({ gpus: 8, variants: [{ name: 'fp8-tp4', model: 'big', profile: 'llama-3-70b-fp8', tp: 4 }] }),
    ).at(-1)!;
    expect(v.scenario.models.map((m) => [m.name, m.tp, m.replicas])).toEqual([
      ['big', 4, 1],
      ['small', 1, 4],
    ]);
  });

  it('counts a request toward attainment only when it finished within both targets, refused ones as misses', () => {
    const s = base();
    const [, small] = scoreModels(
      s,
      [
        rec({}),
        rec({ firstTokenAt: 3000, finishedAt: 4000 }),
        rec({ outcome: 'rejected', code: 'overloaded', firstTokenAt: -1, firstScheduledAt: -1, finishedAt: 5 }),
      ],
      10,
      0.9,
    );
    expect(small).toMatchObject({ requests: 3, attainment: 0.3333, meets: false, worstWaitS: 0.01 });
    expect(small!.stretch).toEqual([0.25, 1.5, Infinity]);
  });

  it('says "infeasible" and what must change when no candidate meets both targets', () => {
    // Interference x3 breaks the TPOT target under share; every other candidate starves one model.
    const r = plan(base({ interference: 3 }));
    expect(r.feasible).toBe(false);
    const text = formatPlan('tiny', r);
    expect(text).toContain('infeasible');
    expect(text).toMatch(/more GPUs: served side by side the demand needs \d+ GPUs/);
    expect(r.advice.some((a) => a.startsWith('relax targets'))).toBe(true);
    expect(r.results.filter((x) => !x.candidate.name.startsWith('search')).length).toBe(5);
  });
});
