// The in-process link of the simulator: the node link of link.ts (the same framing, codec, schema and frame cap as
// over a WebSocket) carried by a simulated wire on the virtual clock. Each side's messages of one instant leave as
// frames at that instant and arrive in (time, sequence) order after a seeded latency, FIFO per direction.
//
// The shortcut: a tick's lone message the far side can answer by itself (a step under the cost model) need not be
// framed at all when nothing else can happen before its answer arrives. The wire computes both hops exactly as two
// frames would take them (same latency, jitter draws, FIFO floor), the clock skips to the answer's arrival (refused
// if any other event comes first) and the answer is delivered. Reports are the same byte for byte; what is skipped is
// the encode, decode and schema check of those two frames. The DST and `simulate --wire-check` keep every frame.
import type { Clock } from '../runtime/clock.ts';
import type { Rng } from '../runtime/rng.ts';
import type { LaneRun, LaneShape, Msg, Runtime, StepLane } from '../runtime/system.ts';
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
  /** Lets `b` answer lone messages from `a` without the wire (null: every message is framed), and with `lane`, lets
   * `a`'s replicas run their next steps through the lane while the shortcut would answer each (runtime `a`'s lane). */
  setShortcut(shortcut: LinkShortcut | null, lane?: LaneOpener): void;
  /** `messages`: sent while their direction was open (shortcut answers included); `rejected`: frames refused on
   * arrival; `frames` and `bytes`: frames encoded; `shortcuts`: round trips answered without frames. */
  readonly stats: { messages: number; frames: number; bytes: number; rejected: number; shortcuts: number };
}

/** How the receiving side answers a message by itself, seen before anything is committed. */
export interface ShortcutAnswer {
  /** When the answer leaves the receiver. */
  sentAt: number;
  /** Events the receiver would have run between the message's arrival and the answer (its timers). */
  events: number;
  /** The answer: envelopes for the sending side. */
  replies: { to: string; msg: Msg }[];
  /** Applies the receiver's side effects (called once the skip is granted, at the answer's arrival time). */
  commit(): void;
}

/** The receiving side of a shortcut: how it would answer `msg` arriving at `arrival`, or null (take the wire). */
export type LinkShortcut = (to: string, msg: Msg, arrival: number) => ShortcutAnswer | null;

/** The node's side of a lane run: what a step of a shape takes on every rank (they take the same), and crediting
 * that time to each rank as the executor's timers would. */
export interface LaneNode {
  durationMs(shape: LaneShape): number;
  credit(ms: number): void;
}

/** Whether the node would answer every step of `replica` at `epoch` on `gpus`, sent to `to`, by itself (checked
 * once per run: nothing on the node changes but through the link's events), and how. */
export type LaneOpener = (to: string, replica: string, epoch: number, gpus: readonly number[]) => LaneNode | null;

type VClock = Clock & { at(t: number, fn: () => void): number; skipTo(t: number, events: number): boolean };

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
  /** When a frame sent at `sentAt` would arrive, using the `i`-th jitter draw from now (nothing is committed). */
  arrival(dir: 'ab' | 'ba', sentAt: number, i: number): number;
  /** Commits a shortcut's two hops as if their frames were sent: the jitter draws used, the FIFO floors. */
  commitRoundTrip(there: number, back: number): void;
}

/** Creates a two-way simulated wire on the virtual clock. */
export function createSimWire(clock: VClock, rng: Rng, opts: SimLinkOptions): SimWire {
  const open = { ab: true, ba: true };
  let extra = 0;
  type Receiver = (d: unknown) => void;
  // What arrives in each direction, by kind: bytes for the byte carriers, envelope arrays for the object carriers.
  const receivers: Record<'ab' | 'ba', { bytes?: Receiver; objects?: Receiver }> = { ab: {}, ba: {} };
  // Jitter draws taken ahead (a shortcut peeks at two before knowing it may use them); frames use them up in order,
  // so the wire's random stream is consumed exactly as without the shortcut.
  const ahead: number[] = [];
  const jitter = (i: number): number => {
    if (opts.jitterMs <= 0) return 0;
    while (ahead.length <= i) ahead.push(rng.next());
    return ahead[i]! * opts.jitterMs;
  };
  const take = (): number => {
    const j = jitter(0);
    ahead.shift();
    return j;
  };
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
    arrival: (dir, sentAt, i) => arrivalAt(dir, sentAt, jitter(i)),
    commitRoundTrip: (there, back) => {
      take();
      take();
      last.ab = there;
      last.ba = back;
    },
  };
}

/** Connects runtime `a` (control plane) and `b` (node agent) through the node link on the virtual clock. */
export function connectSimLink(a: Runtime, b: Runtime, clock: VClock, rng: Rng, opts: SimLinkOptions): SimLink {
  const wire = createSimWire(clock, rng, opts);
  const stats = { messages: 0, frames: 0, bytes: 0, rejected: 0, shortcuts: 0 };
  const defer = (flush: () => void): void => void clock.at(clock.now(), flush);
  let shortcut: LinkShortcut | null = null;
  let opener: LaneOpener | null = null;
  // True while the shortcut delivers the last report of a step: the event then ends when the delivery returns, so a
  // replica completing that step may take its next ones through the lane (nothing else would follow in this event).
  let delivering = false;
  /** Answers a lone a→b message through the shortcut; false when it must be framed. */
  const bypass = (to: string, msg: Msg): boolean => {
    if (!shortcut || !wire.isOpen('ab') || !wire.isOpen('ba')) return false;
    const there = wire.arrival('ab', clock.now(), 0);
    const answer = shortcut(to, msg, there);
    if (!answer) return false;
    const back = wire.arrival('ba', answer.sentAt, 1);
    // Stood in for: the first frame's delivery, the receiver's timers, the answer's flush and its delivery.
    if (!clock.skipTo(back, 3 + answer.events)) return false;
    wire.commitRoundTrip(there, back);
    stats.messages += answer.replies.length;
    stats.shortcuts++;
    answer.commit();
    const n = answer.replies.length;
    for (let i = 0; i < n - 1; i++) a.send(answer.replies[i]!.to, answer.replies[i]!.msg);
    if (n > 0) {
      delivering = true;
      try {
        a.send(answer.replies[n - 1]!.to, answer.replies[n - 1]!.msg);
      } finally {
        delivering = false;
      }
    }
    return true;
  };
  // Each side's link sends its runtime's messages and delivers what the other side sent to its own runtime.
  const side = (
    carrier: FrameCarrier,
    objects: ObjectCarrier,
    local: Runtime,
    sc?: (to: string, msg: Msg) => boolean,
  ): Link =>
    createLink(carrier, {
      accepts: () => true,
      deliver: (dest, msg) => local.send(dest, msg as Msg),
      onRefused: () => stats.rejected++,
      defer,
      ...(sc ? { bypass: sc } : {}),
      ...(opts.codec === false ? { objects } : {}),
    });
  const linkA = side(wire.ab, wire.objects.ab, a, bypass);
  const linkB = side(wire.ba, wire.objects.ba, b);
  const sender = (link: Link, dir: 'ab' | 'ba') => (dest: string, msg: Msg) => {
    // A cut direction loses what is sent: nothing is queued or scheduled.
    if (!wire.isOpen(dir)) return;
    // A gang's report counts as the one report per rank it stands for (NodeAgentOptions.gangs).
    stats.messages += msg.type === 'step.completed' && msg.gang ? msg.gang.length : 1;
    link.send(dest, msg);
  };
  a.setRemote(sender(linkA, 'ab'));
  b.setRemote(sender(linkB, 'ba'));
  /**
   * A step through the lane is what the shortcut does with a step sent alone: the sender counts the message, its
   * flush is one event, the shortcut's hop there, the ranks' timers, the reports' flush and their delivery are the
   * others, the same jitter draws are taken and the ranks are credited. It holds only when the step would have been
   * alone in its flush (nothing else queued) and its flush the next event (nothing pending up to the reports).
   */
  const lane: StepLane = {
    open: (replica, epoch, gpus) => {
      if (!delivering || !shortcut || !opener) return null;
      const node = opener('node', replica, epoch, gpus);
      if (!node) return null;
      const run: LaneRun = {
        roundTrip: (shape) => {
          if (linkA.queued() > 0 || !wire.isOpen('ab') || !wire.isOpen('ba')) return null;
          const there = wire.arrival('ab', clock.now(), 0);
          const busyMs = node.durationMs(shape);
          const back = wire.arrival('ba', there + (busyMs > 0 ? busyMs : 0), 1);
          if (!clock.skipTo(back, 4 + gpus.length)) return null;
          wire.commitRoundTrip(there, back);
          stats.messages += 1 + gpus.length;
          stats.shortcuts++;
          linkA.stats.messagesOut++;
          node.credit(busyMs);
          return busyMs;
        },
      };
      return run;
    },
  };
  a.setLane(lane);
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
      get shortcuts() {
        return stats.shortcuts;
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
    setShortcut: (s, l) => {
      shortcut = s;
      opener = s ? (l ?? null) : null;
    },
  };
}
