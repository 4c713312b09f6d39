import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { createVirtualClock, type VirtualClock } from '../../../runtime/clock.ts';
import {
  batchShape,
  compatibilityKey,
  createStatelessBatcher,
  shapeBucket,
  type ClosedBatch,
  type StatelessBatcher,
  type StatelessItem,
  type StatelessLimits,
  type StatelessOutcome,
} from '../../../actors/batcher/stateless.ts';
import { failure } from '../../../machines/outcomes.ts';
import { normalizeScenario } from '../../../actors/config.ts';
import { simulate } from '../../../actors/sim/simulate.ts';

const limitsOf = (over: Partial<StatelessLimits> = {}): StatelessLimits => ({
  maxSize: 4,
  maxTokens: 256,
  maxMemoryBytes: 1_000_000,
  maxDelayMs: 10,
  buckets: [16, 32, 64, 128],
  bytesPerToken: 1000,
  maxQueued: 1000,
  ...over,
});

interface Spec {
  id: string;
  at: number;
  tokens: number;
  model: string;
  version: string;
  dtype: string;
  adapter: string | null;
  options: Record<string, string | number | boolean>;
}

const replies = new Map<string, StatelessOutcome[]>();
const item = (s: Spec, clock: VirtualClock): StatelessItem => ({
  ...s,
  receivedAt: clock.now(),
  reply: (o) => replies.set(s.id, [...(replies.get(s.id) ?? []), o]),
});
const spec = (id: string, over: Partial<Spec> = {}): Spec => ({
  id,
  at: 0,
  tokens: 10,
  model: 'emb',
  version: 'v1',
  dtype: 'bf16',
  adapter: null,
  options: {},
  ...over,
});

/** A replica that runs one closed batch at a time for `stepMs` and answers with each member's id. */
function runReplica(
  clock: VirtualClock,
  b: () => StatelessBatcher,
  stepMs: number,
  ran: ClosedBatch[],
): { wake(): void } {
  let busy = false;
  const wake = (): void => {
    if (busy) return;
    const batch = b().next();
    if (!batch) return;
    busy = true;
    ran.push(batch);
    clock.setTimeout(() => {
      busy = false;
      b().complete(
        batch.id,
        batch.members.map((m) => `result:${m.id}`),
      );
      wake();
    }, stepMs);
  };
  return { wake };
}

describe('stateless batcher', () => {
  describe('shape buckets and keys', () => {
    it('pads an input to the first bucket at or above its length', () => {
      expect(shapeBucket(1, [16, 32])).toBe(16);
      expect(shapeBucket(16, [16, 32])).toBe(16);
      expect(shapeBucket(17, [16, 32])).toBe(32);
      expect(shapeBucket(33, [16, 32])).toBe(-1);
    });

    it('keys on model, version, bucket, dtype, adapter and options, whatever the order of the options', () => {
      const base = spec('a', { options: { pooling: 'mean', normalize: true } });
      const same = spec('b', { options: { normalize: true, pooling: 'mean' } });
      expect(compatibilityKey(base, 16)).toBe(compatibilityKey(same, 16));
      for (const diff of [
        { model: 'x' },
        { version: 'v2' },
        { dtype: 'fp32' },
        { adapter: 'lora-1' },
        { options: { pooling: 'cls', normalize: true } },
      ]) {
        expect(compatibilityKey(spec('c', { ...base, ...diff }), 16)).not.toBe(compatibilityKey(base, 16));
      }
      expect(compatibilityKey(base, 32)).not.toBe(compatibilityKey(base, 16));
    });
  });

  describe('closing a batch', () => {
    it('closes by size as the last member joins', () => {
      const clock = createVirtualClock();
      const b = createStatelessBatcher({ clock, limits: limitsOf({ maxSize: 3 }) });
      for (const id of ['a', 'b', 'c']) expect(b.submit(item(spec(id), clock))).toBeNull();
      const batch = b.next()!;
      expect(batch.members.map((m) => m.id)).toEqual(['a', 'b', 'c']);
      expect(batch.closedBy).toBe('size');
    });

    it('closes by work when the next compatible member would exceed the token limit', () => {
      const clock = createVirtualClock();
      const b = createStatelessBatcher({ clock, limits: limitsOf({ maxTokens: 100, maxSize: 10 }) });
      // Three inputs padded to 32 tokens make 96; a fourth would make 128.
      for (const id of ['a', 'b', 'c', 'd']) b.submit(item(spec(id, { tokens: 20 }), clock));
      const batch = b.next()!;
      expect(batch.members.map((m) => m.id)).toEqual(['a', 'b', 'c']);
      expect(batch.tokens).toBe(96);
      expect(batch.closedBy).toBe('tokens');
      expect(b.stats().forming).toBe(1);
    });

    it('closes by memory when the activations of the next member would not fit', () => {
      const clock = createVirtualClock();
      const b = createStatelessBatcher({ clock, limits: limitsOf({ maxMemoryBytes: 40_000, maxSize: 10 }) });
      for (const id of ['a', 'b', 'c']) b.submit(item(spec(id), clock));
      const batch = b.next()!;
      expect(batch.members).toHaveLength(2);
      expect(batch.memoryBytes).toBe(32_000);
      expect(batch.closedBy).toBe('memory');
    });

    it('closes when its oldest member has waited the maximum delay', () => {
      const clock = createVirtualClock();
      const b = createStatelessBatcher({ clock, limits: limitsOf({ maxDelayMs: 10 }) });
      b.submit(item(spec('a'), clock));
      clock.run(6);
      b.submit(item(spec('b'), clock));
      expect(b.next()).toBeNull();
      clock.run(10);
      const batch = b.next()!;
      expect(batch.closedBy).toBe('delay');
      expect(batch.closedAt).toBe(10);
      expect(batch.members.map((m) => m.id)).toEqual(['a', 'b']);
    });

    it('lets a compatible request join a closed batch that has not started yet, never one that has', () => {
      const clock = createVirtualClock();
      const b = createStatelessBatcher({ clock, limits: limitsOf({ maxDelayMs: 10 }) });
      b.submit(item(spec('a'), clock));
      clock.run(12);
      b.submit(item(spec('b'), clock));
      b.submit(item(spec('other', { dtype: 'fp32' }), clock));
      const first = b.next()!;
      expect(first.members.map((m) => m.id)).toEqual(['a', 'b']);
      expect(first.closedBy).toBe('delay');
      b.submit(item(spec('c'), clock));
      expect(b.stats().forming).toBe(2);
      b.checkInvariants();
    });

    it('tells each member when its batch starts to run', () => {
      const clock = createVirtualClock();
      const b = createStatelessBatcher({ clock, limits: limitsOf({ maxSize: 2 }) });
      const started: string[] = [];
      for (const id of ['a', 'b']) b.submit({ ...item(spec(id), clock), started: (t) => started.push(`${id}@${t}`) });
      clock.run(3);
      b.next();
      expect(started).toEqual(['a@3', 'b@3']);
    });

    it('refuses an input no batch can hold, and a full queue, with typed failures', () => {
      const clock = createVirtualClock();
      const b = createStatelessBatcher({ clock, limits: limitsOf({ maxQueued: 2 }) });
      expect(b.submit(item(spec('long', { tokens: 500 }), clock))?.code).toBe('invalid_request');
      expect(b.submit(item(spec('a'), clock))).toBeNull();
      expect(b.submit(item(spec('b'), clock))).toBeNull();
      expect(b.check({ id: 'c', tokens: 10 })).toMatchObject({ code: 'overloaded', retryable: true });
      expect(b.submit(item(spec('c'), clock))).toMatchObject({ code: 'overloaded', retryable: true });
    });

    it('prices a closed batch as one padded prefill per member', () => {
      const clock = createVirtualClock();
      const b = createStatelessBatcher({ clock, limits: limitsOf({ maxSize: 2 }) });
      b.submit(item(spec('a', { tokens: 5 }), clock));
      b.submit(item(spec('b', { tokens: 12 }), clock));
      expect(batchShape(b.next()!)).toEqual({
        prefill: [
          { tokens: 16, cached: 0 },
          { tokens: 16, cached: 0 },
        ],
        decodeBatch: 0,
        decodeContext: 0,
      });
    });
  });

  describe('results', () => {
    it('splits results back to each member in order', () => {
      replies.clear();
      const clock = createVirtualClock();
      const b = createStatelessBatcher({ clock, limits: limitsOf({ maxSize: 2 }) });
      b.submit(item(spec('a'), clock));
      b.submit(item(spec('b'), clock));
      const batch = b.next()!;
      b.complete(batch.id, ['ra', 'rb']);
      expect(replies.get('a')).toEqual([{ ok: true, result: 'ra', batch: batch.id, batchSize: 2, closedBy: 'size' }]);
      expect(replies.get('b')?.[0]).toMatchObject({ ok: true, result: 'rb' });
      expect(b.hasWork()).toBe(false);
    });

    it('fails every member when the results do not match the members', () => {
      replies.clear();
      const clock = createVirtualClock();
      const b = createStatelessBatcher({ clock, limits: limitsOf({ maxSize: 2 }) });
      b.submit(item(spec('a'), clock));
      b.submit(item(spec('b'), clock));
      b.complete(b.next()!.id, ['only one']);
      expect(replies.get('a')).toEqual([{ ok: false, failure: expect.objectContaining({ code: 'internal' }) }]);
      expect(replies.get('b')).toHaveLength(1);
    });

    it('gives a cancelled request no reply and the others theirs', () => {
      replies.clear();
      const clock = createVirtualClock();
      const b = createStatelessBatcher({ clock, limits: limitsOf({ maxSize: 2 }) });
      b.submit(item(spec('a'), clock));
      b.submit(item(spec('b'), clock));
      expect(b.cancel('a')).toBe(true);
      expect(b.cancel('a')).toBe(false);
      const batch = b.next()!;
      b.complete(batch.id, ['ra', 'rb']);
      expect(replies.has('a')).toBe(false);
      expect(replies.get('b')).toHaveLength(1);
    });

    it('fails every waiting member once when the replica fails', () => {
      replies.clear();
      const clock = createVirtualClock();
      const b = createStatelessBatcher({ clock, limits: limitsOf({ maxSize: 2 }) });
      for (const id of ['a', 'b', 'c']) b.submit(item(spec(id), clock));
      b.next();
      b.abortAll(failure('replica_failed', 'gpu fault'));
      b.abortAll(failure('replica_failed', 'gpu fault'));
      for (const id of ['a', 'b', 'c'])
        expect(replies.get(id)).toEqual([
          { ok: false, failure: expect.objectContaining({ code: 'replica_failed', retryable: true }) },
        ]);
      expect(b.hasWork()).toBe(false);
    });
  });

  describe('properties', () => {
    const arbSpec = fc.record({
      at: fc.integer({ min: 0, max: 60 }),
      tokens: fc.integer({ min: 1, max: 128 }),
      model: fc.constantFrom('emb', 'cls'),
      version: fc.constantFrom('v1', 'v2'),
      dtype: fc.constantFrom('bf16', 'fp32'),
      adapter: fc.constantFrom(null, 'lora-a'),
      options: fc.constantFrom<Record<string, string | number | boolean>>({}, { normalize: true }, { pooling: 'cls' }),
    });
    const arbLimits = fc.record({
      maxSize: fc.integer({ min: 1, max: 6 }),
      maxTokens: fc.integer({ min: 128, max: 400 }),
      maxMemoryBytes: fc.integer({ min: 128_000, max: 500_000 }),
      maxDelayMs: fc.integer({ min: 0, max: 20 }),
    });

    it('answers every request exactly once, with its own result, from batches of compatible members within every limit', () => {
      fc.assert(
        fc.property(
          fc.array(arbSpec, { minLength: 1, maxLength: 40 }),
          arbLimits,
          fc.integer({ min: 1, max: 15 }),
          (specs, lim, stepMs) => {
            replies.clear();
            const clock = createVirtualClock();
            const limits = limitsOf(lim);
            const ran: ClosedBatch[] = [];
            // `batcher` is read only once the clock runs, after both are made.
            const replica = runReplica(clock, () => batcher, stepMs, ran);
            const batcher: StatelessBatcher = createStatelessBatcher({ clock, limits, onReady: () => replica.wake() });
            const items = specs.map((s, i) => ({ ...s, id: `r${i}` }));
            for (const s of items) {
              clock.at(s.at, () => {
                expect(batcher.submit(item(s, clock))).toBeNull();
                batcher.checkInvariants();
              });
            }
            clock.run();
            expect(batcher.hasWork()).toBe(false);
            for (const s of items) {
              const got = replies.get(s.id) ?? [];
              expect(got).toHaveLength(1);
              expect(got[0]).toMatchObject({ ok: true, result: `result:${s.id}` });
            }
            for (const b of ran) {
              const keys = new Set(b.members.map((m) => compatibilityKey(m, shapeBucket(m.tokens, limits.buckets))));
              expect(keys.size).toBe(1);
              expect(b.members.length).toBeLessThanOrEqual(limits.maxSize);
              expect(b.tokens).toBeLessThanOrEqual(limits.maxTokens);
              expect(b.memoryBytes).toBeLessThanOrEqual(limits.maxMemoryBytes);
              expect(b.tokens).toBe(b.members.length * b.bucket);
              // No member waits in a forming batch past the delay, counted from the oldest member.
              expect(b.closedAt - b.openedAt).toBeLessThanOrEqual(limits.maxDelayMs);
              for (const m of b.members) expect(m.receivedAt).toBeGreaterThanOrEqual(b.openedAt);
              if (b.closedBy === 'size') expect(b.members.length).toBe(limits.maxSize);
              if (b.closedBy === 'delay') expect(b.closedAt - b.openedAt).toBe(limits.maxDelayMs);
            }
          },
        ),
        { numRuns: 100, seed: 11 },
      );
    });

    it('closes a batch early only when the next compatible request would not fit', () => {
      fc.assert(
        fc.property(fc.array(arbSpec, { minLength: 1, maxLength: 30 }), arbLimits, (specs, lim) => {
          const clock = createVirtualClock();
          const limits = limitsOf({ ...lim, maxDelayMs: 1000 });
          const b = createStatelessBatcher({ clock, limits });
          for (const [i, s] of specs.entries()) b.submit(item({ ...s, id: `r${i}` }, clock));
          for (let c = b.next(); c; c = b.next()) {
            if (c.closedBy === 'tokens')
              expect(c.tokens + c.bucket > limits.maxTokens || c.tokens === limits.maxTokens).toBe(true);
            if (c.closedBy === 'memory') {
              const per = c.bucket * limits.bytesPerToken;
              expect(c.memoryBytes + per > limits.maxMemoryBytes || c.memoryBytes === limits.maxMemoryBytes).toBe(true);
            }
            expect(c.closedBy).not.toBe('delay');
          }
        }),
        { numRuns: 200, seed: 12 },
      );
    });
  });
});

describe('stateless models in a simulation', () => {
  const scenario = (over: Record<string, unknown> = {}) =>
    normalizeScenario({
      name: 'stateless',
      seed: 4,
      models: [
        {
          name: 'embed',
          profile: 'llama-3-8b',
          kind: 'stateless',
          replicas: 2,
          batching: { maxBatch: 16, maxBatchTokens: 8192, maxDelayMs: 5, buckets: [64, 256, 1024] },
          classes: { interactive: { maxQueueMs: 2000 } },
        },
      ],
      traffic: [
        {
          model: 'embed',
          requests: 400,
          lengths: { prompt: { mean: 150, cv: 1, max: 1024 }, output: { mean: 1, cv: 0 } },
          arrival: { process: 'poisson', rate: 300 },
        },
      ],
      ...over,
    });

  it('answers every request once from batches across both replicas, with every invariant checked after each step', () => {
    const r = simulate(scenario());
    expect(r.requests).toEqual({ total: 400, done: 400 });
    expect(r.invariants).toMatchObject({ violations: [], overBudget: 0, withoutOneOutcome: 0 });
    expect(r.batch.meanSize).toBeGreaterThan(1);
    expect(r.gpus.utilisation[0]).toBeGreaterThan(0);
    expect(r.gpus.utilisation[1]).toBeGreaterThan(0);
    expect(r.ttftMs.count).toBe(400);
  });

  it('names the bad field of a stateless batching setting', () => {
    expect(() =>
      scenario({
        models: [{ name: 'embed', profile: 'llama-3-8b', kind: 'stateless', batching: { buckets: [256, 64] } }],
      }),
    ).toThrow(/models\[0\]\.batching\.buckets/);
    expect(() =>
      scenario({
        models: [
          { name: 'embed', profile: 'llama-3-8b', kind: 'stateless', batching: { buckets: [64], maxBatchTokens: 32 } },
        ],
      }),
    ).toThrow(/models\[0\]\.batching\.maxBatchTokens/);
  });

  it('refuses an input longer than the last bucket as invalid, and serves the rest', () => {
    const r = simulate(
      scenario({
        traffic: [
          {
            model: 'embed',
            requests: 200,
            lengths: { prompt: { mean: 600, cv: 1, max: 3000 }, output: { mean: 1, cv: 0 } },
            arrival: { process: 'poisson', rate: 100 },
          },
        ],
      }),
    );
    expect(r.requests['invalid_request']).toBeGreaterThan(0);
    expect((r.requests['done'] ?? 0) + (r.requests['invalid_request'] ?? 0)).toBe(200);
    expect(r.invariants.violations).toEqual([]);
  });
});
