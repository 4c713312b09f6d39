import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import {
  createContinuousBatcher,
  type BatchPolicy,
  type ContinuousBatcher,
  type ContinuousLimits,
  type StepPlan,
} from '../../../actors/batcher/continuous.ts';
import { createSequence, type Sequence, type SequenceListener } from '../../../actors/batcher/sequence.ts';
import { normalizeScenario } from '../../../actors/config.ts';
import { simulate } from '../../../actors/sim/simulate.ts';
import { summarize } from '../../../actors/metrics/histogram.ts';
import type { ControlPlane } from '../../../actors/control-plane.ts';

interface Log {
  events: string[];
  tokens: Map<string, number>;
  finished: string[];
}

const newLog = (): Log => ({ events: [], tokens: new Map(), finished: [] });

const listenerFor = (log: Log): SequenceListener => ({
  scheduled: (s, t) => log.events.push(`scheduled ${s.id} @${t}`),
  preempted: (s, t) => log.events.push(`preempted ${s.id} @${t}`),
  tokens: (s, n) => log.tokens.set(s.id, (log.tokens.get(s.id) ?? 0) + n),
  finished: (s) => log.finished.push(s.id),
});

const limitsOf = (over: Partial<ContinuousLimits> = {}): ContinuousLimits => ({
  policy: 'chunked',
  maxRunning: 8,
  tokenBudget: 64,
  blockTokens: 4,
  blocksTotal: 100,
  maxContext: 1000,
  watermarkBlocks: 0,
  ...over,
});

let order = 0;
const seq = (log: Log, id: string, prompt: number, output: number, priority = 0, generated = 0): Sequence =>
  createSequence({
    id,
    priority,
    order: ++order,
    promptTokens: prompt,
    outputTokens: output,
    maxTokens: output,
    receivedAt: 0,
    generated,
    listener: listenerFor(log),
  });

/** Plans, checks and completes one step at time `t`; returns the plan. */
const step = (b: ContinuousBatcher, t: number): StepPlan | null => {
  const p = b.plan(t);
  if (p) {
    b.complete(p, t);
    b.checkInvariants(p);
  }
  return p;
};

/** Runs steps until the batcher is empty; returns the plans. */
const drain = (b: ContinuousBatcher, maxSteps = 10_000): StepPlan[] => {
  const plans: StepPlan[] = [];
  for (let t = 1; b.hasWork(); t++) {
    if (t > maxSteps) throw new Error('batcher did not drain');
    const p = step(b, t);
    if (!p) throw new Error('plan() returned null with work left');
    plans.push(p);
  }
  return plans;
};

const ids = (ss: readonly Sequence[]): string[] => ss.map((s) => s.id);
const entryIds = (p: StepPlan): string[] => p.entries.map((e) => `${e.seq.id}${e.chunk > 0 ? `:${e.chunk}` : ''}`);

describe('continuous batcher', () => {
  it('refuses a plan that holds a sequence twice, and no other plan, however often a sequence was checked', () => {
    const log = newLog();
    const b = createContinuousBatcher(limitsOf());
    b.enqueue(seq(log, 'a', 4, 3));
    b.enqueue(seq(log, 'b', 4, 3));
    const p = b.plan(1)!;
    b.checkInvariants(p);
    b.checkInvariants(p); // the same sequences checked again: still one each per plan
    const twice = { ...p, entries: [...p.entries, p.entries[0]!], tokens: p.tokens + p.entries[0]!.chunk };
    expect(() => b.checkInvariants(twice)).toThrow(/step holds sequence a twice/);
    b.complete(p, 1);
    expect(() => b.checkInvariants(p)).not.toThrow();
  });

  describe('KV block ledger', () => {
    it('allocates blocks for a prefill chunk, grows one block per blockTokens decoded, and frees them when done', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ blockTokens: 4 }));
      const a = seq(log, 'a', 6, 5);
      b.enqueue(a);
      step(b, 1);
      // 6 prompt tokens need 2 blocks; the prefill produced the first token.
      expect(a.blocks).toBe(2);
      expect(a.computed).toBe(6);
      expect(log.tokens.get('a')).toBe(1);
      step(b, 2); // decodes token 1: 7 cached
      expect(a.blocks).toBe(2);
      step(b, 3); // 8 cached
      expect(a.blocks).toBe(2);
      step(b, 4); // 9 cached: a third block
      expect(a.blocks).toBe(3);
      expect(b.stats().blocksUsed).toBe(3);
      step(b, 5);
      expect(log.finished).toEqual(['a']);
      expect(log.tokens.get('a')).toBe(5);
      expect(b.stats().blocksUsed).toBe(0);
      expect(b.hasWork()).toBe(false);
    });

    it('keeps the ledger equal to the sum of the running sequences’ blocks at every step', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ blocksTotal: 40 }));
      for (let i = 0; i < 12; i++) b.enqueue(seq(log, `s${i}`, 10 + i * 3, 5 + (i % 4) * 6));
      for (let t = 1; b.hasWork(); t++) {
        step(b, t);
        const held = b.runningList().reduce((n, s) => n + s.blocks, 0);
        expect(b.stats().blocksUsed).toBe(held);
        expect(held).toBeLessThanOrEqual(40);
      }
      expect(log.finished).toHaveLength(12);
    });

    it('refuses a sequence longer than the context', () => {
      const b = createContinuousBatcher(limitsOf({ maxContext: 100 }));
      expect(() => b.enqueue(seq(newLog(), 'long', 90, 20))).toThrow(/context of 100/);
    });

    it('reports the blocks in use with each plan (the worker’s cache footprint)', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf());
      b.enqueue(seq(log, 'a', 9, 3));
      b.enqueue(seq(log, 'b', 4, 3));
      const p = b.plan(1)!;
      expect(p.blocksUsed).toBe(3 + 1);
      expect(p.blocksUsed).toBe(b.stats().blocksUsed);
    });
  });

  describe('preemption by recompute', () => {
    it('preempts the newest running sequence when a decode cannot get a block', () => {
      const log = newLog();
      // 4 blocks of 4 tokens: a and b take 2 each after prefill (8 tokens), and the next decode needs a third.
      const b = createContinuousBatcher(limitsOf({ blocksTotal: 4, blockTokens: 4 }));
      b.enqueue(seq(log, 'a', 7, 6));
      b.enqueue(seq(log, 'b', 7, 6));
      step(b, 1); // both prefilled: 7 cached, 2 blocks each
      step(b, 2); // both decode: 8 cached, still 2 blocks
      const p = step(b, 3)!; // a needs a third block: b (newest) is preempted
      expect(log.events).toContain('preempted b @3');
      expect(entryIds(p)).toEqual(['a']);
      expect(ids(b.waitingList())).toEqual(['b']);
      expect(b.stats().preemptions).toBe(1);
    });

    it('resumes a preempted sequence by re-prefilling its prompt plus the tokens it streamed, losing none', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ blocksTotal: 4, blockTokens: 4 }));
      const a = seq(log, 'a', 7, 6);
      const bb = seq(log, 'b', 7, 6);
      b.enqueue(a);
      b.enqueue(bb);
      step(b, 1);
      step(b, 2);
      step(b, 3);
      const streamedBefore = bb.generated;
      expect(streamedBefore).toBe(2);
      expect(log.tokens.get('b')).toBe(2);
      drain(b);
      // b re-prefilled 7 + 2 tokens, then went on from its third token.
      expect(bb.prefillGoal).toBe(7 + streamedBefore);
      expect(log.tokens.get('a')).toBe(6);
      expect(log.tokens.get('b')).toBe(6);
      expect(log.finished.sort()).toEqual(['a', 'b']);
    });

    it('keeps a preempted request at the head of the queue, ahead of requests that arrived after it', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ blocksTotal: 4, blockTokens: 4, maxRunning: 2 }));
      b.enqueue(seq(log, 'a', 7, 6));
      b.enqueue(seq(log, 'b', 7, 6));
      b.enqueue(seq(log, 'c', 3, 2));
      b.enqueue(seq(log, 'd', 3, 2));
      step(b, 1);
      step(b, 2);
      step(b, 3);
      expect(log.events).toContain('preempted b @3');
      expect(ids(b.waitingList())).toEqual(['b', 'c', 'd']);
      // When a finishes, b is scheduled again before c and d.
      const order: string[] = [];
      for (let t = 4; b.hasWork(); t++) {
        const p = step(b, t)!;
        for (const e of p.entries) if (e.chunk > 0 && !order.includes(e.seq.id)) order.push(e.seq.id);
      }
      expect(order.slice(0, 1)).toEqual(['b']);
      expect(log.events.filter((e) => e.startsWith('scheduled')).map((e) => e.split(' ')[1])).toEqual([
        'a',
        'b',
        'b',
        'c',
        'd',
      ]);
    });

    it('does not re-admit a victim in the step that preempted it', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ blocksTotal: 5, blockTokens: 4 }));
      b.enqueue(seq(log, 'a', 8, 10));
      b.enqueue(seq(log, 'b', 4, 10));
      step(b, 1); // a 2 blocks, b 1 block; 2 free
      for (let t = 2; !log.events.some((e) => e.startsWith('preempted')); t++) {
        const p = step(b, t)!;
        expect(p.entries.filter((e) => e.seq.id === 'b').length).toBeLessThanOrEqual(1);
      }
      const last = log.events[log.events.length - 1]!;
      expect(last).toMatch(/^preempted b/);
      expect(b.runningList().map((s) => s.id)).toEqual(['a']);
    });

    it('never deadlocks when every running sequence is mid-prefill and the blocks are gone', () => {
      const log = newLog();
      // Budget 8 and 6 blocks of 4: a and b each take a chunk, then neither chunk can grow.
      const b = createContinuousBatcher(limitsOf({ blocksTotal: 6, blockTokens: 4, tokenBudget: 12 }));
      b.enqueue(seq(log, 'a', 16, 2));
      b.enqueue(seq(log, 'b', 16, 2));
      const plans = drain(b, 200);
      expect(plans.every((p) => p.entries.length > 0)).toBe(true);
      expect(log.finished.sort()).toEqual(['a', 'b']);
      expect(log.tokens.get('a')).toBe(2);
      expect(log.tokens.get('b')).toBe(2);
    });

    it('reports a sequence that can never fit instead of looping', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ blocksTotal: 2, blockTokens: 4 }));
      b.enqueue(seq(log, 'huge', 7, 5));
      expect(() => drain(b, 50)).toThrow(/more KV blocks than the replica has/);
    });
  });

  describe('step composition', () => {
    it('chunked: decodes first, then prefill chunks fill the rest of the token budget', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ tokenBudget: 16 }));
      b.enqueue(seq(log, 'a', 5, 10));
      b.enqueue(seq(log, 'b', 5, 10));
      step(b, 1); // a:5 b:5 prefilled together
      b.enqueue(seq(log, 'c', 40, 3));
      const p = b.plan(2)!;
      expect(entryIds(p)).toEqual(['a', 'b', 'c:14']);
      expect(p.tokens).toBe(16);
      expect(p.decodes).toBe(2);
      b.complete(p, 2);
      // The long prompt continues in the next chunk after the decodes.
      expect(entryIds(b.plan(3)!)).toEqual(['a', 'b', 'c:14']);
    });

    it('prefill-first: a waiting prompt runs as its own step before decodes continue', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ policy: 'prefill-first', tokenBudget: 16 }));
      b.enqueue(seq(log, 'a', 5, 10));
      step(b, 1);
      expect(entryIds(step(b, 2)!)).toEqual(['a']);
      b.enqueue(seq(log, 'b', 12, 10));
      expect(entryIds(step(b, 3)!)).toEqual(['b:12']);
      expect(entryIds(step(b, 4)!)).toEqual(['a', 'b']);
    });

    it('prefill-first: packs whole prompts within the budget, runs a longer prompt alone, then decodes', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ policy: 'prefill-first', tokenBudget: 16 }));
      b.enqueue(seq(log, 'a', 5, 10));
      step(b, 1);
      b.enqueue(seq(log, 'b', 6, 3));
      b.enqueue(seq(log, 'c', 7, 3));
      b.enqueue(seq(log, 'd', 30, 3));
      const p1 = step(b, 2)!;
      expect(entryIds(p1)).toEqual(['b:6', 'c:7']);
      expect(p1.decodes).toBe(0);
      const p2 = step(b, 3)!;
      expect(entryIds(p2)).toEqual(['d:30']);
      const p3 = step(b, 4)!;
      expect(p3.prefillTokens).toBe(0);
      expect(entryIds(p3)).toEqual(['a', 'b', 'c', 'd']);
    });

    it('static: forms a batch, prefills all of it, decodes until every member finishes, and only then admits more', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ policy: 'static', tokenBudget: 16, maxRunning: 4 }));
      b.enqueue(seq(log, 'a', 10, 2));
      b.enqueue(seq(log, 'b', 10, 5));
      const p1 = step(b, 1)!;
      expect(entryIds(p1)).toEqual(['a:10']);
      b.enqueue(seq(log, 'c', 3, 2));
      const p2 = step(b, 2)!;
      // b was in the batch from the start; c arrived after it formed and waits.
      expect(entryIds(p2)).toEqual(['b:10']);
      const seen: string[][] = [];
      for (let t = 3; b.runningList().some((s) => s.id === 'b'); t++) seen.push(entryIds(step(b, t)!));
      expect(seen).toEqual([['a', 'b'], ['b'], ['b'], ['b']]);
      expect(log.finished).toEqual(['a', 'b']);
      expect(entryIds(step(b, 10)!)).toEqual(['c:3']);
    });

    it('static: reserves each member’s whole context up front, so it never preempts', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ policy: 'static', blocksTotal: 10, blockTokens: 4 }));
      b.enqueue(seq(log, 'a', 8, 8)); // 4 blocks
      b.enqueue(seq(log, 'b', 8, 8)); // 4 blocks
      b.enqueue(seq(log, 'c', 8, 8)); // does not fit beside them
      step(b, 1);
      expect(ids(b.runningList())).toEqual(['a', 'b']);
      expect(b.stats().blocksUsed).toBe(8);
      drain(b);
      expect(b.stats().preemptions).toBe(0);
      expect(log.finished).toEqual(['a', 'b', 'c']);
    });

    it('respects the running cap and the token budget in every policy', () => {
      for (const policy of ['chunked', 'prefill-first', 'static'] as BatchPolicy[]) {
        const log = newLog();
        const b = createContinuousBatcher(limitsOf({ policy, maxRunning: 3, tokenBudget: 20 }));
        for (let i = 0; i < 10; i++) b.enqueue(seq(log, `s${i}`, 4 + i, 3 + i));
        for (const p of drain(b)) {
          expect(p.entries.length).toBeLessThanOrEqual(3);
          expect(p.tokens).toBeLessThanOrEqual(20);
        }
        expect(log.finished).toHaveLength(10);
      }
    });
  });

  describe('priority classes', () => {
    it('admits higher classes first', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ tokenBudget: 8 }));
      b.enqueue(seq(log, 'low', 8, 2, 1));
      b.enqueue(seq(log, 'high', 8, 2, 0));
      expect(entryIds(b.plan(1)!)).toEqual(['high:8']);
    });

    it('preempts the lowest class first, even when it is older', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ blocksTotal: 4, blockTokens: 4 }));
      b.enqueue(seq(log, 'low', 7, 6, 1));
      step(b, 1);
      b.enqueue(seq(log, 'high', 7, 6, 0));
      step(b, 2);
      step(b, 3);
      for (let t = 4; !log.events.some((e) => e.startsWith('preempted')); t++) step(b, t);
      expect(log.events.find((e) => e.startsWith('preempted'))).toMatch(/^preempted low/);
    });

    it('preempts a lower class to admit a waiting higher class when the slots are full', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ maxRunning: 2 }));
      b.enqueue(seq(log, 'low1', 4, 20, 1));
      b.enqueue(seq(log, 'low2', 4, 20, 1));
      step(b, 1);
      b.enqueue(seq(log, 'high', 4, 2, 0));
      const p = step(b, 2)!;
      expect(log.events).toContain('preempted low2 @2');
      expect(entryIds(p)).toEqual(['low1', 'high:4']);
      expect(ids(b.waitingList())).toEqual(['low2']);
    });

    it('decodes higher classes first when the token budget cannot cover every sequence', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ policy: 'prefill-first', tokenBudget: 2, maxRunning: 3 }));
      b.enqueue(seq(log, 'low', 1, 5, 1));
      step(b, 1);
      b.enqueue(seq(log, 'h1', 1, 5, 0));
      b.enqueue(seq(log, 'h2', 1, 5, 0));
      expect(entryIds(step(b, 2)!)).toEqual(['h1:1', 'h2:1']);
      expect(entryIds(b.plan(3)!)).toEqual(['h1', 'h2']);
    });
  });

  describe('withdrawal and eviction', () => {
    it('frees a withdrawn sequence’s blocks and ignores its part of the step in flight', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf());
      b.enqueue(seq(log, 'a', 8, 5));
      b.enqueue(seq(log, 'b', 8, 5));
      const p = b.plan(1)!;
      expect(b.withdraw('b')).toBe(true);
      b.complete(p, 1);
      b.checkInvariants(p);
      expect(log.tokens.get('b')).toBeUndefined();
      expect(b.stats().blocksUsed).toBe(2);
      expect(b.withdraw('b')).toBe(false);
    });

    it('evicts every sequence, running and waiting, with the ledger back at zero', () => {
      const log = newLog();
      const b = createContinuousBatcher(limitsOf({ maxRunning: 1 }));
      b.enqueue(seq(log, 'a', 8, 5));
      b.enqueue(seq(log, 'b', 8, 5));
      step(b, 1);
      expect(ids(b.evictAll()).sort()).toEqual(['a', 'b']);
      expect(b.stats()).toMatchObject({ blocksUsed: 0, waiting: 0, running: 0, waitingBlocks: 0 });
      expect(b.hasWork()).toBe(false);
    });
  });

  it('answers every sequence exactly once with all its tokens under any policy, load and cache size', () => {
    const arb = fc.record({
      policy: fc.constantFrom<BatchPolicy>('chunked', 'prefill-first', 'static'),
      blocksTotal: fc.integer({ min: 12, max: 60 }),
      maxRunning: fc.integer({ min: 1, max: 6 }),
      tokenBudget: fc.integer({ min: 4, max: 40 }),
      reqs: fc.array(
        fc.record({
          prompt: fc.integer({ min: 1, max: 20 }),
          output: fc.integer({ min: 1, max: 20 }),
          priority: fc.integer({ min: 0, max: 2 }),
          at: fc.integer({ min: 0, max: 30 }),
        }),
        { minLength: 1, maxLength: 25 },
      ),
    });
    fc.assert(
      fc.property(arb, ({ policy, blocksTotal, maxRunning, tokenBudget, reqs }) => {
        const log = newLog();
        const b = createContinuousBatcher(
          limitsOf({ policy, blocksTotal, maxRunning, tokenBudget, blockTokens: 4, watermarkBlocks: 1 }),
        );
        const pending = reqs.map((r, i) => ({ ...r, id: `r${i}` })).sort((x, y) => x.at - y.at);
        let t = 0;
        while (pending.length > 0 || b.hasWork()) {
          while (pending.length > 0 && pending[0]!.at <= t) {
            const r = pending.shift()!;
            b.enqueue(seq(log, r.id, r.prompt, r.output, r.priority));
          }
          step(b, t);
          t++;
          if (t > 20_000) throw new Error('no progress');
        }
        for (const [i, r] of reqs.entries()) expect(log.tokens.get(`r${i}`)).toBe(r.output);
        expect([...log.finished].sort()).toEqual(reqs.map((_, i) => `r${i}`).sort());
        expect(b.stats().blocksUsed).toBe(0);
      }),
      { numRuns: 150, seed: 7 },
    );
  });
});

describe('continuous batching in a simulation', () => {
  it('preempts the batch class for the interactive one, resumes each request without losing or repeating a token, and keeps every invariant', () => {
    const scenario = normalizeScenario({
      name: 'priority-pressure',
      seed: 2,
      models: [
        {
          name: 'llama-3-8b',
          profile: 'llama-3-8b',
          // Eight slots: interactive arrivals find them held by the batch class.
          batching: { policy: 'chunked', maxRunning: 8, tokenBudget: 1024 },
          classes: { interactive: { maxQueueMs: 120_000 }, batch: { maxQueueMs: 120_000 } },
        },
      ],
      traffic: [
        {
          model: 'llama-3-8b',
          priority: 'interactive',
          requests: 150,
          lengths: { trace: 'splitwise_conv', maxTotalTokens: 4096 },
          arrival: { process: 'poisson', rate: 3 },
        },
        {
          model: 'llama-3-8b',
          priority: 'batch',
          requests: 150,
          lengths: { trace: 'splitwise_conv', maxTotalTokens: 4096 },
          arrival: { process: 'poisson', rate: 3 },
        },
      ],
    });
    const streams = new Map<string, { next: number; want: number; done: boolean }>();
    const broken: string[] = [];
    let records: ControlPlane['collector']['records'] = [];
    const r = simulate(scenario, {
      onStart: (cp) => {
        records = cp.collector.records;
        const submit = cp.submit.bind(cp);
        cp.submit = (spec, listener) =>
          submit(spec, {
            ...listener,
            accepted: (id) =>
              streams.set(id, {
                next: 0,
                want: Math.min(spec.outputTokens ?? spec.maxTokens, spec.maxTokens),
                done: false,
              }),
            tokens: (id, seq, n) => {
              const s = streams.get(id)!;
              if (seq !== s.next) broken.push(`${id}: token ${seq} after ${s.next}`);
              s.next = seq + n;
            },
            terminal: (id, o) => {
              const s = streams.get(id);
              if (!s) return;
              if (s.done) broken.push(`${id}: two outcomes`);
              s.done = true;
              if (o.outcome === 'done' && s.next !== s.want) broken.push(`${id}: ${s.next} tokens of ${s.want}`);
            },
          });
      },
    });
    expect(r.batch.preemptions).toBeGreaterThan(0);
    expect(broken).toEqual([]);
    expect(r.invariants).toMatchObject({ violations: [], overBudget: 0, withoutOneOutcome: 0 });
    expect([...streams.values()].every((s) => s.done)).toBe(true);
    expect(r.requests).toEqual({ total: 300, done: 300 });
    expect(r.estimates['stepMs']!.count).toBe(r.batch.steps);
    // Preemptions fall on the batch class, and it waits longer for its first token.
    const of = (p: string) => records.filter((x) => x.priority === p);
    expect(of('interactive').reduce((n, x) => n + x.preemptions, 0)).toBe(0);
    expect(of('batch').reduce((n, x) => n + x.preemptions, 0)).toBe(r.batch.preemptions);
    const p90 = (p: string) => summarize(of(p).map((x) => x.firstTokenAt - x.receivedAt)).p90;
    expect(p90('interactive')).toBeLessThan(p90('batch'));
  });
});
