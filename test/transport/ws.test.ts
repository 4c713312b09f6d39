// The WebSocket module on real sockets: authentication and subprotocols at the upgrade, payload limits, heartbeats
// that terminate silent peers, and the cap on queued outgoing bytes.
import { createServer, type Server } from 'node:http';
import { connect, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { createWallClock } from '../../runtime/clock.ts';
import {
  CLOSE,
  attachWsServer,
  bearerToken,
  connectWs,
  isLoopback,
  tokenSet,
  type WsPeer,
  type WsServer,
} from '../../transport/ws.ts';

const clock = createWallClock();
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

interface Fixture {
  server: Server;
  ws: WsServer;
  url: string;
  port: number;
  peers: WsPeer[];
}

let fixtures: Fixture[] = [];
afterEach(async () => {
  for (const f of fixtures) {
    f.ws.close();
    f.server.closeAllConnections();
    await new Promise((r) => f.server.close(r));
  }
  fixtures = [];
});

async function start(opts: Partial<Parameters<typeof attachWsServer>[1]> = {}): Promise<Fixture> {
  const server = createServer((_q, r) => r.end());
  const peers: WsPeer[] = [];
  const ws = attachWsServer(server, {
    clock,
    routes: {
      '/open': { tokens: null, onConnection: (p) => peers.push(p) },
      '/secret': { tokens: tokenSet(['s3cret']), onConnection: (p) => peers.push(p) },
      '/proto': { tokens: null, protocols: ['a.v1', 'b.v1'], onConnection: (p) => peers.push(p) },
      '/echo': {
        tokens: null,
        onConnection: (p) => {
          peers.push(p);
          p.onMessage((d) => p.send(d));
        },
      },
    },
    ...opts,
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  const f = { server, ws, url: `ws://127.0.0.1:${port}`, port, peers };
  fixtures.push(f);
  return f;
}

/** A raw TCP client that completes the upgrade and then never answers anything (no pongs, no reads if paused). */
function rawUpgrade(
  port: number,
  path: string,
  headers: Record<string, string> = {},
): Promise<{ socket: Socket; status: number }> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    let buf = '';
    socket.on('error', reject);
    socket.once('connect', () => {
      const extra = Object.entries(headers)
        .map(([k, v]) => `${k}: ${v}\r\n`)
        .join('');
      socket.write(
        `GET ${path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n${extra}\r\n`,
      );
    });
    const onData = (d: Buffer): void => {
      buf += d.toString('latin1');
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      socket.off('data', onData);
      resolve({ socket, status: Number(/^HTTP\/1\.1 (\d+)/.exec(buf)?.[1] ?? 0) });
    };
    socket.on('data', onData);
  });
}

describe('ws', () => {
  describe('tokens', () => {
    it('accepts only the configured bearer tokens', () => {
      const t = tokenSet(['a', 'bb']);
      expect(t.has('a')).toBe(true);
      expect(t.has('bb')).toBe(true);
      expect(t.has('b')).toBe(false);
      expect(t.has('')).toBe(false);
      expect(t.has(null)).toBe(false);
    });

    it('reads the bearer token of a request and recognises loopback hosts', () => {
      expect(bearerToken({ headers: { authorization: 'Bearer abc' } } as never)).toBe('abc');
      expect(bearerToken({ headers: { authorization: 'Basic abc' } } as never)).toBeNull();
      expect(bearerToken({ headers: {} } as never)).toBeNull();
      expect(isLoopback('127.0.0.1')).toBe(true);
      expect(isLoopback('::1')).toBe(true);
      expect(isLoopback('0.0.0.0')).toBe(false);
    });
  });

  describe('the upgrade', () => {
    it('refuses an unknown path with 404 and a missing or wrong token with 401', async () => {
      const f = await start();
      expect(await connectWs(`${f.url}/nowhere`, { clock })).toMatchObject({
        ok: false,
        error: { code: 'http_error', status: 404 },
      });
      expect(await connectWs(`${f.url}/secret`, { clock })).toMatchObject({
        ok: false,
        error: { code: 'unauthorized', status: 401 },
      });
      expect(await connectWs(`${f.url}/secret`, { clock, token: 'nope' })).toMatchObject({
        ok: false,
        error: { code: 'unauthorized' },
      });
      const ok = await connectWs(`${f.url}/secret`, { clock, token: 's3cret' });
      expect(ok.ok).toBe(true);
      if (ok.ok) ok.peer.close();
    });

    it('requires one of the offered subprotocols and negotiates the first the server prefers', async () => {
      const f = await start();
      expect((await connectWs(`${f.url}/proto`, { clock })).ok).toBe(false);
      expect((await connectWs(`${f.url}/proto`, { clock, protocols: ['c.v1'] })).ok).toBe(false);
      const r = await connectWs(`${f.url}/proto`, { clock, protocols: ['b.v1', 'a.v1'] });
      expect(r.ok).toBe(true);
      if (r.ok) {
        expect(r.peer.protocol).toBe('a.v1');
        r.peer.close();
      }
    });

    it('refuses a browser Origin the check rejects with 403', async () => {
      const f = await start({ checkOrigin: (o) => o === undefined || o === 'http://good' });
      const bad = await rawUpgrade(f.port, '/open', { Origin: 'http://evil' });
      expect(bad.status).toBe(403);
      bad.socket.destroy();
      const good = await rawUpgrade(f.port, '/open', { Origin: 'http://good' });
      expect(good.status).toBe(101);
      good.socket.destroy();
    });

    it('turns connections away past maxConnections with 503', async () => {
      const f = await start({ maxConnections: 1 });
      const a = await connectWs(`${f.url}/open`, { clock });
      expect(a.ok).toBe(true);
      expect(await connectWs(`${f.url}/open`, { clock })).toMatchObject({ ok: false, error: { status: 503 } });
      if (a.ok) a.peer.close();
    });
  });

  describe('an open socket', () => {
    it('carries binary and text frames both ways', async () => {
      const f = await start();
      const r = await connectWs(`${f.url}/echo`, { clock });
      if (!r.ok) throw new Error(r.error.message);
      const got: (Uint8Array | string)[] = [];
      r.peer.onMessage((d) => got.push(d));
      r.peer.send(new Uint8Array([1, 2, 3]));
      r.peer.send('hello');
      while (got.length < 2) await sleep(5);
      expect(Array.from(got[0] as Uint8Array)).toEqual([1, 2, 3]);
      expect(got[1]).toBe('hello');
      r.peer.close();
    });

    it('closes with 1009 when a message exceeds maxPayload', async () => {
      const f = await start({ maxPayload: 1024 });
      const r = await connectWs(`${f.url}/echo`, { clock });
      if (!r.ok) throw new Error(r.error.message);
      // The server stops reading at once, so only the sender hears the close code.
      const closed = new Promise<number>((res) => r.peer.onClose((code) => res(code)));
      r.peer.send(new Uint8Array(4096));
      expect(await closed).toBe(CLOSE.tooBig);
    });

    it('terminates a peer that stops answering pings', async () => {
      const f = await start({ heartbeatMs: 30 });
      const { socket, status } = await rawUpgrade(f.port, '/open');
      expect(status).toBe(101);
      const gone = new Promise<void>((res) => socket.once('close', () => res()));
      const serverSide = new Promise<void>((res) => f.peers[0]!.onClose(() => res()));
      await Promise.all([gone, serverSide]);
      expect(f.peers[0]!.isOpen()).toBe(false);
    });

    it('keeps a peer that answers pings', async () => {
      const f = await start({ heartbeatMs: 20 });
      const r = await connectWs(`${f.url}/open`, { clock });
      if (!r.ok) throw new Error(r.error.message);
      await sleep(150);
      expect(r.peer.isOpen()).toBe(true);
      expect(f.peers[0]!.isOpen()).toBe(true);
      r.peer.close();
    });

    it('cuts off a peer that does not read once its queued bytes pass the cap', async () => {
      const f = await start({ maxBufferedBytes: 256 * 1024, highWaterBytes: 64 * 1024 });
      const { socket } = await rawUpgrade(f.port, '/open');
      socket.pause();
      const peer = f.peers[0]!;
      const closed = new Promise<void>((res) => peer.onClose(() => res()));
      const chunk = new Uint8Array(64 * 1024);
      let sent = 0;
      let congested = false;
      for (let i = 0; i < 2000 && peer.send(chunk); i++) {
        sent++;
        congested ||= peer.congested();
      }
      expect(congested).toBe(true);
      expect(sent).toBeLessThan(2000);
      await closed;
      expect(peer.isOpen()).toBe(false);
      socket.destroy();
    });
  });
});
