// `/v1/ws`: one session per client socket. Submits and cancels go to the serving facade; everything said to the client
// in one tick leaves as one frame; while the socket is congested, token messages of the same request are merged so
// the outgoing queue stays bounded by the number of live requests.
import type { Clock, TimerId } from '../../actors/runtime/clock.ts';
import { failure } from '../../actors/outcomes.ts';
import {
  CLIENT_PROTOCOL_VERSION,
  decodeClientFrame,
  encodeFrame,
  formatOf,
  type ClientMessage,
  type ServerMessage,
} from '../client-protocol.ts';
import type { WsPeer } from '../ws.ts';
import type { ServerMetrics } from './metrics.ts';
import type { Serving } from './serving.ts';

/** Options of the streaming API. */
export interface StreamApiOptions {
  clock: Clock;
  /** Most live requests per connection; more are rejected with `overloaded`. */
  maxStreamsPerConnection: number;
  /** Most messages in one outgoing frame. */
  maxMessagesPerFrame?: number;
  /** Retry interval while the socket is congested. */
  congestionRetryMs?: number;
}

/** The streaming API: hand it each authenticated socket. */
export interface StreamApi {
  onConnection(peer: WsPeer): void;
  /** Live sessions. */
  sessions(): number;
  /** Live requests across sessions. */
  streams(): number;
}

type TokensMsg = Extract<ServerMessage, { type: 'tokens' }>;

/** Creates the `/v1/ws` handler over a serving facade. */
export function createStreamApi(serving: Serving, metrics: ServerMetrics, opts: StreamApiOptions): StreamApi {
  let sessions = 0;
  let streams = 0;
  const perFrame = opts.maxMessagesPerFrame ?? 4096;

  const onConnection = (peer: WsPeer): void => {
    const format = formatOf(peer.protocol);
    const live = new Map<string, { cancel(): void }>();
    let out: ServerMessage[] = [];
    // The latest queued tokens message per request, while it is still in `out` (merged into when congested).
    const lastTokens = new Map<string, TokensMsg>();
    let scheduled = false;
    let retry: TimerId | null = null;
    sessions++;

    const flush = (): void => {
      scheduled = false;
      if (out.length === 0 || !peer.isOpen()) return;
      if (peer.congested()) {
        if (retry === null) {
          retry = opts.clock.setTimeout(() => {
            retry = null;
            flush();
          }, opts.congestionRetryMs ?? 5);
        }
        return;
      }
      const msgs = out;
      out = [];
      lastTokens.clear();
      for (let i = 0; i < msgs.length; i += perFrame) peer.send(encodeFrame(i === 0 && msgs.length <= perFrame ? msgs : msgs.slice(i, i + perFrame), format));
    };
    const push = (m: ServerMessage): void => {
      if (m.type === 'tokens') {
        const prev = lastTokens.get(m.id);
        if (prev && prev.seq + prev.n === m.seq) {
          prev.n += m.n;
          if (m.text !== undefined) prev.text = (prev.text ?? '') + m.text;
          return;
        }
        lastTokens.set(m.id, m);
      } else {
        if ('id' in m && m.id !== undefined) lastTokens.delete(m.id);
      }
      out.push(m);
      if (!scheduled && retry === null) {
        scheduled = true;
        queueMicrotask(flush);
      }
    };

    const submit = (m: Extract<ClientMessage, { type: 'submit' }>): void => {
      if (live.has(m.id)) {
        metrics.refused('invalid_request');
        push({ type: 'error', code: 'invalid_request', message: `request id ${m.id} is already live on this connection`, retryable: false });
        return;
      }
      if (live.size >= opts.maxStreamsPerConnection) {
        const f = failure('overloaded', `this connection already has ${live.size} live requests`, { retryAfterMs: 1000 });
        metrics.refused('overloaded');
        push({ type: 'rejected', id: m.id, code: f.code, message: f.message, retryable: f.retryable, retryAfterMs: 1000 });
        return;
      }
      const id = m.id;
      const end = (): void => {
        if (live.delete(id)) streams--;
      };
      const res = serving.submit(
        {
          model: m.model,
          ...(m.version !== undefined ? { version: m.version } : {}),
          ...(m.priority !== undefined ? { priority: m.priority } : {}),
          ...(m.prompt !== undefined ? { prompt: m.prompt } : {}),
          ...(m.promptTokens !== undefined ? { promptTokens: m.promptTokens } : {}),
          maxTokens: m.maxTokens,
          ...(m.deadlineMs !== undefined ? { deadlineMs: m.deadlineMs } : {}),
          text: m.text ?? true,
        },
        {
          tokens: (seq, n, text) => push(text === undefined ? { type: 'tokens', id, seq, n } : { type: 'tokens', id, seq, n, text }),
          done: (info) => {
            end();
            push({ type: 'done', id, ...info });
          },
          failed: (f) => {
            end();
            push({ type: 'error', id, code: f.code, message: f.message, retryable: f.retryable, ...(f.retryAfterMs !== undefined ? { retryAfterMs: f.retryAfterMs } : {}) });
          },
        },
      );
      if (!res.ok) {
        const f = res.failure;
        push({ type: 'rejected', id, code: f.code, message: f.message, retryable: f.retryable, ...(f.retryAfterMs !== undefined ? { retryAfterMs: f.retryAfterMs } : {}) });
        return;
      }
      live.set(id, res);
      streams++;
      // Tokens only come from a later step, so `accepted` is always the request's first frame.
      push({ type: 'accepted', id, request: res.request, model: res.model, version: res.version });
    };

    peer.onMessage((data) => {
      const frame = decodeClientFrame(data, format);
      if (!frame.ok) {
        metrics.refused('invalid_request');
        push({ type: 'error', code: frame.error.code, message: frame.error.message, retryable: false });
        return;
      }
      for (const m of frame.messages) {
        if (m.type === 'submit') submit(m);
        else live.get(m.id)?.cancel();
      }
    });
    peer.onClose(() => {
      sessions--;
      if (retry !== null) opts.clock.clearTimeout(retry);
      // Nobody is listening any more: stop the work (each cancel ends its request and frees its KV).
      for (const r of [...live.values()]) r.cancel();
      out = [];
    });
    push({ type: 'hello', protocol: CLIENT_PROTOCOL_VERSION, server: 'switchyard', backend: 'simulated', models: serving.models().map((x) => x.name) });
  };

  return { onConnection, sessions: () => sessions, streams: () => streams };
}
