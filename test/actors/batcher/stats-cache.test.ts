// The batcher's stats() is cached between changes of its ledger: whatever happens (enqueue, plan, complete,
// withdraw, evictAll, and listeners reading stats() in the middle of a step), the cached copy equals a fresh
// computation. checkInvariants() compares the two; this drives random operation sequences through it.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { createContinuousBatcher, type BatchPolicy, type StepPlan } from '../../../actors/batcher/continuous.ts';
import { createSequence, type SequenceListener } from '../../../actors/batcher/sequence.ts';

type Op =
  | { k: 'enqueue'; prompt: number; output: number; priority: number; atHead: boolean }
  | { k: 'step' }
  | { k: 'plan' }
  | { k: 'complete' }
  | { k: 'withdraw'; pick: number }
  | { k: 'evict' };

const op: fc.Arbitrary<Op> = fc.oneof(
  fc.record({
    k: fc.constant('enqueue' as const),
    prompt: fc.integer({ min: 1, max: 40 }),
    output: fc.integer({ min: 1, max: 12 }),
    priority: fc.integer({ min: 0, max: 2 }),
    atHead: fc.boolean(),
  }),
  fc.constant({ k: 'step' as const }),
  fc.constant({ k: 'plan' as const }),
  fc.constant({ k: 'complete' as const }),
  fc.record({ k: fc.constant('withdraw' as const), pick: fc.nat() }),
  fc.constant({ k: 'evict' as const }),
);

describe('batcher stats cache', () => {
  it('always equals the ledger, with listeners reading stats() mid-step', () => {
    fc.assert(
      fc.property(
        fc.constantFrom<BatchPolicy>('chunked', 'prefill-first', 'static'),
        fc.array(op, { minLength: 1, maxLength: 60 }),
        (policy, ops) => {
          const b = createContinuousBatcher({
            policy,
            maxRunning: 4,
            tokenBudget: 48,
            blockTokens: 4,
            blocksTotal: 40,
            maxContext: 200,
            watermarkBlocks: 1,
          });
          // Every listener call reads stats(), which caches a copy in the middle of plan() and complete().
          const listener: SequenceListener = {
            scheduled: () => void b.stats(),
            preempted: () => void b.stats(),
            tokens: () => void b.stats(),
            finished: () => void b.stats(),
          };
          const ids: string[] = [];
          let pending: StepPlan | null = null;
          let n = 0;
          for (const o of ops) {
            if (o.k === 'enqueue') {
              const id = `s${++n}`;
              ids.push(id);
              b.enqueue(
                createSequence({
                  id,
                  priority: o.priority,
                  order: n,
                  promptTokens: o.prompt,
                  outputTokens: o.output,
                  maxTokens: o.output,
                  receivedAt: 0,
                  generated: 0,
                  listener,
                }),
                o.atHead,
              );
            } else if (o.k === 'step') {
              if (pending) b.complete(pending, n);
              const p = b.plan(n);
              if (p) b.complete(p, n);
              pending = null;
            } else if (o.k === 'plan') {
              if (!pending) pending = b.plan(n);
            } else if (o.k === 'complete') {
              if (pending) b.complete(pending, n);
              pending = null;
            } else if (o.k === 'withdraw') {
              if (ids.length > 0) b.withdraw(ids[o.pick % ids.length]!);
            } else {
              b.evictAll();
              pending = null;
            }
            const { waiting, running, blocksUsed, blocksTotal } = b.stats();
            expect(() => b.checkInvariants()).not.toThrow();
            // The scrape's O(1) gauges are the stats' counts.
            expect(b.gauges()).toEqual({ waiting, running, blocksUsed, blocksTotal });
          }
        },
      ),
      { numRuns: 300 },
    );
  });
});
