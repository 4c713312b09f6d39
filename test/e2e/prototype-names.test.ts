// Names from clients that are also names on Object.prototype (`toString`, `constructor`, ...), sent as a request's
// priority, version, model and other string fields over WebSocket (JSON and msgpack frames) and HTTP (completions and
// chat completions) to a real serving control plane on port 0: each is a typed refusal or a normal answer, the server
// keeps serving, and no request is left live. Then an exception injected into one request's handling fails that
// request alone with `internal` and releases it.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { normalizeScenario } from '../../actors/config.ts';
import type { NodeProcess } from '../../actors/worker/process.ts';
import { startFastWorker } from './harness.ts';
import type { ReplicaHandle } from '../../actors/replica.ts';
import { createWallClock } from '../../runtime/clock.ts';
import {
  SUBPROTOCOL_JSON,
  SUBPROTOCOL_MSGPACK,
  decodeServerFrame,
  encodeFrame,
  type FrameFormat,
  type ServerMessage,
} from '../../transport/client-protocol.ts';
import { connectWs, type WsPeer } from '../../transport/ws.ts';
import { startServer, type RunningServer } from '../../api/server.ts';

const clock = createWallClock();
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const until = async (f: () => boolean | Promise<boolean>, ms = 15_000, what = 'condition'): Promise<void> => {
  const end = performance.now() + ms;
  while (!(await f())) {
    if (performance.now() > end) throw new Error(`${what} not met within ${ms} ms`);
    await sleep(10);
  }
};

const TOKEN = 'client-a';
const WORKER_TOKEN = 'worker-secret';
const MODEL = 'llama-3-8b';
/** Names every plain object answers to through its prototype. */
const NAMES = ['toString', 'constructor', 'valueOf', '__proto__', 'hasOwnProperty'] as const;

let server: RunningServer;
let worker: NodeProcess;
const logged: string[] = [];

beforeAll(async () => {
  const scenario = normalizeScenario({
    name: 'prototype-names',
    routing: { ejection: { failures: 1000 } },
    models: [{ name: MODEL, profile: MODEL, tp: 1, replicas: 2, versions: ['v1'], aliases: { prod: 'v1' } }],
  });
  server = await startServer({
    scenario,
    port: 0,
    clientTokens: [TOKEN],
    workerTokens: [WORKER_TOKEN],
    adminTokens: ['admin-token-for-tests'],
    log: (line) => logged.push(line),
  });
  worker = startFastWorker(server.nodeUrl, WORKER_TOKEN);
  await until(() => server.serving.readiness()[MODEL]!.ready, 20_000, 'model ready');
}, 30_000);

afterAll(async () => {
  worker?.stop();
  await server?.close();
});

/** A raw client socket: every message the server sent on it, decoded. */
async function rawSocket(format: FrameFormat): Promise<{ peer: WsPeer; got: ServerMessage[] }> {
  const r = await connectWs(server.wsUrl, {
    clock,
    token: TOKEN,
    protocols: [format === 'json' ? SUBPROTOCOL_JSON : SUBPROTOCOL_MSGPACK],
  });
  if (!r.ok) throw new Error(`connect: ${r.error.message}`);
  const got: ServerMessage[] = [];
  r.peer.onMessage((d) => {
    const f = decodeServerFrame(d, format);
    if (!f.ok) throw new Error(`bad server frame: ${f.error.message}`);
    got.push(...f.messages);
  });
  await until(() => got.some((m) => m.type === 'hello'), 5_000, 'hello');
  return { peer: r.peer, got };
}

/** The terminal message of client request `id` (rejected, done, or error with its id). */
const terminalOf = (got: readonly ServerMessage[], id: string): ServerMessage | undefined =>
  got.find((m) => (m.type === 'rejected' || m.type === 'done' || m.type === 'error') && 'id' in m && m.id === id);

/** The server's `switchyard_live_requests`, read from /metrics. */
async function liveRequests(): Promise<number> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith('switchyard_live_requests '));
  return Number(line!.split(' ')[1]);
}

/** One completion or chat completion over HTTP: its status and JSON body. */
async function complete(chat: boolean, body: Record<string, unknown>): Promise<{ status: number; body: any }> {
  const payload = chat ? { messages: [{ role: 'user', content: 'hello' }], ...body } : { prompt: 'hello', ...body };
  const res = await fetch(`${server.url}${chat ? '/v1/chat/completions' : '/v1/completions'}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${TOKEN}` },
    body: JSON.stringify({ model: MODEL, max_tokens: 4, ...payload }),
  });
  return { status: res.status, body: await res.json() };
}

/** The server still answers a plain request on each API, and nothing is left live. */
async function stillServing(): Promise<void> {
  const ws = await rawSocket('msgpack');
  ws.peer.send(encodeFrame({ type: 'submit', id: 'plain', model: MODEL, prompt: 'hi', maxTokens: 5 }, 'msgpack'));
  await until(() => terminalOf(ws.got, 'plain') !== undefined, 10_000, 'plain request ends');
  expect(terminalOf(ws.got, 'plain')).toMatchObject({ type: 'done' });
  ws.peer.close(1000, '');
  const http = await complete(false, {});
  expect(http.status).toBe(200);
  await until(async () => (await liveRequests()) === 0, 5_000, 'no live request');
}

/** Each name in each request field: the expected refusal code, or null for a normal answer. */
const CASES: { field: string; expect: string | null; ws(n: string): Record<string, unknown> }[] = [
  { field: 'priority', expect: 'invalid_request', ws: (n) => ({ priority: n }) },
  { field: 'version', expect: 'model_not_found', ws: (n) => ({ version: n }) },
  { field: 'model', expect: 'model_not_found', ws: (n) => ({ model: n }) },
  { field: 'prompt', expect: null, ws: (n) => ({ prompt: n }) },
  { field: 'stop', expect: null, ws: (n) => ({ stop: [n] }) },
];

describe('names on Object.prototype from clients', () => {
  for (const format of ['json', 'msgpack'] as const) {
    it(`are typed refusals or normal answers over WebSocket with ${format} frames, and the server serves on`, async () => {
      const ws = await rawSocket(format);
      const ids: { id: string; expect: string | null }[] = [];
      for (const name of NAMES) {
        for (const c of CASES) {
          const id = `${c.field}-${name}`;
          ids.push({ id, expect: c.expect });
          ws.peer.send(encodeFrame({ type: 'submit', id, model: MODEL, maxTokens: 3, ...c.ws(name) }, format));
        }
        // The client's own id is a name too: a normal request.
        ids.push({ id: name, expect: null });
        ws.peer.send(encodeFrame({ type: 'submit', id: name, model: MODEL, maxTokens: 3 }, format));
      }
      await until(() => ids.every((x) => terminalOf(ws.got, x.id) !== undefined), 15_000, 'every request ends');
      for (const x of ids) {
        const end = terminalOf(ws.got, x.id)!;
        if (x.expect === null) expect(end, x.id).toMatchObject({ type: 'done' });
        else expect(end, x.id).toMatchObject({ type: 'rejected', code: x.expect });
      }
      ws.peer.close(1000, '');
      await stillServing();
    });
  }

  for (const chat of [false, true]) {
    it(`are typed refusals or normal answers over HTTP ${chat ? 'chat completions' : 'completions'}, and the server serves on`, async () => {
      for (const name of NAMES) {
        const priority = await complete(chat, { priority: name });
        expect(priority.status, `priority ${name}`).toBe(400);
        expect(priority.body.error.code).toBe('invalid_request');
        const model = await complete(chat, { model: name });
        expect(model.status, `model ${name}`).toBe(404);
        expect(model.body.error.code).toBe('model_not_found');
        // (The OpenAI endpoints take no version field.)
        const stop = await complete(chat, { stop: name });
        expect(stop.status, `stop ${name}`).toBe(200);
        // As text a name is served; as a chat role it is no role OpenAI knows: a typed refusal naming the field.
        const text = await complete(chat, chat ? { messages: [{ role: 'user', content: name }] } : { prompt: name });
        expect(text.status, `prompt ${name}`).toBe(200);
        if (chat) {
          const role = await complete(true, { messages: [{ role: name, content: name }] });
          expect(role.status, `role ${name}`).toBe(400);
          expect(role.body.error.code).toBe('invalid_request');
          expect(role.body.error.message).toMatch(/role/);
        }
      }
      await stillServing();
    });
  }
});

describe("an exception in one request's handling", () => {
  it('fails that request alone with internal, releases it, and leaves the server serving', async () => {
    // Every replica's hand-off throws for a request asking for exactly 7 tokens.
    const replicas = [...server.serving.cp.placement.replicas.values()] as ReplicaHandle[];
    const restore = replicas.map((r) => {
      const enqueue = r.enqueue;
      r.enqueue = (seq, atHead) => {
        if (seq.maxTokens === 7) throw new Error('injected hand-off failure');
        enqueue(seq, atHead);
      };
      return () => (r.enqueue = enqueue);
    });
    try {
      const before = logged.length;
      for (const format of ['json', 'msgpack'] as const) {
        const ws = await rawSocket(format);
        ws.peer.send(
          encodeFrame(
            [
              { type: 'submit', id: 'bystander', model: MODEL, maxTokens: 20 },
              { type: 'submit', id: 'doomed', model: MODEL, maxTokens: 7 },
              { type: 'submit', id: 'after', model: MODEL, maxTokens: 5 },
            ],
            format,
          ),
        );
        await until(() => ['bystander', 'doomed', 'after'].every((id) => terminalOf(ws.got, id)), 10_000, 'ends');
        expect(terminalOf(ws.got, 'doomed')).toMatchObject({ type: 'rejected', code: 'internal' });
        expect(terminalOf(ws.got, 'bystander')).toMatchObject({ type: 'done' });
        expect(terminalOf(ws.got, 'after')).toMatchObject({ type: 'done' });
        // One end per request: nothing else was said about the failed one.
        expect(ws.got.filter((m) => 'id' in m && m.id === 'doomed')).toHaveLength(1);
        ws.peer.close(1000, '');
      }
      for (const chat of [false, true]) {
        const r = await complete(chat, { max_tokens: 7 });
        expect(r.status).toBe(500);
        expect(r.body.error.code).toBe('internal');
      }
      await until(async () => (await liveRequests()) === 0, 5_000, 'no live request');
      for (const r of replicas) expect(r.work.stats().waiting).toBe(0);
      expect(logged.slice(before).filter((l) => l.includes('injected hand-off failure'))).toHaveLength(4);
    } finally {
      for (const undo of restore) undo();
    }
    await stillServing();
  });
});
