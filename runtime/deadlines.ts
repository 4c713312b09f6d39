// One timer wheel for many deadlines: a heap of (time, callback) behind a single clock timer, so that arming a
// request's queue deadline costs a heap push instead of an actor-system timer.
import type { Clock, TimerId } from './clock.ts';

/** Arms callbacks at absolute times; stale ones are the caller's to ignore (they carry their own time) or to disarm. */
export interface DeadlineWheel {
  /** Arms `fire` at `at`; the function returned disarms it (a deadline that became moot never wakes the clock). */
  arm(at: number, fire: () => void): () => void;
  /** Entries held: armed deadlines, and disarmed ones not yet dropped (at most as many as are armed, or COMPACT_MIN). */
  readonly size: number;
  /** Armed deadlines. */
  readonly armed: number;
}

/** Disarmed entries the heap may hold before it is compacted, whatever the number armed. */
const COMPACT_MIN = 1024;

interface Entry {
  at: number;
  seq: number;
  fire: (() => void) | null;
}

/** Creates a deadline wheel on `clock`; `compactMin` (tests) overrides COMPACT_MIN. */
export function createDeadlineWheel(clock: Clock, compactMin = COMPACT_MIN): DeadlineWheel {
  let heap: Entry[] = [];
  let seq = 0;
  // Disarmed entries still in the heap. A disarmed deadline is usually far from the top (a queue budget of minutes,
  // disarmed milliseconds later when its request is scheduled), so dropping it only when it comes up would let the
  // heap grow with rate x budget; once they outnumber the armed ones the heap is rebuilt without them.
  let dead = 0;
  let timer: TimerId | null = null;
  let timerAt = Infinity;
  const less = (a: Entry, b: Entry): boolean => a.at < b.at || (a.at === b.at && a.seq < b.seq);
  const up = (i: number): void => {
    const e = heap[i]!;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!less(e, heap[p]!)) break;
      heap[i] = heap[p]!;
      i = p;
    }
    heap[i] = e;
  };
  const down = (i: number): void => {
    const e = heap[i]!;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= heap.length) break;
      const r = l + 1;
      const c = r < heap.length && less(heap[r]!, heap[l]!) ? r : l;
      if (!less(heap[c]!, e)) break;
      heap[i] = heap[c]!;
      i = c;
    }
    heap[i] = e;
  };
  /** Rebuilds the heap from its armed entries: their order (time, then arming order) is unchanged. */
  const compact = (): void => {
    heap = heap.filter((e) => e.fire !== null);
    dead = 0;
    for (let i = (heap.length >> 1) - 1; i >= 0; i--) down(i);
  };
  /** Compacts once the disarmed entries outnumber the armed ones (and compactMin). */
  const bound = (): void => {
    if (dead > compactMin && dead > heap.length - dead) compact();
  };
  const pop = (): Entry | undefined => {
    const top = heap[0];
    const last = heap.pop();
    if (top?.fire === null) dead--;
    if (!top || !last || heap.length === 0) return top;
    heap[0] = last;
    down(0);
    return top;
  };
  /** Arms the clock's one timer for the earliest live deadline (disarmed ones at the top are dropped first). */
  const schedule = (): void => {
    while (heap.length > 0 && heap[0]!.fire === null) pop();
    const next = heap[0];
    if (!next) {
      if (timer !== null) clock.clearTimeout(timer);
      timer = null;
      timerAt = Infinity;
      return;
    }
    if (timer !== null && timerAt === next.at) return;
    if (timer !== null) clock.clearTimeout(timer);
    timerAt = next.at;
    timer = clock.setTimeout(tick, Math.max(0, next.at - clock.now()));
  };
  const tick = (): void => {
    timer = null;
    timerAt = Infinity;
    const now = clock.now();
    // One deadline's callback that throws fails alone: the others due fire, the wheel is armed for the next, and then
    // the first error goes on up to the clock (whose caller contains or reports it).
    let failed: { error: unknown } | null = null;
    while (heap.length > 0 && heap[0]!.at <= now) {
      const e = pop()!;
      const fire = e.fire;
      if (fire === null) continue;
      // Fired, it is out of the heap: a later disarm is a no-op and counts nothing.
      e.fire = null;
      try {
        fire();
      } catch (error) {
        failed ??= { error };
      }
    }
    schedule();
    bound();
    if (failed) throw failed.error;
  };
  return {
    arm: (at, fire) => {
      const e: Entry = { at, seq: ++seq, fire };
      heap.push(e);
      up(heap.length - 1);
      if (heap[0] === e) schedule();
      return () => {
        if (e.fire === null) return;
        e.fire = null;
        dead++;
        if (heap[0] === e) schedule();
        bound();
      };
    },
    get size() {
      return heap.length;
    },
    get armed() {
      return heap.length - dead;
    },
  };
}
