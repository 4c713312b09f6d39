// The in-process link of the simulator: the node link of link.ts (the same framing, codec, schema and frame cap as
// over a WebSocket) carried by a simulated wire on the virtual clock. Each side's messages of one instant leave as
// frames at that instant and arrive in (time, sequence) order after a seeded latency, FIFO per direction.
import type { Clock } from '../runtime/clock.ts';
import type { Rng } from '../runtime/rng.ts';
import type { Msg, Runtime } from '../runtime/system.ts';
import { createLink, type FrameCarrier, type Link } from './link.ts';

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
  /** The two sides: `a` sends from runtime a to b, `b` from b to a. */
  readonly a: Link;
  readonly b: Link;
  /** `messages`: sent while their direction was open; `rejected`: frames refused on arrival. */
  readonly stats: { messages: number; frames: number; bytes: number; rejected: number };
}

type VClock = Clock & { at(t: number, fn: () => void): number };

/** The simulated wire: one direction is open or cut; what is sent arrives after latency (+ jitter), in order. */
export interface SimWire {
  /** The carrier each side's link sends on (`ab`: a's frames to b) and receives from (`ba` is b's sending side). */
  readonly ab: FrameCarrier;
  readonly ba: FrameCarrier;
  setOpen(dir: 'ab' | 'ba', open: boolean): void;
  isOpen(dir: 'ab' | 'ba'): boolean;
  setExtraLatency(ms: number): void;
}

/** Creates a two-way simulated wire on the virtual clock. */
export function createSimWire(clock: VClock, rng: Rng, opts: SimLinkOptions): SimWire {
  const open = { ab: true, ba: true };
  let extra = 0;
  const receivers: { ab?: (d: Uint8Array | string) => void; ba?: (d: Uint8Array | string) => void } = {};
  const carrier = (dir: 'ab' | 'ba'): FrameCarrier => {
    const back = dir === 'ab' ? 'ba' : 'ab';
    let last = 0;
    return {
      isOpen: () => open[dir],
      send: (bytes) => {
        if (!open[dir]) return false;
        const jitter = opts.jitterMs > 0 ? rng.next() * opts.jitterMs : 0;
        const at = Math.max(clock.now() + opts.latencyMs + extra + jitter, last);
        last = at;
        clock.at(at, () => {
          if (open[dir]) receivers[back]?.(bytes);
        });
        return true;
      },
      // Frames sent in the other direction arrive here.
      onMessage: (fn) => {
        receivers[dir] = fn;
      },
      close: () => {
        open.ab = false;
        open.ba = false;
      },
    };
  };
  return {
    ab: carrier('ab'),
    ba: carrier('ba'),
    setOpen: (dir, o) => {
      open[dir] = o;
    },
    isOpen: (dir) => open[dir],
    setExtraLatency: (ms) => {
      extra = ms;
    },
  };
}

/** Connects runtime `a` (control plane) and `b` (node agent) through the node link on the virtual clock. */
export function connectSimLink(a: Runtime, b: Runtime, clock: VClock, rng: Rng, opts: SimLinkOptions): SimLink {
  const wire = createSimWire(clock, rng, opts);
  const stats = { messages: 0, frames: 0, bytes: 0, rejected: 0 };
  const defer = (flush: () => void): void => void clock.at(clock.now(), flush);
  // Each side's link sends its runtime's messages and delivers what the other side sent to its own runtime.
  const side = (carrier: FrameCarrier, local: Runtime): Link =>
    createLink(carrier, {
      accepts: () => true,
      deliver: (dest, msg) => local.send(dest, msg as Msg),
      onRefused: () => stats.rejected++,
      defer,
    });
  const linkA = side(wire.ab, a);
  const linkB = side(wire.ba, b);
  const sender = (link: Link, dir: 'ab' | 'ba') => (dest: string, msg: Msg) => {
    // A cut direction loses what is sent: nothing is queued or scheduled.
    if (!wire.isOpen(dir)) return;
    stats.messages++;
    link.send(dest, msg);
  };
  a.setRemote(sender(linkA, 'ab'));
  b.setRemote(sender(linkB, 'ba'));
  const sum = (k: 'framesOut' | 'bytesOut'): number => linkA.stats[k] + linkB.stats[k];
  return {
    a: linkA,
    b: linkB,
    stats: {
      get messages() {
        return stats.messages;
      },
      get frames() {
        return sum('framesOut');
      },
      get bytes() {
        return sum('bytesOut');
      },
      get rejected() {
        return stats.rejected;
      },
    },
    cut: (direction = 'both') => {
      if (direction !== 'bToA') wire.setOpen('ab', false);
      if (direction !== 'aToB') wire.setOpen('ba', false);
    },
    heal: () => {
      wire.setOpen('ab', true);
      wire.setOpen('ba', true);
    },
    setExtraLatency: (ms) => wire.setExtraLatency(ms),
  };
}
