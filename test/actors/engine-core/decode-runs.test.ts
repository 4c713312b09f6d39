// An engine core's decode runs change nothing but how often it reports: on random workloads, with submits, cancels,
// stragglers, hung ranks and stops at random times (mid-run among them), a core with runs gives every sequence the
// same events at the same times (scheduled, each token, preempted, finished and why) as the same core reporting
// after every step, the same partial reports, the same step totals and the same busy time per rank; and it reports
// at most every `decodeRunMs` plus a step while it has work.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { createVirtualClock, type VirtualClock } from '../../../runtime/clock.ts';
import { createCostModel } from '../../../actors/gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../../../actors/gpu/profiles.ts';
import type { ContinuousLimits } from '../../../actors/batcher/continuous.ts';
import { createEngineCore } from '../../../actors/engine-core/core.ts';
import { createModelExecutor, type ModelRank } from '../../../actors/engine-core/model-executor.ts';
import type { CoreExecutor, CoreReport, EngineCore, SubmitSeq } from '../../../actors/engine-core/types.ts';

const cost = createCostModel(modelProfile('llama-3-8b'), gpuProfile('H100-SXM'), 2);
const RUN_MS = 40;

type Op =
  | { kind: 'submit'; at: number; seqs: { prompt: number; output: number; priority: number; atHead: boolean }[] }
  | { kind: 'cancel'; at: number; pick: number }
  | { kind: 'straggle'; at: number; rank: number; factor: number }
  | { kind: 'hang'; at: number; rank: number }
  | { kind: 'stop'; at: number };

const time = fc.integer({ min: 0, max: 4000 }).map((x) => x * 0.173 + 0.0371);
const op: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.record({
      kind: fc.constant('submit' as const),
      at: time,
      seqs: fc.array(
        fc.record({
          prompt: fc.integer({ min: 1, max: 300 }),
          output: fc.integer({ min: 1, max: 120 }),
          priority: fc.integer({ min: 0, max: 1 }),
          atHead: fc.boolean(),
        }),
        { minLength: 1, maxLength: 4 },
      ),
    }),
  },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('cancel' as const), at: time, pick: fc.nat() }) },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant('straggle' as const),
      at: time,
      rank: fc.integer({ min: 0, max: 1 }),
      factor: fc.constantFrom(1, 1.5, 3),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({ kind: fc.constant('hang' as const), at: time, rank: fc.integer({ min: 0, max: 1 }) }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('stop' as const), at: time }) },
);

interface World {
  clock: VirtualClock;
  core: EngineCore;
  reports: CoreReport[];
  crashes: unknown[];
  credits: Map<number, number>;
  runs: number;
}

/** A core over two ranks on its own clock; a device change is told to the core first, as its node does. */
function world(limits: ContinuousLimits, ops: readonly Op[], decodeRunMs: number): World {
  const clock = createVirtualClock();
  const ranks: ModelRank[] = [
    { hung: false, slowdown: 1, serving: true },
    { hung: false, slowdown: 1, serving: true },
  ];
  const credits = new Map<number, number>();
  const inner = createModelExecutor({
    clock,
    cost,
    gpus: [0, 1],
    rank: (g) => ranks[g]!,
    credit: (g, ms) => void credits.set(g, (credits.get(g) ?? 0) + ms),
  });
  const w: World = { clock, core: null as unknown as EngineCore, reports: [], crashes: [], credits, runs: 0 };
  const executor: CoreExecutor = {
    ...inner,
    runSteps: (...args) => {
      const k = inner.runSteps!(...args);
      if (k > 0) w.runs++;
      return k;
    },
  };
  w.core = createEngineCore({
    replica: 'r',
    epoch: 1,
    owner: 'm@v',
    clock,
    limits,
    executor,
    decodeRunMs,
    checkInvariants: true,
    report: (r) => w.reports.push(r),
    crashed: (e) => w.crashes.push(e),
  });
  let n = 0;
  for (const o of ops) {
    clock.at(o.at, () => {
      if (o.kind === 'submit') {
        const seqs: SubmitSeq[] = o.seqs.map((s) => {
          const id = `s${++n}`;
          const base = { id, priority: s.priority, order: n, promptTokens: s.prompt, outputTokens: s.output };
          return { ...base, maxTokens: s.output, estOutputTokens: s.output, generated: 0, atHead: s.atHead };
        });
        w.core.submit(seqs);
      } else if (o.kind === 'cancel') {
        if (n > 0) w.core.cancel([`s${(o.pick % n) + 1}`]);
      } else if (o.kind === 'straggle') {
        w.core.flush();
        ranks[o.rank]!.slowdown = o.factor;
      } else if (o.kind === 'hang') {
        w.core.flush();
        ranks[o.rank]!.hung = true;
      } else w.core.stop();
    });
  }
  clock.run(60_000);
  return w;
}

/** Every sequence's events with their times on the core's clock, in order: `s` at its step's start, each token at
 * its step's end (a `g` with `at` lists them, one without ended at the report's time), `p`, `f` with its reason. */
function timeline(reports: readonly CoreReport[]): Map<string, string[]> {
  const out = new Map<string, string[]>();
  const add = (id: string, what: string): void => {
    let l = out.get(id);
    if (!l) out.set(id, (l = []));
    l.push(what);
  };
  let set: readonly string[] = [];
  for (const r of reports) {
    if (r.ranks) {
      add('(partial)', `${r.ranks.join(',')} @${r.at}`);
      continue;
    }
    for (const e of r.events) {
      if (e.k === 's') add(e.id, `s @${r.start}`);
      else if (e.k === 'p') add(e.id, `p @${r.at}`);
      else if (e.k === 't') for (let i = 0; i < e.n; i++) add(e.id, `t @${r.at}`);
      else if (e.k === 'f') add(e.id, `f ${e.reason} ${e.error ?? ''} @${r.at}`);
      else {
        set = e.ids ?? set;
        for (const t of e.at ?? [r.at]) for (const id of set) add(id, `t @${t}`);
      }
    }
  }
  return out;
}

function compare(limits: ContinuousLimits, ops: readonly Op[]): { runs: number; runReports: number; steps: number } {
  const step = world(limits, ops, 0);
  const run = world(limits, ops, RUN_MS);
  expect(run.crashes).toEqual([]);
  expect(step.crashes).toEqual([]);
  expect(timeline(run.reports)).toEqual(timeline(step.reports));
  const totals = (w: World) => {
    const l = w.core.load();
    return [l.stepCount, l.stepMembers, l.stepTokens, l.stepPredictedMs, l.stepBusyMs, l.preemptions, l.received];
  };
  expect(totals(run)).toEqual(totals(step));
  expect([...run.credits]).toEqual([...step.credits]);
  // Never more reports than step by step, and while work is in flight never longer apart than the bound and a step.
  expect(run.reports.length).toBeLessThanOrEqual(step.reports.length);
  const longest = Math.max(0, ...step.reports.map((r) => r.at - r.start));
  for (let i = 1; i < run.reports.length; i++) {
    const prev = run.reports[i - 1]!;
    if (prev.load.inflightPredictedMs > 0) expect(run.reports[i]!.at - prev.at).toBeLessThanOrEqual(RUN_MS + longest);
  }
  return { runs: run.runs, runReports: run.reports.length, steps: step.reports.length };
}

// The cache holds any one sequence (its longest is 420 tokens), and often not many more: preemption.
const limitsArb = fc
  .record({
    policy: fc.constantFrom<ContinuousLimits['policy']>('chunked', 'prefill-first', 'static'),
    maxRunning: fc.integer({ min: 1, max: 8 }),
    tokenBudget: fc.integer({ min: 64, max: 512 }),
    blockTokens: fc.integer({ min: 1, max: 16 }),
    spare: fc.integer({ min: 0, max: 200 }),
    watermarkBlocks: fc.integer({ min: 0, max: 4 }),
  })
  .map(({ spare, ...l }): ContinuousLimits => ({
    ...l,
    blocksTotal: Math.ceil(420 / l.blockTokens) + l.watermarkBlocks + spare,
    maxContext: 600,
  }));

describe('an engine core with decode runs', () => {
  it('gives every sequence the same events at the same times as reporting after every step', () => {
    let runs = 0;
    let saved = 0;
    fc.assert(
      fc.property(limitsArb, fc.array(op, { minLength: 1, maxLength: 40 }), (limits, ops) => {
        const r = compare(limits, ops);
        runs += r.runs;
        saved += r.steps - r.runReports;
      }),
      { numRuns: 200, seed: 7 },
    );
    // The property compared runs, not only steps reported one by one.
    expect(runs).toBeGreaterThan(500);
    expect(saved).toBeGreaterThan(5000);
  }, 120_000);

  it('cuts a run at a submit, a cancel, a straggler, a hung rank and a stop, mid-run', () => {
    const limits: ContinuousLimits = {
      policy: 'chunked',
      maxRunning: 8,
      tokenBudget: 256,
      blockTokens: 4,
      blocksTotal: 400,
      maxContext: 600,
      watermarkBlocks: 0,
    };
    const two = { kind: 'submit' as const, at: 0.01, seqs: [1, 2].map(() => ({ prompt: 20, output: 100 })) };
    const seqs = two.seqs.map((s) => ({ ...s, priority: 0, atHead: false }));
    for (const late of [
      { kind: 'submit' as const, at: 61.3, seqs: [{ prompt: 9, output: 5, priority: 0, atHead: false }] },
      { kind: 'cancel' as const, at: 61.3, pick: 0 },
      { kind: 'straggle' as const, at: 61.3, rank: 1, factor: 3 },
      { kind: 'hang' as const, at: 61.3, rank: 0 },
      { kind: 'stop' as const, at: 61.3 },
    ]) {
      const r = compare(limits, [{ ...two, seqs }, late]);
      expect(r.runs, late.kind).toBeGreaterThan(0);
      expect(r.runReports, late.kind).toBeLessThan(r.steps);
    }
  });
});
