// The control plane's side of worker links on real sockets: registration with version and epoch, one node at a
// time, epochs continued from what the node reports, and GPUs failed (as one event) after the grace period or at once
// when a new incarnation registers.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { createWallClock } from '../../runtime/clock.ts';
import { createRng } from '../../runtime/rng.ts';
import { createRuntime, type Msg, type Runtime } from '../../runtime/system.ts';
import { PROTOCOL_VERSION, type NodeMessage } from '../../transport/protocol.ts';
import { startNodeLink, type NodeLink } from '../../actors/node-link.ts';
import { createLink, type Link } from '../../transport/link.ts';
import { CLOSE, attachWsServer, connectWs, tokenSet, type WsPeer } from '../../transport/ws.ts';

const clock = createWallClock();
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const until = async (f: () => boolean, ms = 5_000): Promise<void> => {
  const end = performance.now() + ms;
  while (!f()) {
    if (performance.now() > end) throw new Error('condition not met in time');
    await sleep(5);
  }
};

interface Fixture {
  runtime: Runtime;
  node: NodeLink;
  placement: Msg[];
  url: string;
}

let servers: Server[] = [];
afterEach(async () => {
  for (const s of servers) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
  servers = [];
});

async function start(graceMs = 100): Promise<Fixture> {
  const runtime = createRuntime({ name: 'control', clock, rng: createRng(1) });
  const placement: Msg[] = [];
  runtime.register('placement', (m) => placement.push(m));
  const node = startNodeLink(runtime, {
    gpus: 8,
    graceMs,
    registerTimeoutMs: 300,
    settings: { heartbeatMs: 250, repairMs: 1000, lanes: 1 },
  });
  const server = createServer();
  attachWsServer(server, {
    clock,
    routes: { '/v1/node': { tokens: tokenSet(['w']), onConnection: (p) => node.onConnection(p) } },
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  servers.push(server);
  return { runtime, node, placement, url: `ws://127.0.0.1:${(server.address() as AddressInfo).port}/v1/node` };
}

/** A fake worker: connects and (optionally) registers; records what it is sent. */
async function worker(
  url: string,
  register: Partial<Extract<NodeMessage, { type: 'node.register' }>> | null = {},
): Promise<{ peer: WsPeer; link: Link; got: { to: string; msg: NodeMessage }[]; closed: Promise<number> }> {
  const r = await connectWs(url, { clock, token: 'w' });
  if (!r.ok) throw new Error(r.error.message);
  const got: { to: string; msg: NodeMessage }[] = [];
  const closed = new Promise<number>((res) => r.peer.onClose((code) => res(code)));
  const link = createLink(r.peer, { accepts: () => true, deliver: (to, msg) => got.push({ to, msg }) });
  if (register)
    link.send('control', {
      type: 'node.register',
      node: 'n1',
      protocol: PROTOCOL_VERSION,
      gpus: [0, 1, 2, 3, 4, 5, 6, 7],
      epoch: 0,
      ...register,
    });
  return { peer: r.peer, link, got, closed };
}

describe('node link', () => {
  it('registers a worker with a new epoch and the node settings, then routes remote messages to it', async () => {
    const f = await start();
    const w = await worker(f.url);
    await until(() => w.got.length > 0);
    expect(w.got[0]).toEqual({
      to: 'link',
      msg: { type: 'node.registered', node: 'n1', epoch: 1, heartbeatMs: 250, repairMs: 1000, lanes: 1 },
    });
    expect(f.node.status()).toMatchObject({
      connected: true,
      epoch: 1,
      gpus: [0, 1, 2, 3, 4, 5, 6, 7],
      registrations: 1,
    });
    f.runtime.send('gpu.3', { type: 'gpu.release', gpu: 3, replica: 'r', epoch: 1 });
    await until(() => w.got.length > 1);
    expect(w.got[1]).toMatchObject({ to: 'gpu.3', msg: { type: 'gpu.release', gpu: 3 } });
    w.link.send('placement', { type: 'gpu.ready', gpu: 5 });
    await until(() => f.placement.length > 0);
    expect(f.placement[0]).toEqual({ type: 'gpu.ready', gpu: 5 });
    w.peer.close();
  });

  it('refuses another protocol version, GPUs outside the node, and a second node while one is registered', async () => {
    const f = await start();
    expect(await (await worker(f.url, { protocol: PROTOCOL_VERSION + 1 })).closed).toBe(CLOSE.protocolVersion);
    expect(await (await worker(f.url, { gpus: [9] })).closed).toBe(CLOSE.policy);
    const first = await worker(f.url);
    await until(() => f.node.connected());
    expect(await (await worker(f.url)).closed).toBe(CLOSE.duplicateNode);
    expect(f.node.status().lastRefusal).toMatch(/already registered/);
    first.peer.close();
  });

  it('closes a connection that never registers', async () => {
    const f = await start();
    const w = await worker(f.url, null);
    expect(await w.closed).toBe(CLOSE.registerTimeout);
  });

  it('only lets a registered worker address placement and replicas', async () => {
    const f = await start();
    const w = await worker(f.url, null);
    w.link.send('placement', { type: 'gpu.ready', gpu: 1 });
    await sleep(50);
    expect(f.placement).toEqual([]);
    w.peer.close();
  });

  it('fails every GPU of a worker that stays away past the grace period, all in one event', async () => {
    const f = await start(100);
    const w = await worker(f.url);
    await until(() => f.node.connected());
    w.peer.terminate();
    await until(() => !f.node.connected());
    expect(f.placement).toEqual([]);
    expect(f.node.status().pendingFailure).toHaveLength(8);
    await until(() => f.placement.length > 0);
    await sleep(20);
    expect(f.placement).toEqual([{ type: 'node.lost', gpus: [0, 1, 2, 3, 4, 5, 6, 7], code: 'node_lost' }]);
  });

  it('continues epochs from the one the node reports (a restarted control plane never reuses an epoch)', async () => {
    const f = await start();
    const w = await worker(f.url, { epoch: 41 });
    await until(() => w.got.length > 0);
    expect(w.got[0]?.msg).toMatchObject({ type: 'node.registered', epoch: 42 });
    w.peer.close();
  });

  it('fails the old incarnation’s GPUs at once when a worker registers again within the grace period', async () => {
    const f = await start(60_000);
    const w = await worker(f.url);
    await until(() => f.node.connected());
    w.peer.terminate();
    await until(() => !f.node.connected());
    const again = await worker(f.url, { epoch: 1 });
    await until(() => again.got.length > 0);
    expect(f.placement).toEqual([{ type: 'node.lost', gpus: [0, 1, 2, 3, 4, 5, 6, 7], code: 'node_lost' }]);
    expect(again.got[0]?.msg).toMatchObject({ type: 'node.registered', epoch: 2 });
    expect(f.node.status()).toMatchObject({ epoch: 2, registrations: 2, pendingFailure: [] });
    again.peer.close();
  });
});
