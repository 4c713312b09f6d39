// The waiting queue of one replica: a FIFO deque per priority class, with sums kept as sequences enter and
// leave, so that the batcher's stats cost O(running) rather than O(queue).
import { createDeque, type Deque } from './deque.ts';
import type { KvLedger } from './kv-ledger.ts';
import { prefillTarget, type Sequence } from './sequence.ts';

/** Sums over the waiting sequences, updated incrementally. The arrays are live (index = class rank). */
export interface WaitingSums {
  readonly byClass: number[];
  readonly tokensByClass: number[];
  /** Blocks the queue needs for its prefill (plus the first decoded token). */
  blocks: number;
  /** Expected decode tokens still to produce. */
  decode: number;
  /** Blocks the queue will hold at its expected final length. */
  final: number;
}

/** The waiting sequences, highest class first, FIFO within a class (preempted ones back at the head). */
export interface WaitingQueues {
  readonly count: number;
  readonly sums: WaitingSums;
  push(s: Sequence, atHead: boolean): void;
  /** Removes s, which must be the head of its class. */
  shift(s: Sequence): void;
  /** Removes s from anywhere in its class; false if it is not queued. */
  remove(s: Sequence): boolean;
  /** The next sequence to admit: the head of the highest non-empty class. */
  peek(): Sequence | undefined;
  /** Empties every class and returns what was queued, highest class first. */
  drain(): Sequence[];
  /** The queue in admission order; O(queue). */
  list(): Sequence[];
  /** Throws if the deques, the count and the per-class sums disagree. */
  check(): void;
}

/** Creates empty queues whose block sums use the ledger's block size. */
export function createWaitingQueues(ledger: KvLedger): WaitingQueues {
  const classes: Deque[] = [];
  let count = 0;
  const sums: WaitingSums = { byClass: [], tokensByClass: [], blocks: 0, decode: 0, final: 0 };
  const account = (s: Sequence, sign: 1 | -1): void => {
    const goal = prefillTarget(s);
    while (sums.byClass.length <= s.priority) {
      sums.byClass.push(0);
      sums.tokensByClass.push(0);
    }
    sums.byClass[s.priority]! += sign;
    sums.tokensByClass[s.priority]! += sign * goal;
    sums.blocks += sign * ledger.blocksFor(goal + 1);
    sums.decode += sign * Math.max(0, s.estOutputTokens - s.generated);
    sums.final += sign * ledger.finalBlocks(s);
  };
  const queueOf = (p: number): Deque => {
    // A class rank is an index: anything else (a class looked up by a name it does not have) is a broken invariant,
    // refused before the queue or its sums change.
    if (!(p >= 0 && Number.isInteger(p))) throw new RangeError(`queue of class rank ${String(p)}`);
    while (classes.length <= p) classes.push(createDeque());
    return classes[p]!;
  };
  return {
    get count() {
      return count;
    },
    sums,
    push: (s, atHead) => {
      const q = queueOf(s.priority);
      if (atHead) q.unshift(s);
      else q.push(s);
      count++;
      account(s, 1);
    },
    shift: (s) => {
      queueOf(s.priority).shift();
      count--;
      account(s, -1);
    },
    remove: (s) => {
      if (!queueOf(s.priority).remove(s)) return false;
      count--;
      account(s, -1);
      return true;
    },
    peek: () => {
      for (const q of classes) {
        const s = q.peek();
        if (s) return s;
      }
      return undefined;
    },
    drain: () => {
      const out: Sequence[] = [];
      for (const q of classes) {
        for (let s = q.shift(); s; s = q.shift()) out.push(s);
      }
      count = 0;
      sums.byClass.fill(0);
      sums.tokensByClass.fill(0);
      sums.blocks = 0;
      sums.decode = 0;
      sums.final = 0;
      return out;
    },
    list: () => classes.flatMap((q) => q.toArray()),
    check: () => {
      let queued = 0;
      for (const q of classes) queued += q.length;
      let counted = 0;
      for (const c of sums.byClass) counted += c;
      if (queued !== count || counted !== count) {
        throw new Error(`queue drift: ${queued} queued, ${count} counted, ${counted} by class`);
      }
    },
  };
}
