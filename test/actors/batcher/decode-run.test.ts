// Decode runs (actors/batcher/decode-run.ts) change nothing observable: a batcher that steps through them plans the
// same steps, gives the same tokens at the same times and ends in the same state as one that plans every step afresh,
// under every policy, with arrivals, withdrawals, preemption and reads at any point between steps.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import {
  createContinuousBatcher,
  type BatchPolicy,
  type ContinuousBatcher,
  type StepPlan,
} from '../../../actors/batcher/continuous.ts';
import { createSequence, type Sequence, type SequenceListener } from '../../../actors/batcher/sequence.ts';

/** What a world's listener saw, in order: scheduling, preemption, finishing, and every time between tokens. */
interface Log {
  events: string[];
  gaps: number[];
}

const listenerOf = (log: Log): SequenceListener => ({
  scheduled: (s, t) => log.events.push(`scheduled ${s.id} @${t}`),
  preempted: (s, t) => log.events.push(`preempted ${s.id} @${t}`),
  tokens: (s, n, t) => {
    log.events.push(`token ${s.id} #${s.generated} @${t}`);
    if (s.lastTokenAt >= 0) log.gaps.push(t - s.lastTokenAt);
  },
  sameGap: (n, gap) => {
    for (let i = 0; i < n; i++) log.gaps.push(gap);
  },
  finished: (s, t) => log.events.push(`finished ${s.id} @${t}`),
});

type Op =
  | { kind: 'step'; dt: number }
  | { kind: 'arrive'; prompt: number; output: number; priority: number; stream: boolean }
  | { kind: 'withdraw'; pick: number }
  | { kind: 'read' };

const op: fc.Arbitrary<Op> = fc.oneof(
  { weight: 12, arbitrary: fc.record({ kind: fc.constant('step' as const), dt: fc.integer({ min: 1, max: 7 }) }) },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant('arrive' as const),
      prompt: fc.integer({ min: 1, max: 40 }),
      output: fc.integer({ min: 1, max: 60 }),
      priority: fc.integer({ min: 0, max: 1 }),
      stream: fc.integer({ min: 0, max: 5 }).map((x) => x === 0),
    }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('withdraw' as const), pick: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('read' as const) }) },
);

interface World {
  b: ContinuousBatcher;
  log: Log;
  /** One listener for the sequences of a model, as a control plane has, and one for those streamed token by token
   * (no sameGap: each token is its own call). */
  listener: SequenceListener;
  streamed: SequenceListener;
  seqs: Sequence[];
  last: StepPlan | null;
}

const snapshotPlan = (p: StepPlan | null) =>
  p && {
    entries: p.entries.map((e) => `${e.seq.id}:${e.chunk}`),
    shape: JSON.stringify(p.shape),
    tokens: p.tokens,
    prefillTokens: p.prefillTokens,
    decodes: p.decodes,
    blocksUsed: p.blocksUsed,
  };

const snapshotState = (w: World) => ({
  stats: w.b.stats(),
  seqs: w.seqs.map((s) => [s.id, s.computed, s.generated, s.blocks, s.lastTokenAt, s.running, s.gone]),
  log: w.log,
});

let lazySteps = 0;

/** One step at `t`: the reference plans afresh; the other replans the last plan through a decode run when it can. */
function stepBoth(ref: World, run: World, t: number): void {
  const p = ref.b.plan(t);
  const q = run.last !== null && run.b.replan(run.last, true) ? run.last : run.b.plan(t);
  expect(snapshotPlan(q)).toEqual(snapshotPlan(p));
  if (!p || !q) return;
  const before = q.entries.map((e) => e.seq.generated);
  ref.b.complete(p, t);
  run.b.complete(q, t);
  // A step of a run leaves its sequences as they were until the run settles.
  if (q.entries.length > 0 && q.entries.every((e, i) => e.seq.running && e.seq.generated === before[i])) lazySteps++;
  ref.b.checkInvariants(p);
  run.b.checkInvariants(q);
  run.last = q;
}

function play(policy: BatchPolicy, blockTokens: number, blocksTotal: number, ops: Op[]): void {
  const limits = { policy, maxRunning: 6, tokenBudget: 48, blockTokens, blocksTotal, maxContext: 1000 };
  const world = (): World => {
    const log: Log = { events: [], gaps: [] };
    const b = createContinuousBatcher({ ...limits, watermarkBlocks: 0 });
    const { sameGap: _, ...streamed } = listenerOf(log);
    return { b, log, listener: listenerOf(log), streamed, seqs: [], last: null };
  };
  const ref = world();
  const run = world();
  let t = 0;
  let n = 0;
  for (const o of ops) {
    if (o.kind === 'step') stepBoth(ref, run, (t += o.dt));
    else if (o.kind === 'arrive') {
      // A request must fit the cache alone (the router guarantees it): smaller ones only.
      if (Math.ceil((o.prompt + o.output) / blockTokens) > blocksTotal) continue;
      const id = `s${++n}`;
      for (const w of [ref, run]) {
        const s = createSequence({
          ...{ id, priority: o.priority, order: n, promptTokens: o.prompt, outputTokens: o.output },
          ...{ maxTokens: o.output, receivedAt: t, listener: o.stream ? w.streamed : w.listener },
        });
        w.seqs.push(s);
        w.b.enqueue(s);
      }
    } else if (o.kind === 'withdraw' && n > 0) {
      const id = `s${(o.pick % n) + 1}`;
      expect(run.b.withdraw(id)).toBe(ref.b.withdraw(id));
    } else if (o.kind === 'read') expect(snapshotState(run)).toEqual(snapshotState(ref));
  }
  for (let i = 0; i < 400 && ref.b.hasWork(); i++) stepBoth(ref, run, (t += 1));
  expect(snapshotState(run)).toEqual(snapshotState(ref));
}

describe('decode runs', () => {
  it('plan, complete and leave the batcher as planning every step afresh does', () => {
    lazySteps = 0;
    fc.assert(
      fc.property(
        fc.constantFrom<BatchPolicy>('chunked', 'prefill-first', 'static'),
        fc.integer({ min: 1, max: 8 }),
        fc.integer({ min: 12, max: 120 }),
        fc.array(op, { minLength: 5, maxLength: 150 }),
        (policy, blockTokens, blocksTotal, ops) => play(policy, blockTokens, blocksTotal, ops),
      ),
      { numRuns: 300, seed: 14 },
    );
    // The property compared runs, not only steps planned afresh.
    expect(lazySteps).toBeGreaterThan(1000);
  });

  it('stop where the cache runs out, before the step that preempts', () => {
    // Two sequences whose growth outruns 10 blocks of 2 tokens while nothing waits: the run must end before it.
    for (const policy of ['chunked', 'prefill-first', 'static'] as const) {
      lazySteps = 0;
      const arrive = { kind: 'arrive' as const, prompt: 3, output: 14, priority: 0, stream: false };
      play(policy, 2, policy === 'static' ? 17 : 10, [arrive, arrive, ...Array(40).fill({ kind: 'step', dt: 1 })]);
      expect(lazySteps, policy).toBeGreaterThan(0);
    }
  });
});

describe("a decode run's invariant checks", () => {
  // A run's steps are checked by their totals only; what happens to its sequences and the ledger meanwhile is
  // checked in full once it settles, at the next step planned afresh. A ledger corrupted mid-run is found then.
  it('find a ledger corrupted during a run at the next full check', () => {
    const log: Log = { events: [], gaps: [] };
    const listener = listenerOf(log);
    const b = createContinuousBatcher({
      ...{ policy: 'chunked', maxRunning: 4, tokenBudget: 64, blockTokens: 4 },
      ...{ blocksTotal: 100, maxContext: 1000, watermarkBlocks: 0 },
    });
    const seqs = ['a', 'b'].map((id, i) =>
      createSequence({
        id,
        priority: 0,
        order: i,
        promptTokens: 5,
        outputTokens: 30,
        maxTokens: 30,
        receivedAt: 0,
        listener,
      }),
    );
    for (const s of seqs) b.enqueue(s);
    let last: StepPlan | null = null;
    let lazy = 0;
    const problems: string[] = [];
    for (let t = 1; t <= 40 && b.hasWork(); t++) {
      const inRun: boolean = last !== null && b.replan(last, true);
      const p: StepPlan = inRun && last !== null ? last : b.plan(t)!;
      b.complete(p, t);
      if (inRun) lazy++;
      // The corruption: a sequence loses a block behind the ledger's back in the middle of the run.
      if (lazy === 3) seqs[0]!.blocks--;
      try {
        b.checkInvariants(p);
      } catch (e) {
        problems.push(`${t} ${(e as Error).message}`);
      }
      last = p;
    }
    expect(lazy).toBeGreaterThan(3);
    expect(problems[0]).toMatch(/ledger drift/);
  });
});
