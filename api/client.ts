// The typed TypeScript client of `/v1/ws`: many requests multiplexed on one socket, each an async iterator of token
// chunks that ends after `done` or throws a SwitchyardError carrying the typed code of its one terminal frame.
import { createWallClock, type Clock } from '../runtime/clock.ts';
import type { OutcomeCode } from '../machines/outcomes.ts';
import {
  CLIENT_PROTOCOL_VERSION,
  SUBPROTOCOL_JSON,
  SUBPROTOCOL_MSGPACK,
  decodeServerFrame,
  encodeFrame,
  type ClientMessage,
  type ClientRequest,
  type FrameFormat,
  type ServerMessage,
} from '../transport/client-protocol.ts';
import { connectWs, type WsPeer } from '../transport/ws.ts';

/** Codes a client sees: the server's outcome codes plus the connection's own. */
export type ClientErrorCode = OutcomeCode | 'connection_closed' | 'protocol';

/** A request that did not complete: rejected, failed, cancelled, or cut off with the connection. */
export class SwitchyardError extends Error {
  override readonly name = 'SwitchyardError';
  constructor(
    readonly code: ClientErrorCode,
    message: string,
    readonly retryable: boolean,
    readonly retryAfterMs?: number,
  ) {
    super(`${code}: ${message}`);
  }
}

/** Tokens received in one frame: `seq` is the index of the first, contiguous with the previous chunk. */
export interface TokenChunk {
  seq: number;
  n: number;
  text: string;
}

/** How a stream ended. */
export type StreamResult =
  | {
      ok: true;
      finishReason: 'length' | 'stop';
      usage: { promptTokens: number; completionTokens: number };
      timings: { queueMs: number; ttftMs: number; e2eMs: number };
    }
  | { ok: false; error: SwitchyardError };

/** One request's stream. */
export interface TokenStream extends AsyncIterable<TokenChunk> {
  readonly id: string;
  /** The server's request id once accepted. */
  readonly accepted: Promise<{ request: string; model: string; version: string } | null>;
  /** Resolves once with the terminal outcome; never rejects. */
  readonly result: Promise<StreamResult>;
  /** Stops the request (queued or running); the stream then ends with code `cancelled`. */
  cancel(): void;
}

/** A connection to a switchyard server. */
export interface SwitchyardClient {
  readonly models: readonly string[];
  readonly backend: string;
  /** Submits a request; `countsOnly` asks for token counts without their text. */
  stream(req: ClientRequest, opts?: { countsOnly?: boolean }): TokenStream;
  /** Live streams on this connection. */
  live(): number;
  close(): void;
}

/** Options of a client connection. */
export interface ClientOptions {
  token?: string;
  /** Certificate authority (PEM) for a server with a private certificate (`wss://`). */
  ca?: string | Buffer;
  format?: FrameFormat;
  clock?: Clock;
  heartbeatMs?: number;
}

/** Chunks a slow consumer may leave unread before they are merged (memory stays bounded by the text itself). */
const MAX_BUFFERED_CHUNKS = 256;

interface StreamState {
  chunks: TokenChunk[];
  wake: (() => void) | null;
  end: StreamResult | null;
  nextSeq: number;
  accept(v: Accepted): void;
  finish(r: StreamResult): void;
}

/** Connects to `url` (`ws://host:port/v1/ws`, or the server's http URL) and waits for the server's hello. */
export async function connectClient(url: string, opts: ClientOptions = {}): Promise<SwitchyardClient> {
  const format = opts.format ?? 'msgpack';
  const wsUrl = url
    .replace(/^http/, 'ws')
    .replace(/\/+$/, '')
    .replace(/(\/v1\/ws)?$/, '/v1/ws');
  const r = await connectWs(wsUrl, {
    clock: opts.clock ?? createWallClock(),
    ...(opts.token ? { token: opts.token } : {}),
    ...(opts.ca !== undefined ? { ca: opts.ca } : {}),
    protocols: [format === 'json' ? SUBPROTOCOL_JSON : SUBPROTOCOL_MSGPACK],
    ...(opts.heartbeatMs ? { heartbeatMs: opts.heartbeatMs } : {}),
  });
  if (!r.ok) {
    throw new SwitchyardError(
      r.error.code === 'unauthorized' ? 'unauthorized' : 'connection_closed',
      r.error.message,
      r.error.code !== 'unauthorized',
    );
  }
  return new Promise((resolve, reject) => {
    let hello: Extract<ServerMessage, { type: 'hello' }> | null = null;
    const peer: WsPeer = r.peer;
    const streams = new Map<string, StreamState>();
    let counter = 0;
    let closed = false;

    const failAll = (why: string): void => {
      closed = true;
      for (const s of streams.values())
        s.finish({ ok: false, error: new SwitchyardError('connection_closed', why, true) });
      streams.clear();
    };

    const onMessage = (m: ServerMessage): void => {
      if (m.type === 'hello') {
        hello = m;
        if (m.protocol !== CLIENT_PROTOCOL_VERSION) {
          peer.close(1008, 'protocol version');
          reject(
            new SwitchyardError(
              'protocol',
              `server speaks protocol ${m.protocol}, this client ${CLIENT_PROTOCOL_VERSION}`,
              false,
            ),
          );
          return;
        }
        resolve(client);
        return;
      }
      applyStreamMessage(streams, m);
    };

    const client: SwitchyardClient = {
      get models() {
        return hello?.models ?? [];
      },
      get backend() {
        return hello?.backend ?? 'unknown';
      },
      live: () => streams.size,
      close: () => {
        peer.close(1000, 'client closing');
      },
      stream: (req, opts = {}) => {
        const id = `c${++counter}`;
        const { s, accepted, result } = newStreamState();
        if (closed)
          s.finish({ ok: false, error: new SwitchyardError('connection_closed', 'the connection is closed', true) });
        else {
          streams.set(id, s);
          peer.send(encodeFrame(submitMessage(id, req, opts.countsOnly === true), format));
        }
        const cancel = (): void => {
          if (!s.end && streams.has(id)) peer.send(encodeFrame({ type: 'cancel', id }, format));
        };
        return tokenStream(id, s, accepted, result, cancel);
      },
    };
    // Registered last: the hello may already be buffered, and handling it resolves with `client`.
    peer.onMessage((data) => {
      const frame = decodeServerFrame(data, format);
      if (!frame.ok) {
        peer.close(1008, 'bad frame');
        failAll(`server sent a bad frame: ${frame.error.message}`);
        return;
      }
      for (const m of frame.messages) onMessage(m);
    });
    peer.onClose((code, reason) => {
      failAll(`connection closed (${code}${reason ? ` ${reason}` : ''})`);
      if (!hello) reject(new SwitchyardError('connection_closed', `closed before hello (${code})`, true));
    });
  });
}

/** Applies one server message addressed to a stream (accepted, tokens, done, rejected, error) to the stream table. */
function applyStreamMessage(streams: Map<string, StreamState>, m: ServerMessage): void {
  if (m.type === 'hello') return;
  if (m.type === 'error' && m.id === undefined) return;
  const s = streams.get(m.id!);
  if (!s) return;
  if (m.type === 'accepted') s.accept({ request: m.request, model: m.model, version: m.version });
  else if (m.type === 'tokens') {
    if (m.seq !== s.nextSeq) {
      s.finish({
        ok: false,
        error: new SwitchyardError('protocol', `token seq ${m.seq} after ${s.nextSeq - 1}`, false),
      });
      streams.delete(m.id);
      return;
    }
    s.nextSeq += m.n;
    const last = s.chunks[s.chunks.length - 1];
    if (last && s.chunks.length >= MAX_BUFFERED_CHUNKS) {
      last.n += m.n;
      last.text += m.text ?? '';
    } else s.chunks.push({ seq: m.seq, n: m.n, text: m.text ?? '' });
    s.wake?.();
  } else if (m.type === 'done') {
    streams.delete(m.id);
    s.finish({ ok: true, finishReason: m.finishReason, usage: m.usage, timings: m.timings });
  } else if (m.type === 'rejected' || m.type === 'error') {
    streams.delete(m.id!);
    s.accept(null);
    s.finish({
      ok: false,
      error: new SwitchyardError(m.code as ClientErrorCode, m.message, m.retryable, m.retryAfterMs),
    });
  }
}

/** What `accepted` resolves with: the server's ids once accepted, null if it never was. */
type Accepted = { request: string; model: string; version: string } | null;

/** A fresh stream's state and the two promises its handle exposes. */
function newStreamState(): { s: StreamState; accepted: Promise<Accepted>; result: Promise<StreamResult> } {
  let accept!: (v: Accepted) => void;
  let settle!: (r: StreamResult) => void;
  const accepted = new Promise<Accepted>((res) => (accept = res));
  const result = new Promise<StreamResult>((res) => (settle = res));
  const s: StreamState = {
    chunks: [],
    wake: null,
    end: null,
    nextSeq: 0,
    accept: (v) => accept(v),
    finish: (r) => {
      if (s.end) return;
      s.end = r;
      accept(null);
      settle(r);
      s.wake?.();
    },
  };
  return { s, accepted, result };
}

/** The `submit` message of a request. */
function submitMessage(
  id: string,
  req: ClientRequest,
  countsOnly: boolean,
): Extract<ClientMessage, { type: 'submit' }> {
  return {
    type: 'submit',
    id,
    model: req.model,
    ...(req.version !== undefined ? { version: req.version } : {}),
    ...(req.priority !== undefined ? { priority: req.priority } : {}),
    ...(req.prompt !== undefined ? { prompt: req.prompt } : {}),
    ...(req.promptTokens !== undefined ? { promptTokens: req.promptTokens } : {}),
    maxTokens: req.maxTokens,
    ...(req.deadlineMs !== undefined ? { deadlineMs: req.deadlineMs } : {}),
    ...(countsOnly ? { text: false } : {}),
    ...(req.temperature !== undefined ? { temperature: req.temperature } : {}),
    ...(req.topP !== undefined ? { topP: req.topP } : {}),
    ...(req.seed !== undefined ? { seed: req.seed } : {}),
    ...(req.stop !== undefined ? { stop: req.stop } : {}),
    ...(req.logprobs !== undefined ? { logprobs: req.logprobs } : {}),
    ...(req.jsonSchema !== undefined ? { jsonSchema: req.jsonSchema } : {}),
  };
}

/** The caller's handle on a stream: an async iterator over its chunks; `cancel` sends the cancel while it is live. */
function tokenStream(
  id: string,
  s: StreamState,
  accepted: Promise<Accepted>,
  result: Promise<StreamResult>,
  cancel: () => void,
): TokenStream {
  return {
    id,
    accepted,
    result,
    cancel,
    [Symbol.asyncIterator]: () => ({
      next: async (): Promise<IteratorResult<TokenChunk>> => {
        for (;;) {
          const c = s.chunks.shift();
          if (c) return { value: c, done: false };
          if (s.end) {
            if (s.end.ok) return { value: undefined, done: true };
            throw s.end.error;
          }
          await new Promise<void>((w) => (s.wake = w));
          s.wake = null;
        }
      },
      return: async (): Promise<IteratorResult<TokenChunk>> => {
        // Leaving a for-await early stops the request.
        cancel();
        return { value: undefined, done: true };
      },
    }),
  };
}
