// The in-process link of the simulator: messages are batched per instant into one frame (as the WebSocket link
// batches a tick's messages), encoded and decoded by the real codec, validated against the protocol schema, and
// delivered in (time, sequence) order with a seeded latency, FIFO per direction.
import type { Clock } from '../runtime/clock.ts';
import type { Rng } from '../runtime/rng.ts';
import type { Msg, Runtime } from '../runtime/system.ts';
import { decodeMessage, encode } from './codec.ts';
import { nodeMessageSchema } from './protocol.ts';
import { arr, obj, str } from './schema.ts';

/** Latency of a simulated link. */
export interface SimLinkOptions {
  latencyMs: number;
  jitterMs: number;
}

/** A pair of connected runtimes; can be cut to simulate a partition or a crashed process. */
export interface SimLink {
  /** Stops delivery in one or both directions (messages sent meanwhile are lost). */
  cut(direction?: 'both' | 'aToB' | 'bToA'): void;
  heal(): void;
  /** Adds latency to every frame from now on (a slow network), in ms. */
  setExtraLatency(ms: number): void;
  readonly stats: { messages: number; frames: number; bytes: number; rejected: number };
}

/** The frame format: a batch of envelopes, each naming its destination entity. */
const frameSchema = arr(obj({ to: str({ min: 1, max: 200 }), msg: nodeMessageSchema }), { min: 1, max: 100_000 });

/** Connects runtime `a` (control plane) and `b` (node agent) through the codec and the virtual clock. */
export function connectSimLink(
  a: Runtime,
  b: Runtime,
  clock: Clock & { at(t: number, fn: () => void): number },
  rng: Rng,
  opts: SimLinkOptions,
): SimLink {
  const stats = { messages: 0, frames: 0, bytes: 0, rejected: 0 };
  let aToB = true;
  let bToA = true;
  let extra = 0;
  const open = (dir: 'ab' | 'ba'): boolean => (dir === 'ab' ? aToB : bToA);

  const pipe = (to: Runtime, dir: 'ab' | 'ba') => {
    let pending: { to: string; msg: Msg }[] = [];
    let last = 0;
    const flush = (): void => {
      const batch = pending;
      pending = [];
      if (!open(dir) || batch.length === 0) return;
      const bytes = encode(batch);
      stats.frames++;
      stats.bytes += bytes.length;
      const jitter = opts.jitterMs > 0 ? rng.next() * opts.jitterMs : 0;
      const at = Math.max(clock.now() + opts.latencyMs + extra + jitter, last);
      last = at;
      clock.at(at, () => {
        if (!open(dir)) return;
        const frame = decodeMessage(bytes, frameSchema);
        if (!frame.ok) {
          stats.rejected++;
          return;
        }
        for (const env of frame.value) to.send(env.to, env.msg as Msg);
      });
    };
    return (dest: string, msg: Msg): void => {
      if (!open(dir)) return;
      stats.messages++;
      if (pending.length === 0) clock.at(clock.now(), flush);
      pending.push({ to: dest, msg });
    };
  };
  a.setRemote(pipe(b, 'ab'));
  b.setRemote(pipe(a, 'ba'));
  return {
    stats,
    cut: (direction = 'both') => {
      if (direction !== 'bToA') aToB = false;
      if (direction !== 'aToB') bToA = false;
    },
    heal: () => {
      aToB = true;
      bToA = true;
    },
    setExtraLatency: (ms) => {
      extra = ms;
    },
  };
}
