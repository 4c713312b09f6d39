// The continuous batcher with a prefix cache: a prompt that starts as an earlier one did prefills only the rest,
// concurrent prompts share what one computed, the ledger's invariants hold after every step under random traffic
// with preemption, withdrawal and eviction, eviction never refuses a sequence that fits without the cache, and
// every sequence gets exactly its tokens as without the cache. A batcher without the cache is unchanged.
import { describe, expect, it } from 'vitest';
import { segmentBlockHashes } from '../../../actors/batcher/block-hash.ts';
import { createContinuousBatcher, type ContinuousLimits } from '../../../actors/batcher/continuous.ts';
import { createSequence, type Sequence } from '../../../actors/batcher/sequence.ts';
import { createRng } from '../../../runtime/rng.ts';

const B = 4;
const limits = (over: Partial<ContinuousLimits> = {}): ContinuousLimits => ({
  policy: 'chunked',
  maxRunning: 8,
  tokenBudget: 64,
  blockTokens: B,
  blocksTotal: 200,
  maxContext: 1000,
  watermarkBlocks: 0,
  prefixCache: true,
  ...over,
});

let order = 0;
function seqOf(id: string, segments: { key: number; tokens: number }[], output: number, log: Map<string, number>) {
  const prompt = segments.reduce((n, s) => n + s.tokens, 0);
  return createSequence({
    id,
    priority: 0,
    order: ++order,
    promptTokens: prompt,
    outputTokens: output,
    maxTokens: output,
    receivedAt: 0,
    listener: {
      scheduled: () => {},
      preempted: () => {},
      tokens: (s, n) => log.set(s.id, (log.get(s.id) ?? 0) + n),
      finished: (s) => log.set(`${s.id}:done`, 1),
    },
    hashes: segmentBlockHashes([...segments, { key: 1e9 + order, tokens: output }], B),
  });
}

/** Runs a batcher until idle; returns the prefill tokens its steps computed. */
function drain(b: ReturnType<typeof createContinuousBatcher>, t0 = 0): number {
  let prefill = 0;
  for (let t = t0; t < t0 + 10_000; t++) {
    const p = b.plan(t);
    if (!p) return prefill;
    prefill += p.prefillTokens;
    b.checkInvariants(p);
    b.complete(p, t);
    b.checkInvariants();
  }
  throw new Error('did not drain');
}

describe('the prefix cache in the batcher', () => {
  it("prefills only what a finished sequence's cache does not hold", () => {
    const log = new Map<string, number>();
    const b = createContinuousBatcher(limits());
    const sys = { key: 7, tokens: 40 };
    b.enqueue(seqOf('a', [sys, { key: 100, tokens: 10 }], 5, log));
    const first = drain(b);
    expect(first).toBe(50);
    b.enqueue(seqOf('b', [sys, { key: 200, tokens: 10 }], 5, log));
    const second = drain(b, 100);
    // The 40-token system prompt is 10 cached blocks: only the last 10 tokens are prefilled.
    expect(second).toBe(10);
    expect(log.get('a')).toBe(5);
    expect(log.get('b')).toBe(5);
    expect(b.stats().blocksUsed).toBe(0);
  });

  it('shares a prefix computed by a sequence still running, and changes nothing without the cache', () => {
    const run = (cache: boolean) => {
      const log = new Map<string, number>();
      const b = createContinuousBatcher(limits({ prefixCache: cache, tokenBudget: 48 }));
      b.enqueue(
        seqOf(
          'a',
          [
            { key: 9, tokens: 48 },
            { key: 300, tokens: 4 },
          ],
          30,
          log,
        ),
      );
      const p1 = b.plan(0)!;
      b.complete(p1, 0);
      b.enqueue(
        seqOf(
          'b',
          [
            { key: 9, tokens: 48 },
            { key: 301, tokens: 4 },
          ],
          30,
          log,
        ),
      );
      return { prefill: drain(b, 1) + p1.prefillTokens, log };
    };
    const on = run(true);
    const off = run(false);
    expect(off.prefill).toBe(104);
    expect(on.prefill).toBe(104 - 48);
    expect(on.log).toEqual(off.log);
  });

  it('keeps its invariants under random traffic, preemption and eviction, and gives every sequence its tokens', () => {
    for (const seed of [1, 2, 3]) {
      const rng = createRng(seed);
      const log = new Map<string, number>();
      // A small cache: sequences preempt each other and idle blocks are evicted often.
      const b = createContinuousBatcher(limits({ blocksTotal: 60, tokenBudget: 32 }));
      const want = new Map<string, number>();
      let t = 0;
      for (let i = 0; i < 120; i++) {
        const segs = [
          { key: Math.floor(rng.next() * 3), tokens: 8 + Math.floor(rng.next() * 30) },
          { key: 1000 + i, tokens: 1 + Math.floor(rng.next() * 20) },
        ];
        const out = 1 + Math.floor(rng.next() * 25);
        const s: Sequence = seqOf(`s${seed}.${i}`, segs, out, log);
        want.set(s.id, out);
        b.enqueue(s);
        if (rng.next() < 0.05) b.withdraw(`s${seed}.${Math.floor(rng.next() * i)}`);
        for (let k = 0; k < 3; k++) {
          const p = b.plan(t);
          if (!p) break;
          b.checkInvariants(p);
          b.complete(p, t++);
          b.checkInvariants();
        }
      }
      drain(b, t);
      for (const [id, n] of want) if (log.has(`${id}:done`)) expect(log.get(id), id).toBe(n);
      expect(b.stats().blocksUsed).toBe(0);
      expect(b.hasWork()).toBe(false);
    }
  });

  it('never refuses a sequence that fits without the cache: idle cached blocks are evicted for it', () => {
    const log = new Map<string, number>();
    const b = createContinuousBatcher(limits({ blocksTotal: 30 }));
    for (let i = 0; i < 5; i++) {
      b.enqueue(seqOf(`fill${i}`, [{ key: 50 + i, tokens: 60 }], 4, log));
      drain(b, i * 100);
    }
    // The cache now holds idle blocks from earlier prompts; a prompt of the whole cache still runs at once.
    b.enqueue(seqOf('big', [{ key: 999, tokens: 100 }], 4, log));
    drain(b, 1000);
    expect(log.get('big')).toBe(4);
  });
});
