// The node link over a real WebSocket: one frame per tick, and nothing reaches a runtime that the codec or the
// protocol schema refuses or that is addressed where the peer may not send.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { createWallClock } from '../../runtime/clock.ts';
import { encode } from '../../transport/codec.ts';
import { createLink } from '../../transport/ws-link.ts';
import { attachWsServer, connectWs, type WsPeer, type WsServer } from '../../transport/ws.ts';

const clock = createWallClock();
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
let cleanup: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanup) await c();
  cleanup = [];
});

/** A connected pair of peers: [server side, client side]. */
async function pair(): Promise<[WsPeer, WsPeer]> {
  const server: Server = createServer();
  let accepted: WsPeer | null = null;
  const ws: WsServer = attachWsServer(server, {
    clock,
    routes: { '/l': { tokens: null, onConnection: (p) => (accepted = p) } },
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const r = await connectWs(`ws://127.0.0.1:${(server.address() as AddressInfo).port}/l`, { clock });
  if (!r.ok) throw new Error(r.error.message);
  while (!accepted) await sleep(2);
  cleanup.push(async () => {
    ws.close();
    server.closeAllConnections();
    await new Promise((res) => server.close(res));
  });
  return [accepted, r.peer];
}

describe('ws-link', () => {
  it('sends everything queued in one tick as one frame and delivers it in order', async () => {
    const [a, b] = await pair();
    const got: string[] = [];
    const rx = createLink(b, {
      accepts: () => true,
      deliver: (to, m) => got.push(`${to}:${m.type}:${'gpu' in m ? m.gpu : ''}`),
    });
    const tx = createLink(a, { accepts: () => true, deliver: () => {} });
    for (let g = 0; g < 5; g++) tx.send(`gpu.${g}`, { type: 'gpu.release', gpu: g, replica: 'r', epoch: 1 });
    while (got.length < 5) await sleep(2);
    expect(got).toEqual([
      'gpu.0:gpu.release:0',
      'gpu.1:gpu.release:1',
      'gpu.2:gpu.release:2',
      'gpu.3:gpu.release:3',
      'gpu.4:gpu.release:4',
    ]);
    expect(tx.stats.framesOut).toBe(1);
    expect(rx.stats.framesIn).toBe(1);
    expect(rx.stats.messagesIn).toBe(5);
  });

  it('refuses frames the codec or the schema rejects, and keeps the link usable', async () => {
    const [a, b] = await pair();
    const got: string[] = [];
    const reasons: string[] = [];
    const rx = createLink(b, {
      accepts: () => true,
      deliver: (_to, m) => got.push(m.type),
      onRefused: (r) => reasons.push(r),
    });
    a.send(new Uint8Array([0xc1]));
    a.send(encode([{ to: 'gpu.1', msg: { type: 'gpu.release', gpu: -1, replica: 'r', epoch: 1 } }]));
    a.send(encode([{ to: 'gpu.1', msg: { type: 'no.such.message' } }]));
    a.send('text is not a node frame');
    a.send(encode([{ to: 'gpu.1', msg: { type: 'gpu.ready', gpu: 1 } }]));
    while (got.length < 1) await sleep(2);
    expect(got).toEqual(['gpu.ready']);
    expect(rx.stats.refused).toBe(4);
    expect(reasons[0]).toMatch(/malformed/);
    expect(reasons[1]).toMatch(/invalid_message/);
  });

  it('drops envelopes addressed where the peer may not send', async () => {
    const [a, b] = await pair();
    const got: string[] = [];
    const rx = createLink(b, { accepts: (to) => to.startsWith('gpu.'), deliver: (to) => got.push(to) });
    const tx = createLink(a, { accepts: () => true, deliver: () => {} });
    tx.send('router', { type: 'gpu.ready', gpu: 0 });
    tx.send('gpu.2', { type: 'gpu.ready', gpu: 2 });
    while (got.length < 1) await sleep(2);
    expect(got).toEqual(['gpu.2']);
    expect(rx.stats.misaddressed).toBe(1);
  });

  it('counts messages sent while the link is closed as dropped', async () => {
    const [a, b] = await pair();
    const tx = createLink(a, { accepts: () => true, deliver: () => {} });
    const closed = new Promise<void>((r) => a.onClose(() => r()));
    b.close();
    await closed;
    tx.send('gpu.0', { type: 'gpu.ready', gpu: 0 });
    tx.flush();
    expect(tx.stats.dropped).toBe(1);
  });
});
