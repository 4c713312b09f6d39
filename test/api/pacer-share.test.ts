// The stream API handles waiting frames in turns of the event loop: a turn spends at least its budget, and as long as
// the rest of the loop took since the previous turn (up to five budgets), so frames waiting behind long loops (large
// steps, a busy machine) still get half of the time, and a backlog cannot grow while the process has time for it.
import { describe, expect, it } from 'vitest';
import type { Clock, TimerId } from '../../runtime/clock.ts';
import { SUBPROTOCOL_JSON } from '../../transport/client-protocol.ts';
import type { ServerMetrics } from '../../api/metrics.ts';
import type { Serving } from '../../api/serving.ts';
import { createStreamApi } from '../../api/stream-api.ts';
import type { WsPeer } from '../../transport/ws.ts';

/** A clock the test moves: zero-delay timers wait in a queue until the test runs the next one. */
function manualClock(): Clock & { t: number; turn(): boolean } {
  const due: (() => void)[] = [];
  const c = {
    t: 0,
    now: () => c.t,
    setTimeout: (fn: () => void, ms: number): TimerId => {
      if (ms <= 0) due.push(fn);
      return 0;
    },
    clearTimeout: () => {},
    turn: (): boolean => {
      const fn = due.shift();
      fn?.();
      return fn !== undefined;
    },
  };
  return c;
}

/** A JSON client socket: `receive` delivers a frame from the client; `send` sees what the server sends it. */
function testPeer(send: (d: Uint8Array | string) => boolean): { peer: WsPeer; receive(d: string): void } {
  let onMessage: (d: Uint8Array | string) => void = () => {};
  const peer: WsPeer = {
    protocol: SUBPROTOCOL_JSON,
    remote: 'test',
    isOpen: () => true,
    send,
    bufferedAmount: () => 0,
    congested: () => false,
    close: () => {},
    terminate: () => {},
    pause: () => {},
    resume: () => {},
    onMessage: (fn) => (onMessage = fn),
    onClose: () => {},
  };
  return { peer, receive: (d) => onMessage(d) };
}

const submitFrame = (i: number): string =>
  JSON.stringify([{ type: 'submit', id: `q${i}`, model: 'm', promptTokens: 1, maxTokens: 1 }]);

describe('frame pacing', () => {
  it('gives waiting frames as long as the rest of the loop took, between one and five budgets', async () => {
    const clock = manualClock();
    let handled = 0;
    // Each submit takes 1 ms of the clock.
    const serving = {
      submit: () => {
        handled++;
        clock.t += 1;
        return { ok: true, request: `r${handled}`, model: 'm', version: 'v1', promptTokens: 1, cancel: () => {} };
      },
      models: () => [],
      backend: () => 'simulated',
      readiness: () => ({}),
    } as unknown as Serving;
    const metrics = { refused: () => {} } as unknown as ServerMetrics;
    const api = createStreamApi(serving, metrics, { clock, maxStreamsPerConnection: 1e6, turnBudgetMs: 10 });
    // Messages per frame sent to the client.
    const sent: number[] = [];
    const client = testPeer((d) => (sent.push((JSON.parse(d as string) as unknown[]).length), true));
    api.onConnection(client.peer);
    for (let i = 0; i < 200; i++) client.receive(submitFrame(i));
    const pacerTurn = (): number => {
      const before = handled;
      // Outbox flushes are zero-delay timers too: run turns until one handled frames.
      while (clock.turn() && handled === before);
      return handled - before;
    };
    expect(pacerTurn()).toBe(10);
    // The rest of the loop took 30 ms: the next turn takes as long, and the answers it owes leave every budget of it
    // (two frames within the turn; the rest at the end of the task).
    await Promise.resolve();
    const before = sent.length;
    clock.t += 30;
    expect(pacerTurn()).toBe(30);
    expect(sent.slice(before)).toEqual([10, 10]);
    await Promise.resolve();
    expect(sent.slice(before)).toEqual([10, 10, 10]);
    // Short loops: the budget still holds.
    clock.t += 2;
    expect(pacerTurn()).toBe(10);
    // A very long loop: at most five budgets.
    clock.t += 500;
    expect(pacerTurn()).toBe(50);
  });

  it('calls afterTurn once at the end of each turn, after every submit of that turn (the server flushes its node link there)', () => {
    const clock = manualClock();
    const log: string[] = [];
    const serving = {
      submit: () => {
        log.push('submit');
        return { ok: true, request: `r${log.length}`, model: 'm', version: 'v1', promptTokens: 1, cancel: () => {} };
      },
      models: () => [],
      backend: () => 'simulated',
      readiness: () => ({}),
    } as unknown as Serving;
    const metrics = { refused: () => {} } as unknown as ServerMetrics;
    const api = createStreamApi(serving, metrics, {
      clock,
      maxStreamsPerConnection: 1e6,
      afterTurn: () => log.push('afterTurn'),
    });
    const client = testPeer(() => true);
    api.onConnection(client.peer);
    for (let i = 0; i < 3; i++) client.receive(submitFrame(i));
    expect(log).toEqual([]);
    while (clock.turn());
    expect(log).toEqual(['submit', 'submit', 'submit', 'afterTurn']);
  });
});
