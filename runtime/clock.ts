// Time for the whole runtime: injected, so the same actors run on the wall clock or in virtual time.
import { ChurnMap } from './churn-map.ts';

/** A timer handle returned by a clock. */
export type TimerId = number;

/** The clock every actor, timer and `after` delay uses (a superset of XState's `Clock`). */
export interface Clock {
  /** Milliseconds since the clock's epoch. */
  now(): number;
  setTimeout(fn: () => void, ms: number): TimerId;
  clearTimeout(id: TimerId): void;
  /** Schedules fn at an absolute time (never earlier than now), where the clock can: a virtual clock always. */
  at?(timeMs: number, fn: () => void): TimerId;
}

/** A discrete-event clock: callbacks run in (time, sequence) order and time jumps between them. */
export interface VirtualClock extends Clock {
  /** Schedules fn at an absolute virtual time (never earlier than now). */
  at(timeMs: number, fn: () => void): TimerId;
  /** Runs events until none remain, `untilMs` is passed, or `stop()` is called; returns events run. */
  run(untilMs?: number): number;
  /** Makes the running `run()` return after the current event. */
  stop(): void;
  /** Number of pending events. */
  pending(): number;
}

interface Entry {
  t: number;
  seq: number;
  fn: (() => void) | null;
  /** Its slot in the timer table while it is pending (see createVirtualClock). */
  slot: number;
}

/** Slots in a virtual clock's timer table: a timer id is generation × SLOTS + slot. */
const SLOTS = 2 ** 21;

/** Creates a virtual clock backed by a binary heap; ties in time run in scheduling order. */
export function createVirtualClock(startMs = 0): VirtualClock {
  let now = startMs;
  let seq = 0;
  let stopped = false;
  let live = 0;
  const heap: Entry[] = [];
  // Pending timers by id, for clearTimeout: a table of slots reused through a free list, each with a generation
  // bumped on release, so that an id (generation × SLOTS + slot) names one timer only. (A Map set and deleted per
  // event cost about 6 % of a simulation of eight replicas.)
  const slots: (Entry | null)[] = [];
  const gens: number[] = [];
  const freeSlots: number[] = [];
  const release = (slot: number): void => {
    slots[slot] = null;
    gens[slot]!++;
    freeSlots.push(slot);
  };

  const less = (x: Entry, y: Entry): boolean => x.t < y.t || (x.t === y.t && x.seq < y.seq);
  const push = (e: Entry): void => {
    heap.push(e);
    let i = heap.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      const pe = heap[p]!;
      if (!less(e, pe)) break;
      heap[i] = pe;
      i = p;
    }
    heap[i] = e;
  };
  const pop = (): Entry | undefined => {
    const top = heap[0];
    const last = heap.pop();
    if (top === undefined || last === undefined || heap.length === 0) return top;
    let i = 0;
    const n = heap.length;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= n) break;
      const r = l + 1;
      const c = r < n && less(heap[r]!, heap[l]!) ? r : l;
      if (!less(heap[c]!, last)) break;
      heap[i] = heap[c]!;
      i = c;
    }
    heap[i] = last;
    return top;
  };
  const schedule = (t: number, fn: () => void): TimerId => {
    let slot = freeSlots.pop();
    if (slot === undefined) {
      slot = slots.length;
      if (slot >= SLOTS) throw new RangeError(`more than ${SLOTS} timers pending on one virtual clock`);
      slots.push(null);
      gens.push(0);
    }
    const e: Entry = { t: t < now ? now : t, seq: ++seq, fn, slot };
    push(e);
    slots[slot] = e;
    live++;
    return gens[slot]! * SLOTS + slot;
  };

  return {
    now: () => now,
    setTimeout: (fn, ms) => schedule(now + (ms > 0 ? ms : 0), fn),
    at: schedule,
    clearTimeout: (id) => {
      if (typeof id !== 'number' || !(id >= 0)) return;
      const slot = id % SLOTS;
      const e = slots[slot];
      if (!e || gens[slot] !== (id - slot) / SLOTS) return;
      // The entry stays in the heap until it comes up (then skipped); its slot is free from now.
      e.fn = null;
      release(slot);
      live--;
    },
    stop: () => {
      stopped = true;
    },
    pending: () => live,
    run: (untilMs = Infinity) => {
      stopped = false;
      let ran = 0;
      while (!stopped && heap.length > 0) {
        const top = heap[0]!;
        if (top.t > untilMs) break;
        pop();
        if (top.fn === null) continue;
        const fn = top.fn;
        top.fn = null;
        release(top.slot);
        live--;
        now = top.t;
        ran++;
        fn();
      }
      if (!stopped && untilMs !== Infinity && now < untilMs) now = untilMs;
      return ran;
    },
  };
}

/**
 * The wall clock for serving: milliseconds from process start, timers from the host. With `onError`, a timer whose
 * callback throws fails alone: the error goes to `onError` (which logs it, or ends the process over a broken
 * invariant) and every other timer runs on; without it, the error is the host's uncaught exception.
 */
export function createWallClock(onError?: (e: unknown) => void): Clock {
  const origin = performance.now();
  const immediates = new ChurnMap<number, NodeJS.Immediate>();
  let nextImmediate = 0;
  // One function for every timer (the callback is its argument): no closure per timer.
  const run = onError
    ? (fn: () => void): void => {
        try {
          fn();
        } catch (e) {
          onError(e);
        }
      }
    : (fn: () => void): void => fn();
  return {
    now: () => performance.now() - origin,
    setTimeout: (fn, ms) => {
      if (ms > 0) return setTimeout(run, ms, fn) as unknown as TimerId;
      // Node clamps setTimeout(fn, 0) to 1 ms; a zero delay runs on the next turn of the event loop instead.
      const id = -++nextImmediate;
      immediates.set(
        id,
        setImmediate(() => {
          immediates.delete(id);
          run(fn);
        }),
      );
      return id;
    },
    clearTimeout: (id) => {
      if (typeof id === 'number' && id < 0) {
        const im = immediates.get(id);
        if (im) clearImmediate(im);
        immediates.delete(id);
        return;
      }
      clearTimeout(id as unknown as NodeJS.Timeout);
    },
  };
}

/** Milliseconds since the Unix epoch, for the few places that must show calendar time (API `created` fields). */
export function unixTimeMs(): number {
  return performance.timeOrigin + performance.now();
}
