// The in-process link of the simulator: every message is encoded and decoded by the real codec and validated,
// then delivered in (time, sequence) order with a seeded latency, FIFO per direction.
import type { Clock } from '../actors/runtime/clock.ts';
import type { Rng } from '../actors/runtime/rng.ts';
import type { Msg, Runtime } from '../actors/runtime/system.ts';
import { decodeMessage, encode } from './codec.ts';
import { nodeMessageSchema } from './protocol.ts';
import { obj, str } from './schema.ts';

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
  readonly stats: { messages: number; bytes: number; rejected: number };
}

/** Connects runtime `a` (control plane) and `b` (node agent) through the codec and the virtual clock. */
export function connectSimLink(a: Runtime, b: Runtime, clock: Clock & { at(t: number, fn: () => void): number }, rng: Rng, opts: SimLinkOptions): SimLink {
  const stats = { messages: 0, bytes: 0, rejected: 0 };
  let aToB = true;
  let bToA = true;
  const last = { ab: 0, ba: 0 };
  const pipe = (to: Runtime, dir: 'ab' | 'ba') => (dest: string, msg: Msg): void => {
    if (dir === 'ab' ? !aToB : !bToA) return;
    const bytes = encode({ to: dest, msg });
    stats.messages++;
    stats.bytes += bytes.length;
    const jitter = opts.jitterMs > 0 ? rng.next() * opts.jitterMs : 0;
    const at = Math.max(clock.now() + opts.latencyMs + jitter, last[dir]);
    last[dir] = at;
    clock.at(at, () => {
      if (dir === 'ab' ? !aToB : !bToA) return;
      const frame = decodeEnvelope(bytes);
      if (!frame) {
        stats.rejected++;
        return;
      }
      to.send(frame.to, frame.msg);
    });
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
  };
}

function decodeEnvelope(bytes: Uint8Array): { to: string; msg: Msg } | null {
  const env = decodeMessage(bytes, envelopeSchema);
  if (!env.ok) return null;
  return env.value as { to: string; msg: Msg };
}

const envelopeSchema = obj({ to: str({ min: 1, max: 200 }), msg: nodeMessageSchema });
