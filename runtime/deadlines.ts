// One timer wheel for many deadlines: a heap of (time, callback) behind a single clock timer, so that arming a
// request's queue deadline costs a heap push instead of an actor-system timer.
import type { Clock, TimerId } from './clock.ts';

/** Arms callbacks at absolute times; stale ones are the caller's to ignore (they carry their own time) or to disarm. */
export interface DeadlineWheel {
  /** Arms `fire` at `at`; the function returned disarms it (a deadline that became moot never wakes the clock). */
  arm(at: number, fire: () => void): () => void;
  /** Armed deadlines, disarmed ones not yet dropped included. */
  readonly size: number;
}

interface Entry {
  at: number;
  seq: number;
  fire: (() => void) | null;
}

/** Creates a deadline wheel on `clock`. */
export function createDeadlineWheel(clock: Clock): DeadlineWheel {
  const heap: Entry[] = [];
  let seq = 0;
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
  const pop = (): Entry | undefined => {
    const top = heap[0];
    const last = heap.pop();
    if (!top || !last || heap.length === 0) return top;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= heap.length) break;
      const r = l + 1;
      const c = r < heap.length && less(heap[r]!, heap[l]!) ? r : l;
      if (!less(heap[c]!, last)) break;
      heap[i] = heap[c]!;
      i = c;
    }
    heap[i] = last;
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
    while (heap.length > 0 && heap[0]!.at <= now) pop()!.fire?.();
    schedule();
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
        if (heap[0] === e) schedule();
      };
    },
    get size() {
      return heap.length;
    },
  };
}
