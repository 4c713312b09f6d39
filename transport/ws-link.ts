// The node link over a WebSocket: the messages a runtime sends in one tick travel as one msgpack frame (an array of
// envelopes), and every incoming frame is decoded by the hardened codec and validated before any envelope is delivered.
import type { Msg } from '../runtime/system.ts';
import { decodeMessage, encode } from './codec.ts';
import { nodeMessageSchema, type NodeMessage } from './protocol.ts';
import { arr, obj, str, type Infer } from './schema.ts';
import type { WsPeer } from './ws.ts';

/** Most envelopes in one frame; a busier tick is split over several frames. */
export const MAX_ENVELOPES_PER_FRAME = 1024;
/** Most envelopes queued for one link before it is declared overrun (the link is then closed). */
export const MAX_QUEUED_ENVELOPES = 100_000;

const envelope = obj({ to: str({ min: 1, max: 200 }), msg: nodeMessageSchema });
/** The schema of one node-link frame. */
export const nodeFrameSchema = arr(envelope, { min: 1, max: MAX_ENVELOPES_PER_FRAME });

/** One addressed message on the node link. */
export type Envelope = Infer<typeof envelope>;

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
   * loop's turn (a zero-delay timer on the wall clock) also gathers what several I/O callbacks of that turn queued.
   */
  defer?(flush: () => void): void;
}

/** A link: `send` queues, the queue is flushed as frames at the end of the tick. */
export interface Link {
  send(to: string, msg: Msg): void;
  /** Sends whatever is queued now. */
  flush(): void;
  readonly stats: LinkStats;
}

/** Runs the node protocol over `peer`. */
export function createLink(peer: WsPeer, opts: LinkOptions): Link {
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

  const flush = (): void => {
    scheduled = false;
    if (queue.length === 0) return;
    const out = queue;
    queue = [];
    if (!peer.isOpen()) {
      stats.dropped += out.length;
      return;
    }
    for (let i = 0; i < out.length; i += MAX_ENVELOPES_PER_FRAME) {
      const bytes = encode(out.slice(i, i + MAX_ENVELOPES_PER_FRAME));
      stats.framesOut++;
      stats.bytesOut += bytes.length;
      if (!peer.send(bytes)) {
        stats.dropped += out.length - i;
        return;
      }
    }
    stats.messagesOut += out.length;
  };

  peer.onMessage((data) => {
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
    for (const e of frame.value) {
      if (!opts.accepts(e.to)) {
        stats.misaddressed++;
        continue;
      }
      stats.messagesIn++;
      opts.deliver(e.to, e.msg as NodeMessage);
    }
  });

  return {
    stats,
    flush,
    send: (to, msg) => {
      if (queue.length >= MAX_QUEUED_ENVELOPES) {
        stats.dropped++;
        peer.close(1013, 'node link overrun');
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
