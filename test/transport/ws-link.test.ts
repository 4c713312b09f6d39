// The node link over a real WebSocket passes the link conformance suite.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach } from 'vitest';
import { createWallClock } from '../../runtime/clock.ts';
import { createLink } from '../../transport/link.ts';
import { attachWsServer, connectWs, type WsPeer, type WsServer } from '../../transport/ws.ts';
import { describeLinkConformance, type LinkPair } from './link-conformance.ts';

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

describeLinkConformance('WebSocket', async (accepts): Promise<LinkPair> => {
  const [a, b] = await pair();
  const got: string[] = [];
  const refusals: string[] = [];
  const rx = createLink(b, {
    accepts,
    deliver: (to, m) => got.push(`${to}:${m.type}:${'gpu' in m ? m.gpu : ''}`),
    onRefused: (r) => refusals.push(r),
  });
  const tx = createLink(a, { accepts: () => true, deliver: () => {} });
  return {
    tx,
    rx,
    got,
    refusals,
    raw: (data) => void a.send(data),
    until: async (done) => {
      for (let i = 0; i < 2500 && !done(); i++) await sleep(2);
      if (!done()) throw new Error('the link delivered nothing within 5 s');
    },
    close: async () => {
      const closed = new Promise<void>((r) => a.onClose(() => r()));
      b.close();
      await closed;
    },
  };
});
