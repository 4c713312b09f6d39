// A core's reports: one after each step, or, in a decode run, held back for at most `decodeRunMs` since the last one
// and then one for every step since (see core.ts).
import type { StepPlan } from '../batcher/types.ts';
import type { CoreEvents } from './core-events.ts';
import type { CacheReport } from '../../machines/core-messages.ts';
import type { EngineCoreOptions, ReplicaLoad, SeqEvent } from './types.ts';

/** The reports of one core. */
export interface CoreReports {
  /** A submit or cancel changed the load since the last report. */
  dirty: boolean;
  /** The longest a report is held back (0: never). */
  readonly runMs: number;
  /** When the last report was made. */
  sentAt(): number;
  send(at: number, start: number, events: SeqEvent[], ranks: number[] | null): void;
  /** Holds back the report of the step that started at `start`: the buffer keeps its events. */
  hold(start: number): void;
  /** Sends the report held back, if any, at `now`: the steps it covers ended before. */
  flush(now: number): void;
  /** The report of the step started at `began`, ended `now`: its events are the buffer's first `count`. */
  step(now: number, began: number, count: number): void;
  /** Whether the report of `plan`, just completed, may wait: the step in flight is `plan` again in place (a decode
   * step of the same set), its events (the buffer's first `count`, and no others) are decode steps only, nothing was
   * submitted or cancelled, and the last report is recent enough. */
  mayHold(plan: StepPlan, inflight: StepPlan | null, count: number, now: number): boolean;
}

/** Creates the reports of a core whose events collect in `ev`, its load read by `load` and its prefix cache's changes
 * by `cache` (each report carries those since the one before). */
export function createCoreReports(
  o: EngineCoreOptions,
  ev: CoreEvents,
  load: () => ReplicaLoad,
  cache: () => CacheReport | undefined,
): CoreReports {
  const runMs = o.decodeRunMs ?? 0;
  let sentAt = 0;
  // The buffer holds the events of steps whose report was held back; `heldStart`: the last such step's start.
  let holding = false;
  let heldStart = 0;
  const r: CoreReports = {
    dirty: false,
    runMs,
    sentAt: () => sentAt,
    send: (at, start, events, ranks) => {
      r.dirty = false;
      holding = false;
      sentAt = at;
      const c = ranks === null ? cache() : undefined;
      if (ranks !== null) o.report({ at, start, ranks, events, load: load() });
      else if (c === undefined) o.report({ at, start, events, load: load() });
      else o.report({ at, start, events, load: load(), cache: c });
    },
    hold: (start) => {
      holding = true;
      heldStart = start;
    },
    flush: (now) => {
      if (!holding) return;
      ev.stamp();
      r.send(now, heldStart, ev.take(), null);
    },
    step: (now, began, count) => {
      if (holding) ev.stamp();
      r.send(now, began, ev.take(count), null);
    },
    mayHold: (plan, inflight, count, now) =>
      runMs > 0 && inflight === plan && !r.dirty && ev.decodeOnly() && ev.pending() === count && now - sentAt < runMs,
  };
  return r;
}
