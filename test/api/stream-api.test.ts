// The /v1/ws session with a fake socket and a fake serving facade: frame order, one terminal frame per request,
// merging while congested, refused frames, limits, and cancellation when the socket closes.
import { describe, expect, it } from 'vitest';
import { createVirtualClock, createWallClock } from '../../runtime/clock.ts';
import { failure } from '../../machines/outcomes.ts';
import { SUBPROTOCOL_JSON, type ClientRequest, type ServerMessage } from '../../transport/client-protocol.ts';
import type { ServerMetrics } from '../../api/metrics.ts';
import type { Delivery, Serving, StreamSink } from '../../api/serving.ts';
import { createStreamApi } from '../../api/stream-api.ts';
import type { WsPeer } from '../../transport/ws.ts';

// Frames are handled on a later turn and replies leave at the end of that turn: two turns see them out.
const tick = async (): Promise<void> => {
  for (let i = 0; i < 3; i++) await new Promise((r) => setImmediate(r));
};

function fakePeer() {
  let onMessage: (d: Uint8Array | string) => void = () => {};
  let onClose: (code: number, reason: string) => void = () => {};
  const frames: ServerMessage[][] = [];
  const state = { open: true, congested: false, paused: false };
  const peer: WsPeer = {
    protocol: SUBPROTOCOL_JSON,
    remote: 'test',
    isOpen: () => state.open,
    send: (d) => {
      frames.push(JSON.parse(d as string) as ServerMessage[]);
      return true;
    },
    bufferedAmount: () => 0,
    congested: () => state.congested,
    close: () => {
      state.open = false;
      onClose(1000, '');
    },
    terminate: () => {},
    pause: () => {
      state.paused = true;
    },
    resume: () => {
      state.paused = false;
    },
    onMessage: (fn) => (onMessage = fn),
    onClose: (fn) => (onClose = fn),
  };
  return { peer, frames, state, send: (m: unknown) => onMessage(JSON.stringify(m)), all: () => frames.flat() };
}

function fakeServing(opts: { reject?: boolean } = {}) {
  const sinks = new Map<string, StreamSink>();
  const cancelled: string[] = [];
  const submitted: { req: ClientRequest; delivery: Delivery | undefined }[] = [];
  let n = 0;
  const serving = {
    submit: (req: ClientRequest, sink: StreamSink, delivery?: Delivery) => {
      submitted.push({ req, delivery });
      if (opts.reject)
        return { ok: false as const, failure: failure('overloaded', 'queue full', { retryAfterMs: 1500 }) };
      const request = `req.${++n}`;
      sinks.set(request, sink);
      return {
        ok: true as const,
        request,
        model: req.model,
        version: 'v1',
        promptTokens: 3,
        cancel: () => cancelled.push(request),
      };
    },
    models: () => [
      { name: 'm', versions: ['v1'], aliases: {}, tp: 1, kind: 'generate', backend: 'simulated', runs: 'simulated' },
    ],
    backend: () => 'simulated',
    readiness: () => ({}),
  } as unknown as Serving;
  return { serving, sinks, cancelled, submitted };
}

const metrics = { refused: () => {}, outcome: () => {}, step: () => {} } as unknown as ServerMetrics;
const done = {
  finishReason: 'length' as const,
  usage: { promptTokens: 3, completionTokens: 3 },
  timings: { queueMs: 1, ttftMs: 2, e2eMs: 3 },
};

describe('stream api', () => {
  it('hands serving the submit as the one client request type, sampling included, and the text choice apart', async () => {
    const clock = createWallClock();
    const s = fakeServing();
    const api = createStreamApi(s.serving, metrics, { clock, maxStreamsPerConnection: 10 });
    const p = fakePeer();
    api.onConnection(p.peer);
    const sampling = { temperature: 0.7, topP: 0.9, seed: 4, stop: ['\n'] };
    p.send({
      type: 'submit',
      id: 'a',
      model: 'm',
      version: 'v1',
      prompt: 'hi',
      maxTokens: 3,
      ...sampling,
      text: false,
    });
    p.send({ type: 'submit', id: 'b', model: 'm', maxTokens: 3, temperature: 3 });
    await tick();
    expect(s.submitted).toEqual([
      { req: { model: 'm', version: 'v1', prompt: 'hi', maxTokens: 3, ...sampling }, delivery: { text: false } },
    ]);
    expect(p.all().find((m) => m.type === 'error')).toMatchObject({ code: 'invalid_request' });
  });

  it('greets, accepts, streams contiguous tokens and ends with one done frame', async () => {
    const clock = createWallClock();
    const s = fakeServing();
    // Every turn's tokens leave at its end (the flush interval is the next describe's).
    const api = createStreamApi(s.serving, metrics, { clock, maxStreamsPerConnection: 10, tokenFlushMs: 0 });
    const p = fakePeer();
    api.onConnection(p.peer);
    p.send({ type: 'submit', id: 'a', model: 'm', prompt: 'hi', maxTokens: 3 });
    await tick();
    const sink = s.sinks.get('req.1')!;
    sink.tokens(0, 1, ' x');
    await tick();
    sink.tokens(1, 2, ' y z');
    sink.done(done);
    await tick();
    const all = p.all();
    expect(all.map((m) => m.type)).toEqual(['hello', 'accepted', 'tokens', 'tokens', 'done']);
    expect(all[0]).toMatchObject({ type: 'hello', protocol: 1, backend: 'simulated', models: ['m'] });
    expect(all[1]).toEqual({ type: 'accepted', id: 'a', request: 'req.1', model: 'm', version: 'v1' });
    expect(api.streams()).toBe(0);
  });

  it('sends what one tick produced as one frame, merging tokens of the same request', async () => {
    const clock = createWallClock();
    const s = fakeServing();
    const api = createStreamApi(s.serving, metrics, { clock, maxStreamsPerConnection: 10 });
    const p = fakePeer();
    api.onConnection(p.peer);
    p.send([
      { type: 'submit', id: 'a', model: 'm', maxTokens: 9 },
      { type: 'submit', id: 'b', model: 'm', maxTokens: 9 },
    ]);
    await tick();
    const before = p.frames.length;
    s.sinks.get('req.1')!.tokens(0, 1, ' a0');
    s.sinks.get('req.2')!.tokens(0, 1, ' b0');
    s.sinks.get('req.1')!.tokens(1, 1, ' a1');
    await tick();
    expect(p.frames.length).toBe(before + 1);
    expect(p.frames.at(-1)).toEqual([
      { type: 'tokens', id: 'a', seq: 0, n: 2, text: ' a0 a1' },
      { type: 'tokens', id: 'b', seq: 0, n: 1, text: ' b0' },
    ]);
  });

  it('holds frames while the socket is congested, keeping one merged tokens message per request', async () => {
    const clock = createWallClock();
    const s = fakeServing();
    const api = createStreamApi(s.serving, metrics, { clock, maxStreamsPerConnection: 10, congestionRetryMs: 5 });
    const p = fakePeer();
    api.onConnection(p.peer);
    p.send({ type: 'submit', id: 'a', model: 'm', maxTokens: 1000 });
    await tick();
    const before = p.frames.length;
    p.state.congested = true;
    const sink = s.sinks.get('req.1')!;
    for (let i = 0; i < 500; i++) {
      sink.tokens(i, 1, ' w');
      await tick();
    }
    expect(p.frames.length).toBe(before);
    p.state.congested = false;
    await new Promise((r) => setTimeout(r, 30));
    const last = p.frames.at(-1)!;
    expect(last).toEqual([{ type: 'tokens', id: 'a', seq: 0, n: 500, text: ' w'.repeat(500) }]);
  });

  it('answers a bad frame with an error without id and stays usable', async () => {
    const clock = createWallClock();
    const s = fakeServing();
    const api = createStreamApi(s.serving, metrics, { clock, maxStreamsPerConnection: 10 });
    const p = fakePeer();
    api.onConnection(p.peer);
    p.send({ type: 'submit', id: 'a', model: 'm', maxTokens: 0 });
    p.send({ type: 'launch' });
    p.send({ type: 'submit', id: 'b', model: 'm', maxTokens: 2 });
    await tick();
    const all = p.all();
    expect(all.filter((m) => m.type === 'error')).toHaveLength(2);
    for (const e of all.filter((m) => m.type === 'error')) expect(e).not.toHaveProperty('id');
    expect(all.at(-1)).toMatchObject({ type: 'accepted', id: 'b' });
  });

  it('passes a rejection on as one rejected frame, and refuses duplicate ids and streams over the limit', async () => {
    const clock = createWallClock();
    const rejecting = fakeServing({ reject: true });
    const p1 = fakePeer();
    createStreamApi(rejecting.serving, metrics, { clock, maxStreamsPerConnection: 10 }).onConnection(p1.peer);
    p1.send({ type: 'submit', id: 'a', model: 'm', maxTokens: 2 });
    await tick();
    expect(p1.all().at(-1)).toEqual({
      type: 'rejected',
      id: 'a',
      code: 'overloaded',
      message: 'queue full',
      retryable: true,
      retryAfterMs: 1500,
    });

    const s = fakeServing();
    const p2 = fakePeer();
    createStreamApi(s.serving, metrics, { clock, maxStreamsPerConnection: 1 }).onConnection(p2.peer);
    p2.send([
      { type: 'submit', id: 'a', model: 'm', maxTokens: 2 },
      { type: 'submit', id: 'a', model: 'm', maxTokens: 2 },
      { type: 'submit', id: 'b', model: 'm', maxTokens: 2 },
    ]);
    await tick();
    const types = p2.all().map((m) => `${m.type}:${'id' in m ? (m.id ?? '') : ''}`);
    expect(types).toEqual(['hello:', 'accepted:a', 'error:', 'rejected:b']);
  });

  it('stops reading a socket whose inbox fills, and reads again once it drains', async () => {
    const clock = createWallClock();
    const s = fakeServing();
    const api = createStreamApi(s.serving, metrics, { clock, maxStreamsPerConnection: 100_000 });
    const p = fakePeer();
    api.onConnection(p.peer);
    for (let i = 0; i < 100; i++) p.send({ type: 'submit', id: `r${i}`, model: 'm', maxTokens: 2 });
    expect(p.state.paused).toBe(true);
    await tick();
    expect(p.state.paused).toBe(false);
    expect(p.all().filter((m) => m.type === 'accepted')).toHaveLength(100);
  });

  it('cancels a request on cancel and every live request when the socket closes', async () => {
    const clock = createWallClock();
    const s = fakeServing();
    const api = createStreamApi(s.serving, metrics, { clock, maxStreamsPerConnection: 10 });
    const p = fakePeer();
    api.onConnection(p.peer);
    p.send([
      { type: 'submit', id: 'a', model: 'm', maxTokens: 5 },
      { type: 'submit', id: 'b', model: 'm', maxTokens: 5 },
      { type: 'submit', id: 'c', model: 'm', maxTokens: 5 },
    ]);
    p.send({ type: 'cancel', id: 'a' });
    p.send({ type: 'cancel', id: 'nope' });
    await tick();
    expect(s.cancelled).toEqual(['req.1']);
    expect(api.sessions()).toBe(1);
    p.peer.close();
    expect(s.cancelled).toEqual(['req.1', 'req.1', 'req.2', 'req.3']);
    expect(api.sessions()).toBe(0);
  });
});

describe('stream api: the token flush interval', () => {
  // A virtual clock: turns and flushes are its events; microtasks (answers to a frame) run at each await.
  const setup = (tokenFlushMs?: number) => {
    const clock = createVirtualClock();
    const s = fakeServing();
    const api = createStreamApi(s.serving, metrics, {
      clock,
      maxStreamsPerConnection: 10,
      ...(tokenFlushMs !== undefined ? { tokenFlushMs } : {}),
    });
    const p = fakePeer();
    api.onConnection(p.peer);
    const at = async (t: number): Promise<void> => {
      clock.run(t);
      await Promise.resolve();
      clock.run(t);
    };
    return { clock, s, p, at };
  };
  const kinds = (f: ServerMessage[]): string[] =>
    f.map((m) => (m.type === 'tokens' ? `${m.id}:${m.seq}+${m.n}` : `${m.type}${'id' in m ? `:${m.id}` : ''}`));

  it('sends first tokens at the end of the turn and holds later ones until 2 ms after the last frame', async () => {
    const { s, p, at } = setup();
    p.send({ type: 'submit', id: 'a', model: 'm', maxTokens: 9 });
    await at(0);
    expect(p.frames.map(kinds)).toEqual([['hello'], ['accepted:a']]);
    await at(10);
    const a = s.sinks.get('req.1')!;
    a.tokens(0, 1, ' x');
    await at(10);
    expect(p.frames.map(kinds).at(-1)).toEqual(['a:0+1']);
    // Later tokens: the last frame left at 10, so they wait until 12, merged.
    a.tokens(1, 1, ' y');
    await at(11);
    a.tokens(2, 1, ' z');
    await at(11.99);
    expect(p.frames).toHaveLength(3);
    await at(12);
    expect(p.frames).toHaveLength(4);
    expect(p.frames.at(-1)).toEqual([{ type: 'tokens', id: 'a', seq: 1, n: 2, text: ' y z' }]);
    // Long after the last frame, a later token leaves at the end of its turn, and the end waits like a token.
    await at(30);
    a.tokens(3, 1, ' w');
    await at(30);
    expect(p.frames.map(kinds).at(-1)).toEqual(['a:3+1']);
    a.done(done);
    await at(31);
    expect(p.frames).toHaveLength(5);
    await at(32);
    expect(p.frames.map(kinds).at(-1)).toEqual(['done:a']);
  });

  it('lets waiting tokens ride with an answer or a first token that may not wait', async () => {
    const { s, p, at } = setup();
    p.send({ type: 'submit', id: 'a', model: 'm', maxTokens: 9 });
    await at(0);
    const a = s.sinks.get('req.1')!;
    a.tokens(0, 1, ' x');
    await at(0);
    const before = p.frames.length;
    a.tokens(1, 1, ' y');
    await at(1);
    expect(p.frames).toHaveLength(before);
    // A new request's accepted answer, then its first token: each leaves at once, with what waited.
    p.send({ type: 'submit', id: 'b', model: 'm', maxTokens: 9 });
    await at(1);
    expect(p.frames.map(kinds).at(-1)).toEqual(['a:1+1', 'accepted:b']);
    a.tokens(2, 1, ' z');
    s.sinks.get('req.2')!.tokens(0, 1, ' q');
    await at(1.5);
    expect(p.frames.map(kinds).at(-1)).toEqual(['a:2+1', 'b:0+1']);
  });

  it('sends every turn at an interval of 0', async () => {
    const { s, p, at } = setup(0);
    p.send({ type: 'submit', id: 'a', model: 'm', maxTokens: 9 });
    await at(0);
    const a = s.sinks.get('req.1')!;
    for (let k = 0; k < 3; k++) {
      a.tokens(k, 1, ' t');
      await at(0.1 * (k + 1));
    }
    expect(p.frames.map(kinds).slice(2)).toEqual([['a:0+1'], ['a:1+1'], ['a:2+1']]);
  });

  it('forgets a waiting flush when the socket closes', async () => {
    const { clock, s, p, at } = setup();
    p.send({ type: 'submit', id: 'a', model: 'm', maxTokens: 9 });
    await at(0);
    const a = s.sinks.get('req.1')!;
    a.tokens(0, 1, ' x');
    await at(0);
    a.tokens(1, 1, ' y');
    p.peer.close();
    expect(clock.pending()).toBe(0);
  });
});
