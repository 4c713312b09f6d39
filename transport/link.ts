// The node link, one implementation over any frame carrier: the messages a runtime sends in one tick travel as
// msgpack frames of at most MAX_ENVELOPES_PER_FRAME envelopes, and every incoming frame is decoded by the hardened
// codec and validated against the protocol schema before any envelope is delivered. The WebSocket link runs it over
// a socket (a WsPeer is a FrameCarrier), the simulated link (sim-link.ts) over a wire on the virtual clock; both
// pass one conformance suite (test/transport/link-conformance.ts).
import type { Msg } from '../runtime/system.ts';
import { decodeMessage, encode } from './codec.ts';
import { writeForwardedFrame } from './frame-writer.ts';
import { forwardedOf } from './forward.ts';
import { nodeMessageSchema, type NodeMessage } from './protocol.ts';
import { arr, obj, str, type Infer } from './schema.ts';

/** Most envelopes in one frame, on every link; a busier tick is split over several frames. */
export const MAX_ENVELOPES_PER_FRAME = 1024;
/** Most envelopes queued for one link before it is declared overrun (the carrier is then closed). */
export const MAX_QUEUED_ENVELOPES = 100_000;

const envelope = obj({ to: str({ min: 1, max: 200 }), msg: nodeMessageSchema });
/** The schema of one node-link frame. */
export const nodeFrameSchema = arr(envelope, { min: 1, max: MAX_ENVELOPES_PER_FRAME });

/** One addressed message on the node link. */
export type Envelope = Infer<typeof envelope>;

/** What a link needs of the thing that carries its frames (a WebSocket peer satisfies it). */
export interface FrameCarrier {
  isOpen(): boolean;
  /** Sends one frame; false when it was not sent (closed, or cut off). */
  send(data: Uint8Array | string): boolean;
  onMessage(fn: (data: Uint8Array | string) => void): void;
  close(code?: number, reason?: string): void;
}

/**
 * A carrier of frames as envelope arrays, for two sides in one process (the simulator's wire without `--wire-check`):
 * the same framing, order and timing as bytes, without the codec round trip (whose only proof there is the codec's
 * own; the DST and `--wire-check` keep it).
 */
export interface ObjectCarrier {
  send(frame: readonly { to: string; msg: Msg }[]): boolean;
  onMessage(fn: (frame: readonly { to: string; msg: Msg }[]) => void): void;
}

/** Counters of a link. */
export interface LinkStats {
  framesIn: number;
  framesOut: number;
  messagesIn: number;
  messagesOut: number;
  bytesIn: number;
  bytesOut: number;
  /** Frames refused by the codec or the schema. */
  refused: number;
  /** Envelopes whose destination this side does not accept. */
  misaddressed: number;
  /** Messages dropped because the link was closed. */
  dropped: number;
}

/** Options of a link. */
export interface LinkOptions {
  /** Which local destinations a peer may address (the control plane accepts `placement` and replicas, a node its GPUs). */
  accepts(to: string): boolean;
  /** Delivers a validated envelope. */
  deliver(to: string, msg: NodeMessage): void;
  /** Called with each refused frame's reason. */
  onRefused?(reason: string): void;
  /**
   * Schedules the flush of what was queued (default: the end of the current task). Deferring to the end of the event
   * loop's turn (a zero-delay timer on the wall clock) also gathers what several I/O callbacks of that turn queued;
   * the simulated link flushes at the current instant of the virtual clock.
   */
  defer?(flush: () => void): void;
  /** Frames travel as envelope arrays on this carrier instead of as bytes on the frame carrier (see ObjectCarrier). */
  objects?: ObjectCarrier;
}

/** One side of a node link: `send` queues, the queue is flushed as frames at the end of the tick. */
export interface Link {
  send(to: string, msg: Msg): void;
  /** Sends whatever is queued now. */
  flush(): void;
  /** Messages waiting for the next flush. */
  queued(): number;
  readonly stats: LinkStats;
}

/** Runs the node protocol over `carrier`. */
export function createLink(carrier: FrameCarrier, opts: LinkOptions): Link {
  const stats: LinkStats = {
    framesIn: 0,
    framesOut: 0,
    messagesIn: 0,
    messagesOut: 0,
    bytesIn: 0,
    bytesOut: 0,
    refused: 0,
    misaddressed: 0,
    dropped: 0,
  };
  let queue: { to: string; msg: Msg }[] = [];
  let scheduled = false;
  const { objects } = opts;

  /** Sends one frame of envelopes; false when the carrier did not take it. */
  const sendFrame = (part: readonly { to: string; msg: Msg }[]): boolean => {
    stats.framesOut++;
    if (objects) return objects.send(part);
    const bytes = encode(part);
    stats.bytesOut += bytes.length;
    return carrier.send(bytes);
  };
  /** Sends a forwarded message (forward.ts) in a frame of its own, its map's bytes as they came. */
  const sendForwarded = (e: { to: string; msg: Msg }): boolean => {
    const f = forwardedOf(e.msg);
    if (!f || objects) return sendFrame([e]);
    stats.framesOut++;
    const bytes = writeForwardedFrame(e.to, f);
    stats.bytesOut += bytes.length;
    return carrier.send(bytes);
  };

  const flush = (): void => {
    scheduled = false;
    if (queue.length === 0) return;
    const out = queue;
    queue = [];
    if (!carrier.isOpen()) {
      stats.dropped += out.length;
      return;
    }
    // Frames of at most MAX_ENVELOPES_PER_FRAME envelopes, in order; a forwarded message alone in its frame.
    let from = 0;
    for (let i = 0; i <= out.length; i++) {
      const forwarded = i < out.length && forwardedOf(out[i]!.msg) !== undefined;
      if (i < out.length && !forwarded && i - from < MAX_ENVELOPES_PER_FRAME) continue;
      if (i > from && !sendFrame(from === 0 && i === out.length ? out : out.slice(from, i))) {
        stats.dropped += out.length - from;
        return;
      }
      from = i;
      if (!forwarded) continue;
      if (!sendForwarded(out[i]!)) {
        stats.dropped += out.length - i;
        return;
      }
      from = i + 1;
    }
    stats.messagesOut += out.length;
  };

  const deliverAll = (envelopes: readonly { to: string; msg: Msg }[]): void => {
    for (const e of envelopes) {
      if (!opts.accepts(e.to)) {
        stats.misaddressed++;
        continue;
      }
      stats.messagesIn++;
      opts.deliver(e.to, e.msg as NodeMessage);
    }
  };
  objects?.onMessage((frame) => {
    stats.framesIn++;
    deliverAll(frame);
  });

  carrier.onMessage((data) => {
    if (typeof data === 'string') {
      stats.refused++;
      opts.onRefused?.('text frame on the node link');
      return;
    }
    stats.framesIn++;
    stats.bytesIn += data.length;
    const frame = decodeMessage(data, nodeFrameSchema);
    if (!frame.ok) {
      stats.refused++;
      opts.onRefused?.(
        `${frame.error.code}: ${frame.error.message}${frame.error.path ? ` at ${frame.error.path}` : ''}`,
      );
      return;
    }
    deliverAll(frame.value);
  });

  return {
    stats,
    flush,
    queued: () => queue.length,
    send: (to, msg) => {
      if (queue.length >= MAX_QUEUED_ENVELOPES) {
        stats.dropped++;
        carrier.close(1013, 'node link overrun');
        return;
      }
      queue.push({ to, msg });
      if (!scheduled) {
        scheduled = true;
        // Everything the actors said in this tick (or turn, with `defer`) goes out together.
        (opts.defer ?? queueMicrotask)(flush);
      }
    },
  };
}
