// The in-process link of the simulator: messages are batched per instant into one frame (as the WebSocket link
// batches a tick's messages), encoded and decoded by the real codec, validated against the protocol schema, and
// delivered in (time, sequence) order with a seeded latency, FIFO per direction.
//
// The shortcut: a frame that holds one message the far side can answer by itself (a step under the cost model)
// need not cross the codec at all when nothing else can happen before its answer arrives. The link then computes
// both hops exactly as two frames would take them (same latency, jitter draws, FIFO floor), asks the clock to skip
// to the answer's arrival (refused if any other event comes first), and delivers the answer. Reports are the same
// byte for byte; what is skipped is the encode, decode and schema check of those two frames. `wireCheck` keeps
// every frame on the codec (the DST does by default).
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
  /** Lets `b` answer lone messages from `a` without the codec (null: every frame takes the wire). */
  setShortcut(shortcut: LinkShortcut | null): void;
  /** messages and frames count shortcut hops as well; bytes only frames that were encoded. */
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

/** The frame format: a batch of envelopes, each naming its destination entity. */
const frameSchema = arr(obj({ to: str({ min: 1, max: 200 }), msg: nodeMessageSchema }), { min: 1, max: 100_000 });

/** Connects runtime `a` (control plane) and `b` (node agent) through the codec and the virtual clock. */
export function connectSimLink(
  a: Runtime,
  b: Runtime,
  clock: Clock & { at(t: number, fn: () => void): number; skipTo(t: number, events: number): boolean },
  rng: Rng,
  opts: SimLinkOptions,
): SimLink {
  const stats = { messages: 0, frames: 0, bytes: 0, rejected: 0, shortcuts: 0 };
  let aToB = true;
  let bToA = true;
  let extra = 0;
  let shortcut: LinkShortcut | null = null;
  const open = (dir: 'ab' | 'ba'): boolean => (dir === 'ab' ? aToB : bToA);
  // Jitter draws taken ahead (a shortcut peeks at two before knowing it may use them); frames use them up in order,
  // so the link's random stream is consumed exactly as without the shortcut.
  const ahead: number[] = [];
  const peekJitter = (i: number): number => {
    if (opts.jitterMs <= 0) return 0;
    while (ahead.length <= i) ahead.push(rng.next());
    return ahead[i]! * opts.jitterMs;
  };
  const takeJitter = (): number => {
    const j = peekJitter(0);
    ahead.shift();
    return j;
  };
  const last = { ab: 0, ba: 0 };
  const arrival = (dir: 'ab' | 'ba', sentAt: number, jitter: number): number =>
    Math.max(sentAt + opts.latencyMs + extra + jitter, last[dir]);

  /** Answers a lone a→b message through the shortcut; false when it must take the wire. */
  const tryShortcut = (env: { to: string; msg: Msg }): boolean => {
    if (!shortcut || !aToB || !bToA) return false;
    const there = arrival('ab', clock.now(), peekJitter(0));
    const answer = shortcut(env.to, env.msg, there);
    if (!answer) return false;
    const back = arrival('ba', answer.sentAt, peekJitter(1));
    // Stood in for: the first frame's delivery, the receiver's timers, the answer's flush and its delivery.
    if (!clock.skipTo(back, 3 + answer.events)) return false;
    takeJitter();
    takeJitter();
    last.ab = there;
    last.ba = back;
    stats.frames += 2;
    stats.messages += answer.replies.length;
    stats.shortcuts++;
    answer.commit();
    for (const r of answer.replies) a.send(r.to, r.msg);
    return true;
  };

  const pipe = (to: Runtime, dir: 'ab' | 'ba') => {
    let pending: { to: string; msg: Msg }[] = [];
    const flush = (): void => {
      const batch = pending;
      pending = [];
      if (!open(dir) || batch.length === 0) return;
      if (dir === 'ab' && batch.length === 1 && tryShortcut(batch[0]!)) return;
      const bytes = encode(batch);
      stats.frames++;
      stats.bytes += bytes.length;
      const at = arrival(dir, clock.now(), takeJitter());
      last[dir] = at;
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
    setShortcut: (s) => {
      shortcut = s;
    },
  };
}
