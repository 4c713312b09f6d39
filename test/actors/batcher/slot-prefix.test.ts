// Prefix reuse by slot (actors/batcher/slot-prefix.ts): a sequence with token ids takes the free slot whose kept cells
// share the longest prefix with its tokens and prefills only the rest; with no match it takes an empty slot or else
// the least recently used prefix, passes aside; a kept prefix never holds up an admission; the hashes the
// slots keep are reported once however many slots keep them; and every sequence gets exactly its tokens.
import { describe, expect, it } from 'vitest';
import { tokenBlockHashes } from '../../../actors/batcher/block-hash.ts';
import { createBatchState } from '../../../actors/batcher/batch-state.ts';
import { checkBatchState } from '../../../actors/batcher/batch-invariants.ts';
import { completeStep } from '../../../actors/batcher/completion.ts';
import { createContinuousBatcher, type ContinuousLimits, type StepPlan } from '../../../actors/batcher/continuous.ts';
import { createSequence, type Sequence } from '../../../actors/batcher/sequence.ts';
import { createSlotPrefix } from '../../../actors/batcher/slot-prefix.ts';
import { planStep } from '../../../actors/batcher/step-planner.ts';
import { createRng } from '../../../runtime/rng.ts';

const B = 4;
const limits = (over: Partial<ContinuousLimits> = {}): ContinuousLimits => ({
  policy: 'chunked',
  maxRunning: 4,
  tokenBudget: 64,
  blockTokens: B,
  blocksTotal: 200,
  maxContext: 1000,
  watermarkBlocks: 0,
  prefixCache: true,
  ...over,
});

/** What the tests saw: each sequence's tokens, whether it finished, and its slot when scheduled. */
interface Log {
  tokens: Map<string, number>;
  done: Set<string>;
  slot: Map<string, number>;
  computedAtStart: Map<string, number>;
}
const newLog = (): Log => ({ tokens: new Map(), done: new Set(), slot: new Map(), computedAtStart: new Map() });

let order = 0;
/** A sequence with token ids `prompt`; what it generates is its id's number times 1000 plus the position. */
function seqOf(id: string, prompt: number[], output: number, log: Log): Sequence {
  return createSequence({
    id,
    priority: 0,
    order: ++order,
    promptTokens: prompt.length,
    outputTokens: output,
    maxTokens: output,
    receivedAt: 0,
    listener: {
      scheduled: (s) => {
        log.slot.set(s.id, s.slot);
        log.computedAtStart.set(s.id, s.computed);
      },
      preempted: () => {},
      tokens: (s, n) => log.tokens.set(s.id, (log.tokens.get(s.id) ?? 0) + n),
      finished: (s) => log.done.add(s.id),
    },
    tokens: { prompt, out: [], lastText: '', finish: null, sampling: {} },
  });
}

/** Prompt token ids: `n` of them from `base` on. */
const ids = (base: number, n: number): number[] => Array.from({ length: n }, (_, i) => base + i);

/** Puts the token each sampling entry of `p` produces on its sequence, as the core does before the batcher counts. */
function sample(p: StepPlan): void {
  for (const { seq: s, chunk } of p.entries) {
    if (s.gone || !s.running || !s.tokens) continue;
    if (chunk > 0 && s.computed + chunk < s.prefillGoal) continue;
    s.tokens.out.push(900_000 + s.tokens.out.length);
  }
}

type Batcher = ReturnType<typeof createContinuousBatcher>;

/** One step: planned, checked, sampled, completed; the prefill tokens it computed (-1 when there was no work). */
function step(b: Batcher, t: number): number {
  const p = b.plan(t);
  if (!p) return -1;
  b.checkInvariants(p);
  sample(p);
  b.complete(p, t);
  b.checkInvariants();
  return p.prefillTokens;
}

/** Runs a batcher until idle; returns the prefill tokens its steps computed. */
function drain(b: Batcher, t0 = 0): number {
  let prefill = 0;
  for (let t = t0; t < t0 + 10_000; t++) {
    const n = step(b, t);
    if (n < 0) return prefill;
    prefill += n;
  }
  throw new Error('did not drain');
}

describe('prefix reuse by slot', () => {
  describe('choosing the slot', () => {
    it('takes the free slot whose kept cells share the longest prefix, and prefills only the rest', () => {
      const log = newLog();
      const b = createContinuousBatcher(limits());
      const a = seqOf('a', ids(100, 40), 5, log);
      const c = seqOf('c', ids(500, 30), 3, log);
      b.enqueue(a);
      b.enqueue(c);
      expect(drain(b)).toBe(70);
      expect([log.slot.get('a'), log.slot.get('c')]).toEqual([0, 1]);
      // A turn that extends c's prompt and answer: c's cells are its prompt and the answer's first two tokens.
      const turn = [...c.tokens!.prompt, ...c.tokens!.out, ...ids(700, 10)];
      b.enqueue(seqOf('c2', turn, 4, log));
      expect(drain(b, 100)).toBe(turn.length - 32);
      expect(log.slot.get('c2')).toBe(1);
      expect(log.computedAtStart.get('c2')).toBe(32);
      // A prompt shorter than what a slot keeps reuses all of it but its last token.
      b.enqueue(seqOf('a2', ids(100, 20), 2, log));
      expect(drain(b, 200)).toBe(1);
      expect(log.slot.get('a2')).toBe(0);
      expect(log.tokens.get('c2')).toBe(4);
      expect(log.tokens.get('a2')).toBe(2);
    });

    it('takes the lowest free slot when no slot keeps anything', () => {
      const log = newLog();
      const b = createContinuousBatcher(limits());
      for (const id of ['x', 'y', 'z']) b.enqueue(seqOf(id, ids(10, 8), 2, log));
      step(b, 0);
      expect(['x', 'y', 'z'].map((id) => log.slot.get(id))).toEqual([0, 1, 2]);
    });

    it('with no match, overwrites an empty slot, else the least recently used prefix, whatever passes it adds', () => {
      const log = newLog();
      const b = createContinuousBatcher(limits());
      // Four sequences in slots 0-3, finishing in the order 3, 1, 0, 2.
      const outputs = [6, 4, 8, 2];
      ['a', 'b', 'c', 'd'].forEach((id, i) => b.enqueue(seqOf(id, ids(1000 * (i + 1), 8), outputs[i]!, log)));
      drain(b);
      expect(['a', 'b', 'c', 'd'].map((id) => log.slot.get(id))).toEqual([0, 1, 2, 3]);
      // Slot 3 keeps the oldest prefix.
      b.enqueue(seqOf('e', ids(50_000, 8), 30, log));
      step(b, 100);
      expect(log.slot.get('e')).toBe(3);
      // Slot 2 beside e would add no pass, but its prefix is the newest of the free slots': slot 1's is older.
      b.enqueue(seqOf('f', ids(60_000, 8), 30, log));
      step(b, 101);
      expect(log.slot.get('f')).toBe(1);
      // A match of at least a block wins over the passes: a's prefix, in slot 0, and c's, still in slot 2.
      b.enqueue(seqOf('a2', [...ids(1000, 8), 1], 2, log));
      b.enqueue(seqOf('c2', [...ids(3000, 8), 1], 2, log));
      step(b, 102);
      expect([log.slot.get('a2'), log.slot.get('c2')]).toEqual([0, 2]);
      expect([log.computedAtStart.get('a2'), log.computedAtStart.get('c2')]).toEqual([8, 8]);
      drain(b, 103);
    });

    it("keeps a finished turn's prefix in a hole between running sequences for the next turn", () => {
      const log = newLog();
      const b = createContinuousBatcher(limits());
      // x and z run long in slots 0 and 2; the conversation's turn c, in slot 1 between them, finishes first.
      b.enqueue(seqOf('x', ids(100, 8), 40, log));
      const c = seqOf('c', ids(200, 12), 2, log);
      b.enqueue(c);
      b.enqueue(seqOf('z', ids(300, 8), 40, log));
      for (let t = 0; t < 4; t++) step(b, t);
      expect(log.done.has('c')).toBe(true);
      expect(log.slot.get('c')).toBe(1);
      // A new prompt that matches nothing takes the empty slot 3, not the hole that keeps c's cells.
      b.enqueue(seqOf('n', ids(400, 8), 40, log));
      step(b, 10);
      expect(log.slot.get('n')).toBe(3);
      // The conversation's next turn: c's prompt and answer, then a new message, reuses all c computed.
      const turn = [...c.tokens!.prompt, ...c.tokens!.out, ...ids(500, 6)];
      b.enqueue(seqOf('c2', turn, 2, log));
      step(b, 11);
      expect(log.slot.get('c2')).toBe(1);
      expect(log.computedAtStart.get('c2')).toBe(c.tokens!.prompt.length + 1);
      drain(b, 12);
    });

    it('among slots sharing as much (a system prompt), overwrites the least recently used', () => {
      const log = newLog();
      const b = createContinuousBatcher(limits());
      const sys = ids(100, 8);
      // Two conversations on one system prompt, in slots 0 and 1; the one in slot 1 finishes first.
      b.enqueue(seqOf('a', [...sys, ...ids(200, 4)], 6, log));
      b.enqueue(seqOf('b', [...sys, ...ids(300, 4)], 2, log));
      drain(b);
      expect([log.slot.get('a'), log.slot.get('b')]).toEqual([0, 1]);
      // A new conversation on that prompt reuses it where the older turn was, keeping a's for a's next turn.
      b.enqueue(seqOf('c', [...sys, ...ids(400, 4)], 2, log));
      step(b, 100);
      expect(log.slot.get('c')).toBe(1);
      expect(log.computedAtStart.get('c')).toBe(8);
      drain(b, 101);
    });

    it('reuses what a preempted sequence left in its slot when it runs again', () => {
      const log = newLog();
      // Room for one long sequence: the second admitted is preempted when the first grows.
      const b = createContinuousBatcher(limits({ blocksTotal: 12, maxRunning: 2, tokenBudget: 16 }));
      b.enqueue(seqOf('p', ids(10, 12), 30, log));
      b.enqueue(seqOf('q', ids(20, 12), 30, log));
      const on = drain(b);
      const offLog = newLog();
      const off = createContinuousBatcher(
        limits({ blocksTotal: 12, maxRunning: 2, tokenBudget: 16, prefixCache: false }),
      );
      off.enqueue(seqOf('p', ids(10, 12), 30, offLog));
      off.enqueue(seqOf('q', ids(20, 12), 30, offLog));
      const without = drain(off);
      expect(off.stats().preemptions).toBeGreaterThan(0);
      expect(b.stats().preemptions).toBeGreaterThan(0);
      expect(on).toBeLessThan(without);
      expect(log.tokens).toEqual(offLog.tokens);
    });
  });

  describe('admission', () => {
    it('never holds up an admission: a kept prefix larger than the free blocks is reused in part', () => {
      const run = (prefixCache: boolean) => {
        const log = newLog();
        const b = createContinuousBatcher(limits({ maxRunning: 2, blocksTotal: 16, prefixCache }));
        const a = seqOf('a', ids(100, 40), 2, log);
        b.enqueue(a);
        drain(b);
        // c holds 8 blocks while b, which extends a's 41 kept tokens, arrives: 8 blocks (32 tokens) are free.
        b.enqueue(seqOf('c', ids(500, 30), 3, log));
        step(b, 100);
        b.enqueue(seqOf('b', [...a.tokens!.prompt, a.tokens!.out[0]!, ...ids(800, 10)], 2, log));
        step(b, 101);
        const admitted = log.slot.has('b');
        const started = log.computedAtStart.get('b');
        drain(b, 102);
        return { admitted, started, log };
      };
      const on = run(true);
      const off = run(false);
      expect(off.admitted).toBe(true);
      expect(on.admitted).toBe(true);
      expect(on.started).toBe(31);
      expect(on.log.tokens).toEqual(off.log.tokens);
    });

    it('keeps its invariants under conversations, preemption and withdrawal, and gives every sequence its tokens', () => {
      for (const seed of [1, 2, 3]) {
        const run = (prefixCache: boolean) => {
          const rng = createRng(seed);
          const log = newLog();
          const b = createContinuousBatcher(limits({ blocksTotal: 40, tokenBudget: 24, maxRunning: 4, prefixCache }));
          const conversations: Sequence[] = [];
          const want = new Map<string, number>();
          let prefill = 0;
          let t = 0;
          for (let i = 0; i < 100; i++) {
            // A later turn: an earlier prompt and its whole answer, then a new message.
            const prior =
              conversations.length > 0 && rng.next() < 0.6
                ? conversations[Math.floor(rng.next() * conversations.length)]!
                : null;
            const head = prior
              ? [...prior.tokens!.prompt, ...ids(900_000, prior.outputTokens)]
              : ids(10_000 * (1 + Math.floor(rng.next() * 3)), 12);
            const prompt = [...head.slice(0, 60), ...ids(100_000 + i * 100, 1 + Math.floor(rng.next() * 10))];
            const s = seqOf(`s${i}`, prompt, 1 + Math.floor(rng.next() * 12), log);
            want.set(s.id, s.outputTokens);
            conversations.push(s);
            b.enqueue(s);
            if (rng.next() < 0.05) b.withdraw(`s${Math.floor(rng.next() * i)}`);
            for (let k = 0; k < 3; k++) {
              const n = step(b, t++);
              if (n < 0) break;
              prefill += n;
            }
          }
          prefill += drain(b, t);
          expect(b.stats().blocksUsed).toBe(0);
          expect(b.hasWork()).toBe(false);
          for (const id of log.done) expect(log.tokens.get(id), id).toBe(want.get(id));
          expect(log.done.size).toBeGreaterThan(90);
          return { prefill, preemptions: b.stats().preemptions };
        };
        const on = run(true);
        const off = run(false);
        expect(off.preemptions).toBeGreaterThan(0);
        expect(on.prefill).toBeLessThan(off.prefill);
      }
    });
  });

  describe('what the control plane hears', () => {
    it('adds a block hash when the first slot keeps it and evicts it when the last slot drops it', () => {
      const log = newLog();
      const st = createBatchState(limits());
      let t = 0;
      const run = () => {
        for (;;) {
          const p = planStep(st, t);
          if (!p) return;
          checkBatchState(st, p);
          sample(p);
          completeStep(st, p, t++);
          checkBatchState(st);
        }
      };
      const sys = ids(100, 8);
      // Two sequences sharing a two-block system prompt, in slots 0 and 1 at once.
      st.waiting.push(seqOf('a', [...sys, ...ids(200, 4)], 1, log), false);
      st.byId.set('a', st.waiting.peek()!);
      const bSeq = seqOf('b', [...sys, ...ids(300, 4)], 1, log);
      st.waiting.push(bSeq, false);
      st.byId.set('b', bSeq);
      run();
      const first = st.ledger.takeChanges();
      const sysHashes = tokenBlockHashes(sys, B);
      const aHashes = tokenBlockHashes([...sys, ...ids(200, 4)], B);
      const bHashes = tokenBlockHashes([...sys, ...ids(300, 4)], B);
      expect(first.overflow).toBe(false);
      expect(first.evicted).toEqual([]);
      expect(new Set(first.added)).toEqual(new Set([...sysHashes, aHashes[2], bHashes[2]]));
      expect(first.added.length).toBe(4);
      // A prompt sharing nothing overwrites slot 2 (empty), then slot 0 (the older of 0 and 1): a's own block goes,
      // the system prompt stays (slot 1 still keeps it).
      for (const id of ['x', 'y']) {
        const s = seqOf(id, ids(id === 'x' ? 5000 : 6000, 8), 1, log);
        st.waiting.push(s, false);
        st.byId.set(id, s);
        const p = planStep(st, t)!;
        sample(p);
        completeStep(st, p, t++);
      }
      expect(log.slot.get('x')).toBe(2);
      expect(log.slot.get('y')).toBe(3);
      const z = seqOf('z', ids(7000, 8), 1, log);
      st.waiting.push(z, false);
      st.byId.set('z', z);
      run();
      expect(log.slot.get('z')).toBe(0);
      const second = st.ledger.takeChanges();
      expect(second.evicted).toEqual([aHashes[2]]);
      expect(second.added.length).toBe(6);
      // Slot 1 overwritten too: the system prompt's blocks are gone from every slot.
      const w = seqOf('w', ids(8000, 8), 1, log);
      st.waiting.push(w, false);
      st.byId.set('w', w);
      run();
      expect(log.slot.get('w')).toBe(1);
      const third = st.ledger.takeChanges();
      expect(new Set(third.evicted)).toEqual(new Set([...sysHashes, bHashes[2]]));
      expect(st.ledger.takeChanges()).toEqual({ added: [], evicted: [], overflow: false });
      // The replica lost its memory: the index is told to forget everything.
      st.ledger.clearCache();
      expect(st.ledger.takeChanges()).toEqual({ added: [], evicted: [], overflow: true });
      expect(st.ledger.slotPrefix!.kept(1)).toBeNull();
    });

    it('tells the whole set kept after more changes than it tells apart', () => {
      const kept = createSlotPrefix(B, 3);
      const a = seqOf('a', ids(10, 20), 1, newLog());
      a.computed = 20;
      kept.leave(0, a);
      // Five blocks changed, three are told apart: the next look is a full one, and the one after it is empty.
      const full = kept.takeChanges(false)!;
      expect(full.overflow).toBe(true);
      expect(new Set(full.added)).toEqual(new Set(tokenBlockHashes(ids(10, 20), B).slice(0, 3)));
      expect(kept.takeChanges(false)).toBeNull();
      kept.take(0, 8);
      expect(kept.takeChanges(false)).toEqual({
        added: [],
        evicted: tokenBlockHashes(ids(10, 20), B).slice(2),
        overflow: false,
      });
    });
  });
});
