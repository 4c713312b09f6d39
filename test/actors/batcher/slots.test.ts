// Engine slots: the passes a step takes over them (llama.cpp's split_equal), and the batcher's assignment of slots.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { createContinuousBatcher, type BatchPolicy, type StepPlan } from '../../../actors/batcher/continuous.ts';
import { createSequence, type Sequence, type SequenceListener } from '../../../actors/batcher/sequence.ts';
import { createSlotTable, fewestPasses, passes } from '../../../actors/batcher/slots.ts';

/**
 * llama.cpp's `llama_batch_allocr::split_equal(n_ubatch, sequential = true)` token by token, as written there: the
 * reference passes() must agree with. `batch` lists each token's sequence id in batch order.
 */
function splitEqualReference(batch: readonly number[]): number {
  const used = batch.map(() => false);
  let ubatches = 0;
  for (;;) {
    const set: number[] = [];
    let last = -1;
    for (let i = 0; i < batch.length; i++) {
      if (used[i]) continue;
      const id = batch[i]!;
      if (set.includes(id)) continue;
      if (set.length > 0 && id !== last + 1) continue;
      set.push(id);
      last = id;
    }
    if (set.length === 0) return ubatches;
    // Equal tokens from each sequence of the set, while every one has more.
    const left = (id: number): number[] => batch.flatMap((s, i) => (s === id && !used[i] ? [i] : []));
    const take = Math.min(...set.map((id) => left(id).length));
    for (const id of set) for (const i of left(id).slice(0, take)) used[i] = true;
    ubatches++;
  }
}

/** The batch of a step queued in ascending slot order: each item's tokens in a row. */
const batchOf = (items: readonly { slot: number; tokens: number }[]): number[] =>
  [...items].sort((a, b) => a.slot - b.slot).flatMap((it) => Array.from({ length: it.tokens }, () => it.slot));

/** Runs of consecutive numbers in a set of slots. */
const runs = (slots: readonly number[]): number => {
  const s = [...slots].sort((a, b) => a - b);
  return s.filter((x, i) => i === 0 || x !== s[i - 1]! + 1).length;
};

const distinctSlots = fc.uniqueArray(fc.integer({ min: 0, max: 31 }), { minLength: 1, maxLength: 16 });

describe('passes over slots', () => {
  it('counts one pass per run of consecutive slots for a step of decodes: the fewest any order can take', () => {
    fc.assert(
      fc.property(distinctSlots, (slots) => {
        const n = passes(
          slots,
          slots.map(() => 1),
          slots.length,
        );
        // A micro-batch takes only sequences whose ids rise by one in batch order, so it never spans a gap between
        // slots: no order of these slots runs in fewer passes than their runs, and ascending order reaches it.
        expect(n).toBe(runs(slots));
        expect(n).toBe(splitEqualReference(batchOf(slots.map((slot) => ({ slot, tokens: 1 })))));
      }),
    );
    expect(passes([0, 1, 2, 3, 4, 5, 6, 7], [1, 1, 1, 1, 1, 1, 1, 1], 8)).toBe(1);
    expect(passes([7, 6, 5, 4, 3, 2, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1], 8)).toBe(1);
    expect(passes([0, 2, 4, 6], [1, 1, 1, 1], 4)).toBe(4);
  });

  it("agrees with llama.cpp's split, token by token, for prefill chunks beside decodes", () => {
    fc.assert(
      fc.property(
        distinctSlots.chain((slots) =>
          fc.tuple(
            fc.constant(slots),
            fc.array(fc.integer({ min: 1, max: 9 }), { minLength: slots.length, maxLength: slots.length }),
          ),
        ),
        ([slots, tokens]) => {
          const reference = splitEqualReference(batchOf(slots.map((slot, i) => ({ slot, tokens: tokens[i]! }))));
          expect(passes(slots, tokens, slots.length)).toBe(reference);
          // Consecutive slots in ascending order of tokens reach one pass per distinct count.
          const order = tokens.map((t, i) => [t, i] as const).sort((a, b) => a[0] - b[0]);
          const packed = order.map((_, k) => k);
          const packedTokens = order.map(([t]) => t);
          expect(passes(packed, packedTokens, packed.length)).toBe(fewestPasses(tokens, tokens.length));
        },
      ),
    );
    // A 64-token chunk after 7 decodes in slots 0-7: one token of each together, then the chunk's other 63.
    expect(passes([0, 1, 2, 3, 4, 5, 6, 7], [1, 1, 1, 1, 1, 1, 1, 64], 8)).toBe(2);
  });
});

describe('slot table', () => {
  it('hands out the lowest free slot, and frees only slots in use', () => {
    const t = createSlotTable(4);
    expect([t.take(), t.take(), t.take()]).toEqual([0, 1, 2]);
    t.free(1);
    expect(t.take()).toBe(1);
    expect(t.take()).toBe(3);
    expect(() => t.take()).toThrow(/no free slot/);
    t.free(0);
    expect(() => t.free(0)).toThrow(/not in use/);
    expect(() => t.free(9)).toThrow(/not in use/);
    expect(t.used).toBe(3);
  });
});

/** One action of a random workload: a request arriving, a step, or a cancellation of the n-th known request. */
type Action =
  { k: 'arrive'; prompt: number; output: number; priority: number } | { k: 'step' } | { k: 'cancel'; n: number };

const actions = fc.array(
  fc.oneof(
    fc.record({
      k: fc.constant('arrive' as const),
      prompt: fc.integer({ min: 1, max: 40 }),
      output: fc.integer({ min: 1, max: 12 }),
      priority: fc.integer({ min: 0, max: 1 }),
    }),
    fc.constant({ k: 'step' as const }),
    fc.constant({ k: 'step' as const }),
    fc.record({ k: fc.constant('cancel' as const), n: fc.nat(40) }),
  ),
  { maxLength: 120 },
);

const quiet: SequenceListener = {
  scheduled: () => undefined,
  preempted: () => undefined,
  tokens: () => undefined,
  finished: () => undefined,
};

/** Plays a workload on a batcher; checks the slots after every step and returns each step's entries and slots. */
function play(policy: BatchPolicy, blocks: number, script: readonly Action[]): string[] {
  const maxRunning = 6;
  const b = createContinuousBatcher({
    policy,
    maxRunning,
    tokenBudget: 32,
    blockTokens: 4,
    blocksTotal: blocks,
    maxContext: 60,
    watermarkBlocks: 0,
  });
  const all: Sequence[] = [];
  const trace: string[] = [];
  let t = 0;
  const check = (p: StepPlan): void => {
    const running = b.runningList();
    const slots = running.map((s) => s.slot);
    expect(new Set(slots).size).toBe(slots.length);
    for (const x of slots) expect(x >= 0 && x < maxRunning).toBe(true);
    // Every sequence that left (finished, preempted, cancelled, waiting) holds no slot.
    for (const s of all) if (!s.running) expect(s.slot).toBe(-1);
    // A step's passes are those of its entries' slots; a step of decodes alone, one per run of its slots.
    const entrySlots = p.entries.map((e) => e.seq.slot);
    if (p.prefillTokens === 0 && entrySlots.every((x) => x >= 0)) expect(p.shape.passes).toBe(runs(entrySlots));
  };
  for (const a of script) {
    if (a.k === 'arrive') {
      const s = createSequence({
        id: `r${all.length}`,
        priority: a.priority,
        order: all.length,
        promptTokens: a.prompt,
        outputTokens: a.output,
        maxTokens: a.output,
        receivedAt: t,
        listener: quiet,
      });
      all.push(s);
      b.enqueue(s);
    } else if (a.k === 'cancel') {
      const s = all[a.n];
      if (s) b.withdraw(s.id);
    } else {
      const p = b.plan(++t);
      if (!p) continue;
      trace.push(p.entries.map((e) => `${e.seq.id}@${e.seq.slot}:${e.chunk}`).join(' ') + ` passes ${p.shape.passes}`);
      check(p);
      b.complete(p, t);
      b.checkInvariants(p);
    }
  }
  return trace;
}

describe('slot assignment by the continuous batcher', () => {
  it('keeps slots unique and within range, frees them on finish, preemption and cancel, and is deterministic', () => {
    fc.assert(
      fc.property(
        fc.constantFrom<BatchPolicy>('chunked', 'prefill-first', 'static'),
        fc.integer({ min: 16, max: 80 }),
        actions,
        (policy, blocks, script) => {
          const first = play(policy, blocks, script);
          expect(play(policy, blocks, script)).toEqual(first);
        },
      ),
      { numRuns: 150 },
    );
  });

  it('gives sequences scheduled together consecutive slots, so their decodes run in one pass', () => {
    const b = createContinuousBatcher({
      policy: 'chunked',
      maxRunning: 8,
      tokenBudget: 64,
      blockTokens: 4,
      blocksTotal: 400,
      maxContext: 200,
      watermarkBlocks: 0,
    });
    const mk = (i: number, output: number): Sequence =>
      createSequence({
        id: `s${i}`,
        priority: 0,
        order: i,
        promptTokens: 4,
        outputTokens: output,
        maxTokens: output,
        receivedAt: 0,
        listener: quiet,
      });
    // s2 ends first, leaving a hole at slot 2 that the next admission fills.
    for (let i = 0; i < 8; i++) b.enqueue(mk(i, i === 2 ? 2 : 20));
    let p = b.plan(1)!;
    expect(p.entries.map((e) => e.seq.slot)).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    b.complete(p, 1);
    p = b.plan(2)!;
    expect([p.decodes, p.shape.passes]).toEqual([8, 1]);
    b.complete(p, 2);
    p = b.plan(3)!;
    // Seven decodes over slots 0-1 and 3-7: two runs.
    expect([p.decodes, p.shape.passes]).toEqual([7, 2]);
    b.complete(p, 3);
    b.enqueue(mk(8, 20));
    p = b.plan(4)!;
    const late = p.entries.find((e) => e.seq.id === 's8')!;
    expect(late.seq.slot).toBe(2);
    b.complete(p, 4);
    p = b.plan(5)!;
    expect([p.decodes, p.shape.passes]).toEqual([8, 1]);
  });
});
