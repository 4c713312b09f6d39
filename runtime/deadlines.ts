// One timer wheel for many deadlines: a heap of (time, callback) behind a single clock timer, so that arming a
// request's queue deadline costs a heap push instead of an actor-system timer.
import type { Clock, TimerId } from './clock.ts';

/** Arms callbacks at absolute times; stale ones are the caller's to ignore (they carry their own time). */
export interface DeadlineWheel {
  /** Calls `fire` at `at`; the handle disarms it. */
  arm(at: number, fire: () => void): Deadline;
  /** Forgets the callback of an armed deadline (and so what it holds): it will not be called. Its slot stays until
   * its time, so the wheel's timer fires as it would have. */
  disarm(d: Deadline): void;
  /** Deadlines armed and not yet due, disarmed ones included. */
  readonly size: number;
  /** Deadlines armed and not yet due nor disarmed: the callbacks the wheel holds. */
  readonly armed: number;
}

/** An armed deadline. */
export interface Deadline {
  readonly at: number;
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
  let armed = 0;
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
  const schedule = (): void => {
    const next = heap[0];
    if (!next) return;
    if (timer !== null && timerAt <= next.at) return;
    if (timer !== null) clock.clearTimeout(timer);
    timerAt = next.at;
    timer = clock.setTimeout(tick, Math.max(0, next.at - clock.now()));
  };
  const tick = (): void => {
    timer = null;
    timerAt = Infinity;
    const now = clock.now();
    while (heap.length > 0 && heap[0]!.at <= now) {
      const e = pop()!;
      const { fire } = e;
      if (!fire) continue;
      e.fire = null;
      armed--;
      fire();
    }
    schedule();
  };
  return {
    arm: (at, fire) => {
      const e: Entry = { at, seq: ++seq, fire };
      heap.push(e);
      armed++;
      up(heap.length - 1);
      schedule();
      return e;
    },
    disarm: (d) => {
      const e = d as Entry;
      if (e.fire) armed--;
      e.fire = null;
    },
    get size() {
      return heap.length;
    },
    get armed() {
      return armed;
    },
  };
}
