import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { normalizeScenario } from '../../actors/config.ts';
import { startServer, type RunningServer } from '../../api/server.ts';
import { INSPECT_SUBPROTOCOL, type InspectMessage } from '../../inspector/protocol.ts';

const scenario = normalizeScenario({
  name: 'inspect-server',
  models: [{ name: 'llama-3-8b', profile: 'llama-3-8b', tp: 1, replicas: 1 }],
});

/** Opens /v1/inspect; resolves with the first message, or with the close code when the server closes first. */
const open = (
  server: RunningServer,
  opts: { protocols?: string[]; headers?: Record<string, string>; origin?: string } = {},
): Promise<{ ws: WebSocket; first: InspectMessage | null; closed: { code: number; reason: string } | null }> =>
  new Promise((resolve, reject) => {
    const ws = new WebSocket(
      `${server.url.replace('http', 'ws')}/v1/inspect`,
      opts.protocols ?? [INSPECT_SUBPROTOCOL],
      {
        headers: opts.headers ?? {},
        ...(opts.origin ? { origin: opts.origin } : {}),
      },
    );
    ws.once('message', (d) => resolve({ ws, first: JSON.parse(String(d)) as InspectMessage, closed: null }));
    ws.once('close', (code, reason) => resolve({ ws, first: null, closed: { code, reason: reason.toString() } }));
    ws.once('unexpected-response', (_req, res) => reject(new Error(`HTTP ${res.statusCode}`)));
    ws.once('error', () => {});
  });

/** The admin token of every server here, as a bearer header. */
const ADMIN = { authorization: 'Bearer a' };

describe('the inspector on the serving control plane', () => {
  describe('with an open client API (loopback)', () => {
    let server: RunningServer;
    beforeAll(async () => {
      server = await startServer({ scenario, port: 0, workerTokens: ['w'], adminTokens: ['a'] });
    });
    afterAll(async () => {
      await server?.close();
    });

    it('serves the page and its assets from the control plane, loading nothing from elsewhere', async () => {
      const res = await fetch(`${server.url}/inspector`);
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toMatch(/text\/html/);
      expect(res.headers.get('content-security-policy')).toMatch(/default-src 'self'/);
      const html = await res.text();
      const refs = [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]!);
      expect(refs.length).toBeGreaterThan(0);
      for (const ref of refs) expect(ref).toMatch(/^(\/inspector\/|data:)/);
      for (const asset of refs.filter((r) => r.startsWith('/inspector/')))
        expect((await fetch(`${server.url}${asset}`)).status).toBe(200);
      for (const js of ['app.js', 'model.js', 'statechart.js']) {
        const text = await (await fetch(`${server.url}/inspector/${js}`)).text();
        expect(text).not.toMatch(/(?:import|fetch)\s*\(?\s*['"`]https?:/);
      }
      expect((await fetch(`${server.url}/inspector/nope.js`)).status).toBe(404);
    });

    it('streams versioned frames, hello first, and turns inspection on only while someone reads', async () => {
      expect(server.inspector.session.active()).toBe(false);
      const { ws, first } = await open(server, { headers: ADMIN });
      expect(first?.v).toBe(1);
      expect(first?.frames[0]).toMatchObject({ k: 'hello', v: 1, mode: 'live', gpus: 8 });
      expect(ws.protocol).toBe(INSPECT_SUBPROTOCOL);
      expect(server.inspector.session.active()).toBe(true);
      const node = first!.frames.find((f) => f.k === 'node');
      expect(node && node.k === 'node' ? node.gpus.length : 0).toBe(8);
      ws.close();
      await expect.poll(() => server.inspector.session.active()).toBe(false);
    });

    it('refuses a page from another site, and accepts its own', async () => {
      // Refused before the upgrade completes: no socket, no slot.
      await expect(open(server, { origin: 'http://evil.example', headers: ADMIN })).rejects.toThrow('HTTP 403');
      const own = await open(server, { origin: server.url, headers: ADMIN });
      expect(own.first?.frames[0]?.k).toBe('hello');
      own.ws.close();
    });

    it('is read-only: a reader that keeps sending is cut off', async () => {
      const { ws } = await open(server, { headers: ADMIN });
      const closed = new Promise<number>((r) => ws.once('close', (code) => r(code)));
      for (let i = 0; i < 100; i++) ws.send(JSON.stringify({ type: 'admin.fail', gpu: 3 }));
      expect(await closed).toBe(1008);
    });
  });

  describe('with client tokens', () => {
    let server: RunningServer;
    beforeAll(async () => {
      server = await startServer({
        scenario,
        port: 0,
        clientTokens: ['tok-1'],
        workerTokens: ['w'],
        adminTokens: ['a'],
        inspectorTokens: ['insp-1'],
        maxInspectorReaders: 2,
      });
    });
    afterAll(async () => {
      await server?.close();
    });

    it('refuses the upgrade itself without an admin or inspector token, before any socket or slot is spent', async () => {
      await expect(open(server)).rejects.toThrow('HTTP 401');
      await expect(open(server, { headers: { authorization: 'Bearer wrong' } })).rejects.toThrow('HTTP 401');
      expect(server.inspector.readers()).toBe(0);
    });

    it("refuses a client's token: every tenant's requests are for admins only", async () => {
      await expect(open(server, { headers: { authorization: 'Bearer tok-1' } })).rejects.toThrow('HTTP 401');
      const asPage = [INSPECT_SUBPROTOCOL, `switchyard.token.${Buffer.from('tok-1').toString('base64url')}`];
      await expect(open(server, { protocols: asPage })).rejects.toThrow('HTTP 401');
      const auth = await fetch(`${server.url}/inspector/auth`, { headers: { authorization: 'Bearer tok-1' } });
      expect(auth.status).toBe(401);
      expect(server.inspector.readers()).toBe(0);
    });

    it('accepts the admin token as a bearer header or, from a browser, as a subprotocol, and an inspector token', async () => {
      const a = await open(server, { headers: ADMIN });
      expect(a.first?.frames[0]?.k).toBe('hello');
      a.ws.close();
      const b = await open(server, {
        protocols: [INSPECT_SUBPROTOCOL, `switchyard.token.${Buffer.from('insp-1').toString('base64url')}`],
      });
      expect(b.first?.frames[0]?.k).toBe('hello');
      expect(b.ws.protocol).toBe(INSPECT_SUBPROTOCOL);
      b.ws.close();
      await expect.poll(() => server.inspector.readers()).toBe(0);
    });

    it('serves a bounded number of readers and refuses the next one with 429 until one leaves', async () => {
      const a = await open(server, { headers: ADMIN });
      const b = await open(server, { headers: { authorization: 'Bearer insp-1' } });
      expect(server.inspector.readers()).toBe(2);
      await expect(open(server, { headers: ADMIN })).rejects.toThrow('HTTP 429');
      const auth = await fetch(`${server.url}/inspector/auth`, { headers: ADMIN });
      expect(await auth.json()).toMatchObject({ ok: false, status: 429 });
      a.ws.close();
      await expect.poll(() => server.inspector.readers()).toBe(1);
      const c = await open(server, { headers: ADMIN });
      expect(c.first?.frames[0]?.k).toBe('hello');
      b.ws.close();
      c.ws.close();
    });
  });
});
