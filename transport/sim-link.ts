// The in-process link of the simulator: the node link of link.ts (the same framing, codec, schema and frame cap as
// over a WebSocket) carried by a simulated wire on the virtual clock. Each side's messages of one instant leave as
// frames at that instant and arrive in (time, sequence) order after a seeded latency, FIFO per direction.
import type { Clock } from '../runtime/clock.ts';
import type { Rng } from '../runtime/rng.ts';
import type { Msg, Runtime } from '../runtime/system.ts';
import { createLink, type FrameCarrier, type Link, type ObjectCarrier } from './link.ts';

/** Latency of a simulated link. */
export interface SimLinkOptions {
  latencyMs: number;
  jitterMs: number;
  /** Frames cross the codec as bytes (encode, pre-scan, decode, schema check); false: they travel as envelope
   * arrays with the same framing, order and timing (the DST and `--wire-check` keep the codec). Default true. */
  codec?: boolean;
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
  /** `messages`: sent while their direction was open; `rejected`: frames refused on arrival; `frames` and `bytes`:
   * frames encoded. */
  readonly stats: { messages: number; frames: number; bytes: number; rejected: number };
}

type VClock = Clock & { at(t: number, fn: () => void): number };

/** The simulated wire: one direction is open or cut; what is sent arrives after latency (+ jitter), in order. */
export interface SimWire {
  /** The carrier each side's link sends on (`ab`: a's frames to b) and receives from (`ba` is b's sending side). */
  readonly ab: FrameCarrier;
  readonly ba: FrameCarrier;
  /** The same two directions carrying frames as envelope arrays (one wire: timing, order and cuts are shared). */
  readonly objects: { readonly ab: ObjectCarrier; readonly ba: ObjectCarrier };
  setOpen(dir: 'ab' | 'ba', open: boolean): void;
  isOpen(dir: 'ab' | 'ba'): boolean;
  setExtraLatency(ms: number): void;
}

/** Creates a two-way simulated wire on the virtual clock. */
export function createSimWire(clock: VClock, rng: Rng, opts: SimLinkOptions): SimWire {
  const open = { ab: true, ba: true };
  let extra = 0;
  type Receiver = (d: unknown) => void;
  // What arrives in each direction, by kind: bytes for the byte carriers, envelope arrays for the object carriers.
  const receivers: Record<'ab' | 'ba', { bytes?: Receiver; objects?: Receiver }> = { ab: {}, ba: {} };
  const take = (): number => (opts.jitterMs <= 0 ? 0 : rng.next() * opts.jitterMs);
  const last = { ab: 0, ba: 0 };
  const arrivalAt = (dir: 'ab' | 'ba', sentAt: number, j: number): number =>
    Math.max(sentAt + opts.latencyMs + extra + j, last[dir]);
  /** Sends one frame in `dir`: it arrives after latency (+ jitter), in order, unless the direction is cut by then. */
  const sendOn = (dir: 'ab' | 'ba', kind: 'bytes' | 'objects', data: unknown): boolean => {
    if (!open[dir]) return false;
    const at = arrivalAt(dir, clock.now(), take());
    last[dir] = at;
    const back = dir === 'ab' ? 'ba' : 'ab';
    clock.at(at, () => {
      if (open[dir]) receivers[back][kind]?.(data);
    });
    return true;
  };
  const carrier = (dir: 'ab' | 'ba'): FrameCarrier => ({
    isOpen: () => open[dir],
    send: (bytes) => sendOn(dir, 'bytes', bytes),
    // Frames sent in the other direction arrive here.
    onMessage: (fn) => {
      receivers[dir].bytes = fn as Receiver;
    },
    close: () => {
      open.ab = false;
      open.ba = false;
    },
  });
  const objectCarrier = (dir: 'ab' | 'ba'): ObjectCarrier => ({
    send: (frame) => sendOn(dir, 'objects', frame),
    onMessage: (fn) => {
      receivers[dir].objects = fn as Receiver;
    },
  });
  return {
    ab: carrier('ab'),
    ba: carrier('ba'),
    objects: { ab: objectCarrier('ab'), ba: objectCarrier('ba') },
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
  const stats = { messages: 0, rejected: 0 };
  const defer = (flush: () => void): void => void clock.at(clock.now(), flush);
  // Each side's link sends its runtime's messages and delivers what the other side sent to its own runtime.
  const side = (carrier: FrameCarrier, objects: ObjectCarrier, local: Runtime): Link =>
    createLink(carrier, {
      accepts: () => true,
      deliver: (dest, msg) => local.send(dest, msg as Msg),
      onRefused: () => stats.rejected++,
      defer,
      ...(opts.codec === false ? { objects } : {}),
    });
  const linkA = side(wire.ab, wire.objects.ab, a);
  const linkB = side(wire.ba, wire.objects.ba, b);
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
