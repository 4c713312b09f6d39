// Fakes for the SSE tests: a clock the test drives, and a serving facade that hands the test each request's sink.
import type { Serving, StreamSink } from '../../../api/serving.ts';
import type { Clock, TimerId } from '../../../runtime/clock.ts';

/** A clock whose time the test sets (`t`) and whose timers it fires; `waits` lists the delays of those pending. */
export function manualClock(): Clock & { t: number; readonly waits: number[]; fire(): void } {
  const timers = new Map<number, { fn: () => void; ms: number }>();
  let n = 0;
  const c = {
    t: 0,
    now: () => c.t,
    setTimeout: (fn: () => void, ms: number) => (timers.set(++n, { fn, ms }), n as TimerId),
    clearTimeout: (id: TimerId) => void timers.delete(id as number),
    get waits() {
      return [...timers.values()].map((x) => x.ms);
    },
    fire: () => {
      const all = [...timers.values()];
      timers.clear();
      for (const x of all) x.fn();
    },
  };
  return c;
}

/** A serving facade that accepts every request as `r1` and hands the test its sink. */
export function servingTo(sinks: StreamSink[]): Serving {
  return {
    submit: (_req: unknown, sink: StreamSink) => {
      sinks.push(sink);
      return { ok: true, request: 'r1', model: 'm', version: 'v1', promptTokens: 2, cancel: () => {} };
    },
  } as unknown as Serving;
}
