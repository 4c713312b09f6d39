// `/v1/ws`: one session per client socket. Submits and cancels go to the serving facade; everything said to the client
// in one tick leaves as one frame; while the socket is congested, token messages of the same request are merged so
// the outgoing queue stays bounded by the number of live requests.
import type { Clock, TimerId } from '../runtime/clock.ts';
import { ChurnMap } from '../runtime/churn-map.ts';
import { failure } from '../machines/outcomes.ts';
import {
  CLIENT_PROTOCOL_VERSION,
  decodeClientFrame,
  encodeFrame,
  formatOf,
  type ClientMessage,
  type ServerMessage,
} from '../transport/client-protocol.ts';
import { CLOSE, DEFAULT_MAX_BUFFERED, type WsPeer } from '../transport/ws.ts';
import { tokensMessage, writeFrame, type TokensEntry } from '../transport/frame-writer.ts';
import type { ServerMetrics } from './metrics.ts';
import { TOKEN_FLUSH_MS, type DoneInfo, type Serving, type StreamSink } from './serving.ts';
import type { Failure } from '../machines/outcomes.ts';
import type { TerminalOutcome } from '../actors/control-plane.ts';
import { contained } from '../runtime/contain.ts';

/** Options of the streaming API. */
export interface StreamApiOptions {
  clock: Clock;
  /** Most live requests per connection; more are rejected with `overloaded`. */
  maxStreamsPerConnection: number;
  /** Most messages in one outgoing frame. */
  maxMessagesPerFrame?: number;
  /** Retry interval while the socket is congested. */
  congestionRetryMs?: number;
  /** Most time one turn of the event loop spends on a connection's incoming frames before yielding. */
  turnBudgetMs?: number;
  /** Called at the end of each turn of frame handling, after its answers were queued: the server flushes the node
   * link here, so that a step dispatched for a request just admitted leaves now, not after another turn of the loop. */
  afterTurn?: () => void;
  /** Outgoing bytes (socket buffer plus merged messages waiting) past which a client that does not read is cut off (4001). */
  maxQueuedBytes?: number;
  /** Bytes of incoming frames waiting to be handled, across every connection; a frame past it is refused. 64 MiB. */
  maxInboundBytes?: number;
  /** The same, of one client (its tenant, token or address): one client cannot fill the budget of all. 16 MiB. */
  maxInboundBytesPerClient?: number;
  /** Least time between two frames to one client that carry only later tokens and ends (ms; TOKEN_FLUSH_MS; 0: every
   * turn of the loop). */
  tokenFlushMs?: number;
  /** The operator's log: what failed while handling one message, frame or connection (that alone fails). */
  log?(line: string): void;
}

/** Default budget of incoming frames waiting across connections. */
export const DEFAULT_MAX_INBOUND_BYTES = 64 * 1024 * 1024;
/** Default budget of one client's incoming frames waiting. */
export const DEFAULT_MAX_INBOUND_BYTES_PER_CLIENT = 16 * 1024 * 1024;

const sizeOf = (d: Uint8Array | string): number => (typeof d === 'string' ? 2 * d.length : d.byteLength);

/** Incoming frames a connection may have waiting before its socket stops being read (TCP backpressure). */
const INBOX_PAUSE = 64;
/** Longest turn of the pacer, in turn budgets: how long handling a backlog of frames may hold the event loop. */
const MAX_TURN_BUDGETS = 5;
/** Incoming frames past which a connection is closed: it kept sending after it was paused. */
const INBOX_MAX = 4096;

/** The streaming API: hand it each authenticated socket. */
export interface StreamApi {
  /** `tenant`: whose token the socket presented (its requests go through that tenant's limits and fair share);
   * `client`: whom its incoming frames count against (its tenant, token or address; default: the socket alone). */
  onConnection(peer: WsPeer, tenant?: string, client?: string): void;
  /** Live sessions. */
  sessions(): number;
  /** Live requests across sessions. */
  streams(): number;
  /** Bytes of incoming frames waiting to be handled, across sessions. */
  inboundBytes(): number;
}

/** Creates the `/v1/ws` handler over a serving facade. */
export function createStreamApi(serving: Serving, metrics: ServerMetrics, opts: StreamApiOptions): StreamApi {
  let sessions = 0;
  let streams = 0;
  const perFrame = opts.maxMessagesPerFrame ?? 4096;
  const maxQueuedBytes = opts.maxQueuedBytes ?? DEFAULT_MAX_BUFFERED;
  const log = opts.log ?? (() => {});
  // Outboxes holding answers to frames handled in the pacer's turn: a long turn sends them every budget, not at its end.
  const answering = new Set<() => void>();
  const pacer = createPacer(
    opts.clock,
    opts.turnBudgetMs ?? 10,
    () => {
      for (const answer of [...answering]) answer();
    },
    opts.afterTurn ?? (() => {}),
    log,
  );
  const maxInbound = opts.maxInboundBytes ?? DEFAULT_MAX_INBOUND_BYTES;
  const maxPerClient = opts.maxInboundBytesPerClient ?? DEFAULT_MAX_INBOUND_BYTES_PER_CLIENT;
  let inboundBytes = 0;
  const inboundOf = new Map<string, number>();

  const onConnection = (peer: WsPeer, tenant?: string, client: string = peer.remote): void => {
    // Bytes waiting count against the client's budget and the budget of all.
    const inbound = (d: number): void => {
      inboundBytes += d;
      const left = (inboundOf.get(client) ?? 0) + d;
      if (left <= 0) inboundOf.delete(client);
      else inboundOf.set(client, left);
    };
    const format = formatOf(peer.protocol);
    sessions++;
    const outbox = createOutbox(peer, format, metrics, {
      clock: opts.clock,
      perFrame,
      maxQueuedBytes,
      congestionRetryMs: opts.congestionRetryMs ?? 5,
      tokenFlushMs: opts.tokenFlushMs ?? TOKEN_FLUSH_MS,
      answering,
      log,
    });
    const push = outbox.push;
    const requests = createRequestTable(
      serving,
      metrics,
      opts.maxStreamsPerConnection,
      outbox,
      (d) => (streams += d),
      tenant,
    );

    const handle = (data: Uint8Array | string): void => {
      const frame = decodeClientFrame(data, format);
      if (!frame.ok) {
        metrics.refused('invalid_request');
        push({ type: 'error', code: frame.error.code, message: frame.error.message, retryable: false });
        return;
      }
      for (const m of frame.messages) {
        try {
          if (m.type === 'submit') requests.submit(m);
          else requests.cancel(m.id);
        } catch (e) {
          // This message alone fails: a submit the server failed on is refused (internal); the frame's others go on.
          log(`${peer.remote}: handling ${m.type} ${m.id} failed: ${contained(e)}`);
          metrics.refused('internal');
          if (m.type === 'submit' && !requests.live(m.id)) push(internalRefusal(m.id));
        }
      }
      // The answers to a frame (accepted, rejected) leave when this turn's work is done, not a loop iteration later.
      outbox.soon();
    };
    // Frames wait in a bounded inbox and are handled on later turns, round-robin across connections within one time
    // budget, so a burst of submits cannot hold back the node link, timers and other clients; a full inbox stops
    // reading its socket (TCP backpressure).
    // Over the budget shared by every connection, a frame is not kept: each submit in it is rejected (overloaded,
    // retry soon), its cancels still run, so every request still hears exactly one answer.
    const refuseFrame = (data: Uint8Array | string, whose: string, limit: number): void => {
      metrics.refused('inbound_budget');
      const frame = decodeClientFrame(data, format);
      if (!frame.ok) return;
      for (const m of frame.messages) {
        if (m.type === 'cancel') requests.cancel(m.id);
        else {
          const message = `${whose} budget for incoming frames (${limit} bytes) is full: retry soon`;
          push({ type: 'rejected', id: m.id, code: 'overloaded', message, retryable: true, retryAfterMs: 100 });
        }
      }
      outbox.soon();
    };
    const queued = (d: Uint8Array | string): void => {
      inbound(-sizeOf(d));
      handle(d);
    };
    const inbox: Inbox = { frames: [], head: 0, paused: false, handle: queued, peer };
    peer.onMessage((data) => {
      const size = sizeOf(data);
      if ((inboundOf.get(client) ?? 0) + size > maxPerClient) return refuseFrame(data, 'this client’s', maxPerClient);
      if (inboundBytes + size > maxInbound) return refuseFrame(data, 'the server’s', maxInbound);
      inbound(size);
      inbox.frames.push(data);
      const waiting = inbox.frames.length - inbox.head;
      if (waiting > INBOX_MAX) {
        peer.close(1008, 'too many frames waiting');
        return;
      }
      if (waiting >= INBOX_PAUSE && !inbox.paused) {
        inbox.paused = true;
        peer.pause();
      }
      pacer.wake(inbox);
    });
    peer.onClose(() => {
      sessions--;
      // Frames this connection left unhandled give their bytes back to the budget.
      for (let i = inbox.head; i < inbox.frames.length; i++) inbound(-sizeOf(inbox.frames[i]!));
      inbox.frames = [];
      inbox.head = 0;
      outbox.stopRetry();
      // Nobody is listening any more: stop the work (each cancel ends its request and frees its KV).
      requests.cancelAll();
      outbox.drop();
    });
    push({
      type: 'hello',
      protocol: CLIENT_PROTOCOL_VERSION,
      server: 'switchyard',
      backend: serving.backend(),
      models: serving.models().map((x) => x.name),
    });
  };

  return { onConnection, sessions: () => sessions, streams: () => streams, inboundBytes: () => inboundBytes };
}

/** The refusal of a submit the server failed on while handling it. */
const internalRefusal = (id: string): ServerMessage => {
  const f = failure('internal', `the server failed while handling request ${id}`);
  return { type: 'rejected', id, code: f.code, message: f.message, retryable: f.retryable };
};

/** A connection's waiting frames. */
interface Inbox {
  frames: (Uint8Array | string)[];
  head: number;
  paused: boolean;
  handle(data: Uint8Array | string): void;
  peer: WsPeer;
}

/**
 * Handles waiting frames round-robin across connections, one turn of the event loop at a time. A turn spends at most
 * as long as the rest of the loop took since the previous turn, and between `budgetMs` and MAX_TURN_BUDGETS times it:
 * while frames wait, handling them gets at least half of the process's time, however much the node link, timers and
 * flushes take meanwhile. (A fixed budget per turn was not enough: when steps grew, each loop took longer, the
 * frames' share of it fell, submits arrived faster than they were handled, and the backlog kept the steps large.)
 */
function createPacer(
  clock: Clock,
  budgetMs: number,
  answer: () => void,
  afterTurn: () => void,
  log: (line: string) => void,
): { wake(inbox: Inbox): void } {
  const ready: Inbox[] = [];
  const queued = new Set<Inbox>();
  let scheduled = false;
  // When the previous turn ended, while frames were still waiting (-1: none were).
  let lastEnd = -1;
  const turn = (): void => {
    scheduled = false;
    const start = clock.now();
    const rest = lastEnd >= 0 ? start - lastEnd : 0;
    const until = start + Math.min(MAX_TURN_BUDGETS * budgetMs, Math.max(budgetMs, rest));
    // The answers to the frames handled so far leave every budget of a long turn.
    let answerAt = start + budgetMs;
    while (ready.length > 0 && clock.now() < until) {
      if (clock.now() >= answerAt) {
        answer();
        answerAt = clock.now() + budgetMs;
      }
      const box = ready.shift()!;
      const d = box.frames[box.head];
      if (d !== undefined && box.peer.isOpen()) {
        box.frames[box.head++] = '';
        try {
          box.handle(d);
        } catch (e) {
          // Handling the frame failed past its messages' own handling: its connection alone is closed (1011), which
          // cancels its requests and releases what they held; the pacer serves the other connections on.
          log(`${box.peer.remote}: handling a frame failed, closing the connection: ${contained(e)}`);
          box.peer.close(CLOSE.internalError, 'internal error');
        }
      }
      if (box.head < box.frames.length && box.peer.isOpen()) ready.push(box);
      else {
        queued.delete(box);
        box.frames = [];
        box.head = 0;
      }
      if (box.paused && box.frames.length - box.head < INBOX_PAUSE / 2) {
        box.paused = false;
        box.peer.resume();
      }
    }
    lastEnd = ready.length > 0 ? clock.now() : -1;
    if (ready.length > 0) schedule();
    afterTurn();
  };
  const schedule = (): void => {
    if (scheduled) return;
    scheduled = true;
    clock.setTimeout(turn, 0);
  };
  return {
    wake: (box) => {
      if (!queued.has(box)) {
        queued.add(box);
        ready.push(box);
      }
      schedule();
    },
  };
}

/**
 * One request's stream to its client: the sink serving talks to, and its tokens while they wait in the outbox,
 * merged per frame (reused for every frame; `gen` names the outbox's batch they wait in, -1 once the request ended).
 * A class, so a request costs no closures and a token touches this one object on its way to the outbox.
 */
class TokensSlot implements TokensEntry, StreamSink {
  seq = 0;
  n = 0;
  text: string | undefined = undefined;
  gen = -1;
  head: Uint8Array | undefined = undefined;
  constructor(
    readonly id: string,
    private readonly outbox: Pick<Outbox, 'push' | 'pushTokens'>,
    private readonly ended: (id: string) => void,
  ) {}
  tokens(seq: number, n: number, text: string | undefined): void {
    this.outbox.pushTokens(this, seq, n, text);
  }
  done(info: DoneInfo): void {
    this.end();
    this.outbox.push({ type: 'done', id: this.id, ...info });
  }
  failed(f: Failure & { outcome: TerminalOutcome['outcome'] }): void {
    this.end();
    this.outbox.push({
      type: 'error',
      id: this.id,
      code: f.code,
      message: f.message,
      retryable: f.retryable,
      ...(f.retryAfterMs !== undefined ? { retryAfterMs: f.retryAfterMs } : {}),
    });
  }
  private end(): void {
    // Nothing merges into tokens queued before the request's end.
    this.gen = -1;
    this.ended(this.id);
  }
}

const isSlot = (x: unknown): boolean => x instanceof TokensSlot;

/** A connection's outgoing queue. */
interface Outbox {
  /** Queues a message; it leaves with the others queued in this turn. */
  push(m: ServerMessage): void;
  /** Queues a request's tokens, merged into its tokens message still waiting (same turn, or congested). */
  pushTokens(slot: TokensSlot, seq: number, n: number, text: string | undefined): void;
  /** Sends what is queued at the end of the current task instead of the end of the loop's turn. */
  soon(): void;
  /** Cancels a pending congestion retry (the connection closed); later pushes are no longer scheduled. */
  stopRetry(): void;
  /** Drops whatever is still queued. */
  drop(): void;
}

/** Everything said to the client in one tick leaves as one frame; while the socket is congested, token messages of
 * the same request are merged, and a client whose backlog passes `maxQueuedBytes` is cut off. */
function createOutbox(
  peer: WsPeer,
  format: ReturnType<typeof formatOf>,
  metrics: ServerMetrics,
  o: {
    clock: Clock;
    perFrame: number;
    maxQueuedBytes: number;
    congestionRetryMs: number;
    tokenFlushMs: number;
    answering: Set<() => void>;
    log: (line: string) => void;
  },
): Outbox {
  let out: (ServerMessage | TokensSlot)[] = [];
  // Which batch `out` holds: a request's slot merges tokens only into a message of the current batch.
  let gen = 0;
  // A flush at the end of the loop's turn is scheduled (something in `out` may not wait), or a deferred one is armed
  // for `lastSentAt + tokenFlushMs` (only later tokens and ends wait).
  let scheduled = false;
  let deferred: TimerId | null = null;
  let lastSentAt = -Infinity;
  let retry: TimerId | null = null;
  // Rough size of what waits in `out` (merged token text included): a client that never reads is bounded by it.
  let waitingBytes = 0;

  const flush = (): void => {
    scheduled = false;
    if (deferred !== null) {
      o.clock.clearTimeout(deferred);
      deferred = null;
    }
    if (out.length === 0 || !peer.isOpen()) return;
    if (peer.congested()) {
      if (peer.bufferedAmount() + waitingBytes > o.maxQueuedBytes) {
        metrics.refused('slow_consumer');
        peer.close(CLOSE.slowConsumer, 'too slow reading');
        peer.terminate();
        return;
      }
      if (retry === null) {
        retry = o.clock.setTimeout(() => {
          retry = null;
          flush();
        }, o.congestionRetryMs);
      }
      return;
    }
    const msgs = out;
    out = [];
    gen++;
    waitingBytes = 0;
    lastSentAt = o.clock.now();
    try {
      for (let i = 0; i < msgs.length; i += o.perFrame) {
        const part = i === 0 && msgs.length <= o.perFrame ? msgs : msgs.slice(i, i + o.perFrame);
        // msgpack frames are written directly (tokens from their slots); JSON ones from the messages.
        peer.send(
          format === 'msgpack'
            ? writeFrame(part, isSlot)
            : encodeFrame(
                part.map((x) => (x instanceof TokensSlot ? tokensMessage(x) : x)),
                format,
              ),
        );
      }
    } catch (e) {
      // A frame that cannot be written leaves this client's stream with a gap: its connection alone is closed (1011),
      // which cancels its requests and releases what they held.
      o.log(`${peer.remote}: writing a frame failed, closing the connection: ${contained(e)}`);
      peer.close(CLOSE.internalError, 'internal error');
    }
  };
  const flushDeferred = (): void => {
    deferred = null;
    flush();
  };
  /** Schedules the flush of what was just queued: at the end of the loop's turn (tokens from every step applied in
   * this turn share one frame per client) when it may not wait (`urgent`) or the client's last frame is older than
   * tokenFlushMs; otherwise when it is that old. */
  const schedule = (urgent: boolean): void => {
    if (scheduled || retry !== null) return;
    const wait = urgent ? 0 : lastSentAt + o.tokenFlushMs - o.clock.now();
    if (wait <= 0) {
      scheduled = true;
      o.clock.setTimeout(flush, 0);
    } else if (deferred === null) {
      deferred = o.clock.setTimeout(flushDeferred, wait);
    }
  };
  const push = (m: ServerMessage): void => {
    waitingBytes += m.type === 'tokens' ? 24 + (m.text?.length ?? 0) : 128;
    out.push(m);
    schedule(m.type !== 'done');
  };
  const pushTokens = (slot: TokensSlot, seq: number, n: number, text: string | undefined): void => {
    waitingBytes += 24 + (text?.length ?? 0);
    if (slot.gen === gen) {
      if (slot.seq + slot.n === seq) {
        slot.n += n;
        if (text !== undefined) slot.text = (slot.text ?? '') + text;
        return;
      }
      // Not contiguous with what waits (never, as sequence numbers are): a message of its own.
      out.push(tokensMessage({ id: slot.id, seq, n, text }));
      schedule(seq === 0);
      return;
    }
    slot.gen = gen;
    slot.seq = seq;
    slot.n = n;
    slot.text = text;
    out.push(slot);
    // A request's first tokens leave at the end of this turn (its time to first token); later ones may wait.
    schedule(seq === 0);
  };
  let soonPending = false;
  const answerNow = (): void => {
    if (!soonPending) return;
    soonPending = false;
    o.answering.delete(answerNow);
    flush();
  };
  const soon = (): void => {
    if (soonPending || out.length === 0) return;
    soonPending = true;
    // At the end of this task, or sooner when the pacer's turn runs long; the flush scheduled for the end of the
    // loop's turn then finds nothing left (or what was queued after this one).
    o.answering.add(answerNow);
    queueMicrotask(answerNow);
  };
  return {
    push,
    pushTokens,
    soon,
    // `retry` is left set on purpose, as before the split: nothing pushed after the close schedules a flush.
    stopRetry: () => {
      if (retry !== null) o.clock.clearTimeout(retry);
      if (deferred !== null) o.clock.clearTimeout(deferred);
      deferred = null;
    },
    drop: () => {
      out = [];
      gen++;
    },
  };
}

/** A connection's live requests. */
interface RequestTable {
  submit(m: Extract<ClientMessage, { type: 'submit' }>): void;
  /** True while the request of this client id is live on the connection. */
  live(id: string): boolean;
  cancel(id: string): void;
  /** Cancels every live request (the connection closed). */
  cancelAll(): void;
}

/** Submits to the serving facade and relays each request's tokens and end to the outbox; `counted` hears +1 when a
 * request goes live and -1 when it ends. */
function createRequestTable(
  serving: Serving,
  metrics: ServerMetrics,
  maxStreams: number,
  outbox: Pick<Outbox, 'push' | 'pushTokens'>,
  counted: (delta: 1 | -1) => void,
  tenant: string | undefined,
): RequestTable {
  const { push } = outbox;
  const live = new ChurnMap<string, { cancel(): void }>();
  const ended = (id: string): void => {
    if (live.delete(id)) counted(-1);
  };
  const submit = (m: Extract<ClientMessage, { type: 'submit' }>): void => {
    if (live.has(m.id)) {
      metrics.refused('invalid_request');
      push({
        type: 'error',
        code: 'invalid_request',
        message: `request id ${m.id} is already live on this connection`,
        retryable: false,
      });
      return;
    }
    if (live.size >= maxStreams) {
      const f = failure('overloaded', `this connection already has ${live.size} live requests`, {
        retryAfterMs: 1000,
      });
      metrics.refused('overloaded');
      push({
        type: 'rejected',
        id: m.id,
        code: f.code,
        message: f.message,
        retryable: f.retryable,
        retryAfterMs: 1000,
      });
      return;
    }
    const id = m.id;
    const { type: _type, id: _id, text: withText, ...request } = m;
    const res = serving.submit(request, new TokensSlot(id, outbox, ended), {
      text: withText ?? true,
      ...(tenant !== undefined ? { tenant } : {}),
    });
    if (!res.ok) {
      const f = res.failure;
      push({
        type: 'rejected',
        id,
        code: f.code,
        message: f.message,
        retryable: f.retryable,
        ...(f.retryAfterMs !== undefined ? { retryAfterMs: f.retryAfterMs } : {}),
      });
      return;
    }
    live.set(id, res);
    counted(1);
    // Tokens only come from a later step, so `accepted` is always the request's first frame.
    push({ type: 'accepted', id, request: res.request, model: res.model, version: res.version });
  };

  return {
    submit,
    live: (id) => live.has(id),
    cancel: (id) => live.get(id)?.cancel(),
    cancelAll: () => {
      for (const r of [...live.values()]) r.cancel();
    },
  };
}
