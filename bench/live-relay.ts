// The baseline of `npm run bench:live`: a bare two-hop ws+msgpack relay moving the same messages as switchyard
// (client frames in the client protocol, node-link envelopes to a worker that answers every step at once), with no
// actors, routing, batching policy or KV accounting. Run as `relay-server` and `relay-worker` processes by bench/live.ts.
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

/** Lanes stepping independently, like switchyard's eight single-GPU replicas. */
const LANES = 8;

interface Active {
  out: (m: ServerMessage) => void;
  id: string;
  left: number;
  seq: number;
}

/** Runs the relay's server hop; prints `{"url": ...}` once listening. */
export async function runRelayServer(): Promise<void> {
  const clock = createWallClock();
  const server = createServer((_req, res) => res.end());
  const lanes = Array.from({ length: LANES }, () => ({ active: [] as Active[], stepping: false, step: 0 }));
  let worker: ReturnType<typeof createLink> | null = null;
  let next = 0;

  const kick = (k: number): void => {
    const lane = lanes[k]!;
    if (lane.stepping || lane.active.length === 0 || !worker) return;
    lane.stepping = true;
    lane.step++;
    worker.send('node', {
      type: 'step.execute',
      replica: `relay#${k}`,
      epoch: 1,
      step: lane.step,
      gpus: [k],
      shape: { prefill: [], decodeBatch: lane.active.length, decodeContext: 0 },
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
            deliver: (to, msg) => {
              if (msg.type !== 'step.completed') return;
              const k = Number(to.slice(6));
              const lane = lanes[k]!;
              lane.stepping = false;
              const still: Active[] = [];
              for (const a of lane.active) {
                a.out({ type: 'tokens', id: a.id, seq: a.seq, n: 1 });
                a.seq++;
                if (--a.left > 0) still.push(a);
                else
                  a.out({
                    type: 'done',
                    id: a.id,
                    finishReason: 'length',
                    usage: { promptTokens: 1, completionTokens: a.seq },
                    timings: { queueMs: 0, ttftMs: 0, e2eMs: 0 },
                  });
              }
              lane.active = still;
              kick(k);
            },
          });
          for (let k = 0; k < LANES; k++) kick(k);
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
              lanes[k]!.active.push({ out, id: m.id, left: m.maxTokens, seq: 0 });
              out({ type: 'accepted', id: m.id, request: m.id, model: m.model, version: 'v1' });
              kick(k);
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

/** Runs the relay's worker hop: answers every step.execute at once with step.completed. */
export async function runRelayWorker(url: string): Promise<void> {
  const clock = createWallClock();
  const r = await connectWs(url, { clock });
  if (!r.ok) throw new Error(`relay worker: ${r.error.message}`);
  const link = createLink(r.peer, {
    accepts: (to) => to === 'node',
    deliver: (_to, msg) => {
      if (msg.type !== 'step.execute') return;
      link.send(msg.replica, {
        type: 'step.completed',
        gpu: msg.gpus[0] ?? 0,
        replica: msg.replica,
        epoch: msg.epoch,
        step: msg.step,
        busyMs: 0,
      });
    },
  });
  r.peer.onClose(() => process.exit(0));
}
