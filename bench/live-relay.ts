// The baseline of `npm run bench:live`: a bare two-hop ws+msgpack relay moving the same messages as switchyard
// (client frames in the client protocol; request-level node messages to a worker whose loop per lane steps at once and
// reports each step in one progress message), with no actors, routing, batching policy or KV accounting. Run as `relay-server` and `relay-worker` processes by bench/live.ts.
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createWallClock } from '../runtime/clock.ts';
import {
  CLIENT_PROTOCOL_VERSION,
  CLIENT_SUBPROTOCOLS,
  decodeClientFrame,
  encodeFrame,
  formatOf,
  type ServerMessage,
} from '../transport/client-protocol.ts';
import { createLink } from '../transport/link.ts';
import { attachWsServer, connectWs, type WsPeer } from '../transport/ws.ts';
import { idleLoad, type ReplicaLoad, type SeqEvent } from '../machines/core-messages.ts';

/** Lanes stepping independently, like switchyard's eight single-GPU replicas, each with its own loop at the worker. */
const LANES = 8;

interface Active {
  out: (m: ServerMessage) => void;
  id: string;
  seq: number;
}

/** A load report of nothing, as the node protocol requires one in every progress message. */
const IDLE_LOAD: ReplicaLoad = idleLoad();

/** Runs the relay's server hop; prints `{"url": ...}` once listening. */
export async function runRelayServer(): Promise<void> {
  const clock = createWallClock();
  const server = createServer((_req, res) => res.end());
  const active = new Map<string, Active>();
  let worker: ReturnType<typeof createLink> | null = null;
  let next = 0;

  const submit = (k: number, id: string, maxTokens: number): void => {
    const seq = { id, priority: 0, order: next, promptTokens: 1, outputTokens: maxTokens, maxTokens };
    worker?.send('node', {
      type: 'seq.submit',
      replica: `relay#${k}`,
      epoch: 1,
      seqs: [{ ...seq, estOutputTokens: maxTokens, generated: 0 }],
    });
  };

  const ws = attachWsServer(server, {
    clock,
    routes: {
      '/v1/node': {
        tokens: null,
        onConnection: (peer) => {
          worker = createLink(peer, {
            accepts: (to) => to.startsWith('relay#'),
            deliver: (_to, msg) => {
              if (msg.type !== 'seq.progress') return;
              for (const e of msg.events) {
                const a = e.k === 't' || e.k === 'f' ? active.get(e.id) : undefined;
                if (!a) continue;
                if (e.k === 't') {
                  a.out({ type: 'tokens', id: a.id, seq: a.seq, n: e.n });
                  a.seq += e.n;
                } else {
                  active.delete(a.id);
                  a.out({
                    type: 'done',
                    id: a.id,
                    finishReason: 'length',
                    usage: { promptTokens: 1, completionTokens: a.seq },
                    timings: { queueMs: 0, ttftMs: 0, e2eMs: 0 },
                  });
                }
              }
            },
          });
          process.stdout.write(`${JSON.stringify({ worker: true })}\n`);
        },
      },
      '/v1/ws': {
        tokens: null,
        protocols: CLIENT_SUBPROTOCOLS,
        onConnection: (peer: WsPeer) => {
          const format = formatOf(peer.protocol);
          let queue: ServerMessage[] = [];
          let scheduled = false;
          const flush = (): void => {
            scheduled = false;
            const q = queue;
            queue = [];
            if (q.length > 0 && peer.isOpen()) peer.send(encodeFrame(q, format));
          };
          const out = (m: ServerMessage): void => {
            queue.push(m);
            if (!scheduled) {
              scheduled = true;
              queueMicrotask(flush);
            }
          };
          peer.onMessage((data) => {
            const f = decodeClientFrame(data, format);
            if (!f.ok) return;
            for (const m of f.messages) {
              if (m.type !== 'submit') continue;
              const k = next++ % LANES;
              active.set(m.id, { out, id: m.id, seq: 0 });
              out({ type: 'accepted', id: m.id, request: m.id, model: m.model, version: 'v1' });
              submit(k, m.id, m.maxTokens);
            }
          });
          out({
            type: 'hello',
            protocol: CLIENT_PROTOCOL_VERSION,
            server: 'relay',
            backend: 'simulated',
            models: ['relay'],
          });
        },
      },
    },
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` })}\n`);
  process.once('SIGTERM', () => {
    ws.close();
    server.close();
    process.exit(0);
  });
}

/** Runs the relay's worker hop: a loop per lane that, on the clock's next turn, gives each of its sequences a token,
 * ends those that reached their length, and reports the step in one progress message. */
export async function runRelayWorker(url: string): Promise<void> {
  const clock = createWallClock();
  const r = await connectWs(url, { clock });
  if (!r.ok) throw new Error(`relay worker: ${r.error.message}`);
  const lanes = new Map<string, { seqs: { id: string; left: number }[]; stepping: boolean }>();
  const step = (replica: string): void => {
    const lane = lanes.get(replica)!;
    const events: SeqEvent[] = [];
    const still: { id: string; left: number }[] = [];
    for (const q of lane.seqs) {
      events.push({ k: 't', id: q.id, n: 1 });
      if (--q.left > 0) still.push(q);
      else events.push({ k: 'f', id: q.id, reason: 'length' });
    }
    lane.seqs = still;
    const at = clock.now();
    link.send(replica, { type: 'seq.progress', replica, epoch: 1, at, start: at, events, load: IDLE_LOAD });
    if (still.length > 0) clock.setTimeout(() => step(replica), 0);
    else lane.stepping = false;
  };
  const link = createLink(r.peer, {
    accepts: (to) => to === 'node',
    deliver: (_to, msg) => {
      if (msg.type !== 'seq.submit') return;
      let lane = lanes.get(msg.replica);
      if (!lane) lanes.set(msg.replica, (lane = { seqs: [], stepping: false }));
      for (const q of msg.seqs ?? []) lane.seqs.push({ id: q.id, left: q.maxTokens });
      if (!lane.stepping) {
        lane.stepping = true;
        clock.setTimeout(() => step(msg.replica), 0);
      }
    },
  });
  r.peer.onClose(() => process.exit(0));
}
