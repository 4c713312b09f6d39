// Graceful stop at the edge: once draining, new requests are refused (model_unavailable, retry later) while the
// ones already accepted run on until a deadline; then each one still open is cancelled, so it gets exactly one
// terminal event, and the drain resolves when the control plane holds none.
import type { TokenLogprob } from '../machines/core-messages.ts';
import { failure } from '../machines/outcomes.ts';
import { ChurnMap } from '../runtime/churn-map.ts';
import type { Clock } from '../runtime/clock.ts';
import type { Accepted, DoneInfo, Serving, StreamSink } from './serving.ts';

/** How often the drain looks at what is left (ms). */
const POLL_MS = 25;
/** Longest wait for cancelled requests to reach their terminal event after the deadline (ms). */
const SETTLE_MS = 2_000;

/** A Serving that can be drained. */
export interface DrainGate {
  /** The wrapped Serving: refuses new requests once draining, tracks accepted ones. */
  readonly serving: Serving;
  draining(): boolean;
  /** Starts draining; resolves when `live()` is 0 (cancelling what is left at the deadline). */
  drain(deadlineMs: number, live: () => number): Promise<void>;
}

/** A sink whose request leaves the open set when it ends (a class: no closures per request). */
class Tracked implements StreamSink {
  id = '';
  ended = false;
  constructor(
    private readonly sink: StreamSink,
    private readonly open: ChurnMap<string, Accepted>,
  ) {}
  tokens(seq: number, n: number, text: string | undefined, lp?: readonly TokenLogprob[]): void {
    this.sink.tokens(seq, n, text, lp);
  }
  done(d: DoneInfo): void {
    this.forget();
    this.sink.done(d);
  }
  failed(f: Parameters<StreamSink['failed']>[0]): void {
    this.forget();
    this.sink.failed(f);
  }
  private forget(): void {
    this.ended = true;
    this.open.delete(this.id);
  }
}

/** Wraps `inner` so that it can be drained. */
export function createDrainGate(inner: Serving, clock: Clock): DrainGate {
  let draining = false;
  // Every accepted request passes through here: a Map refilled at that rate promotes what it held (churn-map.ts).
  const open = new ChurnMap<string, Accepted>();
  const serving: Serving = {
    ...inner,
    submit: (req, sink, delivery) => {
      if (draining) {
        return {
          ok: false,
          failure: { ...failure('model_unavailable', 'the server is shutting down'), retryAfterMs: 1000 },
        };
      }
      const tracked = new Tracked(sink, open);
      const r = inner.submit(req, tracked, delivery);
      if (r.ok && !tracked.ended) {
        tracked.id = r.request;
        open.set(r.request, r);
      }
      return r;
    },
  };
  const wait = (ms: number): Promise<void> => new Promise((resolve) => clock.setTimeout(resolve, ms));
  const drain = async (deadlineMs: number, live: () => number): Promise<void> => {
    draining = true;
    const until = clock.now() + deadlineMs;
    while (live() > 0 && clock.now() < until) await wait(POLL_MS);
    // Past the deadline: whatever is still open is cancelled, which ends it with one typed terminal event.
    for (const a of [...open.values()]) a.cancel();
    const settleBy = clock.now() + SETTLE_MS;
    while ((live() > 0 || open.size > 0) && clock.now() < settleBy) await wait(POLL_MS);
  };
  return { serving, draining: () => draining, drain };
}
