// A replica's engine core on a virtual clock: its step loop, the events and load it reports, and how it fails.
import { describe, expect, it } from 'vitest';
import { createVirtualClock, type VirtualClock } from '../../../runtime/clock.ts';
import { createCostModel } from '../../../actors/gpu/cost-model.ts';
import { gpuProfile, modelProfile } from '../../../actors/gpu/profiles.ts';
import { createContinuousBatcher, type ContinuousLimits } from '../../../actors/batcher/continuous.ts';
import { createSequence } from '../../../actors/batcher/sequence.ts';
import type { StatelessLimits } from '../../../actors/batcher/stateless.ts';
import { createEngineCore } from '../../../actors/engine-core/core.ts';
import { createModelExecutor, type ModelRank } from '../../../actors/engine-core/model-executor.ts';
import type {
  CoreExecutor,
  CoreReport,
  EngineCore,
  SeqEvent,
  StepResult,
  SubmitSeq,
} from '../../../actors/engine-core/types.ts';

const cost = createCostModel(modelProfile('llama-3-8b'), gpuProfile('H100-SXM'), 1);

const limitsOf = (over: Partial<ContinuousLimits> = {}): ContinuousLimits => ({
  policy: 'chunked',
  maxRunning: 8,
  tokenBudget: 256,
  blockTokens: 4,
  blocksTotal: 200,
  maxContext: 1000,
  watermarkBlocks: 0,
  ...over,
});

const statelessLimits: StatelessLimits = {
  maxSize: 3,
  maxTokens: 1024,
  maxMemoryBytes: 1e9,
  maxDelayMs: 5,
  buckets: [16, 64],
  bytesPerToken: 1000,
  maxQueued: 100,
};

const seq = (id: string, promptTokens: number, outputTokens: number, over: Partial<SubmitSeq> = {}): SubmitSeq => ({
  id,
  priority: 0,
  order: 0,
  promptTokens,
  outputTokens,
  maxTokens: outputTokens,
  estOutputTokens: outputTokens,
  generated: 0,
  ...over,
});

interface Rig {
  clock: VirtualClock;
  core: EngineCore;
  reports: CoreReport[];
  crashes: unknown[];
  /** Steps the executor was asked to run. */
  runs: number;
}

/** A core on a virtual clock; its executor is the cost model over `ranks` unless one is given. */
function rig(
  o: {
    limits?: ContinuousLimits;
    stateless?: StatelessLimits;
    ranks?: ModelRank[];
    executor?: (clock: VirtualClock) => CoreExecutor;
  } = {},
): Rig {
  const clock = createVirtualClock();
  const ranks = o.ranks ?? [{ hung: false, slowdown: 1, serving: true }];
  const inner =
    o.executor?.(clock) ??
    createModelExecutor({ clock, cost, gpus: ranks.map((_, i) => i), rank: (g) => ranks[g]!, credit: () => {} });
  const r: Rig = { clock, core: null as unknown as EngineCore, reports: [], crashes: [], runs: 0 };
  const executor: CoreExecutor = {
    ...inner,
    run: (...args) => {
      r.runs++;
      inner.run(...args);
    },
  };
  r.core = createEngineCore({
    replica: 'replica.m@v#0',
    epoch: 1,
    owner: 'm@v',
    clock,
    limits: o.limits ?? limitsOf(),
    ...(o.stateless ? { stateless: o.stateless } : {}),
    executor,
    report: (x) => r.reports.push(x),
    crashed: (e) => r.crashes.push(e),
    checkInvariants: true,
  });
  return r;
}

/** Each report's events with the report's time, in order. */
const eventsOf = (reports: readonly CoreReport[]): { at: number; start: number; e: SeqEvent }[] =>
  reports.flatMap((r) => r.events.map((e) => ({ at: r.at, start: r.start, e })));

/** Tokens per sequence, reading `g` events against the decode set they name (or the one before). */
function tokensOf(reports: readonly CoreReport[]): Map<string, number> {
  const n = new Map<string, number>();
  let set: readonly string[] = [];
  for (const { e } of eventsOf(reports)) {
    if (e.k === 't') n.set(e.id, (n.get(e.id) ?? 0) + e.n);
    if (e.k === 'g') {
      set = e.ids ?? set;
      for (const id of set) n.set(id, (n.get(id) ?? 0) + 1);
    }
  }
  return n;
}

const kinds = (reports: readonly CoreReport[], id: string): string[] =>
  eventsOf(reports)
    .map(({ e }) => e)
    .filter((e) => 'id' in e && e.id === id)
    .map((e) => e.k);

describe('engine core', () => {
  describe('continuous batching', () => {
    it('reports the tokens and finishes the batcher produces, at the times it produces them', () => {
      const seqs = [seq('a', 20, 3), seq('b', 300, 6), seq('c', 5, 12), seq('d', 40, 1)];
      const r = rig();
      r.core.submit(seqs);
      r.clock.run();
      // The same batcher stepped by hand, each step taking the cost model's time.
      const tokens = new Map<string, number>();
      const finished: [string, number][] = [];
      const listener = {
        scheduled: () => {},
        preempted: () => {},
        tokens: (s: { id: string }, n: number) => tokens.set(s.id, (tokens.get(s.id) ?? 0) + n),
        finished: (s: { id: string }, t: number) => finished.push([s.id, t]),
      };
      const b = createContinuousBatcher(limitsOf());
      for (const s of seqs) b.enqueue(createSequence({ ...s, receivedAt: 0, listener }));
      let t = 0;
      let steps = 0;
      for (let p = b.plan(t); p; p = b.plan(t)) {
        t += cost.stepS(p.shape) * 1000;
        b.complete(p, t);
        steps++;
      }
      expect(tokensOf(r.reports)).toEqual(tokens);
      const fs = eventsOf(r.reports).filter(({ e }) => e.k === 'f');
      expect(fs.map(({ at, e }) => [(e as { id: string }).id, at])).toEqual(finished);
      expect(fs.every(({ e }) => e.k === 'f' && e.reason === 'done' && e.error === undefined)).toBe(true);
      expect(r.runs).toBe(steps);
      expect(r.crashes).toEqual([]);
    });

    it('sends one report per step, made once the next step runs', () => {
      const r = rig();
      r.core.submit([seq('a', 20, 5), seq('b', 10, 8)]);
      expect(r.core.busy()).toBe(true);
      expect(r.reports).toEqual([]);
      r.clock.run();
      expect(r.reports).toHaveLength(r.runs);
      const last = r.reports[r.reports.length - 1]!;
      for (const x of r.reports.slice(0, -1)) expect(x.load.inflightPredictedMs).toBeGreaterThan(0);
      expect(last.load).toMatchObject({ inflightPredictedMs: 0, inflightMs: 0, running: 0, waiting: 0 });
      expect(last.load.stepCount).toBe(r.runs);
      expect(last.load.stepMembers).toBeGreaterThanOrEqual(r.runs);
      expect(last.load.stepBusyMs).toBeCloseTo(last.at, 6);
      expect(last.load.received).toBe(2);
      // Each report names the step it reports: starts follow one another, the previous report's time.
      r.reports.forEach((x, i) => expect(x.start).toBe(i === 0 ? 0 : r.reports[i - 1]!.at));
      expect(r.core.busy()).toBe(false);
    });

    it('reports a sequence scheduled in the report of the step that started it', () => {
      const r = rig();
      r.core.submit([seq('a', 20, 4)]);
      r.clock.run(0.001);
      r.core.submit([seq('b', 20, 2)]);
      r.clock.run();
      const sb = eventsOf(r.reports).find(({ e }) => e.k === 's' && e.id === 'b')!;
      // b came while step 1 ran: it was scheduled at step 2's start, which is when step 1 completed.
      expect(sb.start).toBe(r.reports[0]!.at);
      // Its first token alone, its second with a's as one decode step of the pair.
      expect(kinds(r.reports, 'b')).toEqual(['s', 't', 'f']);
      expect(tokensOf(r.reports).get('b')).toBe(2);
    });

    it('reports a preempted sequence p, then s again when it is rescheduled, with all its tokens', () => {
      const r = rig({ limits: limitsOf({ blocksTotal: 8, tokenBudget: 64 }) });
      r.core.submit([seq('a', 8, 12), seq('b', 8, 12, { order: 1 })]);
      r.clock.run();
      const b = kinds(r.reports, 'b');
      const p = b.indexOf('p');
      expect(p).toBeGreaterThan(0);
      expect(b.indexOf('s', p)).toBeGreaterThan(p);
      expect(b[b.length - 1]).toBe('f');
      expect(tokensOf(r.reports)).toEqual(
        new Map([
          ['a', 12],
          ['b', 12],
        ]),
      );
      expect(r.reports[r.reports.length - 1]!.load.preemptions).toBeGreaterThan(0);
      expect(r.crashes).toEqual([]);
    });

    it('drops a cancelled sequence with no event, and answers a cancel at once only when idle', () => {
      const r = rig();
      r.core.submit([seq('a', 20, 10), seq('b', 20, 10)]);
      while (r.reports.length < 2) r.clock.run(r.clock.now() + 0.5);
      expect(tokensOf(r.reports).get('a')).toBeGreaterThan(0);
      const before = r.reports.length;
      r.core.cancel(['a']);
      expect(r.reports).toHaveLength(before);
      r.clock.run();
      const after = eventsOf(r.reports.slice(before)).map(({ e }) => e);
      expect(after.some((e) => 'id' in e && e.id === 'a')).toBe(false);
      expect(kinds(r.reports, 'a')).not.toContain('f');
      expect(tokensOf(r.reports).get('b')).toBe(10);
      const idle = r.reports.length;
      r.core.cancel(['b']);
      expect(r.reports).toHaveLength(idle + 1);
      expect(r.reports[idle]!.events).toEqual([]);
      expect(r.reports[idle]!.start).toBe(r.reports[idle]!.at);
    });

    it('finishes an oversize or duplicate sequence with an error and runs the rest', () => {
      const r = rig();
      r.core.submit([seq('a', 900, 200), seq('b', 10, 2), seq('b', 10, 2)]);
      r.clock.run();
      const fs = eventsOf(r.reports)
        .map(({ e }) => e)
        .filter((e) => e.k === 'f');
      expect(fs).toHaveLength(3);
      expect(fs[0]).toMatchObject({ id: 'a', reason: 'done', error: expect.stringMatching(/exceed the context/) });
      expect(fs[1]).toMatchObject({ id: 'b', reason: 'done', error: expect.stringMatching(/already/) });
      expect(fs[2]).toEqual({ k: 'f', id: 'b', reason: 'done' });
      expect(r.crashes).toEqual([]);
    });

    it('answers a submit it refuses entirely at once when idle', () => {
      const r = rig();
      r.core.submit([seq('a', 900, 200)]);
      expect(r.reports).toHaveLength(1);
      expect(r.reports[0]!.events).toMatchObject([{ k: 'f', id: 'a' }]);
      expect(r.core.busy()).toBe(false);
    });

    it('names the decode set in a g only when it changed since the last', () => {
      const r = rig();
      r.core.submit([seq('a', 10, 3), seq('b', 10, 6), seq('c', 10, 6)]);
      r.clock.run();
      const gs = eventsOf(r.reports)
        .map(({ e }) => e)
        .filter((e) => e.k === 'g');
      expect(gs.map((g) => (g.k === 'g' ? (g.ids ?? null) : null))).toEqual([
        ['a', 'b', 'c'],
        null,
        ['b', 'c'],
        null,
        null,
      ]);
      expect(tokensOf(r.reports)).toEqual(
        new Map([
          ['a', 3],
          ['b', 6],
          ['c', 6],
        ]),
      );
    });

    it('reports the same sequence of reports for the same inputs', () => {
      const play = (): string => {
        const r = rig({ limits: limitsOf({ blocksTotal: 30, tokenBudget: 48 }) });
        r.core.submit([seq('a', 40, 9), seq('b', 12, 20, { priority: 1 }), seq('c', 30, 14)]);
        r.clock.at(3, () => r.core.submit([seq('d', 7, 25, { atHead: true }), seq('e', 60, 3)]));
        r.clock.at(9, () => r.core.cancel(['c']));
        r.clock.run();
        expect(r.crashes).toEqual([]);
        return JSON.stringify(r.reports);
      };
      const first = play();
      expect(first.length).toBeGreaterThan(1000);
      expect(play()).toBe(first);
    });
  });

  describe('dynamic batching (stateless)', () => {
    const item = (id: string, tokens: number) => ({ id, tokens, dtype: 'bf16', adapter: null, options: {} });

    it('answers every item exactly once with its result, its batch and its size', () => {
      const r = rig({ stateless: statelessLimits });
      const ids = ['i0', 'i1', 'i2', 'i3', 'i4', 'i5', 'i6'];
      r.core.submitItems([...ids.map((id, k) => item(id, 5 + k)), item('big', 100)]);
      r.clock.run();
      expect(r.crashes).toEqual([]);
      const fs = eventsOf(r.reports)
        .map(({ e }) => e)
        .filter((e) => e.k === 'f');
      expect(fs.map((f) => f.k === 'f' && f.id).sort()).toEqual([...ids, 'big'].sort());
      expect(fs.find((f) => f.k === 'f' && f.id === 'big')).toMatchObject({
        error: expect.stringMatching(/^invalid_request: input of 100 tokens/),
      });
      const answered = fs.filter((f) => f.k === 'f' && f.id !== 'big');
      const batches = new Map<string, number>();
      for (const f of answered) {
        if (f.k !== 'f') continue;
        expect(f.result).toBe(5 + ids.indexOf(f.id));
        expect(f.error).toBeUndefined();
        batches.set(f.batch!, (batches.get(f.batch!) ?? 0) + 1);
      }
      // Three members at most per batch: 3 + 3 + 1, the last closed by its delay.
      expect([...batches.values()]).toEqual([3, 3, 1]);
      for (const f of answered) if (f.k === 'f') expect(f.size).toBe(batches.get(f.batch!));
      for (const id of ids) expect(kinds(r.reports, id)).toEqual(['s', 'f']);
      expect(r.runs).toBe(3);
      const last = r.reports[r.reports.length - 1]!.load;
      expect(last).toMatchObject({ queued: 0, stepCount: 3, stepMembers: 7, saturated: false, received: 8 });
    });

    it('drops a cancelled item with no answer, and reports the queue when idle', () => {
      const r = rig({ stateless: statelessLimits });
      r.core.submitItems([item('a', 5), item('b', 5)]);
      expect(r.reports).toHaveLength(1);
      expect(r.reports[0]!.load.queued).toBe(2);
      r.core.cancel(['a']);
      expect(r.reports).toHaveLength(2);
      expect(r.reports[1]!.load.queued).toBe(1);
      r.clock.run();
      expect(kinds(r.reports, 'a')).toEqual([]);
      expect(kinds(r.reports, 'b')).toEqual(['s', 'f']);
    });

    it('refuses a generative sequence with an error, as a generative core refuses an item', () => {
      const r = rig({ stateless: statelessLimits });
      r.core.submit([seq('x', 5, 5)]);
      expect(r.reports[0]!.events).toMatchObject([{ k: 'f', id: 'x', error: expect.stringMatching(/stateless/) }]);
      const g = rig();
      g.core.submitItems([item('y', 5)]);
      expect(g.reports[0]!.events).toMatchObject([{ k: 'f', id: 'y', error: expect.stringMatching(/generative/) }]);
    });
  });

  describe('a stalled rank', () => {
    it('sends a partial report naming the ranks that finished, and no step after it', () => {
      const r = rig({
        ranks: [
          { hung: false, slowdown: 1, serving: true },
          { hung: true, slowdown: 1, serving: true },
        ],
      });
      r.core.submit([seq('a', 10, 4)]);
      r.clock.run();
      expect(r.runs).toBe(1);
      expect(r.reports).toHaveLength(1);
      expect(r.reports[0]).toMatchObject({ start: 0, ranks: [0], events: [] });
      expect(r.reports[0]!.at).toBeGreaterThan(0);
      expect(r.reports[0]!.load.inflightPredictedMs).toBeGreaterThan(0);
      expect(r.core.busy()).toBe(true);
    });
  });

  describe('a real engine', () => {
    /** An engine that samples token 100 + position for every sequence asked, 'eos' at `eosAt` output tokens. */
    function engine(clock: VirtualClock, eosAt: number, skip?: string): CoreExecutor {
      let timer = -1;
      return {
        predictMs: () => 2,
        run: (plan, _b, done) => {
          const sampled: NonNullable<StepResult['sampled']>[number][] = [];
          for (const { seq: s, chunk } of plan.entries) {
            if (s.id === skip || (chunk > 0 && s.computed + chunk < s.prefillGoal)) continue;
            const n = s.tokens!.out.length;
            sampled.push({ seq: s.id, token: 100 + n, text: `w${n}`, ...(n + 1 === eosAt ? { finish: 'eos' } : {}) });
          }
          timer = clock.setTimeout(() => done({ busyMs: 2, sampled }), 2);
        },
        stop: () => clock.clearTimeout(timer),
      };
    }
    const withIds = (id: string, prompt: number): SubmitSeq =>
      seq(id, prompt, 50, { prompt: Array.from({ length: prompt }, (_, i) => i) });

    it('reports each token with its id and text, never as a g, and the engine reason it ended', () => {
      const r = rig({ executor: (clock) => engine(clock, 4) });
      r.core.submit([withIds('a', 5), withIds('b', 7)]);
      r.clock.run();
      expect(r.crashes).toEqual([]);
      const events = eventsOf(r.reports).map(({ e }) => e);
      expect(events.some((e) => e.k === 'g')).toBe(false);
      for (const id of ['a', 'b']) {
        const ts = events.filter((e) => e.k === 't' && e.id === id);
        expect(ts).toEqual([0, 1, 2, 3].map((n) => ({ k: 't', id, n: 1, ids: [100 + n], text: `w${n}` })));
        expect(events.filter((e) => e.k === 'f' && e.id === id)).toEqual([{ k: 'f', id, reason: 'eos' }]);
      }
    });

    it('crashes once and reports no more when the engine sampled no token for a sequence', () => {
      const r = rig({ executor: (clock) => engine(clock, 0, 'b') });
      r.core.submit([withIds('a', 5), withIds('b', 7)]);
      r.clock.run();
      expect(r.crashes).toHaveLength(1);
      expect(String(r.crashes[0])).toMatch(/sampled no token for b/);
      expect(r.reports).toEqual([]);
      r.core.submit([withIds('c', 5)]);
      r.core.cancel(['a']);
      r.clock.run();
      expect(r.reports).toEqual([]);
      expect(r.crashes).toHaveLength(1);
      expect(r.core.busy()).toBe(false);
    });
  });
});
