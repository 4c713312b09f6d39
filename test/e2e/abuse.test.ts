// WebSocket and HTTP abuse against a real serving control plane on port 0 (a real worker link, real sockets): every
// abusive input is refused with its documented outcome (docs/serving.md, "Limits and refusals") while a well-behaved
// client keeps streaming with contiguous tokens. Each test prints how many abusive inputs it tried.
import { connect, type Socket } from 'node:net';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { normalizeScenario } from '../../actors/config.ts';
import type { NodeProcess } from '../../actors/worker/process.ts';
import { startFastWorker } from './harness.ts';
import { createWallClock } from '../../runtime/clock.ts';
import { SUBPROTOCOL_JSON } from '../../transport/client-protocol.ts';
import { connectClient, type SwitchyardClient } from '../../api/client.ts';
import { encode } from '../../transport/codec.ts';
import { PROTOCOL_VERSION } from '../../transport/protocol.ts';
import { startServer, type RunningServer } from '../../api/server.ts';
import { connectWs, type WsPeer } from '../../transport/ws.ts';
import { INSPECT_SUBPROTOCOL } from '../../inspector/protocol.ts';

const clock = createWallClock();
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const until = async (f: () => boolean, ms = 15_000, what = 'condition'): Promise<void> => {
  const end = performance.now() + ms;
  while (!f()) {
    if (performance.now() > end) throw new Error(`${what} not met within ${ms} ms`);
    await sleep(10);
  }
};
const report = (what: string, inputs: number, outcome: string): void =>
  console.log(`abuse: ${what}: ${inputs} abusive inputs, ${outcome}`);

const TOKEN = 'client-a';
const OTHER_TOKEN = 'client-b';
const WORKER_TOKEN = 'worker-secret';
// A long heartbeat: a paused reader must be cut off by the buffer cap, not by missing pings.
const LIMITS = {
  heartbeatMs: 60_000,
  maxWsConnections: 300,
  // Every abusive socket here comes from 127.0.0.1: the per-address caps are tested on their own (test/api/http).
  maxWsPerAddress: 100_000,
  maxConnectionsPerAddress: 100_000,
  headersTimeoutMs: 1_000,
  maxBufferedBytes: 256 * 1024,
  highWaterBytes: 32 * 1024,
};
const MODEL = 'llama-3-8b';

/** A raw socket that spoke an HTTP upgrade: the status line and headers, then WebSocket frames both ways. */
interface Raw {
  socket: Socket;
  status: number;
  headers: string;
  /** Frames the server sent after the upgrade. */
  frames: { opcode: number; payload: Buffer }[];
  closed: Promise<void>;
  /** The code of the server's close frame, or null when the socket ended without one. */
  closeCode(): number | null;
}

/** A masked client frame. */
function frame(opcode: number, payload: Buffer, fin = true): Buffer {
  const mask = randomBytes(4);
  const len = payload.length;
  const head =
    len < 126 ? Buffer.from([(fin ? 0x80 : 0) | opcode, 0x80 | len]) : len < 65536 ? Buffer.alloc(4) : Buffer.alloc(10);
  if (len >= 126 && len < 65536) {
    head[0] = (fin ? 0x80 : 0) | opcode;
    head[1] = 0x80 | 126;
    head.writeUInt16BE(len, 2);
  } else if (len >= 65536) {
    head[0] = (fin ? 0x80 : 0) | opcode;
    head[1] = 0x80 | 127;
    head.writeBigUInt64BE(BigInt(len), 2);
  }
  const body = Buffer.from(payload);
  for (let i = 0; i < body.length; i++) body[i]! ^= mask[i & 3]!;
  return Buffer.concat([head, mask, body]);
}

/** Opens a TCP socket, writes `request` (raw HTTP), and parses what comes back. */
function rawHttp(port: number, request: string | null): Raw {
  const socket = connect(port, '127.0.0.1');
  let buf = Buffer.alloc(0);
  let headerDone = false;
  let closeCode: number | null = null;
  const raw: Raw = {
    socket,
    status: 0,
    headers: '',
    frames: [],
    closed: new Promise((r) => socket.once('close', () => r())),
    closeCode: () => closeCode,
  };
  socket.on('error', () => {});
  socket.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    if (!headerDone) {
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      raw.headers = buf.subarray(0, end).toString('latin1');
      raw.status = Number(/^HTTP\/1\.1 (\d+)/.exec(raw.headers)?.[1] ?? 0);
      buf = buf.subarray(end + 4);
      headerDone = true;
    }
    if (raw.status !== 101) return;
    for (;;) {
      if (buf.length < 2) return;
      const opcode = buf[0]! & 0x0f;
      let len = buf[1]! & 0x7f;
      let off = 2;
      if (len === 126) {
        if (buf.length < 4) return;
        len = buf.readUInt16BE(2);
        off = 4;
      } else if (len === 127) {
        if (buf.length < 10) return;
        len = Number(buf.readBigUInt64BE(2));
        off = 10;
      }
      if (buf.length < off + len) return;
      const payload = buf.subarray(off, off + len);
      raw.frames.push({ opcode, payload });
      if (opcode === 8) {
        if (payload.length >= 2) closeCode = payload.readUInt16BE(0);
        // Answer the close handshake as a browser would, so the server need not wait for its close timeout.
        if (socket.writable) socket.end(frame(8, Buffer.from(payload.subarray(0, 2))));
      }
      buf = buf.subarray(off + len);
    }
  });
  if (request !== null) socket.write(request);
  return raw;
}

/** The request line and headers of a WebSocket upgrade. */
function upgradeRequest(path: string, headers: Record<string, string> = {}): string {
  const all: Record<string, string> = {
    Host: '127.0.0.1',
    Upgrade: 'websocket',
    Connection: 'Upgrade',
    'Sec-WebSocket-Key': randomBytes(16).toString('base64'),
    'Sec-WebSocket-Version': '13',
    ...headers,
  };
  return `GET ${path} HTTP/1.1\r\n${Object.entries(all)
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join('')}\r\n`;
}

/** Opens a raw WebSocket on /v1/ws with the JSON subprotocol and waits for the upgrade's answer. */
async function rawClient(port: number, token = TOKEN): Promise<Raw> {
  const raw = rawHttp(
    port,
    upgradeRequest('/v1/ws', { Authorization: `Bearer ${token}`, 'Sec-WebSocket-Protocol': SUBPROTOCOL_JSON }),
  );
  await until(() => raw.status !== 0 || raw.socket.destroyed, 5_000, 'upgrade answer');
  return raw;
}

/** A well-behaved client streaming request after request until stopped; every stream must complete, contiguous. */
function bystander(client: SwitchyardClient): { stop(): Promise<{ requests: number; tokens: number }> } {
  let running = true;
  let requests = 0;
  let tokens = 0;
  const loop = (async () => {
    while (running || requests === 0) {
      const s = client.stream({ model: MODEL, prompt: 'keep streaming', maxTokens: 40 });
      let next = 0;
      for await (const c of s) {
        expect(c.seq).toBe(next);
        next += c.n;
      }
      const r = await s.result;
      expect(r.ok).toBe(true);
      expect(next).toBe(40);
      requests++;
      tokens += next;
    }
  })();
  // Awaited in stop(); this handler only keeps an early failure from counting as unhandled meanwhile.
  loop.catch(() => {});
  return {
    stop: async () => {
      running = false;
      await loop;
      return { requests, tokens };
    },
  };
}

let server: RunningServer;
let worker: NodeProcess;
let good: SwitchyardClient;

/** Runs `abuse` while a bystander streams on its own connection; the bystander must finish every stream intact. */
async function whileStreaming<T>(abuse: () => Promise<T>): Promise<T> {
  const b = bystander(good);
  const out = await abuse();
  const r = await b.stop();
  expect(r.requests).toBeGreaterThan(0);
  return out;
}

beforeAll(async () => {
  const scenario = normalizeScenario({
    name: 'abuse',
    routing: { ejection: { failures: 1000 } },
    models: [{ name: MODEL, profile: MODEL, tp: 1, replicas: 2 }],
  });
  server = await startServer({
    scenario,
    port: 0,
    clientTokens: [TOKEN, OTHER_TOKEN],
    workerTokens: [WORKER_TOKEN],
    adminTokens: ['admin'],
    ...LIMITS,
  });
  worker = startFastWorker(server.nodeUrl, WORKER_TOKEN);
  await until(() => server.serving.readiness()[MODEL]!.ready, 20_000, 'model ready');
  good = await connectClient(server.wsUrl, { token: TOKEN });
}, 30_000);

afterAll(async () => {
  good?.close();
  worker?.stop();
  await server?.close();
});

describe('WebSocket abuse', () => {
  it('closes a connection that sends an oversized message with 1009, whether in one frame or summed over fragments', async () => {
    await whileStreaming(async () => {
      // One frame declaring 2 MiB: refused on the header alone.
      const big = await rawClient(server.port);
      const header = Buffer.from([0x81, 0x80 | 127, 0, 0, 0, 0, 0, 0x20, 0, 0, 1, 2, 3, 4]);
      big.socket.write(header);
      await big.closed;
      expect(big.closeCode()).toBe(1009);
      // Three 512 KiB fragments: each under the limit, their sum over it.
      const frag = await rawClient(server.port);
      const part = Buffer.alloc(512 * 1024, 0x61);
      frag.socket.write(Buffer.concat([frame(1, part, false), frame(0, part, false), frame(0, part, true)]));
      await frag.closed;
      expect(frag.closeCode()).toBe(1009);
      // The typed path: a peer over the ws library sending 2 MiB in one message.
      const r = await connectWs(server.wsUrl, {
        clock,
        token: TOKEN,
        protocols: [SUBPROTOCOL_JSON],
        maxPayload: 64 * 1024 * 1024,
      });
      expect(r.ok).toBe(true);
      const peer = (r as { ok: true; peer: WsPeer }).peer;
      const code = new Promise<number>((res) => peer.onClose((c) => res(c)));
      peer.send('x'.repeat(2 * 1024 * 1024));
      expect(await code).toBe(1009);
      report('oversized messages', 3, 'each closed with 1009');
    });
  });

  it('closes a connection flooding tiny or empty fragments with 1008 once one message has 1024 of them', async () => {
    await whileStreaming(async () => {
      let sent = 0;
      for (const size of [1, 0]) {
        const raw = await rawClient(server.port);
        const parts: Buffer[] = [frame(1, Buffer.alloc(size, 0x20), false)];
        for (let i = 0; i < 5_000; i++) parts.push(frame(0, Buffer.alloc(size, 0x20), false));
        sent += parts.length;
        raw.socket.write(Buffer.concat(parts));
        await raw.closed;
        expect(raw.closeCode()).toBe(1008);
      }
      report('fragment floods', sent, 'two connections, each closed with 1008 after 1024 fragments');
    });
  });

  it('answers a slow upgrade (headers dribbled in) with 408 once the headers timeout passes', async () => {
    await whileStreaming(async () => {
      const n = 20;
      const t0 = performance.now();
      const slow = Array.from({ length: n }, () => {
        const raw = rawHttp(server.port, `GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n`);
        const drip = setInterval(() => {
          if (!raw.socket.destroyed) raw.socket.write(`X-Slow-${Math.floor(performance.now())}: x\r\n`);
        }, 200);
        void raw.closed.then(() => clearInterval(drip));
        return raw;
      });
      await Promise.all(slow.map((r) => r.closed));
      const took = performance.now() - t0;
      for (const r of slow) expect(r.status).toBe(408);
      // Closed by the timeout (1 s, checked every 250 ms), not by the drip ending.
      expect(took).toBeGreaterThanOrEqual(LIMITS.headersTimeoutMs - 50);
      report('slow upgrades', n, `each answered 408 after ${Math.round(took)} ms`);
    });
  });

  it('answers an upgrade with too many or too large headers with 431', async () => {
    await whileStreaming(async () => {
      const many = rawHttp(
        server.port,
        upgradeRequest('/v1/ws', Object.fromEntries(Array.from({ length: 5_000 }, (_, i) => [`x-h${i}`, 'v']))),
      );
      const huge = rawHttp(server.port, upgradeRequest('/v1/ws', { 'x-huge': 'y'.repeat(20_000) }));
      await Promise.all([many.closed, huge.closed]);
      expect(many.status).toBe(431);
      expect(huge.status).toBe(431);
      report('oversized header blocks', 2, 'each answered 431');
    });
  });

  it('bounds thousands of idle sockets: silent TCP sockets get 408, WebSockets past the cap get 503 with Retry-After', async () => {
    await whileStreaming(async () => {
      const before = server.streams.sessions();
      const silent: Raw[] = [];
      const idle: Raw[] = [];
      try {
        // Silent TCP connections never send a request line: the headers timeout closes them. They are opened in
        // waves so the kernel's accept backlog does not drop SYNs (a dropped SYN retries seconds later).
        for (let wave = 0; wave < 5; wave++) {
          for (let i = 0; i < 200; i++) silent.push(rawHttp(server.port, null));
          await new Promise((r) => setTimeout(r, 100));
        }
        // Authenticated WebSockets that then say nothing: the connection cap bounds them.
        for (let i = 0; i < 400; i++) {
          idle.push(
            rawHttp(
              server.port,
              upgradeRequest('/v1/ws', {
                Authorization: `Bearer ${TOKEN}`,
                'Sec-WebSocket-Protocol': SUBPROTOCOL_JSON,
              }),
            ),
          );
          if (i % 100 === 99) await new Promise((r) => setTimeout(r, 100));
        }
        await until(() => idle.every((r) => r.status !== 0), 20_000, 'every upgrade answered');
        const accepted = idle.filter((r) => r.status === 101);
        const refused = idle.filter((r) => r.status === 503);
        expect(accepted.length + refused.length).toBe(idle.length);
        expect(accepted.length).toBeLessThanOrEqual(LIMITS.maxWsConnections);
        expect(refused.length).toBeGreaterThanOrEqual(idle.length - LIMITS.maxWsConnections);
        for (const r of refused) expect(r.headers).toMatch(/Retry-After: 1/i);
        await Promise.all(silent.map((r) => r.closed));
        expect(silent.every((r) => r.status === 408)).toBe(true);
        for (const r of accepted) r.socket.destroy();
        // Room again once they leave.
        await until(() => server.streams.sessions() <= before, 5_000, 'idle sessions gone');
        const again = await rawClient(server.port);
        expect(again.status).toBe(101);
        again.socket.destroy();
        report(
          'idle sockets',
          silent.length + idle.length,
          `${silent.length} silent TCP answered 408; ${accepted.length} WebSockets admitted, ${refused.length} refused 503`,
        );
      } finally {
        // Whatever happened, leave no socket behind for the tests that follow.
        for (const r of [...silent, ...idle]) r.socket.destroy();
      }
    });
  }, 90_000);

  it('cuts off a client that never reads once its queued bytes pass the cap, and cancels its requests', async () => {
    await whileStreaming(async () => {
      const before = server.streams.sessions();
      const raw = await rawClient(server.port);
      // The bound is generous: under the full suite's load the handshake alone has taken over 5 s.
      await until(() => server.streams.sessions() > before, 15_000, 'session open');
      const submits = Array.from({ length: 96 }, (_, i) => ({
        type: 'submit',
        id: `r${i}`,
        model: MODEL,
        promptTokens: 1,
        maxTokens: 2_000,
      }));
      raw.socket.write(frame(1, Buffer.from(JSON.stringify(submits))));
      raw.socket.pause();
      await until(() => server.streams.streams() >= 96, 5_000, 'requests admitted');
      await until(() => server.streams.sessions() === before, 20_000, 'slow reader cut off');
      // Its requests were cancelled with it: nothing keeps generating for a reader that is gone.
      await until(() => server.streams.streams() <= 1, 5_000, 'its streams ended');
      expect(await server.metrics.text()).toMatch(/switchyard_edge_refusals_total\{code="slow_consumer"\} 1/);
      raw.socket.destroy();
      report(
        'never-reading client',
        submits.length,
        `cut off (close 4001) at the ${LIMITS.maxBufferedBytes}-byte cap, its ${submits.length} requests cancelled`,
      );
    });
  }, 30_000);
});

describe('authentication and authority', () => {
  it('refuses unauthenticated clients, workers and inspectors, and inspector pages from another Origin', async () => {
    await whileStreaming(async () => {
      const nodeUrl = server.nodeUrl;
      const inspectUrl = server.wsUrl.replace('/v1/ws', '/v1/inspect');
      const results = await Promise.all([
        connectWs(server.wsUrl, { clock, protocols: [SUBPROTOCOL_JSON] }),
        connectWs(server.wsUrl, { clock, protocols: [SUBPROTOCOL_JSON], token: 'wrong' }),
        connectWs(nodeUrl, { clock }),
        connectWs(nodeUrl, { clock, token: TOKEN }),
      ]);
      for (const r of results) expect(r).toMatchObject({ ok: false, error: { code: 'unauthorized', status: 401 } });
      // The inspector refuses before the upgrade completes: no socket, no slot.
      const noToken = rawHttp(
        server.port,
        upgradeRequest('/v1/inspect', { 'Sec-WebSocket-Protocol': INSPECT_SUBPROTOCOL }),
      );
      const badOrigin = rawHttp(
        server.port,
        upgradeRequest('/v1/inspect', {
          'Sec-WebSocket-Protocol': INSPECT_SUBPROTOCOL,
          Authorization: 'Bearer admin',
          Origin: 'https://evil.example',
        }),
      );
      await Promise.all([noToken.closed, badOrigin.closed]);
      expect(noToken.status).toBe(401);
      expect(badOrigin.status).toBe(403);
      // A client's token never opens the inspector (it shows every client's requests); the admin token with an
      // allowed (absent) Origin is served.
      const client = await connectWs(inspectUrl, { clock, token: TOKEN, protocols: [INSPECT_SUBPROTOCOL] });
      expect(client).toMatchObject({ ok: false, error: { status: 401 } });
      const ok = await connectWs(inspectUrl, { clock, token: 'admin', protocols: [INSPECT_SUBPROTOCOL] });
      expect(ok.ok).toBe(true);
      if (ok.ok) ok.peer.close();
      report(
        'unauthenticated or cross-site upgrades',
        results.length + 2,
        'clients and workers 401, inspector close 1008',
      );
    });
  });

  it('refuses a worker registering a GPU outside the node, a duplicate GPU id, or GPUs another node holds', async () => {
    await whileStreaming(async () => {
      const attempts: [number[], number][] = [
        [[0, 9], 1008],
        [[2, 2], 1008],
        [[], 1008],
        [[0, 1, 2, 3, 4, 5, 6, 7], 4009],
      ];
      for (const [gpus, want] of attempts) {
        const r = await connectWs(server.nodeUrl, { clock, token: WORKER_TOKEN });
        expect(r.ok).toBe(true);
        const peer = (r as { ok: true; peer: WsPeer }).peer;
        const closed = new Promise<number>((res) => peer.onClose((c) => res(c)));
        peer.send(
          encode([
            { to: 'control', msg: { type: 'node.register', node: 'evil', protocol: PROTOCOL_VERSION, gpus, epoch: 0 } },
          ]),
        );
        expect(await closed).toBe(want);
      }
      expect(server.node.status()).toMatchObject({ connected: true, node: 'node', registrations: 1 });
      report('bad worker registrations', attempts.length, 'closed 1008 (bad GPU ids) or 4009 (GPUs already held)');
    });
  });

  it("keeps one client from cancelling or reading another's request: ids are scoped to their connection", async () => {
    const victim = await connectClient(server.wsUrl, { token: TOKEN });
    const s = victim.stream({ model: MODEL, prompt: 'mine', maxTokens: 150 });
    const acc = await s.accepted;
    expect(acc).not.toBeNull();
    const attacker = await rawClient(server.port, OTHER_TOKEN);
    const tries = [
      { type: 'cancel', id: s.id },
      { type: 'cancel', id: acc!.request },
      { type: 'submit', id: s.id, model: MODEL, promptTokens: 1, maxTokens: 3 },
    ];
    attacker.socket.write(frame(1, Buffer.from(JSON.stringify(tries))));
    let next = 0;
    for await (const c of s) {
      expect(c.seq).toBe(next);
      next += c.n;
    }
    expect(await s.result).toMatchObject({ ok: true });
    expect(next).toBe(150);
    // The attacker's own request under the same client id is its own, with another server id.
    await until(
      () => attacker.frames.some((f) => f.opcode === 1 && f.payload.toString().includes('"done"')),
      5_000,
      'attacker done',
    );
    const said = attacker.frames
      .filter((f) => f.opcode === 1)
      .flatMap((f) => JSON.parse(f.payload.toString()) as { type: string; id?: string; request?: string }[]);
    const accepted = said.find((m) => m.type === 'accepted');
    expect(accepted?.id).toBe(s.id);
    expect(accepted?.request).not.toBe(acc!.request);
    expect(
      said.filter((m) => m.id === s.id && (m.type === 'done' || m.type === 'error' || m.type === 'rejected')),
    ).toHaveLength(1);
    attacker.socket.destroy();
    victim.close();
    report(
      "another client's request ids",
      tries.length,
      'no effect on the victim; the same id names the attacker’s own request',
    );
  });
});

describe('a worker that claims a GPU it did not register', () => {
  it('is refused with close 1008 naming the GPU', async () => {
    const scenario = normalizeScenario({
      name: 'abuse-node',
      models: [{ name: MODEL, profile: MODEL, tp: 1, replicas: 1 }],
    });
    const s2 = await startServer({ scenario, port: 0, workerTokens: [WORKER_TOKEN], adminTokens: ['admin'] });
    try {
      const r = await connectWs(s2.nodeUrl, { clock, token: WORKER_TOKEN });
      expect(r.ok).toBe(true);
      const peer = (r as { ok: true; peer: WsPeer }).peer;
      const closed = new Promise<[number, string]>((res) => peer.onClose((c, why) => res([c, why])));
      peer.send(
        encode([
          {
            to: 'control',
            msg: { type: 'node.register', node: 'half', protocol: PROTOCOL_VERSION, gpus: [0, 1], epoch: 0 },
          },
        ]),
      );
      await until(() => s2.node.status().connected, 5_000, 'registered');
      peer.send(encode([{ to: 'placement', msg: { type: 'gpu.failed', gpu: 5, code: 'fault', replica: null } }]));
      const [code, why] = await closed;
      expect(code).toBe(1008);
      expect(why).toMatch(/gpu 5/);
      expect(s2.node.status().lastRefusal).toMatch(/did not register/);
      report('foreign GPU claims', 1, 'closed 1008');
    } finally {
      await s2.close();
    }
  });
});
