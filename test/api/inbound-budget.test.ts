// The stream API's budget for incoming frames shared by every connection: frames waiting to be handled are bounded
// in bytes; a frame past the budget is not kept, each submit in it is rejected (overloaded, retryAfterMs) and every
// request still gets one answer; bytes come back as frames are handled or their connection closes.
import { describe, expect, it } from 'vitest';
import { createWallClock } from '../../runtime/clock.ts';
import { SUBPROTOCOL_JSON, type ServerMessage } from '../../transport/client-protocol.ts';
import type { ServerMetrics } from '../../api/metrics.ts';
import type { Serving, StreamSink } from '../../api/serving.ts';
import { createStreamApi } from '../../api/stream-api.ts';
import type { WsPeer } from '../../transport/ws.ts';

const tick = async (): Promise<void> => {
  for (let i = 0; i < 3; i++) await new Promise((r) => setImmediate(r));
};

/** A socket whose incoming frames the test delivers at once (as a burst read in one go). */
function fakePeer(): { peer: WsPeer; send(m: unknown): void; all(): ServerMessage[]; close(): void } {
  let onMessage: (d: Uint8Array | string) => void = () => {};
  let onClose: (code: number, reason: string) => void = () => {};
  const frames: ServerMessage[][] = [];
  let open = true;
  const peer: WsPeer = {
    protocol: SUBPROTOCOL_JSON,
    remote: 'test',
    isOpen: () => open,
    send: (d) => (frames.push(JSON.parse(d as string) as ServerMessage[]), true),
    bufferedAmount: () => 0,
    congested: () => false,
    close: () => {
      open = false;
      onClose(1000, '');
    },
    terminate: () => {},
    pause: () => {},
    resume: () => {},
    onMessage: (fn) => (onMessage = fn),
    onClose: (fn) => (onClose = fn),
  };
  return { peer, send: (m) => onMessage(JSON.stringify(m)), all: () => frames.flat(), close: () => peer.close() };
}

function fakeServing(): Serving {
  let n = 0;
  return {
    submit: (req: { model: string }, _sink: StreamSink) => ({
      ok: true as const,
      request: `req.${++n}`,
      model: req.model,
      version: 'v1',
      promptTokens: 1,
      cancel: () => {},
    }),
    models: () => [
      { name: 'm', versions: ['v1'], aliases: {}, tp: 1, kind: 'generate', backend: 'simulated', runs: 'simulated' },
    ],
    backend: () => 'simulated',
    readiness: () => ({}),
  } as unknown as Serving;
}

/** A submit of about 470 bytes: its frame takes about 2 × 470 bytes of the budget. */
const submit = (id: string): unknown => ({ type: 'submit', id, model: 'm', prompt: 'x'.repeat(400), maxTokens: 1 });

/** A stream API with these incoming-frame budgets, and the refusals its metrics heard. */
function budgeted(limits: { maxInboundBytes: number; maxInboundBytesPerClient?: number }): {
  api: ReturnType<typeof createStreamApi>;
  refused: string[];
} {
  const refused: string[] = [];
  const metrics = { refused: (c: string) => refused.push(c) } as unknown as ServerMetrics;
  const api = createStreamApi(fakeServing(), metrics, {
    clock: createWallClock(),
    maxStreamsPerConnection: 100,
    ...limits,
  });
  return { api, refused };
}

describe('incoming frame budget', () => {
  it('refuses the frames past the budget across connections, answering each submit, and frees handled bytes', async () => {
    // The budget holds four frames.
    const { api, refused } = budgeted({ maxInboundBytes: 4_000 });
    const a = fakePeer();
    const b = fakePeer();
    api.onConnection(a.peer);
    api.onConnection(b.peer);
    for (let i = 0; i < 3; i++) a.send(submit(`a${i}`));
    for (let i = 0; i < 3; i++) b.send(submit(`b${i}`));
    expect(api.inboundBytes()).toBeLessThanOrEqual(4_000);
    expect(refused).toEqual(['inbound_budget', 'inbound_budget']);
    await tick();
    expect(api.inboundBytes()).toBe(0);
    const answers = [...a.all(), ...b.all()].filter((m) => m.type === 'accepted' || m.type === 'rejected');
    expect(answers).toHaveLength(6);
    const rejected = answers.filter((m) => m.type === 'rejected');
    expect(rejected).toHaveLength(2);
    for (const r of rejected) expect(r).toMatchObject({ code: 'overloaded', retryable: true, retryAfterMs: 100 });
    // With the budget free again, frames are taken as before.
    b.send(submit('b9'));
    await tick();
    expect(
      b
        .all()
        .filter((m) => m.type === 'accepted')
        .map((m) => (m as { id: string }).id),
    ).toContain('b9');
  });

  it("keeps one client's frames to its own share, so that another client from the same address still gets in", async () => {
    // The budget of all holds four frames, one client's two.
    const { api, refused } = budgeted({ maxInboundBytes: 4_000, maxInboundBytesPerClient: 2_000 });
    const flood = [fakePeer(), fakePeer()];
    const quiet = fakePeer();
    // Both tenants' sockets come from one address (a gateway): they are told apart by tenant.
    for (const f of flood) api.onConnection(f.peer, 'flood', 'tenant:flood');
    api.onConnection(quiet.peer, 'quiet', 'tenant:quiet');
    for (let i = 0; i < 3; i++) for (const [k, f] of flood.entries()) f.send(submit(`f${k}.${i}`));
    for (let i = 0; i < 2; i++) quiet.send(submit(`q${i}`));
    expect(refused).toEqual(['inbound_budget', 'inbound_budget', 'inbound_budget', 'inbound_budget']);
    await tick();
    const answered = quiet.all().filter((m) => m.type === 'accepted' || m.type === 'rejected');
    expect(answered.map((m) => m.type)).toEqual(['accepted', 'accepted']);
    const floodRejected = flood.flatMap((f) => f.all()).filter((m) => m.type === 'rejected');
    expect(floodRejected).toHaveLength(4);
    for (const r of floodRejected) expect(r).toMatchObject({ code: 'overloaded', retryable: true, retryAfterMs: 100 });
    expect(api.inboundBytes()).toBe(0);
  });

  it('gives back the bytes of frames a closed connection left unhandled', () => {
    const metrics = { refused: () => {} } as unknown as ServerMetrics;
    const api = createStreamApi(fakeServing(), metrics, {
      clock: createWallClock(),
      maxStreamsPerConnection: 100,
      maxInboundBytes: 1_000_000,
    });
    const a = fakePeer();
    api.onConnection(a.peer);
    for (let i = 0; i < 5; i++) a.send({ type: 'submit', id: `a${i}`, model: 'm', maxTokens: 1 });
    expect(api.inboundBytes()).toBeGreaterThan(0);
    a.close();
    expect(api.inboundBytes()).toBe(0);
  });
});
